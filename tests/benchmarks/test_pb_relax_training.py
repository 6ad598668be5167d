"""benchmarks/pb_relax_training.py judges PB-Relax in fp16 training by its rules, on hand-made tables."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("pb_relax_training", ROOT / "benchmarks" / "pb_relax_training.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pt = _load()
A, B = pt.FAVOURED, pt.OTHER


def _runs(high_a=4, high_b=0, low_a=2, low_b=2, logit_high=2e5, logit_low=2e4, drop=None) -> pd.DataFrame:
    """Every planned run; `high_a` of the favoured arm's runs at the crossing gain trained, and so on."""
    trained = {(pt.GAIN_HIGH, A): high_a, (pt.GAIN_HIGH, B): high_b, (pt.GAIN_LOW, A): low_a, (pt.GAIN_LOW, B): low_b}
    rows = []
    for gain, arm, seed in pt.runs_planned():
        seeds = pt.SEEDS_HIGH if gain == pt.GAIN_HIGH else pt.SEEDS_LOW
        row = {c: np.nan for c in pt.RUN_COLUMNS}
        row |= {"size": pt.size_name(gain), "arm": arm, "seed": seed, "qk_gain": gain}
        row |= {"trained": seeds.index(seed) < trained[(gain, arm)], "status": "completed", "updates": pt.STEPS}
        row |= {"nonfinite_steps": 0}
        row |= {"attn_logit_max": logit_high if gain == pt.GAIN_HIGH else logit_low}
        rows.append(row)
    runs = pd.DataFrame(rows)
    return runs.drop(index=drop) if drop is not None else runs


def test_the_plan_is_four_seeds_per_arm_across_the_limit_and_two_below_it():
    plan = pt.runs_planned()
    assert len(plan) == 12 and plan[0][0] == pt.GAIN_HIGH  # the crossing gain runs first
    assert {(g, a) for g, a, _ in plan} == {(g, a) for g in (pt.GAIN_LOW, pt.GAIN_HIGH) for a in (A, B)}
    assert pt.sizes()[pt.size_name(pt.GAIN_HIGH)]["train.precision"] == "fp16_fairseq"
    assert pt.sizes()[pt.size_name(pt.GAIN_HIGH)]["train.steps"] >= 800


def test_four_of_four_against_none_with_the_cells_as_planned_is_supported():
    v = pt.judge_runs(_runs())
    assert v["verdict"] == "supported" and v["p_for"] == pytest.approx(1 / 70)
    assert v["trained_high"] == {A: 4, B: 0} and v["unfused_trains_in_range"]


def test_three_of_four_cannot_reach_the_level():
    v = pt.judge_runs(_runs(high_a=3))
    assert v["verdict"] == "undecided" and v["p_for"] == pytest.approx(4 / 56)  # C(4,3) C(4,0) / C(8,3)


def test_the_unfused_order_doing_better_is_a_contradiction():
    assert pt.judge_runs(_runs(high_a=0, high_b=4))["verdict"] == "contradicted"


@pytest.mark.parametrize(
    "kw",
    [
        {"logit_high": 5e4},  # the high gain never crossed 65,504
        {"logit_low": 7e4},  # the low gain did
        {"low_b": 0},  # the unfused order fails in range too: its failure is not about range
    ],
)
def test_a_separation_in_cells_other_than_planned_decides_nothing(kw):
    v = pt.judge_runs(_runs(**kw))
    assert v["verdict"] == "undecided: the cells are not as the rules need"


def test_a_run_stopped_early_is_not_trained_whatever_its_last_loss():
    runs = _runs(high_b=4)  # the unfused runs end below the plateau, but...
    unfused_high = (runs["arm"] == B) & (runs["qk_gain"] == pt.GAIN_HIGH)
    runs.loc[unfused_high, "updates"] = 67  # ...the loss scaler stopped them at update 67
    runs.loc[unfused_high, "status"] = "diverged"
    v = pt.judge_runs(runs)
    assert v["trained_high"] == {A: 4, B: 0} and v["verdict"] == "supported"
    runs.loc[unfused_high, ["updates", "status"]] = [pt.STEPS, "completed_with_nonfinite"]
    assert pt.judge_runs(runs)["trained_high"][B] == 4  # through every update, some skipped: trained


def test_a_missing_run_leaves_it_unfinished():
    assert pt.judge_runs(_runs(drop=[3]))["verdict"] == "not finished"
