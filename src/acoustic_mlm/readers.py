"""One reader per kind of file a stage reads, whether the user gave it or an earlier stage wrote it.

Each reader checks what it reads (parse, columns, types, ranges, finiteness, the last row complete)
and refuses a damaged file in one `ReadError` line naming the file, what is wrong and the stage to
rerun; nothing damaged is used silently. Every stage reading a kind goes through its reader:

    tokenizer.json, fit.json, encode.json  read_json            tokenize
    shard-<k>/codes.npy                    read_codes           tokenize
    a seed's summary.json                  read_seed_summary    train
    metrics.csv (a seed's or an arm's)     read_metrics         train
    loss_curves.csv                        read_curves          aggregate
    diagnostics.csv                        read_diagnostics     aggregate
    the paper's curves CSV                 read_reference       (shipped in data/reference/)
    manifest.csv                           read_csv_table       prepare (corpus.load_prepared checks the rest)

A CSV written by the package always ends with a newline and has every field of every row: a file
cut short (an interrupted copy, an editor) fails those checks even where the cut falls inside a
number, which would otherwise parse as a different number.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from acoustic_mlm.errors import UserError, one_line

SCAN_BLOCK = 1 << 22  # codes checked 4 M values at a time (8 MB of int16): memory stays flat


class ReadError(UserError):
    """A file a stage reads is missing or damaged; the message names it and the stage to rerun."""


def _rerun(stage: str) -> str:
    return f"rerun the {stage} stage" if stage else "restore it (git checkout data/reference/paper_curves.csv) or fix it"


def _check_file(path: Path, what: str, stage: str) -> None:
    if path.is_file():
        return
    if path.exists():
        raise ReadError(f"{path}: not a regular file; {_rerun(stage)}")
    found = f"{what} not found" if what else "not found"
    raise ReadError(f"{path}: {found}; run the {stage} stage first" if stage else f"{path}: {found}")


# ----------------------------------------------------------------------------- JSON


def read_json(path: str | Path, what: str, stage: str, required: dict[str, type | tuple] | None = None) -> dict:
    """A JSON object with `required` keys of the given types (bool is never an int here)."""
    path = Path(path)
    _check_file(path, what, stage)
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReadError(f"{path}: not valid JSON ({one_line(exc)}); it was cut short or edited: "
                        f"{_rerun(stage)}") from None
    if not isinstance(obj, dict):
        raise ReadError(f"{path}: a JSON {type(obj).__name__}, not an object; {_rerun(stage)}")
    for key, kind in (required or {}).items():
        if key not in obj:
            raise ReadError(f"{path}: lacks '{key}'; {_rerun(stage)}")
        value = obj[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise ReadError(f"{path}: '{key}' is {_short(value)}, not {' or '.join(k.__name__ for k in kinds)}; "
                            f"{_rerun(stage)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ReadError(f"{path}: '{key}' is {value}; {_rerun(stage)}")
    return obj


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_tokenizer_summary(path: str | Path) -> dict:
    """data/codes/tokenizer.json: the codes' summary (written last by tokenize: it marks them complete)."""
    path = Path(path)
    meta = read_json(path, "", "tokenize", {"n_codebooks": int, "max_code": list,
                                                               "codebook_size": int})
    n, top = meta["n_codebooks"], meta["max_code"]
    if n < 1 or len(top) != n:
        raise ReadError(f"{path}: 'n_codebooks' is {n} but 'max_code' lists {len(top)} codebooks; rerun the "
                        "tokenize stage")
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in top):
        raise ReadError(f"{path}: 'max_code' must list whole numbers, one per codebook; rerun the tokenize stage")
    bad = [c for c in top if not -1 <= c < meta["codebook_size"]]
    if bad:
        raise ReadError(f"{path}: 'max_code' holds {bad[0]}, outside 0-{meta['codebook_size'] - 1}; rerun the "
                        "tokenize stage")
    return meta


SEED_SUMMARY_KEYS = {"status": str, "final_train_loss_cb0": (int, float), "final_valid_loss_cb0": (int, float),
                     "nonfinite_steps": int, "fingerprint": dict}


def read_seed_summary(path: str | Path) -> dict:
    """results/runs/<run>/seeds/seed<S>/summary.json: one seed's completed run."""
    return read_json(path, "a seed's summary", "train", SEED_SUMMARY_KEYS)


# ----------------------------------------------------------------------------- codes


