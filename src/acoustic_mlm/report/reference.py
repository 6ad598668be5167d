"""The paper's curves, digitised from a description of its figure (data only; figure.py draws them).

`data/reference/paper_curves.csv` (run, role, label, step, loss_bits, note) holds about 15 points
per arm read from the description of MERT's figure: stated values to about 0.1 bits, the rest
interpolated (see data/reference/README.md). `role` names the paper's curve (config.ROLES), so a
reproduction finds its counterpart whatever its arms are called.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

# The repository's copy: src/acoustic_mlm/report/reference.py -> <repo>/data/reference/paper_curves.csv
REFERENCE_PATH = Path(__file__).resolve().parents[3] / "data" / "reference" / "paper_curves.csv"
COLUMNS = ["run", "role", "label", "step", "loss_bits", "note"]


def load_reference(path: str | Path | None = None) -> pd.DataFrame:
    """The digitised paper curves, sorted by run (file order) and step."""
    from acoustic_mlm.readers import read_reference

    path = Path(path) if path is not None else REFERENCE_PATH
    ref = read_reference(path)  # every step and loss finite, steps positive, roles known
    order = {run: i for i, run in enumerate(dict.fromkeys(ref["run"]))}
    return ref.sort_values(
        ["run", "step"], key=lambda c: c.map(order) if c.name == "run" else c, kind="stable"
    ).reset_index(drop=True)


def as_curves(reference: pd.DataFrame) -> pd.DataFrame:
    """The reference in loss_curves.csv's tidy shape (train split, codebook 0, seed 0)."""
    return reference.assign(seed=0, split="train", codebook=0)[
        ["run", "label", "seed", "step", "split", "codebook", "loss_bits"]
    ]


def runs_of(reference: pd.DataFrame) -> dict:
    """The reference's arms as a config `runs:` mapping (run -> label, role), in file order."""
    arms = reference.drop_duplicates("run")
    return {row.run: {"label": row.label, "role": row.role} for row in arms.itertuples()}
