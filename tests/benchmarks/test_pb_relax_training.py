"""benchmarks/pb_relax_training.py judges PB-Relax in fp16 training by its rules, on hand-made tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import load_benchmark

pt = load_benchmark("pb_relax_training")
A, B = pt.FAVOURED, pt.OTHER
R4, R5 = pt.ROUNDS[4], pt.ROUNDS[5]
LOW5 = 24.0  # a low gain for round 5's hand-made tables


def _runs(rnd=R4, low=48.0, high_a=4, high_b=0, low_a=2, low_b=2, logit_high=2e5, logit_low=2e4, drop=None):
    """Every planned run of a round; `high_a` of the favoured arm's runs at the crossing gain trained, and so on."""
    high = rnd.gain_high
    trained = {(high, A): high_a, (high, B): high_b, (low, A): low_a, (low, B): low_b}
    rows = []
    for gain, arm, seed in pt.runs_planned(rnd, low):
        seeds = rnd.seeds_high if gain == high else rnd.seeds_low
        row = {c: np.nan for c in pt.RUN_COLUMNS}
        row |= {"size": pt.size_name(gain), "arm": arm, "seed": seed, "qk_gain": gain}
        row |= {"trained": seeds.index(seed) < trained[(gain, arm)], "status": "completed", "updates": pt.STEPS}
        row |= {"nonfinite_steps": 0}
        row |= {"attn_logit_max": logit_high if gain == high else logit_low}
        rows.append(row)
    runs = pd.DataFrame(rows)
    return runs.drop(index=drop) if drop is not None else runs


def _judge(runs, rnd=R4, low=48.0):
    return pt.judge_runs(runs, rnd, low)


def test_the_plan_is_four_seeds_per_arm_across_the_limit_and_two_below_it():
    for rnd, low in ((R4, 48.0), (R5, LOW5)):
        plan = pt.runs_planned(rnd, low)
        assert len(plan) == 12 and plan[0][0] == rnd.gain_high  # the crossing gain runs first
        assert {(g, a) for g, a, _ in plan} == {(g, a) for g in (low, rnd.gain_high) for a in (A, B)}
    size = pt.size_of(R5.gain_high)
    assert size["train.precision"] == "fp16_fairseq" and size["train.steps"] >= 800
    assert R4.gain_low == 48.0 and pt.gain_low(R4) == 48.0


def test_the_confirming_round_uses_fresh_seeds():
    assert not set(R5.seeds_high + R5.seeds_low) & set(R4.seeds_high + R4.seeds_low + (pt.PILOT_SEED,))


def _pilot(*rows):
    """Pilot rows: (gain, largest logit, updates done, trained)."""
    return pd.DataFrame(
        [
            {
                "qk_gain": g,
                "attn_logit_max": logit,
                "updates": n,
                "status": "completed" if n == pt.STEPS else "diverged",
                "trained": trained,
                "final_loss": 1.0,
                "size": pt.size_name(g),
                "arm": B,
                "seed": pt.PILOT_SEED,
            }
            for g, logit, n, trained in rows
        ]
    )


def test_the_low_gain_is_the_largest_pilot_gain_in_range_with_the_margin_that_trained_through():
    assert pt.FP16_MAX / pt.PILOT_MARGIN == pytest.approx(43669.33, abs=0.01)
    # gain 32 went past the margin's limit: 24 is taken
    assert pt.low_gain_from_pilot(_pilot((32.0, 50_000, 800, True), (24.0, 30_000, 800, True))) == 24.0
    assert pt.low_gain_from_pilot(_pilot((32.0, 43_000, 800, True), (24.0, 30_000, 800, True))) == 32.0
    # in range but stopped early, or through but not trained: it does not qualify
    assert pt.low_gain_from_pilot(_pilot((32.0, 20_000, 500, True), (24.0, 30_000, 800, False))) is None
    v = pt.judge_pilot(_pilot((32.0, 50_000, 800, True), (24.0, 30_000, 800, True)), R5)
    assert v["finished"] and v["gain_low"] == 24.0


def test_without_a_qualifying_pilot_the_round_cannot_be_planned(tmp_path):
    rnd = pt.Round(9, 128.0, (1, 2, 3, 4), (5, 6), tmp_path, pilot_gains=(32.0,))
    with pytest.raises(SystemExit, match="no pilot run qualifies"):
        pt.gain_low(rnd)
    rnd.pilot_out.mkdir()
    _pilot((32.0, 20_000, 800, True)).to_csv(rnd.pilot_out / "runs.csv", index=False)
    assert pt.gain_low(rnd) == 32.0


