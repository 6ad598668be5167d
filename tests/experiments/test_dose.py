"""The dose-response's statistics (experiments.dose) and rules (experiments.rules' dose_response and
equivalence kinds) on hand-made data: the exact test against Fisher's, the fit and its interval on
simulated runs with a known shift, the power numbers the declarations state, and the verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from acoustic_mlm.experiments import declaration as D
from acoustic_mlm.experiments import dose, rules
from acoustic_mlm.experiments import record as R
from acoustic_mlm.experiments.stats import fisher_greater

ROUND6 = D.load("config/experiments/dose_response.yaml")
ROUND8 = D.load("config/experiments/aa_control.yaml")


def test_one_stratum_is_fishers_exact_test_and_strata_add_evidence():
    for k_a, n_a, k_b, n_b in [(11, 12, 6, 12), (3, 7, 0, 7), (7, 7, 7, 7), (0, 5, 4, 5)]:
        assert dose.exact_shift_p([(k_a, n_a, k_b, n_b)]) == pytest.approx(fisher_greater(k_a, n_a, k_b, n_b))
    one = dose.exact_shift_p([(5, 7, 2, 7)])
    assert dose.exact_shift_p([(5, 7, 2, 7)] * 3) < one / 5  # the same evidence at three rates
    # strata where every run trained, or none did, carry no evidence and change nothing
    assert dose.exact_shift_p([(5, 7, 2, 7), (7, 7, 7, 7), (0, 7, 0, 7)]) == pytest.approx(one)


def test_the_exact_test_holds_its_level_between_identical_arms():
    truth = {"slope": -10.0, "midpoint": np.log(0.05), "shift": 0.0}
    rejected = dose.power(truth, np.log([0.04, 0.05, 0.06, 0.07]), 7, 0.025, sims=2000, seed=1)
    assert rejected <= 0.025 + 0.007  # exact tests are conservative; 0.007 is 2 binomial sd at 2000 draws


def test_the_fit_recovers_a_known_shift_and_its_interval_covers_it():
    rng = np.random.default_rng(0)
    rates = np.log(np.repeat([0.03, 0.04, 0.05, 0.06, 0.07, 0.08], 200))
    x = np.concatenate([rates, rates])
    g = np.concatenate([np.ones(len(rates)), np.zeros(len(rates))])
    y = rng.random(len(x)) < dose.curve(x, g, -10.0, np.log(0.05), 0.2)
    best = dose.fit(x, g, y)
    assert not best["separated"]
    assert best["shift"] == pytest.approx(0.2, abs=0.03) and best["slope"] == pytest.approx(-10, rel=0.15)
    ci = dose.shift_interval(x, g, y, best)
    assert ci["low"] < 0.2 < ci["high"] and ci["high"] - ci["low"] < 0.15
    assert not (ci["low_open"] or ci["high_open"])


def test_separated_runs_are_said_to_be_so():
    x = np.log([0.04, 0.05, 0.06, 0.07] * 2)
    g = np.array([1] * 4 + [0] * 4)
    assert dose.separated(x, g, np.array([1, 1, 0, 0, 1, 0, 0, 0]))  # each arm a clean step
    assert dose.separated(x, g, np.array([1, 1, 1, 1, 1, 0, 1, 0]))  # an arm all trained
    assert not dose.separated(x, g, np.array([1, 0, 1, 0, 1, 1, 0, 0]))  # one arm is no step: a curve exists
    best = dose.fit(x, g, np.array([1, 0, 1, 0, 1, 1, 0, 0]))
    assert np.isfinite([best["slope"], best["shift"]]).all()


@pytest.mark.parametrize("slope, stated", [(-5.0, 0.94), (-10.0, 0.80), (-20.0, 0.38)])
def test_round_6s_seeds_come_from_the_power_it_states(slope, stated):
    """dose_response.yaml: 7 seeds give 80 % power at slope -10 (94 % at -5, 38 % at -20) at P2's effect."""
    effect = np.log(11 / 1) - np.log(6 / 6)  # P2: 11 of 12 against 6 of 12 trained, as log odds
    truth = {"slope": slope, "midpoint": np.log(0.05), "shift": effect / -slope}
    rates = np.log(ROUND6.cells["S1"]["rates"])
    assert dose.power(truth, rates, len(ROUND6.seeds["main"]), 0.025, sims=2000) == pytest.approx(stated, abs=0.02)


