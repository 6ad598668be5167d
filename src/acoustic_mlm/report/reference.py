"""The paper's curves, digitised from a description of its figure: their checked reader (figure.py draws them).

`data/reference/paper_curves.csv` (run, role, label, step, loss_bits, note) holds about 15 points
per arm read from the description of MERT's figure: stated values to about 0.1 bits, the rest
interpolated (see data/reference/README.md). `role` names the paper's curve (config.ROLES), so a
reproduction finds its counterpart whatever its arms are called.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts import curve_tables
from acoustic_mlm.artifacts.checked import ReadError, read_csv_table, rerun_advice
from acoustic_mlm.config import ROLES

# The repository's copy: src/acoustic_mlm/report/reference.py -> <repo>/data/reference/paper_curves.csv
REFERENCE_PATH = Path(__file__).resolve().parents[3] / "data" / "reference" / "paper_curves.csv"
COLUMNS = ["run", "role", "label", "step", "loss_bits", "note"]


def read_reference(path: str | Path) -> pd.DataFrame:
    """The paper's digitised curves (data/reference/paper_curves.csv or the user's own): every step
    and loss a finite number, steps positive (the figure's x axis is logarithmic), roles known."""
    path = Path(path)
    if not path.is_file():
        raise ReadError(
            f"{path}: the paper's digitised curves are not found; they ship in the repository "
            "(data/reference/paper_curves.csv), so run from a checkout or pass the path"
        )
    frame = read_csv_table(
        path, "the paper's curves", "", COLUMNS, finite=["step", "loss_bits"], choices={"role": ROLES}
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


def load_reference(path: str | Path | None = None) -> pd.DataFrame:
    """The digitised paper curves, sorted by run (file order) and step."""
    path = Path(path) if path is not None else REFERENCE_PATH
    ref = read_reference(path)  # every step and loss finite, steps positive, roles known
    order = {run: i for i, run in enumerate(dict.fromkeys(ref["run"]))}
    return ref.sort_values(
        ["run", "step"], key=lambda c: c.map(order) if c.name == "run" else c, kind="stable"
    ).reset_index(drop=True)


def as_curves(reference: pd.DataFrame) -> pd.DataFrame:
    """The reference in loss_curves.csv's tidy shape (train split, codebook 0, seed 0)."""
    return reference.assign(seed=0, split="train", codebook=0)[curve_tables.COLUMNS]


def runs_of(reference: pd.DataFrame) -> dict:
    """The reference's arms as a config `runs:` mapping (run -> label, role), in file order."""
    arms = reference.drop_duplicates("run")
    return {row.run: {"label": row.label, "role": row.role} for row in arms.itertuples()}
