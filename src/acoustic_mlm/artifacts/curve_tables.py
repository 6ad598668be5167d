"""The aggregate stage's two tables: their files, their columns, their writers and their checked
readers. The aggregate stage (acoustic_mlm.report.aggregate) writes them; the figure, the stability
figure and the claims read them through here.

    results/loss_curves.csv    one row per (run, seed, step, split, codebook): run, label, seed, step,
                               split (train | valid), codebook, loss_bits, and nonfinite (updates skipped
                               for a non-finite loss so far, cumulative), so the figure can say so
    results/diagnostics.csv    beside it, one row per (run, seed, step, diagnostic): run, label, seed,
                               step, diagnostic (a metrics column's name), value

Arms appear in the order of the configuration's `runs:` (the legend's order).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.checked import ReadError, convert_columns, read_csv_table
from acoustic_mlm.utils import atomic_path

LOSS_CURVES = "loss_curves.csv"
DIAGNOSTICS = "diagnostics.csv"  # written beside loss_curves.csv
COLUMNS = ["run", "label", "seed", "step", "split", "codebook", "loss_bits"]  # and NONFINITE
NONFINITE = M.NONFINITE  # loss_curves.csv's last column: the metrics column, carried over
DIAGNOSTIC_COLUMNS = ["run", "label", "seed", "step", "diagnostic", "value"]


def write_table(frame: pd.DataFrame, path: str | Path) -> None:
    """Either table, written whole under a temporary name and then renamed."""
    with atomic_path(Path(path)) as tmp:
        frame.to_csv(tmp, index=False)


def read_curves(path: str | Path) -> pd.DataFrame:
    """loss_curves.csv, as aggregate writes it (a `nonfinite` column, when present, is whole)."""
    path = Path(path)
    frame = read_csv_table(
        path,
        "loss curves",
        "aggregate",
        COLUMNS,
        ints=["seed", "step", "codebook"],
        numbers=["loss_bits"],
        choices={"split": ("train", "valid")},
    )
    convert_columns(frame, path, "aggregate", ints=[NONFINITE] if NONFINITE in frame else [])
    if (frame["step"] < 0).any() or (frame["codebook"] < 0).any():
        raise ReadError(f"{path}: a negative step or codebook; rerun the aggregate stage")
    return frame


def read_diagnostics(path: str | Path) -> pd.DataFrame:
    """diagnostics.csv, as aggregate writes it (no rows is fine: no diagnostics were recorded)."""
    return read_csv_table(
        path, "diagnostics", "aggregate", DIAGNOSTIC_COLUMNS, ints=["seed", "step"], numbers=["value"], empty_ok=True
    )