def _row(cell, arm, lr, seed, trained, final=None, rnd=6):
    final = (1.0 if trained else 3.99) if final is None else final
    row = {c.name: np.nan for c in R.columns(fp16=False)}
    row |= {"round": rnd, "size": cell, "arm": arm, "lr": lr, "seed": seed, "status": "completed"}
    return row | {"plateau": 3.984, "final_loss": final, "first_loss": 4.0, "trained": trained, "left_plateau": trained}


def _dose_runs(fav_breaks: float, other_breaks: float) -> pd.DataFrame:
    """D1's runs, each arm trained below its breakdown rate, with one seed per rate on the wrong side so
    that the runs do not separate."""
    rows = []
    for arm, breaks in (("prenorm_clip1", fav_breaks), ("prenorm_clip10", other_breaks)):
        for lr in ROUND6.cells["S1"]["rates"]:
            for i, seed in enumerate(ROUND6.seeds["main"]):
                rows.append(_row("S1", arm, lr, seed, (lr < breaks) != (i == 0)))
    return pd.DataFrame(rows)


def test_the_dose_response_verdicts():
    supported = rules.judge_dose(ROUND6, _dose_runs(0.065, 0.045))["verdicts"]
    d1 = supported[0]
    assert d1["id"] == "D1" and d1["verdict"] == "supported" and d1["p_for"] < 0.025
    assert d1["shift_log_rate"] > 0 and d1["shift_interval_95"][0] > 0
    assert [r["trained_a"] for r in d1["by_rate"]] == [6, 6, 6, 1]
    assert [r["trained_b"] for r in d1["by_rate"]] == [6, 1, 1, 1]
    assert all(v["verdict"] == "not finished" for v in supported[1:])  # no noclip, no width 64 yet
    contradicted = rules.judge_dose(ROUND6, _dose_runs(0.045, 0.065))["verdicts"][0]
    assert contradicted["verdict"] == "contradicted" and contradicted["shift_log_rate"] < 0
    same = rules.judge_dose(ROUND6, _dose_runs(0.055, 0.055))["verdicts"][0]
    assert same["verdict"] == "undecided" and same["shift_interval_95"][0] < 0 < same["shift_interval_95"][1]


def test_runs_separated_by_rate_give_the_shares_difference_and_its_interval_in_place_of_a_shift():
    """No curve exists where an arm trains at no rate (round 12's clip 10): the verdict still decides by the
    exact test and reports the difference of the shares trained over every rate with its Newcombe interval."""
    rows = [
        _row("S1", arm, lr, seed, arm == "prenorm_clip1" and lr == 0.04 and i < 2)
        for arm in ("prenorm_clip1", "prenorm_clip10")
        for lr in ROUND6.cells["S1"]["rates"]
        for i, seed in enumerate(ROUND6.seeds["main"])
    ]
    d1 = rules.judge_dose(ROUND6, pd.DataFrame(rows))["verdicts"][0]
    assert (d1["trained_a"], d1["trained_b"], d1["shift_log_rate"]) == (2, 0, None) and "separated" in d1["reading"]
    assert d1["verdict"] == "undecided" and d1["p_for"] == pytest.approx(
        21 / 91
    )  # both trained of 14 at 4e-2: C(7,2)/C(14,2)
    assert d1["difference"] == pytest.approx(2 / 28, abs=1e-4) and d1["interval_95"][0] < 0 < d1["interval_95"][1]


