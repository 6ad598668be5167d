"""A run's metrics: the loss columns, a seed's rows written and an arm's joined (a `seed` column
first), the rows so far while a seed trains, and the checked readers (steps increasing per seed, the
figure's loss present, the columns `amlm status` reads), and the declared columns against the
headers training wrote."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from helpers import read_refused

from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.metrics import (
    FIGURE_LOSS,
    LOSS_COLUMN,
    METRICS,
    PARTIAL,
    join_seed_metrics,
    loss_column,
    loss_columns,
    read_metrics,
    read_partial_metrics,
    remove_partial,
    write_metrics,
    write_partial,
)


def test_the_loss_columns():
    assert loss_column("train", 0) == FIGURE_LOSS == "train_loss_cb0"
    assert LOSS_COLUMN.match("valid_loss_cb12").groups() == ("valid", "12") and not LOSS_COLUMN.match("train_loss")
    frame = pd.DataFrame(columns=["step", "train_loss_cb0", "train_loss", "valid_loss_cb0", "train_loss_cb1"])
    assert loss_columns(frame) == ["train_loss_cb0", "valid_loss_cb0", "train_loss_cb1"]


def _rows(steps, cb0):
    return [{"step": s, "train_loss_cb0": v, "lr": 1e-3, "wall_time": 0.5 * s} for s, v in zip(steps, cb0)]


def test_a_seeds_rows_so_far_then_its_metrics_then_the_arms(tmp_path):
    seeds = {1: tmp_path / "seed1", 2: tmp_path / "seed2"}
    for seed, folder in seeds.items():
        write_partial(folder, _rows([1, 2], [9.5, 9.0 + seed / 10]))
        assert read_partial_metrics(folder / PARTIAL)["step"].tolist() == [1, 2]
        write_metrics(folder / METRICS, pd.DataFrame(_rows([1, 2, 4], [9.5, math.nan, 8.0])))
        remove_partial(folder)
        assert not (folder / PARTIAL).exists()
    remove_partial(seeds[1])  # already gone: nothing to do
    arm = join_seed_metrics({seed: folder / METRICS for seed, folder in seeds.items()})
    assert list(arm.columns) == ["seed", "step", "train_loss_cb0", "lr", "wall_time"]
    assert arm["seed"].tolist() == [1, 1, 1, 2, 2, 2]
    write_metrics(tmp_path / METRICS, arm)
    back = read_metrics(tmp_path / METRICS)
    pd.testing.assert_frame_equal(back, arm)
    write_metrics(tmp_path / "again.csv", back)
    assert (tmp_path / "again.csv").read_bytes() == (tmp_path / METRICS).read_bytes()


def test_read_metrics_wants_increasing_steps_per_seed_and_the_figures_loss(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("seed,step,train_loss_cb0,grad_norm\n1,1,9.5,\n1,2,nan,0.5\n2,1,9.4,0.4\n")
    frame = read_metrics(path)
    assert frame["step"].tolist() == [1, 2, 1] and np.isnan(frame["train_loss_cb0"].iloc[1])
    path.write_text("seed,step,train_loss_cb0\n1,2,9.5\n1,1,9.0\n")
    read_refused(lambda: read_metrics(path), path, "'step' must increase", "rerun the train stage")
    path.write_text("step,valid_loss_cb0\n1,9.5\n")
    read_refused(lambda: read_metrics(path), path, "missing column train_loss_cb0")


def test_read_partial_metrics_wants_the_columns_status_reads(tmp_path):
    path = tmp_path / "metrics.partial.csv"
    path.write_text("step,train_loss_cb0,wall_time\n1,9.5,0.5\n2,nan,1.0\n")
    assert read_partial_metrics(path)["wall_time"].tolist() == [0.5, 1.0]
    for text, needles in [
        ("step,train_loss_cb0\n1,9.5\n", ("missing column(s) wall_time", "rerun the train stage")),
        ("epoch,loss,time\n1,9.5,0.5\n", ("missing column(s) step",)),
        ("step,train_loss_cb0,wall_time,loss_scale\n1,9.5,0.5,128\n", ("missing column(s) overflow_skips",)),
        ("step,train_loss_cb0,wall_time\n1,9.5,0.5\n2,9.4,1.", ("cut short",)),
        ("step,train_loss_cb0,wall_time\n1,9.5,soon\n", ("column 'wall_time', row 2: 'soon' is not a number",)),
    ]:
        path.write_text(text)
        read_refused(lambda: read_partial_metrics(path), path, *needles)


def test_the_declared_columns_are_the_shipped_reference_runs_headers():
    """Both shipped reference runs (written by training, smoke: 2 layers, default: 4) have the
    header columns() declares, after their `run` and `seed` columns (a column declared since they
    were recorded aside); the fixed columns in order."""
    root = Path(__file__).resolve().parents[2] / "data" / "reference"
    for preset, layers in (("smoke_run", 2), ("default_run", 4)):
        for path in sorted((root / preset).glob("*/metrics.csv")):
            header = path.read_text().split("\n", 1)[0].split(",")
            assert header[:2] == [M.RUN, M.SEED], path
            assert header[2:] == [c for c in M.columns(8, layers) if c in header], path
    assert M.COLUMNS == [
        "step",
        "train_loss",
        "feature_penalty",
        "grad_norm_max",
        "clip_frac",
        "lr",
        "grad_norm",
        "clipped",
        "clipped_steps",
        "nonfinite",
        "overflow_skips",
        "loss_scale",
        "diverged",
        "wall_time",
    ]
    assert M.columns(1) == ["step", "train_loss_cb0", *M.COLUMNS[1:8], "valid_loss_cb0", *M.COLUMNS[8:]]
    assert M.diagnostic_columns(["conv", "heads"], 1) == [
        "grad_norm_conv",
        "grad_norm_heads",
        "update_ratio_conv",
        "update_ratio_heads",
        "masked_frac",
        "attn_logit_max_l0",
        "attn_logit_max",
        "attn_logit_fp16_frac",
        "valid_acc_cb0",
    ]
