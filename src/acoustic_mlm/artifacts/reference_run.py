"""A reference run (data/reference/<preset>_run/), written by `amlm verify --record` and read by
`amlm verify`: the known-good side of a comparison. Its files, their writer and their checked readers.

    metrics.csv      every arm's metrics rows (artifacts.metrics' columns), a `run` column first
    reference.json   the package version and commit, the machine, the command, the CPU kernels, the
                     data stages' hashes, each arm's settings (`arms`) and the tolerances

A damaged reference is refused as the reference's damage (ReferenceDamaged), never compared: a NaN
or a missing row in it would otherwise read as this installation's fault ("DIFFERS").
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.checked import Advice, ReadError, convert_columns, read_csv_table, read_json, short_value
from acoustic_mlm.artifacts.metrics import LOSS_COLUMN, loss_columns
from acoustic_mlm.utils import atomic_group, write_json

METRICS = M.METRICS  # every arm's rows, with a `run` column
META = "reference.json"
# the `stage` of a reference's files: its advice is to restore it, not to rerun a stage
REFERENCE_RUN = Advice(
    "the reference is damaged, not the run being checked: restore it (git checkout -- "
    "data/reference) or record it again (amlm verify --record DIR)"
)
REFERENCE_RUN_COLUMNS = (M.RUN, M.SEED, M.STEP, M.FIGURE_LOSS)  # what verify matches rows on and draws


def write_reference_run(out_dir: Path, arm_metrics: dict[str, pd.DataFrame], meta: dict) -> Path:
    """A reference folder: every arm's metrics rows in one metrics.csv (a `run` column first; full
    precision: a deterministic rerun matches to the bit) and reference.json, written together into a
    temporary folder that then replaces `out_dir` (its other files carried over)."""
    frames = [metrics.assign(**{M.RUN: run}) for run, metrics in arm_metrics.items()]
    metrics = pd.concat(frames, ignore_index=True)
    metrics = metrics[[M.RUN] + [c for c in metrics.columns if c != M.RUN]]
    out_dir = Path(out_dir)
    with atomic_group(out_dir, (METRICS, META)) as tmp:  # both files or neither: never a mixed reference
        metrics.to_csv(tmp / METRICS, index=False)
        write_json(tmp / META, meta)
    return out_dir


class ReferenceDamaged(ReadError):
    """A reference run's file is missing or damaged: the reference's fault, not the run's being checked."""


