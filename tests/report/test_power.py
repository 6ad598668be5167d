"""report/power.py: Fisher's power against an enumeration with scipy's own test and the sample sizes;
experiments.stats.fisher_greater against scipy's one-sided test."""

from __future__ import annotations

import pytest
from scipy.stats import binom, fisher_exact

from acoustic_mlm.experiments.stats import fisher_greater
from acoustic_mlm.report import power as P


def test_the_rounds_fisher_greater_is_scipys_one_sided_test():
    for a, na, b, nb in [(4, 4, 0, 4), (3, 4, 0, 4), (6, 8, 4, 8), (2, 5, 3, 7), (0, 3, 3, 3)]:
        expected = fisher_exact([[a, na - a], [b, nb - b]], alternative="greater")[1]
        assert fisher_greater(a, na, b, nb) == pytest.approx(expected)


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
