"""One reader per kind of file a stage reads, whether the user gave it or an earlier stage wrote it.

Each reader checks what it reads (parse, columns, types, ranges, finiteness, the last row complete)
and refuses a damaged file in one `ReadError` line naming the file, what is wrong and the stage to
rerun; nothing damaged is used silently. Every stage reading a kind goes through its reader:

    tokenizer.json, fit.json, encode.json  read_json            tokenize
    shard-<k>/codes.npy                    read_codes           tokenize
    a seed's summary.json                  read_seed_summary    train (read_seed_status: amlm status)
    metrics.partial.csv (a training seed)  read_partial_metrics train (amlm status)
    metrics.csv (a seed's or an arm's)     read_metrics         train
    loss_curves.csv                        read_curves          aggregate
    diagnostics.csv                        read_diagnostics     aggregate
    the paper's curves CSV                 read_reference       (shipped in data/reference/)
    a reference run's reference.json       read_reference_json    (data/reference/<preset>_run/, amlm verify)
    a reference run's metrics.csv          read_reference_metrics (data/reference/<preset>_run/, amlm verify)
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
    if stage == REFERENCE_RUN:
        return _reference_advice()
    if stage:
        return f"rerun the {stage} stage"
    return "restore it (git checkout data/reference/paper_curves.csv) or fix it"


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


SEED_STATUSES = ("completed", "completed_with_nonfinite", "diverged")  # train.summary.summarize's statuses


def read_seed_summary(path: str | Path) -> dict:
    """results/runs/<run>/seeds/seed<S>/summary.json: one seed's completed run."""
    summary = read_json(path, "a seed's summary", "train", SEED_SUMMARY_KEYS)
    _check_choice(Path(path), summary, "status", SEED_STATUSES, "train")
    return summary


def read_seed_status(path: str | Path) -> dict:
    """A seed's summary.json as `amlm status` needs it: its status, the steps it ran and (when
    there) its wall time, each of its kind; a file cut short or holding a control character is refused."""
    path = Path(path)
    summary = read_json(path, "a seed's summary", "train", {"status": str, "steps": int})
    _check_choice(path, summary, "status", SEED_STATUSES, "train")
    if summary["steps"] < 0:
        raise ReadError(f"{path}: 'steps' is {summary['steps']}, below 0; rerun the train stage")
    wall = summary.get("wall_time_s")
    if wall is not None and (isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall)):
        raise ReadError(f"{path}: 'wall_time_s' is {_short(wall)}, not a finite number; rerun the train stage")
    return summary


def _check_choice(path: Path, obj: dict, key: str, allowed: tuple, stage: str) -> None:
    if obj[key] not in allowed:
        raise ReadError(f"{path}: '{key}' is {_short(obj[key])}, not one of {', '.join(allowed)}; {_rerun(stage)}")


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


def loss_columns(frame: pd.DataFrame) -> list[str]:
    """The metrics columns of losses (train_loss_cb<k>, valid_loss_cb<k>), in the frame's order."""
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


PARTIAL_COLUMNS = ["step", "train_loss_cb0", "wall_time"]  # what amlm status reads of a seed's rows so far


def read_partial_metrics(path: str | Path) -> pd.DataFrame:
    """A training seed's metrics.partial.csv (rewritten whole at every metrics row): read_metrics'
    checks, and the columns `amlm status` reads (step, train_loss_cb0, wall_time) present; a
    fp16 loss scale comes with its overflow skips."""
    path = Path(path)
    frame = read_metrics(path)
    missing = [c for c in PARTIAL_COLUMNS if c not in frame.columns]
    if "loss_scale" in frame.columns and "overflow_skips" not in frame.columns:
        missing.append("overflow_skips")
    if missing:
        raise ReadError(f"{path}: missing column(s) {', '.join(missing)} (a seed's rows so far have "
                        f"{', '.join(PARTIAL_COLUMNS)}); it was edited or written by another program: rerun the train "
                        "stage")
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


# ----------------------------------------------------------------------------- a reference run (amlm verify)
#
# A reference folder (data/reference/<preset>_run/: metrics.csv and reference.json, written by
# `amlm verify --record`) is the known-good side of a comparison. A damaged one is refused as the
# reference's damage (ReferenceDamaged), never compared: a NaN or a missing row in it would
# otherwise read as this installation's fault ("DIFFERS").

