"""`amlm stability` takes the states the pipeline itself produces: an arm that diverged before any finite
loss (every loss row NaN) is drawn and named in the legend, as the main figure does, not refused."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from helpers import make_config

from acoustic_mlm.errors import UserError
from acoustic_mlm.report import stability


def test_an_arm_without_a_finite_loss_is_named_in_the_legend_not_refused():
    cfg = make_config()
    runs = dict(cfg.runs)
    first, *rest = runs
    loss, diag = [], []
    for name, r in runs.items():
        for s in (1, 2, 4, 8, 16, 32):
            bits = math.nan if name == first else 10.0 - s / 10
            loss.append(
                {
                    "run": name,
                    "label": r.label,
                    "seed": 1,
                    "step": s,
                    "split": "train",
                    "codebook": 0,
                    "loss_bits": bits,
                }
            )
            diag.append(
                {"run": name, "label": r.label, "seed": 1, "step": s, "diagnostic": "grad_norm_max", "value": 3.0}
            )
    fig, axes, found = stability.draw(
        pd.DataFrame(loss), pd.DataFrame(diag), runs, cfg.figure, cfg.claims.spike_threshold, cfg.claims.recovery_margin
    )
    texts = [t.get_text() for t in axes["loss"].get_legend().get_texts()]
    diverged = [t for t in texts if "no finite loss" in t]
    assert diverged == [f"{runs[first].label}: diverged at step 32, no finite loss (seed 1)"]
    assert all(any(runs[n].label in t for t in texts) for n in rest) and found == []


def test_an_arm_without_any_row_is_still_one_line():
    cfg = make_config()
    runs = dict(cfg.runs)
    first = next(iter(runs))
    loss = pd.DataFrame(
        [{"run": first, "label": "x", "seed": 1, "step": 1, "split": "train", "codebook": 0, "loss_bits": 9.0}]
    )
    diag = pd.DataFrame(columns=["run", "label", "seed", "step", "diagnostic", "value"])
    with pytest.raises(UserError, match="loss curves hold no train codebook-0 rows for"):
        stability.draw(loss, diag, runs, cfg.figure, 0.5, 0.2)
