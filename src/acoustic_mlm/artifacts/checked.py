"""The checked reading every reader of a file builds on: a JSON object with its keys of their
kinds (`read_json`), a CSV table with its columns, every field of every row and its numbers
(`read_csv_table`, `convert_columns`), and the one-line refusal (`ReadError`) naming the file, what is
wrong and the stage to rerun (`rerun_advice`; an `Advice` instead where a file is restored, not rerun).

Each artifact's reader (the modules beside this one) and the paper's curves' (acoustic_mlm.report.reference)
checks what it reads through here; nothing damaged is used silently. A CSV written by the package
always ends with a newline and has every field of every row: a file cut short (an interrupted copy,
an editor) fails those checks even where the cut falls inside a number, which would otherwise parse
as a different number.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from acoustic_mlm.errors import UserError, one_line


class ReadError(UserError):
    """A file a stage reads is missing or damaged; the message names it and the stage to rerun."""


class Advice(str):
    """A `stage` that is the whole advice of a refusal rather than a stage to rerun (a reference
    run's files are restored, never rerun: artifacts.reference_run)."""


def rerun_advice(stage: str) -> str:
    """What a refusal tells the user to do: rerun `stage` (an `Advice`: that advice itself; none:
    restore the shipped paper's curves)."""
    if isinstance(stage, Advice):
        return str(stage)
    if stage:
        return f"rerun the {stage} stage"
    return "restore it (git checkout data/reference/paper_curves.csv) or fix it"


def check_file(path: Path, what: str, stage: str) -> None:
    """`path` is a regular file; else one ReadError line naming it and what to run (or do)."""
    if path.is_file():
        return
    if path.exists():
        raise ReadError(f"{path}: not a regular file; {rerun_advice(stage)}")
    found = f"{what} not found" if what else "not found"
    if isinstance(stage, Advice):
        raise ReadError(f"{path}: {found}; {stage}")
    raise ReadError(f"{path}: {found}; run the {stage} stage first" if stage else f"{path}: {found}")


# ----------------------------------------------------------------------------- JSON


def read_json(path: str | Path, what: str, stage: str, required: dict[str, type | tuple] | None = None) -> dict:
    """A JSON object with `required` keys of the given types (bool is never an int here)."""
    path = Path(path)
    check_file(path, what, stage)
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReadError(
            f"{path}: not valid JSON ({one_line(exc)}); it was cut short or edited: {rerun_advice(stage)}"
        ) from None
    if not isinstance(obj, dict):
        raise ReadError(f"{path}: a JSON {type(obj).__name__}, not an object; {rerun_advice(stage)}")
    for key, kind in (required or {}).items():
        if key not in obj:
            raise ReadError(f"{path}: lacks '{key}'; {rerun_advice(stage)}")
        value = obj[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise ReadError(
                f"{path}: '{key}' is {short_value(value)}, not {' or '.join(k.__name__ for k in kinds)}; "
                f"{rerun_advice(stage)}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ReadError(f"{path}: '{key}' is {value}; {rerun_advice(stage)}")
    return obj


def short_value(value: Any, limit: int = 40) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_choice(path: Path, obj: dict, key: str, allowed: tuple, stage: str) -> None:
    """obj[key] is one of `allowed`; else one ReadError line naming the file and the key."""
    if obj[key] not in allowed:
        raise ReadError(
            f"{path}: '{key}' is {short_value(obj[key])}, not one of {', '.join(allowed)}; {rerun_advice(stage)}"
        )


# ----------------------------------------------------------------------------- CSV


def read_csv_table(
    path: str | Path,
    what: str,
    stage: str,
    columns,
    *,
    ints=(),
    numbers=(),
    finite=(),
    choices: dict | None = None,
    dtype: dict | None = None,
    empty_ok: bool = False,
) -> pd.DataFrame:
    """A CSV the package wrote (or the user gave), checked whole: it ends with a newline, every row
    has every field, `ints` are whole numbers, `numbers` are numbers (an empty field is NaN),
    `finite` are finite numbers, `choices` hold allowed values. Other columns stay text."""
    path = Path(path)
    check_file(path, what, stage)
    with open(path, "rb") as fh:
        head = fh.read(4)
        fh.seek(0, 2)
        size = fh.tell()
        if size == 0:
            raise ReadError(f"{path}: an empty file; {rerun_advice(stage)}")
        wide = wide_encoding(head)
        if wide:  # its last byte is a NUL, its columns unreadable as UTF-8: name the encoding, not a symptom
            raise ReadError(f"{path}: {wide} text, not UTF-8; save it as UTF-8 (or {rerun_advice(stage)})")
        fh.seek(-1, 2)
        if fh.read(1) != b"\n":
            raise ReadError(f"{path}: cut short (its last row does not end with a line break); {rerun_advice(stage)}")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[], encoding="utf-8")
    except UnicodeDecodeError:
        raise ReadError(f"{path}: not UTF-8 text; {rerun_advice(stage)}") from None
    except Exception as exc:  # noqa: BLE001 - pandas' parser errors (a row with extra fields, ...)
        raise ReadError(
            f"{path}: not a readable CSV ({one_line(exc).splitlines()[0]}); {rerun_advice(stage)}"
        ) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ReadError(f"{path}: missing column(s) {', '.join(missing)}; {rerun_advice(stage)}")
    if frame.empty and not empty_ok:
        raise ReadError(f"{path}: no rows; {rerun_advice(stage)}")
    _check_fields(path, len(frame.columns), stage)
    convert_columns(frame, path, stage, ints, numbers, finite)
    for col, allowed in (choices or {}).items():
        bad = ~frame[col].isin(list(allowed))
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise ReadError(
                f"{path}: column '{col}', row {i + 2}: {frame[col].iloc[i][:30]!r} is not one of "
                f"{', '.join(map(str, allowed))}; {rerun_advice(stage)}"
            )
    for col, kind in (dtype or {}).items():
        if col in frame.columns and col not in ints and col not in numbers and col not in finite:
            frame[col] = frame[col].astype(kind)
    return frame


def wide_encoding(head: bytes) -> str | None:
    """'UTF-16' or 'UTF-32' when a file's first bytes are such a byte-order mark, or hold the NUL bytes
    of UTF-16 text without one (an ASCII header: every other byte 0); else None."""
    if head[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"):
        return "UTF-32"
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "UTF-16"
    if len(head) >= 4 and (head[1] == head[3] == 0 or head[0] == head[2] == 0) and b"\x00" * 2 not in head:
        return "UTF-16"
    return None


def _check_fields(path: Path, width: int, stage: str) -> None:
    """Every row has as many fields as the header (pandas fills a short row with empty values)."""
    with open(path, newline="", encoding="utf-8") as fh:
        for i, row in enumerate(csv.reader(fh)):
            if len(row) != width and row:
                raise ReadError(
                    f"{path}: row {i + 1} has {len(row)} fields, the header {width} (cut short or "
                    f"edited); {rerun_advice(stage)}"
                )


def convert_columns(frame: pd.DataFrame, path: Path, stage: str, ints=(), numbers=(), finite=()) -> None:
    """Text columns to numbers in place: `ints` whole and finite, `finite` finite, `numbers` any
    number or empty (NaN); anything else is refused naming the column and row."""
    for col in dict.fromkeys([*ints, *numbers, *finite]):
        if col not in frame.columns:
            continue
        text = frame[col].str.strip()
        values = pd.to_numeric(text.where(text != "", "nan"), errors="coerce")
        bad = values.isna() & ~text.str.lower().isin(["", "nan", "-nan"])
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise ReadError(
                f"{path}: column '{col}', row {i + 2}: {frame[col].iloc[i][:30]!r} is not a number; "
                f"{rerun_advice(stage)}"
            )
        if col in ints or col in finite:
            arr = values.to_numpy(dtype=float)
            nonfinite = ~np.isfinite(arr)
            if nonfinite.any():
                i = int(np.flatnonzero(nonfinite)[0])
                raise ReadError(
                    f"{path}: column '{col}', row {i + 2} is {frame[col].iloc[i] or 'empty'}; it must be "
                    f"a finite number; {rerun_advice(stage)}"
                )
        if col in ints:
            if values.dtype.kind == "f":
                frac = values.to_numpy() != np.floor(values.to_numpy())
                if frac.any():
                    i = int(np.flatnonzero(frac)[0])
                    raise ReadError(
                        f"{path}: column '{col}', row {i + 2}: {frame[col].iloc[i]!r} is not a whole "
                        f"number; {rerun_advice(stage)}"
                    )
                values = values.astype(np.int64)
        elif values.dtype.kind != "f":
            values = values.astype(np.float64)
        frame[col] = values
