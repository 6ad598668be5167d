"""The aggregate stage: every arm's metrics.csv into one tidy `loss_curves.csv`.

Columns: run, label, seed, step, split (train | valid), codebook, loss_bits.
Arms appear in the order of the config's `runs:` mapping (the legend order).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from . import config as C
from .errors import UserError
from .utils import atomic_path, log

LOSS_COLUMN = re.compile(r"^(train|valid)_loss_cb(\d+)$")
COLUMNS = ["run", "label", "seed", "step", "split", "codebook", "loss_bits"]


def tidy(metrics: pd.DataFrame, run: C.RunConfig) -> pd.DataFrame:
    """One arm's wide metrics table as tidy rows, one per (step, split, codebook)."""
    loss_cols = [c for c in metrics.columns if LOSS_COLUMN.match(c)]
    if "step" not in metrics.columns or not loss_cols:
        raise UserError(f"metrics of run '{run.name}' lack 'step' or per-codebook loss columns")
    if "seed" not in metrics.columns:  # a single seed's own metrics file
        metrics = metrics.assign(seed=run.seeds[0])
    long = metrics.melt(id_vars=["seed", "step"], value_vars=loss_cols, var_name="column", value_name="loss_bits")
    parts = long["column"].str.extract(LOSS_COLUMN)
    long["split"], long["codebook"] = parts[0], parts[1].astype(int)
    long["run"], long["label"] = run.name, run.label
    return long[COLUMNS]


def run(cfg: dict, runs_dir: Path, out_path: Path) -> pd.DataFrame:
    frames = []
    for name in cfg["runs"]:
        path = Path(runs_dir) / name / "metrics.csv"
        if not path.is_file():
            raise UserError(f"{path}: metrics of run '{name}' not found; train it first")
        frames.append(tidy(pd.read_csv(path), C.run_config(cfg, name)))
    curves = pd.concat(frames, ignore_index=True)
    curves = curves.sort_values(["run", "seed", "split", "codebook", "step"], key=_run_order(cfg), kind="stable")
    with atomic_path(out_path) as tmp:
        curves.to_csv(tmp, index=False)
    log.info("aggregate: %d rows from %d runs -> %s", len(curves), len(frames), out_path)
    return curves


def _run_order(cfg: dict):
    order = {name: i for i, name in enumerate(cfg["runs"])}

    def key(col: pd.Series) -> pd.Series:
        return col.map(order) if col.name == "run" else col

    return key
