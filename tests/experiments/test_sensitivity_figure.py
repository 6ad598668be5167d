"""The sensitivity curves are drawn from a round's table alone, written atomically."""

from __future__ import annotations

import numpy as np
import pandas as pd

from acoustic_mlm.experiments import declaration as D
from acoustic_mlm.experiments import record as R
from acoustic_mlm.experiments.sensitivity_figure import sensitivity_figure

CONFIRM = D.load("config/experiments/confirm_round.yaml")


def _run(arm, lr, final):
    row = {c.name: np.nan for c in R.columns()}
    row |= {"size": "S1", "arm": arm, "lr": lr, "seed": 401, "final_loss": final, "first_loss": 4.0}
    return row | {"plateau": 3.98}


def test_the_sensitivity_figure_is_drawn_from_the_runs(tmp_path):
    rates = CONFIRM.sensitivity["rates"]
    every = pd.DataFrame([_run(arm, lr, 1.0 + i) for arm in CONFIRM.sensitivity["arms"] for i, lr in enumerate(rates)])
    path = sensitivity_figure(CONFIRM, every, tmp_path / "sens.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob(".*"))