def _reference_advice() -> str:
    return str(REFERENCE_RUN)  # the line every refusal of a reference ends with


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
        raise ReadError(
            f"{path}: not found; a reference folder holds metrics.csv and reference.json "
            "(amlm verify --record DIR writes one)"
        )
    meta = _reference(read_json, path, "", REFERENCE_RUN, {"arms": dict, "config": str})
    advice = _reference_advice()
    if not meta["arms"]:
        raise ReferenceDamaged(f"{path}: 'arms' is empty (no arm's settings); {advice}")
    for run, settings in meta["arms"].items():
        if not isinstance(settings, dict):
            raise ReferenceDamaged(
                f"{path}: 'arms.{run}' is {short_value(settings)}, not an object of settings; {advice}"
            )
    if "tolerance_bits" in meta and not (_finite_number(meta["tolerance_bits"]) and meta["tolerance_bits"] >= 0):
        raise ReferenceDamaged(
            f"{path}: 'tolerance_bits' is {short_value(meta['tolerance_bits'])}, not a finite number >= 0; {advice}"
        )
    until = meta.get("tolerance_until_step")
    if until is not None:
        if isinstance(until, bool) or not isinstance(until, int) or until < 0:
            raise ReferenceDamaged(
                f"{path}: 'tolerance_until_step' is {short_value(until)}, not a whole number >= 0 or null; {advice}"
            )
        late = meta.get("late_tolerance_bits")
        if not (_finite_number(late) and late >= 0):
            raise ReferenceDamaged(
                f"{path}: 'late_tolerance_bits' is "
                f"{short_value(late) if 'late_tolerance_bits' in meta else 'missing'}, "
                "not a finite number >= 0 (it holds the rows after 'tolerance_until_step'); "
                f"{advice}"
            )
    for key in ("native_tolerance_bits", "median_tolerance_bits"):
        value = meta.get(key)
        if value is not None and not (_finite_number(value) and value >= 0):
            raise ReferenceDamaged(
                f"{path}: '{key}' is {short_value(value)}, not a finite number >= 0 or null; {advice}"
            )
    if meta.get("cpu_kernels") not in (None, "avx2", "native"):
        raise ReferenceDamaged(
            f"{path}: 'cpu_kernels' is {short_value(meta['cpu_kernels'])}, not avx2, native or null; {advice}"
        )
    hashes = meta.get("data_hashes")
    if hashes is not None and not (
        isinstance(hashes, dict)
        and all(
            isinstance(files, dict)
            and all(isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in files.items())
            for files in hashes.values()
        )
    ):
        raise ReferenceDamaged(f"{path}: 'data_hashes' must map each stage to {{file: sha256}}; {advice}")
    if "machine" in meta and not isinstance(meta["machine"], (dict, type(None))):
        raise ReferenceDamaged(f"{path}: 'machine' is {short_value(meta['machine'])}, not an object; {advice}")
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
        raise ReadError(
            f"{path}: not found; a reference folder holds metrics.csv and reference.json "
            "(amlm verify --record DIR writes one)"
        )
    advice = _reference_advice()
    frame = _reference(read_csv_table, path, "", REFERENCE_RUN, list(dict.fromkeys([*REFERENCE_RUN_COLUMNS, *columns])))
    losses = loss_columns(frame)
    codebooks = {
        split: sorted(int(LOSS_COLUMN.match(c).group(2)) for c in losses if c.startswith(split))
        for split in ("train", "valid")
    }
    for split, ks in codebooks.items():
        if ks and ks != list(range(len(ks))):
            gap = next(k for k in range(len(ks) + 1) if k not in ks)
            raise ReferenceDamaged(f"{path}: has {split}_loss_cb{ks[-1]} but no {split}_loss_cb{gap}; {advice}")
    if codebooks["valid"] and codebooks["valid"] != codebooks["train"]:
        raise ReferenceDamaged(
            f"{path}: {len(codebooks['train'])} train_loss_cb<k> columns but "
            f"{len(codebooks['valid'])} valid_loss_cb<k>; {advice}"
        )
    others = [c for c in frame.columns if c not in (M.RUN, M.SEED, M.STEP) and c not in losses]
    _reference(convert_columns, frame, path, REFERENCE_RUN, ints=[M.SEED, M.STEP], finite=losses, numbers=others)
    if (frame[M.RUN].str.strip() == "").any():
        i = int(np.flatnonzero((frame[M.RUN].str.strip() == "").to_numpy())[0])
        raise ReferenceDamaged(f"{path}: column 'run', row {i + 2} is empty; {advice}")
    for (run, seed), steps in frame.groupby([M.RUN, M.SEED], sort=False)[M.STEP]:
        s = steps.to_numpy()
        if (s < 0).any() or (np.diff(s) <= 0).any():
            raise ReferenceDamaged(
                f"{path}: arm {run!r}, seed {seed}: 'step' must increase from row to row "
                f"(a row repeated, reordered or edited); {advice}"
            )
    return frame


def read_reference_run(folder: str | Path) -> tuple[pd.DataFrame, dict]:
    """A reference folder's metrics.csv and reference.json (read_reference_metrics,
    read_reference_json), checked against each other: every arm of reference.json has rows and
    every arm with rows is in reference.json, and each seed's rows reach the arm's `train.steps`
    unless its last row is marked diverged (a file cut at a row boundary loses the last rows)."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "not found" if not folder.exists() else "not a folder"
        raise ReadError(
            f"{folder}: {what}; a reference is a folder holding metrics.csv and reference.json "
            "(amlm verify --record DIR writes one)"
        )
    meta = read_reference_json(folder / META)
    metrics = read_reference_metrics(folder / METRICS)
    advice = _reference_advice()
    have = list(dict.fromkeys(metrics[M.RUN]))
    lacking = [r for r in meta["arms"] if r not in have]
    if lacking:
        raise ReferenceDamaged(
            f"{folder / METRICS}: no rows of arm {lacking[0]!r}, which {folder / META} lists; {advice}"
        )
    extra = [r for r in have if r not in meta["arms"]]
    if extra:
        raise ReferenceDamaged(
            f"{folder / METRICS}: rows of arm {extra[0]!r}, which {folder / META} does not list; {advice}"
        )
    for (run, seed), rows in metrics.groupby([M.RUN, M.SEED], sort=False):
        steps = meta["arms"][run].get("train.steps")
        last = rows.iloc[-1]
        diverged = M.DIVERGED in rows.columns and _finite_number(last[M.DIVERGED]) and last[M.DIVERGED] > 0
        if _finite_number(steps) and not diverged and int(last[M.STEP]) != int(steps):
            raise ReferenceDamaged(
                f"{folder / METRICS}: arm {run!r}, seed {seed} ends at step "
                f"{int(last[M.STEP])}, "
                f"not at its train.steps ({int(steps)}) nor marked diverged (rows lost); {advice}"
            )
    return metrics, meta
