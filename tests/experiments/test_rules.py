"""The rounds' rules (experiments.rules, experiments.record's words) on hand-made tables: the pairs'
Fisher verdicts and the A/A pair, the one definition of an instability, Wortsman et al.'s sensitivity,
the fp16 rounds' cells and their pilot's low gain, the sizing procedure's (a), (b) and (c)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from acoustic_mlm.experiments import declaration as D
from acoustic_mlm.experiments import record as R
from acoustic_mlm.experiments import rules
from acoustic_mlm.experiments.stats import fisher_greater
from acoustic_mlm.report.power import fisher_power

CONFIRM = D.load("config/experiments/confirm_round.yaml")
R4 = D.load("config/experiments/pb_relax_training.yaml")
A, B = "prenorm_attnrelax_clip1", "prenorm_unfused_clip1"


def _run(arm, seed, trained, lr=0.05, spike=0.0, left=True, final=None, logit=5.0, first=4.0, size="S1"):
    final = (1.0 if trained else 3.99) if final is None else final
    row = {c.name: np.nan for c in R.columns(fp16=True)}
    row |= {"round": 3, "size": size, "arm": arm, "lr": lr, "seed": seed, "status": "completed", "plateau": 3.984}
    row |= {"final_loss": final, "first_loss": first, "trained": trained, "left_plateau": left or trained}
    row |= {"largest_late_spike_bits": spike, "largest_spike_bits": spike, "nonfinite_steps": 0}
    return row | {"attn_logit_final": logit, "updates": 800}


def _arm(arm, seeds, n_trained, **kw):
    return [_run(arm, s, i < n_trained, **kw) for i, s in enumerate(seeds)]


SEEDS, AA_SEEDS = list(range(101, 113)), list(range(201, 211))


def test_the_pairs_rules_verdicts_with_an_interval_for_the_undecided():
    rows = _arm("prenorm_clip1", SEEDS, 11) + _arm("prenorm_noclip", SEEDS, 2)  # P1: 11/12 against 2/12
    rows += _arm("prenorm_clip10", SEEDS, 11)  # P2: 11/12 against 11/12: undecided
    d12 = {"size": "D12", "lr": 0.01}
    rows += _arm("postnorm_deepnorm_clip1", SEEDS, 0, **d12) + _arm("postnorm_clip1", SEEDS, 8, **d12)  # against
    rows += _arm("prenorm_attnrelax_clip1", AA_SEEDS, 9)
    result = rules.judge_pairs(CONFIRM, pd.DataFrame(rows))
    p1, p2, p3 = result["verdicts"]
    assert p1["verdict"] == "supported" and (p1["trained_a"], p1["trained_b"]) == (11, 2)
    assert p1["p_for"] == pytest.approx(fisher_greater(11, 12, 2, 12)) and "interval_95" not in p1
    assert p1["unstable_b"] == 10  # the untrained runs left the plateau and fell back: a collapse
    assert p2["verdict"] == "undecided" and (p2["difference"], p2["interval_95"][0] < 0 < p2["interval_95"][1]) == (
        0.0,
        True,
    )
    assert "excluded_effect" not in p2
    assert p3["verdict"] == "contradicted" and p3["p_against"] < 0.025
    aa = result["aa"]
    assert aa["verdict"] == "undecided" and aa["calibrated"] is True
    assert aa["rejects_identical_arms"] == pytest.approx(fisher_power(19 / 20, 19 / 20, 10, 10, alpha=0.025))


def test_a_pair_across_cells_plans_and_reads_the_against_arm_in_its_own_cell():
    """Round 10's C1: DeepNorm at D12 (no warm-up) against plain Post-Norm at D12w (with a warm-up). The
    against arm's runs are planned and read in D12w only; a run of that arm in D12 does not count."""
    r10 = D.load("config/experiments/p3_controls.yaml")
    plan = rules.pairs_plan(r10)
    assert {(c, a) for c, a, _, _ in plan} == {
        ("D12", "postnorm_deepnorm_clip1"),
        ("D12w", "postnorm_clip1"),
        ("D12", "prenorm_clip1"),
    }
    assert len(plan) == 24 and {lr for _, _, lr, _ in plan} == {0.01}
    main = list(range(5001, 5009))
    d12, d12w = {"size": "D12", "lr": 0.01}, {"size": "D12w", "lr": 0.01}
    rows = _arm("postnorm_deepnorm_clip1", main, 8, **d12) + _arm("postnorm_clip1", main, 1, **d12w)
    rows += _arm("postnorm_clip1", main, 8, **d12)  # not of the round: the same arm in the other cell
    rows += _arm("prenorm_clip1", list(range(5009, 5017)), 7, **d12)
    runs = pd.DataFrame(rows)
    (c1,) = rules.judge_pairs(r10, runs)["verdicts"]
    assert (c1["size"], c1["size_b"], c1["trained_a"], c1["trained_b"]) == ("D12", "D12w", 8, 1)
    assert c1["p_for"] == pytest.approx(fisher_greater(8, 8, 1, 8)) and c1["verdict"] == "supported"
    (c2,) = rules.judge_pairs(r10, runs)["secondary"]
    assert "size_b" not in c2 and (c2["trained_a"], c2["trained_b"]) == (8, 7) and "interval_95" in c2


