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

# ----------------------------------------------------------------------------- columns
# Every metrics column is named here once; training writes them, the readers select them by these
# names. A new column: its constant here, its place in columns(), the code that computes it.

SEED = "seed"  # an arm's metrics.csv: the seed of the row (first column)
RUN = "run"  # a reference run's metrics.csv: the arm of the row (before `seed`)
STEP = "step"  # the update the row was taken after
TRAIN_LOSS = "train_loss"  # the objective, mean since the previous row
FEATURE_PENALTY = "feature_penalty"  # mean since the previous row
GRAD_NORM_MAX = "grad_norm_max"  # largest total gradient norm since the previous row
CLIP_FRAC = "clip_frac"  # share of clipped updates since the previous row
LR = "lr"  # the learning rate of this step
GRAD_NORM = "grad_norm"  # total norm before clipping, this step
CLIPPED = "clipped"  # this step clipped: 0/1
CLIPPED_STEPS = "clipped_steps"  # cumulative clipped updates
NONFINITE = "nonfinite"  # cumulative skipped non-finite steps
OVERFLOW_SKIPS = "overflow_skips"  # cumulative updates skipped by the loss scaler
LOSS_SCALE = "loss_scale"  # the loss scale now; NaN without one
DIVERGED = "diverged"  # 1 on the row where train.max_nonfinite non-finite steps in a row stopped the run
WALL_TIME = "wall_time"  # seconds since the start

# the stability diagnostics (train.diagnostics), per row step; per-block and per-layer ones below
MASKED_FRAC = "masked_frac"  # masked frames / frames of the row's update
MASKED_SHARE = MASKED_FRAC  # the same column, by what it measures
ATTN_LOGIT_MAX = "attn_logit_max"  # largest pre-softmax attention logit over the layers (validation)
ATTN_LOGIT_FP16_FRAC = "attn_logit_fp16_frac"  # ATTN_LOGIT_MAX as a fraction of float16's largest value
VALID_ACC_CB0 = "valid_acc_cb0"  # codebook-0 accuracy on the masked validation frames

FIGURE_LOSS = "train_loss_cb0"  # the figure's loss: every metrics file has it
PARTIAL_COLUMNS = [STEP, FIGURE_LOSS, WALL_TIME]  # what amlm status reads of a seed's rows so far

# the fixed columns, in the order training writes them (the per-codebook losses and the
# diagnostics go between them: columns() gives a whole header)
TRAINING_MEANS = [TRAIN_LOSS, FEATURE_PENALTY, GRAD_NORM_MAX, CLIP_FRAC]  # after train_loss_cb<k>
STEP_VALUES = [LR, GRAD_NORM, CLIPPED]  # before valid_loss_cb<k>
COUNTERS = [CLIPPED_STEPS, NONFINITE, OVERFLOW_SKIPS, LOSS_SCALE, DIVERGED, WALL_TIME]  # the row's end
COLUMNS = [STEP, *TRAINING_MEANS, *STEP_VALUES, *COUNTERS]


def loss_column(split: str, codebook: int) -> str:
    """The loss column of a split (train | valid) and a codebook: train_loss_cb0, valid_loss_cb3, ..."""
    return f"{split}_loss_cb{codebook}"


def grad_norm_column(block: str) -> str:
    """A block's gradient norm (diagnostics): grad_norm_conv, grad_norm_block0, grad_norm_heads, ..."""
    return f"{GRAD_NORM}_{block}"


def update_ratio_column(block: str) -> str:
    """A block's update ratio ||dW|| / ||W|| (diagnostics): update_ratio_embed, update_ratio_block3, ..."""
    return f"update_ratio_{block}"


def attn_logit_max_column(layer: int) -> str:
    """A layer's largest attention logit (diagnostics): attn_logit_max_l0, ..."""
    return f"{ATTN_LOGIT_MAX}_l{layer}"


def diagnostic_columns(blocks: list[str], layers: int) -> list[str]:
    """The diagnostics' columns in the order training writes them: per block (conv, embed,
    block0..N-1, heads) the gradient norms then the update ratios, the masked share, per layer the
    attention logit maxima, then their maximum, its float16 fraction and codebook-0 accuracy."""
    return [
        *map(grad_norm_column, blocks),
        *map(update_ratio_column, blocks),
        MASKED_FRAC,
        *map(attn_logit_max_column, range(layers)),
        ATTN_LOGIT_MAX,
        ATTN_LOGIT_FP16_FRAC,
        VALID_ACC_CB0,
    ]


DIAGNOSTIC_COLUMNS = [MASKED_FRAC, ATTN_LOGIT_MAX, ATTN_LOGIT_FP16_FRAC, VALID_ACC_CB0]  # besides per block/layer


def model_blocks(layers: int) -> list[str]:
    """The blocks of a model of `layers` transformer layers, in model order (train.diagnostics'
    param_blocks): conv, embed, block0..N-1, heads."""
    return ["conv", "embed", *(f"block{i}" for i in range(layers)), "heads"]


def columns(codebooks: int, layers: int | None = None) -> list[str]:
    """A seed's metrics.csv header, as training writes it: `codebooks` loss columns per split, and
    with `layers` (train.diagnostics on, a model of that many layers) the diagnostics."""
    diagnostics = diagnostic_columns(model_blocks(layers), layers) if layers is not None else []
    return [
        STEP,
        *(loss_column("train", k) for k in range(codebooks)),
        *TRAINING_MEANS,
        *STEP_VALUES,
        *(loss_column("valid", k) for k in range(codebooks)),
        *diagnostics,
        *COUNTERS,
    ]


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
