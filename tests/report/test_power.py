"""report/power.py: the log-rank test against a hand-computed example, Fisher's power against an
enumeration with scipy's own test, the sample sizes, and the log-rank power by simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, fisher_exact, norm

from acoustic_mlm.report import power as P


def test_logrank_matches_a_hand_computed_example():
    # A leaves at 2 and 4, one run censored at 6; B leaves at 1 and 4, one censored at 5.
    # t=1: 6 at risk (3 of A), 1 event (B):   E_A 3/6,         V 1 (1/2)(1/2)(5/5)   = 0.25
    # t=2: 5 at risk (3 of A), 1 event (A):   E_A 3/5,         V 1 (3/5)(2/5)(4/4)   = 0.24
    # t=4: 4 at risk (2 of A), 2 events (1+1): E_A 2 * 2/4 = 1, V 2 (1/2)(1/2)(2/3)   = 1/3
    # O_A = 2, E_A = 2.1, V = 0.82333..., Z = -0.1 / sqrt(V)
    out = P.logrank([2, 4, 6], [True, True, False], [1, 4, 5], [True, True, False])
    assert out["observed_a"] == 2
    assert out["expected_a"] == pytest.approx(2.1)
    assert out["variance"] == pytest.approx(0.25 + 0.24 + 1 / 3)
    z = -0.1 / math.sqrt(0.25 + 0.24 + 1 / 3)
    assert out["z"] == pytest.approx(z)
    assert out["p"] == pytest.approx(norm.sf(z))
    # swapping the arms flips the sign of Z
    assert P.logrank([1, 4, 5], [True, True, False], [2, 4, 6], [True, True, False])["z"] == pytest.approx(-z)


def test_logrank_separates_arms_that_leave_from_arms_that_never_do():
    # 4 runs of A leave at step 10; 4 runs of B never leave (censored at their budget, 100):
    # one event time, 8 at risk, E_A = 4 * 4/8 = 2, V = 4 (1/2)(1/2)(4/7), Z = 2 / sqrt(4/7)
    out = P.logrank([10] * 4, [True] * 4, [100] * 4, [False] * 4)
    assert out["z"] == pytest.approx(2 / math.sqrt(4 / 7))
    assert out["p"] < 0.01
    # no event at all: nothing was measured, no p-value
    none = P.logrank([100] * 3, [False] * 3, [100] * 3, [False] * 3)
    assert math.isnan(none["z"]) and math.isnan(none["p"])


def test_fisher_greater_is_scipys_one_sided_test():
    for a, na, b, nb in [(4, 4, 0, 4), (3, 4, 0, 4), (6, 8, 4, 8), (2, 5, 3, 7), (0, 3, 3, 3)]:
        expected = fisher_exact([[a, na - a], [b, nb - b]], alternative="greater")[1]
        assert P.fisher_greater(a, na, b, nb) == pytest.approx(expected)


def test_fisher_power_by_hand_and_by_enumeration():
    # 0.5 against 0 with 4 runs each: only 4 of 4 against 0 of 4 has p < 0.05 (1/70; 3 of 4: 4/56),
    # so the power is P(4 of 4) = 1/16
    assert P.fisher_power(0.5, 0.0, 4) == pytest.approx(1 / 16)
    # against a plain enumeration with scipy's test
    for pa, pb, n, alpha in [(0.5, 0.05, 9, 0.025), (0.8, 0.3, 6, 0.05), (0.3, 0.3, 5, 0.05)]:
        total = 0.0
        for x in range(n + 1):
            for y in range(n + 1):
                p = fisher_exact([[x, n - x], [y, n - y]], alternative="greater")[1]
                if p < alpha:
                    total += binom.pmf(x, n, pa) * binom.pmf(y, n, pb)
        assert P.fisher_power(pa, pb, n, alpha=alpha) == pytest.approx(total)


def test_seeds_for_power():
    # 1 against 0: 3 of 3 against 0 of 3 gives p = 1/20, not below 0.05; 4 against 0 gives 1/70
    assert P.seeds_for_power(lambda n: P.fisher_power(1.0, 0.0, n)) == 4
    # 0.5 against 0: the power first reaches 0.8 at 10 (0.828 there; 0.637 at 8); the expected table
    # at 7 seeds (4 of 7 against 0, p = 0.035) has only 50 % power
    assert P.fisher_power(0.5, 0.0, 7) == pytest.approx(0.5)
    assert P.seeds_for_power(lambda n: P.fisher_power(0.5, 0.0, n)) == 10
    assert P.fisher_power(0.5, 0.0, 9) < 0.8 <= P.fisher_power(0.5, 0.0, 10)
    # equal shares never reach it
    assert P.seeds_for_power(lambda n: P.fisher_power(0.3, 0.3, n), most=20) is None


def test_loss_seeds_for_power():
    # gap 1, sds 1 and 1, one-sided alpha 0.025, power 0.8: (1.95996 + 0.84162)^2 * 2 = 15.70 -> 16
    assert P.loss_seeds_for_power(1.0, 1.0, 1.0) == 16
    assert P.loss_seeds_for_power(10.0, 0.1, 0.1) == 2  # never fewer than 2
    with pytest.raises(ValueError):
        P.loss_seeds_for_power(0.0, 1.0, 1.0)


def test_logrank_power_by_simulation():
    # arms that always differ: every draw rejects at n = 4 (Z = 2.65 as above)
    a, b = [(10, True)] * 5, [(100, False)] * 5
    assert P.logrank_power(a, b, 4, sims=200) == 1.0
    # the same pilot for both arms: the rejection rate stays near alpha (one-sided 0.05)
    rng = np.random.default_rng(1)
    pilot = [(float(t), bool(t < 100)) for t in rng.choice([20, 40, 60, 80, 100], size=10)]
    assert P.logrank_power(pilot, pilot, 8, sims=2000) <= 0.08
    # a real difference gains power with n
    a = [(20, True), (30, True), (40, True), (100, False)]
    b = [(50, True), (100, False), (100, False), (100, False)]
    assert P.logrank_power(a, b, 4, sims=500) < P.logrank_power(a, b, 12, sims=500)


def test_excluded_reading_names_the_effect_or_says_none_is_excluded():
    from acoustic_mlm.report.power import excluded_reading

    r = excluded_reading(0.0, 12, 12, "share trained")
    assert r["excluded_effect"] == 0.5
    assert r["reading"] == "no effect larger than 0.5 (share trained) excluded at n = 12 per arm"
    r = excluded_reading(0.95, 12, 12, "share trained")
    assert r == {"excluded_effect": None, "reading": "no effect size excluded at n = 12 per arm"}