REFERENCE_RUN = "\x00reference run"  # the `stage` of a reference's files: its advice is to restore it
REFERENCE_RUN_COLUMNS = ("run", "seed", "step", "train_loss_cb0")  # what verify matches rows on and draws


class ReferenceDamaged(ReadError):
    """A reference run's file is missing or damaged: the reference's fault, not the run's being checked."""


def _reference_advice() -> str:
    return ("the reference is damaged, not the run being checked: restore it (git checkout -- data/reference) "
            "or record it again (amlm verify --record DIR)")


def _reference(call, *args, **kwargs):
    """`call` with every ReadError it raises turned into a ReferenceDamaged with the same line."""
    try:
        return call(*args, **kwargs)
    except ReferenceDamaged:
        raise
    except ReadError as exc:
        raise ReferenceDamaged(str(exc)) from None


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_reference_json(path: str | Path) -> dict:
    """A reference run's reference.json: an object with `arms` (each arm's settings, an object of
    dotted keys), `config` (the preset it ran), a finite `tolerance_bits` >= 0 when present, and
    `tolerance_until_step` (a whole number >= 0, or null) with a finite `late_tolerance_bits` >= 0
    when it is set. Anything else (cut short, a control character, a missing key, a wrong type) is
    one ReferenceDamaged line naming the file."""
    path = Path(path)
    if not path.is_file() and not path.exists():
        raise ReadError(f"{path}: not found; a reference folder holds metrics.csv and reference.json "
                        "(amlm verify --record DIR writes one)")
    meta = _reference(read_json, path, "", REFERENCE_RUN, {"arms": dict, "config": str})
    advice = _reference_advice()
    if not meta["arms"]:
        raise ReferenceDamaged(f"{path}: 'arms' is empty (no arm's settings); {advice}")
    for run, settings in meta["arms"].items():
        if not isinstance(settings, dict):
            raise ReferenceDamaged(f"{path}: 'arms.{run}' is {_short(settings)}, not an object of settings; {advice}")
    if "tolerance_bits" in meta and not (_finite_number(meta["tolerance_bits"]) and meta["tolerance_bits"] >= 0):
        raise ReferenceDamaged(f"{path}: 'tolerance_bits' is {_short(meta['tolerance_bits'])}, not a finite number "
                               f">= 0; {advice}")
    until = meta.get("tolerance_until_step")
    if until is not None:
        if isinstance(until, bool) or not isinstance(until, int) or until < 0:
            raise ReferenceDamaged(f"{path}: 'tolerance_until_step' is {_short(until)}, not a whole number >= 0 "
                                   f"or null; {advice}")
        late = meta.get("late_tolerance_bits")
        if not (_finite_number(late) and late >= 0):
            raise ReferenceDamaged(f"{path}: 'late_tolerance_bits' is "
                                   f"{_short(late) if 'late_tolerance_bits' in meta else 'missing'}, "
                                   "not a finite number >= 0 (it holds the rows after 'tolerance_until_step'); "
                                   f"{advice}")
    native = meta.get("native_tolerance_bits")
    if native is not None and not (_finite_number(native) and native >= 0):
        raise ReferenceDamaged(f"{path}: 'native_tolerance_bits' is {_short(native)}, not a finite number >= 0 "
                               f"or null; {advice}")
    if meta.get("cpu_kernels") not in (None, "avx2", "native"):
        raise ReferenceDamaged(f"{path}: 'cpu_kernels' is {_short(meta['cpu_kernels'])}, not avx2, native or null; "
                               f"{advice}")
    hashes = meta.get("data_hashes")
    if hashes is not None and not (isinstance(hashes, dict) and all(
            isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) and len(v) == 64
                                            for k, v in files.items()) for files in hashes.values())):
        raise ReferenceDamaged(f"{path}: 'data_hashes' must map each stage to {{file: sha256}}; {advice}")
    if "machine" in meta and not isinstance(meta["machine"], (dict, type(None))):
        raise ReferenceDamaged(f"{path}: 'machine' is {_short(meta['machine'])}, not an object; {advice}")
    return meta