@pytest.mark.parametrize("rnd, low", [(R4, 48.0), (R5, LOW5)])
def test_four_of_four_against_none_with_the_cells_as_planned_is_supported(rnd, low):
    v = _judge(_runs(rnd, low), rnd, low)
    assert v["verdict"] == "supported" and v["p_for"] == pytest.approx(1 / 70)
    assert v["trained_high"] == {A: 4, B: 0} and v["unfused_trains_in_range"] and v["round"] == rnd.number


def test_runs_of_another_round_do_not_count():
    v = _judge(_runs(R4, 48.0), R5, LOW5)  # round 4's seeds and low gain, judged as round 5
    assert v["verdict"] == "not finished"


def test_three_of_four_cannot_reach_the_level():
    v = _judge(_runs(high_a=3))
    assert v["verdict"] == "undecided" and v["p_for"] == pytest.approx(4 / 56)  # C(4,3) C(4,0) / C(8,3)


def test_the_unfused_order_doing_better_is_a_contradiction():
    assert _judge(_runs(high_a=0, high_b=4))["verdict"] == "contradicted"


@pytest.mark.parametrize(
    "kw",
    [
        {"logit_high": 5e4},  # the high gain never crossed 65,504
        {"logit_low": 7e4},  # the low gain did
        {"low_b": 0},  # the unfused order fails in range too: its failure is not about range
    ],
)
def test_a_separation_in_cells_other_than_planned_decides_nothing(kw):
    v = _judge(_runs(**kw))
    assert v["verdict"] == "undecided: the cells are not as the rules need"


def test_a_run_stopped_early_is_not_trained_whatever_its_last_loss():
    runs = _runs(high_b=4)  # the unfused runs end below the plateau, but...
    unfused_high = (runs["arm"] == B) & (runs["qk_gain"] == R4.gain_high)
    runs.loc[unfused_high, "updates"] = 67  # ...the loss scaler stopped them at update 67
    runs.loc[unfused_high, "status"] = "diverged"
    v = _judge(runs)
    assert v["trained_high"] == {A: 4, B: 0} and v["verdict"] == "supported"
    runs.loc[unfused_high, ["updates", "status"]] = [pt.STEPS, "completed_with_nonfinite"]
    assert _judge(runs)["trained_high"][B] == 4  # through every update, some skipped: trained


def test_a_missing_run_leaves_it_unfinished():
    assert _judge(_runs(drop=[3]))["verdict"] == "not finished"


def test_the_published_round_4_judges_as_published():
    runs = pd.read_csv(R4.out / "runs.csv")
    published = json.loads((R4.out / "verdict.json").read_text())
    assert json.loads(json.dumps(_judge(runs))) == published
    assert published["verdict"] == "undecided: the cells are not as the rules need"


def test_an_undecided_round_5_says_what_it_excludes():
    v = _judge(_runs(R5, LOW5, high_a=3), R5, LOW5)
    # at 4 per arm only 4/4 against 0/4 decides: shares 0.95 against 0 give it with probability 0.95^4 = 0.81
    assert v["verdict"] == "undecided" and v["excluded_effect"] == 0.95
    assert v["reading"] == "no effect larger than 0.95 (share trained through) excluded at n = 4 per arm"
    v = _judge(_runs(R5, LOW5, high_a=3, high_b=1), R5, LOW5)
    assert v["excluded_effect"] is None and v["reading"] == "no effect size excluded at n = 4 per arm"
    assert "excluded_effect" not in _judge(_runs(high_a=3))  # round 4's rules did not ask for it


def test_the_published_round_5_judges_as_published_from_its_published_pilot():
    assert pt.gain_low(R5) == 32.0  # by the rule, from pilot/runs.csv
    assert json.loads((R5.pilot_out / "pilot.json").read_text())["gain_low"] == 32.0
    runs = pd.read_csv(R5.out / "runs.csv")
    published = json.loads((R5.out / "verdict.json").read_text())
    assert json.loads(json.dumps(_judge(runs, R5, 32.0))) == published
    assert published["verdict"] == "supported" and published["trained_high"] == {A: 4, B: 0}