def _aa_runs(aa_sd: float, planted: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for p in ROUND8.promises:
        for cell, seeds in ((p.cell, p.seeds), (p.cell_against, p.seeds_against)):
            lr = ROUND8.cells[cell]["lr"]
            for s in seeds:
                shift = planted if cell == "planted" else 0.0
                rows.append(_row(cell, "prenorm_clip1", lr, s, True, 0.93 + shift + rng.normal(0, aa_sd), rnd=8))
    return pd.DataFrame(rows).drop_duplicates(["size", "seed"])


def test_the_aa_pair_can_fail_and_its_control_must_be_seen():
    ok = rules.judge_equivalence(ROUND8, _aa_runs(0.005, 0.05))
    assert ok["verdict"].startswith("calibrated")
    assert [p["reading"] for p in ok["pairs"]] == ["equivalent within the margin", "detected: outside the margin"]
    noisy = rules.judge_equivalence(ROUND8, _aa_runs(0.05, 0.05))  # noise ten times the pilot's: it fails
    assert noisy["verdict"].startswith("not calibrated")
    blind = rules.judge_equivalence(ROUND8, _aa_runs(0.005, 0.0))  # nothing planted: the control is not seen
    assert blind["verdict"].startswith("uninformative")
    part = rules.judge_equivalence(ROUND8, _aa_runs(0.005, 0.05).iloc[:-1])
    assert part["verdict"] == "not finished"


def test_rounds_of_rates_are_declared_strictly(tmp_path):
    import yaml

    from acoustic_mlm.errors import UserError

    doc = yaml.safe_load(open("config/experiments/dose_response.yaml"))
    for edit, message in [
        (lambda d: d["cells"]["S1"].update(lr=0.05), "one rate or a list of rates"),
        (lambda d: d["cells"]["S1"].update(rates=[0.05, 0.04]), "rising"),
        (lambda d: d["cells"]["S1"].pop("rates"), "needs a list of 'rates'"),
        (lambda d: d["promises"][1].update(family="dose_response"), "a family holds confirmatory tests"),
        (lambda d: d["promises"][3].update(cell_against="W128"), "not a cell of the round"),
        (lambda d: d["promises"][0].update(test="fisher"), "exact_shift exactly where"),
    ]:
        bad = yaml.safe_load(yaml.safe_dump(doc))
        edit(bad)
        path = tmp_path / "dose_response.yaml"
        path.write_text(yaml.safe_dump(bad))
        with pytest.raises(UserError, match=message):
            D.load(path)


def test_round_9_is_sized_as_its_declaration_says_and_round_8_could_barely_pass():
    """The chances quoted in config/experiments/aa_margin.yaml, recomputed (stats.equivalence_power at
    round 8's sd, 0.037 bits), and round 8's own at that sd: its A/A pair held with chance about 0.2 %."""
    from acoustic_mlm.experiments.stats import equivalence_power

    round9 = D.load("config/experiments/aa_margin.yaml")
    margin, n = round9.params["margin"], len(round9.promises[0].seeds)
    assert (margin, n, round9.cells["planted"]["lr"]) == (0.06, 12, 0.003)
    assert equivalence_power(0.0, 0.037, n, margin)["equivalent"] == pytest.approx(0.97, abs=0.01)
    assert equivalence_power(0.13, 0.037, n, margin)["detected"] == pytest.approx(0.997, abs=0.003)
    assert equivalence_power(0.10, 0.037, n, margin)["detected"] == pytest.approx(0.82, abs=0.01)
    old = equivalence_power(0.0, 0.037, len(ROUND8.promises[0].seeds), ROUND8.params["margin"])
    assert old["equivalent"] < 0.005
    assert equivalence_power(0.019, 0.037, 10, ROUND8.params["margin"])["detected"] == pytest.approx(0.04, abs=0.01)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_interval_by_bisection_is_the_full_scans(seed):
    """shift_interval bisects for each end; a scan of every grid shift finds the same ends (rounds' sizes:
    four rates, eight seeds a side, so that an end may be open)."""
    rng = np.random.default_rng(seed)
    rates = np.log(np.repeat([0.03, 0.045, 0.065, 0.1], 8))
    x, g = np.concatenate([rates, rates]), np.repeat([1.0, 0.0], len(rates))
    y = rng.random(len(x)) < dose.curve(x, g, -4.0, np.log(0.05), 0.3)
    best = dose.fit(x, g, y)
    assert not best["separated"]
    grid = np.linspace(best["shift"] - 3, best["shift"] + 3, 121)  # the default 601, coarser: a scan costs
    start = np.array([best["slope"], best["midpoint"], best["shift"]])
    inside = [2 * (best["loglik"] - dose._best(x, g, y, float(s), start)[0]) <= dose.CHI2_95 for s in grid]
    idx = np.flatnonzero(inside)
    assert (np.diff(idx) == 1).all()  # one interval, as the bisection assumes
    ci = dose.shift_interval(x, g, y, best, points=121)
    assert (ci["low"], ci["high"]) == (grid[idx[0]], grid[idx[-1]])
    assert (ci["low_open"], ci["high_open"]) == (idx[0] == 0, idx[-1] == 120)
