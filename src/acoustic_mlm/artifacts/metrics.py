"""A run's metrics, the train stage's rows: their files, their columns, their writers and their
checked readers. Training writes them (acoustic_mlm.train.loop); aggregate, the stability map, the
decisive experiments, `amlm status` and `amlm verify` read them through here.

    <run>/seeds/seed<S>/metrics.partial.csv   a training seed's rows so far, rewritten whole at every
                                              row (write_partial, read_partial_metrics), removed at its end
    <run>/seeds/seed<S>/metrics.csv           a seed's rows (write_metrics, read_metrics)
    <run>/metrics.csv                         every seed's rows of an arm, a `seed` column first
                                              (join_seed_metrics, write_metrics, read_metrics)

Rows are written every `train.log_interval` steps, at the last step, and (unless
`train.log_powers_of_two` is false) at steps 1, 2, 4, 8, ...; the training means of a row cover the
updates since the previous row, which makes them fairseq's interval means when only multiples of
`log_interval` get rows. The columns:
  step, train_loss_cb{k} (bits, mean since the previous row), train_loss (objective, mean),
  valid_loss_cb{k} (bits, fixed held-out crops and masks), lr, grad_norm (total norm before
  clipping, this step), grad_norm_max (since previous row), clipped (this step 0/1),
  clip_frac (since previous row), clipped_steps (cumulative clipped updates), feature_penalty,
  nonfinite (cumulative count of skipped non-finite steps), diverged (1 on the row where train.max_nonfinite
  non-finite steps in a row stopped the run), overflow_skips (cumulative updates skipped by the loss scaler),
  loss_scale (the loss scale now; NaN without one), wall_time (s since start).
The loss columns (one per split and codebook) match LOSS_COLUMN; train_loss_cb0 (FIGURE_LOSS) is the
figure's loss. With train.diagnostics each row also holds the stability diagnostics of
acoustic_mlm.train.diagnostics (per-block gradient norms and update ratios, attention logit maxima
`attn_logit_max`, masked share, codebook-0 accuracy), measured at the row steps only.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts.checked import ReadError, convert_columns, read_csv_table
from acoustic_mlm.utils import atomic_path

METRICS = "metrics.csv"
PARTIAL = "metrics.partial.csv"  # the rows so far, while a seed trains
LOSS_COLUMN = re.compile(r"^(train|valid)_loss_cb(\d+)$")  # a metrics column of losses: split, codebook
FIGURE_LOSS = "train_loss_cb0"  # the figure's loss: every metrics file has it
PARTIAL_COLUMNS = ["step", FIGURE_LOSS, "wall_time"]  # what amlm status reads of a seed's rows so far


def loss_column(split: str, codebook: int) -> str:
    """The loss column of a split (train | valid) and a codebook: train_loss_cb0, valid_loss_cb3, ..."""
    return f"{split}_loss_cb{codebook}"


def loss_columns(frame: pd.DataFrame) -> list[str]:
    """The metrics columns of losses (train_loss_cb<k>, valid_loss_cb<k>), in the frame's order."""
    return [c for c in frame.columns if LOSS_COLUMN.match(c)]


# ----------------------------------------------------------------------------- writers


def write_metrics(path: Path, metrics: pd.DataFrame) -> None:
    """A seed's or an arm's metrics.csv, atomically, every value at full precision (a deterministic
    rerun matches to the bit)."""
    with atomic_path(Path(path)) as tmp:
        metrics.to_csv(tmp, index=False)


def write_partial(seed_dir: Path, rows: list[dict]) -> None:
    """A training seed's rows so far into its metrics.partial.csv, atomically: visible progress,
    never the final name; a full disk is one line."""
    with atomic_path(Path(seed_dir) / PARTIAL) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)


def remove_partial(seed_dir: Path) -> None:
    """A finished seed's metrics.partial.csv, removed (its metrics.csv holds the rows)."""
    (Path(seed_dir) / PARTIAL).unlink(missing_ok=True)


def join_seed_metrics(seed_files: dict[int, Path]) -> pd.DataFrame:
    """An arm's metrics: each seed's metrics.csv (read_metrics) in turn, a `seed` column first."""
    frames = [read_metrics(path).assign(seed=seed) for seed, path in seed_files.items()]
    metrics = pd.concat(frames, ignore_index=True)
    return metrics[["seed"] + [c for c in metrics.columns if c != "seed"]]


# ----------------------------------------------------------------------------- readers


def read_metrics(path: str | Path) -> pd.DataFrame:
    """A run's metrics.csv: `step` (whole, increasing per seed), a loss column per split and
    codebook, every other column a number. Losses and diagnostics may be NaN (an update skipped
    as non-finite, a statistic without samples), never text or a cut row."""
    path = Path(path)
    frame = read_csv_table(path, "metrics", "train", ["step"], ints=["step"])
    convert_columns(
        frame,
        path,
        "train",
        ints=["seed"] if "seed" in frame else [],
        numbers=[c for c in frame.columns if c not in ("step", "seed")],
    )
    if FIGURE_LOSS not in frame.columns:
        raise ReadError(f"{path}: missing column {FIGURE_LOSS} (the figure's loss); rerun the train stage")
    for _, steps in frame.groupby("seed", sort=False)["step"] if "seed" in frame else [(None, frame["step"])]:
        s = steps.to_numpy()
        if (s < 0).any() or (np.diff(s) <= 0).any():
            raise ReadError(f"{path}: 'step' must increase from row to row (within a seed); rerun the train stage")
    return frame


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
        raise ReadError(
            f"{path}: missing column(s) {', '.join(missing)} (a seed's rows so far have "
            f"{', '.join(PARTIAL_COLUMNS)}); it was edited or written by another program: rerun the train "
            "stage"
        )
    return frame