def test_a_decided_aa_pair_marks_the_round_not_calibrated_and_unfinished_parts_have_no_verdict():
    rows = _arm("prenorm_clip1", SEEDS, 12) + _arm("prenorm_attnrelax_clip1", AA_SEEDS, 1)
    rows += _arm("prenorm_noclip", SEEDS[:5], 0)
    result = rules.judge_pairs(CONFIRM, pd.DataFrame(rows))
    assert result["aa"]["calibrated"] is False and "not calibrated" in result["note"]
    assert [v["verdict"] for v in result["verdicts"]] == ["not finished"] * 3


def test_one_definition_of_an_instability():
    runs = pd.DataFrame(
        [
            _run("a", 1, True),
            _run("a", 2, True, spike=0.5),  # (i) a late spike
            _run("a", 3, False, left=True),  # (iii) a collapse
            _run("a", 4, False, left=False),  # never left, no spike: not unstable
            _run("a", 5, False, left=False, logit=53.0, final=3.99),  # (iv): x10 the reference, 0.5 bits worse
            _run("a", 6, True, logit=60.0, final=1.2),  # growth without the loss cost
            _run("a", 7, True) | {"status": "diverged"},  # (ii) failed
        ]
    )
    assert R.unstable(runs, 5.3, 0.94).tolist() == [False, True, True, False, True, False, True]
    assert R.collapsed(runs).tolist() == [False, False, True, False, False, False, False]


SIZING = D.load("config/experiments/proxy_sizing.yaml")  # rules 2 at S1, the baseline clip 10


def _sizing(rules_: int) -> dict:
    return rules.sizing_params(SIZING) | {"rules": rules_}


def test_the_sizing_best_rate_and_instabilities_by_round_1s_rules():
    runs = pd.DataFrame(
        [
            _run("prenorm_clip10", 1, True, lr=0.003, final=1.10),
            _run("prenorm_clip10", 1, True, lr=0.01, final=0.95),
            _run("prenorm_clip10", 1, True, lr=0.03, final=0.96),  # within 0.02 of the lowest: the lower rate wins
            _run("prenorm_clip10", 2, True, lr=0.01, final=0.90, logit=4.0),
            _run("prenorm_noclip", 1, True, lr=0.1, spike=0.6),  # (i) a spike
            _run("prenorm_noclip", 2, True, lr=0.1) | {"status": "diverged"},  # (ii) diverged
            _run("prenorm_clip1", 1, False, lr=0.1, final=3.5),  # (iii) left the plateau, ended above U - 1
            _run("prenorm_clip1", 2, False, lr=0.1, left=False, logit=40.0),  # (iv) logit x10 and 0.5 bits worse
            _run("postnorm_clip1", 1, False, lr=0.1, left=False, logit=49.0),  # logit x9.8: not growth
            _run("postnorm_clip1", 2, True, lr=0.1, final=1.30, logit=400.0),  # logit growth without the loss cost
        ]
    )
    par = _sizing(1)
    assert rules.best_rate(runs, par) == 0.01
    assert rules.best_rate(runs[runs["seed"] == 2], par) is None  # the first seed scans
    flags = rules.sizing_flags(runs, par, 0.01)
    assert flags.tolist() == [False, False, False, False, True, True, True, True, False, False]


def test_round_2s_rules_count_late_spikes_only_and_ask_the_stabilized_arm_to_learn():
    base = [_run("prenorm_clip10", s, True, lr=0.01, final=0.95) for s in (1, 2, 3)]
    early = [_run("prenorm_noclip", s, True, spike=0.0) | {"largest_spike_bits": 0.6} for s in (1, 2, 3)]
    late = [_run("prenorm_clip10", s, True, spike=0.6) for s in (1, 2)] + [_run("prenorm_clip10", 3, True)]
    learns = [_run("prenorm_clip1", s, True) for s in (1, 2, 3)]
    stuck = [_run("prenorm_clip1", s, False, lr=0.07, left=False) for s in (1, 2, 3)]
    late_07 = [_run("prenorm_clip10", s, True, lr=0.07, spike=0.7) for s in (1, 2, 3)]
    runs = pd.DataFrame(base + early + late + learns + stuck + late_07)
    one, two = _sizing(1), _sizing(2)
    v1, v2 = rules.sizing_flags(runs, one, 0.01), rules.sizing_flags(runs, two, 0.01)
    assert v1[3:6].tolist() == [True] * 3 and v2[3:6].tolist() == [False] * 3  # spikes before the warm-up's end
    assert v2[6:9].tolist() == [True, True, False]

    def prevents(par, flags, bad, good, lr, table=runs):
        return rules.prevents(table, flags, par, bad, good, lr)

    assert prevents(two, v2, "prenorm_clip10", "prenorm_clip1", 0.05) == {
        "lr": 0.05,
        "without": "prenorm_clip10",
        "with": "prenorm_clip1",
        "unstable_without": 2,
    }
    assert prevents(two, v2, "prenorm_noclip", "prenorm_clip1", 0.05) is None  # no late spike: nothing prevented
    # clip 1 is free of instability at 7e-2 but never learns: round 1 called that preventing, round 2 does not
    assert prevents(one, v1, "prenorm_clip10", "prenorm_clip1", 0.07) is not None
    assert prevents(two, v2, "prenorm_clip10", "prenorm_clip1", 0.07) is None
    fewer = runs.iloc[:-1]  # clip 10 on two seeds at 7e-2: the procedure's three are needed
    assert prevents(one, rules.sizing_flags(fewer, one, 0.01), "prenorm_clip10", "prenorm_clip1", 0.07, fewer) is None