def read_codes(path: str | Path, frames: int, codebooks: int | None, codebook_size: int,
               what: str = "codes") -> np.ndarray:
    """A shard's codes.npy, memory-mapped read-only: an integer array of at least `codebooks` rows
    (None: all it has) and `frames` columns whose every value of those rows lies in
    [0, codebook_size), or is -1 (a frame outside every clip). Every value is checked once (one
    pass over the file, in blocks)."""
    path = Path(path)
    _check_file(path, what, "tokenize")
    try:
        codes = np.load(path, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise ReadError(f"{path}: not a readable .npy array ({one_line(exc)}); rerun the tokenize stage") from None
    if codes.dtype.kind not in "iu":
        raise ReadError(f"{path}: {codes.dtype} values; codes are whole numbers; rerun the tokenize stage")
    if codes.ndim == 2 and codebooks is None:
        codebooks = codes.shape[0]
    if codes.ndim != 2 or codes.shape[0] < codebooks or codes.shape[1] != frames:
        raise ReadError(f"{path}: shape {codes.shape}, expected ({codebooks}+, {frames}) for its shard's audio; "
                        "rerun the tokenize stage")
    step = max(1, SCAN_BLOCK // max(codebooks, 1))
    for start in range(0, frames, step):
        block = np.asarray(codes[:codebooks, start : start + step])
        low, high = int(block.min()), int(block.max())
        if low < -1 or high >= codebook_size:
            row, col = np.argwhere((block < -1) | (block >= codebook_size))[0]
            raise ReadError(f"{path}: code {int(block[row, col])} at codebook {row}, frame {start + col} lies outside "
                            f"the codebook (0-{codebook_size - 1}); rerun the tokenize stage")
    return codes


# ----------------------------------------------------------------------------- CSV


def read_csv_table(path: str | Path, what: str, stage: str, columns, *, ints=(), numbers=(), finite=(),
                   choices: dict | None = None, dtype: dict | None = None, empty_ok: bool = False) -> pd.DataFrame:
    """A CSV the package wrote (or the user gave), checked whole: it ends with a newline, every row
    has every field, `ints` are whole numbers, `numbers` are numbers (an empty field is NaN),
    `finite` are finite numbers, `choices` hold allowed values. Other columns stay text."""
    path = Path(path)
    _check_file(path, what, stage)
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        if size == 0:
            raise ReadError(f"{path}: an empty file; {_rerun(stage)}")
        fh.seek(-1, 2)
        if fh.read(1) != b"\n":
            raise ReadError(f"{path}: cut short (its last row does not end with a line break); "
                            f"{_rerun(stage)}")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[], encoding="utf-8")
    except UnicodeDecodeError:
        raise ReadError(f"{path}: not UTF-8 text; {_rerun(stage)}") from None
    except Exception as exc:  # noqa: BLE001 - pandas' parser errors (a row with extra fields, ...)
        raise ReadError(f"{path}: not a readable CSV ({one_line(exc).splitlines()[0]}); "
                        f"{_rerun(stage)}") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ReadError(f"{path}: missing column(s) {', '.join(missing)}; {_rerun(stage)}")
    if frame.empty and not empty_ok:
        raise ReadError(f"{path}: no rows; {_rerun(stage)}")
    _check_fields(path, len(frame.columns), stage)
    _convert(frame, path, stage, ints, numbers, finite)
    for col, allowed in (choices or {}).items():
        bad = ~frame[col].isin(list(allowed))
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise ReadError(f"{path}: column '{col}', row {i + 2}: {frame[col].iloc[i][:30]!r} is not one of "
                            f"{', '.join(map(str, allowed))}; {_rerun(stage)}")
    for col, kind in (dtype or {}).items():
        if col in frame.columns and col not in ints and col not in numbers and col not in finite:
            frame[col] = frame[col].astype(kind)
    return frame


def _check_fields(path: Path, width: int, stage: str) -> None:
    """Every row has as many fields as the header (pandas fills a short row with empty values)."""
    with open(path, newline="", encoding="utf-8") as fh:
        for i, row in enumerate(csv.reader(fh)):
            if len(row) != width and row:
                raise ReadError(f"{path}: row {i + 1} has {len(row)} fields, the header {width} (cut short or "
                                f"edited); {_rerun(stage)}")


def _convert(frame: pd.DataFrame, path: Path, stage: str, ints=(), numbers=(), finite=()) -> None:
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
            raise ReadError(f"{path}: column '{col}', row {i + 2}: {frame[col].iloc[i][:30]!r} is not a number; "
                            f"{_rerun(stage)}")
        if col in ints or col in finite:
            arr = values.to_numpy(dtype=float)
            nonfinite = ~np.isfinite(arr)
            if nonfinite.any():
                i = int(np.flatnonzero(nonfinite)[0])
                raise ReadError(f"{path}: column '{col}', row {i + 2} is {frame[col].iloc[i] or 'empty'}; it must be "
                                f"a finite number; {_rerun(stage)}")
        if col in ints:
            if values.dtype.kind == "f":
                frac = values.to_numpy() != np.floor(values.to_numpy())
                if frac.any():
                    i = int(np.flatnonzero(frac)[0])
                    raise ReadError(f"{path}: column '{col}', row {i + 2}: {frame[col].iloc[i]!r} is not a whole "
                                    f"number; {_rerun(stage)}")
                values = values.astype(np.int64)
        elif values.dtype.kind != "f":
            values = values.astype(np.float64)
        frame[col] = values


LOSS_COLUMN = re.compile(r"^(train|valid)_loss_cb(\d+)$")  # a metrics column of losses: split, codebook


def _loss_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if LOSS_COLUMN.match(c)]


