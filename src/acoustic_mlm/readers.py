"""The readers of the files that no artifact module owns: the aggregate stage's tables and the
paper's digitised curves. Each checks what it reads through acoustic_mlm.artifacts.checked and
refuses a damaged file in one `ReadError` line naming the file, what is wrong and the stage to rerun:

    loss_curves.csv                        read_curves          aggregate
    diagnostics.csv                        read_diagnostics     aggregate
    the paper's curves CSV                 read_reference       (shipped in data/reference/)

The files one stage writes and another reads have their writer, reader and columns in one module
of acoustic_mlm.artifacts: the prepared corpus (`artifacts.prepared`: manifest.csv, shards.csv,
shard-<k>/audio.npy), the codes (`artifacts.codes`: codes.npy, tokenizer.json, fit.json,
encode.json), a run's metrics (`artifacts.metrics`: metrics.csv, metrics.partial.csv), a run's
summary (`artifacts.run_summary`: summary.json) and a reference run (`artifacts.reference_run`:
amlm verify's reference.json and metrics.csv).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts.checked import ReadError, convert_columns, read_csv_table, rerun_advice

CURVE_COLUMNS = ["run", "label", "seed", "step", "split", "codebook", "loss_bits"]
DIAGNOSTIC_COLUMNS = ["run", "label", "seed", "step", "diagnostic", "value"]


def read_curves(path: str | Path) -> pd.DataFrame:
    """results/loss_curves.csv, as aggregate writes it (a `nonfinite` column, when present, is whole)."""
    path = Path(path)
    frame = read_csv_table(
        path,
        "loss curves",
        "aggregate",
        CURVE_COLUMNS,
        ints=["seed", "step", "codebook"],
        numbers=["loss_bits"],
        choices={"split": ("train", "valid")},
    )
    convert_columns(frame, path, "aggregate", ints=["nonfinite"] if "nonfinite" in frame else [])
    if (frame["step"] < 0).any() or (frame["codebook"] < 0).any():
        raise ReadError(f"{path}: a negative step or codebook; rerun the aggregate stage")
    return frame


def read_diagnostics(path: str | Path) -> pd.DataFrame:
    """results/diagnostics.csv, as aggregate writes it."""
    return read_csv_table(
        path, "diagnostics", "aggregate", DIAGNOSTIC_COLUMNS, ints=["seed", "step"], numbers=["value"], empty_ok=True
    )


REFERENCE_COLUMNS = ["run", "role", "label", "step", "loss_bits", "note"]


def read_reference(path: str | Path) -> pd.DataFrame:
    """The paper's digitised curves (data/reference/paper_curves.csv or the user's own): every step
    and loss a finite number, steps positive (the figure's x axis is logarithmic), roles known."""
    from acoustic_mlm.config import ROLES

    path = Path(path)
    if not path.is_file():
        raise ReadError(
            f"{path}: the paper's digitised curves are not found; they ship in the repository "
            "(data/reference/paper_curves.csv), so run from a checkout or pass the path"
        )
    frame = read_csv_table(
        path, "the paper's curves", "", REFERENCE_COLUMNS, finite=["step", "loss_bits"], choices={"role": ROLES}
    )
    if (frame["step"] <= 0).any():
        i = int(np.flatnonzero((frame["step"] <= 0).to_numpy())[0])
        raise ReadError(
            f"{path}: column 'step', row {i + 2} is {frame['step'].iloc[i]:g}; steps are positive "
            "(the x axis is logarithmic)"
        )
    counts = frame.groupby("role")["step"].count()
    thin = [r for r in ROLES if counts.get(r, 0) < 2]
    if thin:  # the claims on the paper's curves compare every role with the others
        raise ReadError(
            f"{path}: role {thin[0]} has {counts.get(thin[0], 0)} point(s); the paper's curves hold "
            f"every role ({', '.join(ROLES)}) with at least 2 points; {rerun_advice('')}"
        )
    roles = frame.groupby("run")["role"].nunique()
    if (roles > 1).any():
        raise ReadError(f"{path}: run {roles.index[roles > 1][0]!r} has several roles; {rerun_advice('')}")
    return frame
