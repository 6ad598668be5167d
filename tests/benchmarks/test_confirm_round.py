"""benchmarks/confirm_round.py judges the confirmatory round by its rules, on hand-made tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import load_benchmark

from acoustic_mlm.report.power import excluded_effect, fisher_power

cr = load_benchmark("confirm_round")


def _run(arm, seed, trained, lr=0.05, spike=0.0, left=True, final=None, logit=5.0, first=4.0, size="S1"):
    final = (1.0 if trained else 3.99) if final is None else final
    row = {c: np.nan for c in cr.ps.RUN_COLUMNS}
    row |= {"round": 3, "size": size, "arm": arm, "lr": lr, "seed": seed, "status": "completed"}
    row |= {"final_loss": final, "first_loss": first, "trained": trained, "left_plateau": left or trained}
    row |= {"largest_late_spike_bits": spike, "nonfinite_steps": 0, "attn_logit_final": logit}
    return row


def _arm(arm, seeds, n_trained, **kw):
    return [_run(arm, s, i < n_trained, **kw) for i, s in enumerate(seeds)]


def _sizing(tmp_path):
    sizing = tmp_path / "sizing"
    sizing.mkdir()
    base = _run("prenorm_clip10", 1, True, lr=0.01, final=0.94, logit=5.3)
    pd.DataFrame([base | {"round": 2}]).to_csv(sizing / "runs.csv", index=False)
    return sizing


def test_the_rules_verdicts_and_the_excluded_effect(tmp_path):
    rows = _arm("prenorm_clip1", cr.SEEDS, 11) + _arm("prenorm_noclip", cr.SEEDS, 2)  # P1: 11/12 vs 2/12
    rows += _arm("prenorm_clip10", cr.SEEDS, 11)  # P2: 11/12 vs 11/12, undecided
    d12 = {"size": "D12", "lr": 0.01}  # P3's cell
    rows += _arm("postnorm_deepnorm_clip1", cr.SEEDS, 0, **d12) + _arm("postnorm_clip1", cr.SEEDS, 8, **d12)  # against
    rows += _arm("postnorm_deepnorm_clip1", cr.SEEDS, 12)  # at S1 and 5e-2: not P3's cell, not counted
    rows += _arm("prenorm_attnrelax_clip1", cr.AA_SEEDS, 9)  # A/A: 9/10 against clip 1's 10/10 of 101-110
    out = tmp_path / "out"
    out.mkdir()
    pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)
    result = cr.judge(out, _sizing(tmp_path))
    p1, p2, p3 = result["verdicts"]
    assert p1["verdict"] == "supported" and p1["trained_a"] == 11 and p1["trained_b"] == 2
    assert p1["p_for"] == pytest.approx(cr.fisher_greater(11, 12, 2, 12)) and p1["p_for"] < 0.025
    assert p1["unstable_b"] == 10  # the untrained runs left the plateau and fell back: (iii)
    assert p2["verdict"] == "undecided" and p2["excluded_effect"] == excluded_effect(11 / 12, 12, 12)
    assert p3["verdict"] == "contradicted" and p3["p_against"] < 0.025 and p3["trained_a"] == 0
    assert result["aa"]["verdict"] == "undecided" and result["aa"]["calibrated"] is True
    assert json.loads((out / "verdicts.json").read_text()) == result


def test_a_decided_aa_pair_marks_the_round_not_calibrated_and_unfinished_parts_have_no_verdict(tmp_path):
    rows = _arm("prenorm_clip1", cr.SEEDS, 12) + _arm("prenorm_attnrelax_clip1", cr.AA_SEEDS, 1)
    rows += _arm("prenorm_noclip", cr.SEEDS[:5], 0)
    out = tmp_path / "out"
    out.mkdir()
    pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)
    result = cr.judge(out, _sizing(tmp_path))
    assert result["aa"]["calibrated"] is False and "not calibrated" in result["note"]
    assert [v["verdict"] for v in result["verdicts"]] == ["not finished"] * 3


def test_excluded_effect_and_instability_definitions():
    assert excluded_effect(0.0, 12, 12) == 0.5  # fisher_power(0.5, 0, 12) >= 0.8 first at d = 0.5
    assert fisher_power(0.45, 0.0, 12, alpha=0.025) < 0.8 <= fisher_power(0.5, 0.0, 12, alpha=0.025)
    assert excluded_effect(0.95, 12, 12) is None  # 1.0 against 0.95 is out of reach at 12
    runs = pd.DataFrame(
        [
            _run("a", 1, True),
            _run("a", 2, True, spike=0.5),  # (i)
            _run("a", 3, False, left=True),  # (iii)
            _run("a", 4, False, left=False),  # never left, no spike: not unstable
            _run("a", 5, False, left=False, logit=53.0, final=3.99),  # (iv): x10 the reference and 0.5 bits worse
            _run("a", 6, True, logit=60.0, final=1.2),  # growth without the loss cost
        ]
    )
    assert cr.unstable(runs, 5.3, 0.94).tolist() == [False, True, True, False, True, False]


def test_sensitivity_is_wortsmans_mean_capped_excess(tmp_path):
    finals = [2.0, 1.0, 1.5, 3.0, 9.0, np.nan, 3.99, 3.99]  # 9.0 above L0 = 4.0 is capped; NaN counts as L0
    rows = [
        _run("prenorm_clip1", cr.SENSITIVITY_SEED, True, lr=lr, final=f) for lr, f in zip(cr.SENSITIVITY_RATES, finals)
    ]
    table = cr.sensitivity(pd.DataFrame(rows))
    summary = table[(table["arm"] == "prenorm_clip1") & table["lr"].isna()].iloc[0]
    capped = [2.0, 1.0, 1.5, 3.0, 4.0, 4.0, 3.99, 3.99]
    assert summary["final_loss"] == 1.0 and summary["lr_sensitivity"] == pytest.approx(np.mean(capped) - 1.0)
    assert bool(summary["finished"])
    others = table[(table["arm"] == "prenorm_clip10") & table["lr"].isna()].iloc[0]
    assert not bool(others["finished"]) and np.isnan(others["lr_sensitivity"])


def test_the_round_runs_each_arm_with_fresh_seeds_in_its_part_order():
    parts = dict(cr.parts())
    assert list(parts) == ["P1", "P2", "AA", "P3", "sensitivity"]
    assert sum(len(v) for v in parts.values()) == 102
    seeds = {s for v in parts.values() for *_, s in v}
    assert {(size, lr) for size, _, lr, _ in parts["P3"]} == {("D12", 0.01)}
    assert seeds.isdisjoint({1, 2, 3})  # never the sizing's seeds
    settings = cr.ps.settings_for("S1", "prenorm_attnrelax_clip1", 0.05, 101, cr.ARMS)
    assert settings.runs["prenorm_attnrelax_clip1"].attention == "pb_relax"


def test_the_sensitivity_figure_is_drawn_from_the_runs(tmp_path):
    rows = [
        _run(arm, cr.SENSITIVITY_SEED, True, lr=lr, final=1.0 + i) | {"plateau": 3.98}
        for arm in cr.FIGURE_ARMS
        for i, lr in enumerate(cr.SENSITIVITY_RATES)
    ]
    path = cr.sensitivity_figure(pd.DataFrame(rows), tmp_path / "sens.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob(".*"))  # no temporary left