def read_metrics(path: str | Path) -> pd.DataFrame:
    """A run's metrics.csv: `step` (whole, increasing per seed), a loss column per split and
    codebook, every other column a number. Losses and diagnostics may be NaN (an update skipped
    as non-finite, a statistic without samples), never text or a cut row."""
    path = Path(path)
    frame = read_csv_table(path, "metrics", "train", ["step"], ints=["step"])
    _convert(frame, path, "train", ints=["seed"] if "seed" in frame else [],
             numbers=[c for c in frame.columns if c not in ("step", "seed")])
    if "train_loss_cb0" not in frame.columns:
        raise ReadError(f"{path}: missing column train_loss_cb0 (the figure's loss); rerun the train stage")
    for _, steps in frame.groupby("seed", sort=False)["step"] if "seed" in frame else [(None, frame["step"])]:
        s = steps.to_numpy()
        if (s < 0).any() or (np.diff(s) <= 0).any():
            raise ReadError(f"{path}: 'step' must increase from row to row (within a seed); rerun the train stage")
    return frame


CURVE_COLUMNS = ["run", "label", "seed", "step", "split", "codebook", "loss_bits"]
DIAGNOSTIC_COLUMNS = ["run", "label", "seed", "step", "diagnostic", "value"]


def read_curves(path: str | Path) -> pd.DataFrame:
    """results/loss_curves.csv, as aggregate writes it (a `nonfinite` column, when present, is whole)."""
    path = Path(path)
    frame = read_csv_table(path, "loss curves", "aggregate", CURVE_COLUMNS, ints=["seed", "step", "codebook"],
                           numbers=["loss_bits"], choices={"split": ("train", "valid")})
    _convert(frame, path, "aggregate", ints=["nonfinite"] if "nonfinite" in frame else [])
    if (frame["step"] < 0).any() or (frame["codebook"] < 0).any():
        raise ReadError(f"{path}: a negative step or codebook; rerun the aggregate stage")
    return frame


def read_diagnostics(path: str | Path) -> pd.DataFrame:
    """results/diagnostics.csv, as aggregate writes it."""
    return read_csv_table(path, "diagnostics", "aggregate", DIAGNOSTIC_COLUMNS, ints=["seed", "step"],
                          numbers=["value"], empty_ok=True)


REFERENCE_COLUMNS = ["run", "role", "label", "step", "loss_bits", "note"]


def read_reference(path: str | Path) -> pd.DataFrame:
    """The paper's digitised curves (data/reference/paper_curves.csv or the user's own): every step
    and loss a finite number, steps positive (the figure's x axis is logarithmic), roles known."""
    from acoustic_mlm.config import ROLES

    path = Path(path)
    if not path.is_file():
        raise ReadError(f"{path}: the paper's digitised curves are not found; they ship in the repository "
                        "(data/reference/paper_curves.csv), so run from a checkout or pass the path")
    frame = read_csv_table(path, "the paper's curves", "", REFERENCE_COLUMNS, finite=["step", "loss_bits"],
                           choices={"role": ROLES})
    if (frame["step"] <= 0).any():
        i = int(np.flatnonzero((frame["step"] <= 0).to_numpy())[0])
        raise ReadError(f"{path}: column 'step', row {i + 2} is {frame['step'].iloc[i]:g}; steps are positive "
                        "(the x axis is logarithmic)")
    counts = frame.groupby("role")["step"].count()
    thin = [r for r in ROLES if counts.get(r, 0) < 2]
    if thin:  # the claims on the paper's curves compare every role with the others
        raise ReadError(f"{path}: role {thin[0]} has {counts.get(thin[0], 0)} point(s); the paper's curves hold "
                        f"every role ({', '.join(ROLES)}) with at least 2 points; {_rerun('')}")
    roles = frame.groupby("run")["role"].nunique()
    if (roles > 1).any():
        raise ReadError(f"{path}: run {roles.index[roles > 1][0]!r} has several roles; {_rerun('')}")
    return frame