def test_sensitivity_is_wortsmans_mean_capped_excess():
    rates = CONFIRM.sensitivity["rates"]
    finals = [2.0, 1.0, 1.5, 3.0, 9.0, np.nan, 3.99, 3.99]  # 9.0 above L0 = 4.0 is capped; NaN counts as L0
    rows = [_run("prenorm_clip1", 401, True, lr=lr, final=f) for lr, f in zip(rates, finals)]
    table = rules.sensitivity(CONFIRM, pd.DataFrame(rows))
    summary = table[(table["arm"] == "prenorm_clip1") & table["lr"].isna()].iloc[0]
    capped = [2.0, 1.0, 1.5, 3.0, 4.0, 4.0, 3.99, 3.99]
    assert summary["final_loss"] == 1.0 and summary["lr_sensitivity"] == pytest.approx(np.mean(capped) - 1.0)
    others = table[(table["arm"] == "prenorm_clip10") & table["lr"].isna()].iloc[0]
    assert not bool(others["finished"]) and np.isnan(others["lr_sensitivity"])


def _fp16(high_a=4, high_b=0, low_a=2, low_b=2, logit_high=2e5, logit_low=2e4):
    low, high = rules.gains(R4)
    trained = {(high, A): high_a, (high, B): high_b, (low, A): low_a, (low, B): low_b}
    rows = []
    for size, arm, lr, seed in rules.fp16_plan(R4):
        gain = high if size == rules.size_name(R4, high) else low
        seeds = R4.seeds["high" if gain == high else "low"]
        rows.append(
            _run(arm, seed, seeds.index(seed) < trained[(gain, arm)], lr=lr, size=size)
            | {"qk_gain": gain, "attn_logit_max": logit_high if gain == high else logit_low}
        )
    return pd.DataFrame(rows)


def test_the_fp16_rules_need_their_cells_and_count_only_runs_trained_through():
    assert rules.judge_fp16(R4, _fp16())["verdict"] == "supported"
    assert rules.judge_fp16(R4, _fp16(logit_low=7e4))["verdict"] == "undecided: the cells are not as the rules need"
    assert rules.judge_fp16(R4, _fp16(logit_high=6e4))["verdict"] == "undecided: the cells are not as the rules need"
    assert rules.judge_fp16(R4, _fp16(low_b=0))["verdict"] == "undecided: the cells are not as the rules need"
    undecided = rules.judge_fp16(R4, _fp16(high_a=3))
    assert (
        undecided["verdict"] == "undecided" and undecided["difference"] == 0.75 and "excluded_effect" not in undecided
    )
    runs = _fp16(high_b=4)
    stopped = (runs["arm"] == B) & (runs["qk_gain"] == 128.0)
    runs.loc[stopped, ["updates", "status"]] = [67, "diverged"]  # the loss scaler stopped them at update 67
    v = rules.judge_fp16(R4, runs)
    assert v["trained_high"] == {A: 4, B: 0} and v["verdict"] == "supported"
    assert rules.judge_fp16(R4, _fp16().drop(index=[3]))["verdict"] == "not finished"


def test_the_pilots_rule_takes_the_largest_gain_trained_through_within_the_margin():
    pilot = D.load("config/experiments/pb_relax_confirm_pilot.yaml")
    rows = [
        _run(B, 1, True, size="S1-fp16-g32") | {"qk_gain": 32.0, "attn_logit_max": 43_000.0},
        _run(B, 1, True, size="S1-fp16-g24") | {"qk_gain": 24.0, "attn_logit_max": 13_000.0},
    ]
    assert rules.low_gain(pilot, pd.DataFrame(rows)) == 32.0  # 43,000 <= 65,504 / 1.5
    rows[0]["attn_logit_max"] = 44_000.0
    assert rules.low_gain(pilot, pd.DataFrame(rows)) == 24.0
    rows[1]["updates"] = 500
    assert rules.low_gain(pilot, pd.DataFrame(rows)) is None