def read_reference_metrics(path: str | Path, columns=REFERENCE_RUN_COLUMNS) -> pd.DataFrame:
    """A reference run's metrics.csv (every arm's rows, a `run` column): the `columns` present;
    `seed` and `step` whole numbers, steps increasing within an arm's seed; every loss column
    (train_loss_cb<k>, valid_loss_cb<k>) a finite number, the two splits with the same codebooks
    0..K-1; every other column but `run` a number or empty. The last row must end with a line
    break (a cut inside a number would parse as another number). Anything else is one
    ReferenceDamaged line naming the file, the column and the row."""
    path = Path(path)
    if not path.is_file() and not path.exists():
        raise ReadError(f"{path}: not found; a reference folder holds metrics.csv and reference.json "
                        "(amlm verify --record DIR writes one)")
    advice = _reference_advice()
    frame = _reference(read_csv_table, path, "", REFERENCE_RUN, list(dict.fromkeys([*REFERENCE_RUN_COLUMNS, *columns])))
    losses = loss_columns(frame)
    codebooks = {split: sorted(int(LOSS_COLUMN.match(c).group(2)) for c in losses if c.startswith(split))
                 for split in ("train", "valid")}
    for split, ks in codebooks.items():
        if ks and ks != list(range(len(ks))):
            gap = next(k for k in range(len(ks) + 1) if k not in ks)
            raise ReferenceDamaged(f"{path}: has {split}_loss_cb{ks[-1]} but no {split}_loss_cb{gap}; {advice}")
    if codebooks["valid"] and codebooks["valid"] != codebooks["train"]:
        raise ReferenceDamaged(f"{path}: {len(codebooks['train'])} train_loss_cb<k> columns but "
                               f"{len(codebooks['valid'])} valid_loss_cb<k>; {advice}")
    others = [c for c in frame.columns if c not in ("run", "seed", "step") and c not in losses]
    _reference(_convert, frame, path, REFERENCE_RUN, ints=["seed", "step"], finite=losses, numbers=others)
    if (frame["run"].str.strip() == "").any():
        i = int(np.flatnonzero((frame["run"].str.strip() == "").to_numpy())[0])
        raise ReferenceDamaged(f"{path}: column 'run', row {i + 2} is empty; {advice}")
    for (run, seed), steps in frame.groupby(["run", "seed"], sort=False)["step"]:
        s = steps.to_numpy()
        if (s < 0).any() or (np.diff(s) <= 0).any():
            raise ReferenceDamaged(f"{path}: arm {run!r}, seed {seed}: 'step' must increase from row to row "
                                   f"(a row repeated, reordered or edited); {advice}")
    return frame


def read_reference_run(folder: str | Path) -> tuple[pd.DataFrame, dict]:
    """A reference folder's metrics.csv and reference.json (read_reference_metrics,
    read_reference_json), checked against each other: every arm of reference.json has rows and
    every arm with rows is in reference.json, and each seed's rows reach the arm's `train.steps`
    unless its last row is marked diverged (a file cut at a row boundary loses the last rows)."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "not found" if not folder.exists() else "not a folder"
        raise ReadError(f"{folder}: {what}; a reference is a folder holding metrics.csv and reference.json "
                        "(amlm verify --record DIR writes one)")
    meta = read_reference_json(folder / "reference.json")
    metrics = read_reference_metrics(folder / "metrics.csv")
    advice = _reference_advice()
    have = list(dict.fromkeys(metrics["run"]))
    lacking = [r for r in meta["arms"] if r not in have]
    if lacking:
        raise ReferenceDamaged(f"{folder / 'metrics.csv'}: no rows of arm {lacking[0]!r}, which "
                               f"{folder / 'reference.json'} lists; {advice}")
    extra = [r for r in have if r not in meta["arms"]]
    if extra:
        raise ReferenceDamaged(f"{folder / 'metrics.csv'}: rows of arm {extra[0]!r}, which {folder / 'reference.json'} "
                               f"does not list; {advice}")
    for (run, seed), rows in metrics.groupby(["run", "seed"], sort=False):
        steps = meta["arms"][run].get("train.steps")
        last = rows.iloc[-1]
        diverged = "diverged" in rows.columns and _finite_number(last["diverged"]) and last["diverged"] > 0
        if _finite_number(steps) and not diverged and int(last["step"]) != int(steps):
            raise ReferenceDamaged(f"{folder / 'metrics.csv'}: arm {run!r}, seed {seed} ends at step "
                                   f"{int(last['step'])}, "
                                   f"not at its train.steps ({int(steps)}) nor marked diverged (rows lost); {advice}")
    return metrics, meta
