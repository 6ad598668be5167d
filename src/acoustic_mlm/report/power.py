"""Power for the stability experiments' comparisons (docs/stability.md): how many seeds a fresh
comparison needs, if the observed numbers were the truth (report.decisive's "seeds to decide").

    fisher_power          the exact power of the one-sided Fisher test for true shares p_a, p_b with n_a,
                          n_b runs (a sum over both binomial outcomes: no simulation)
    seeds_for_power       the fewest runs per arm whose power reaches a target (0.8)
    loss_seeds_for_power  the same for a difference of mean losses by a one-sided z-test

Power plans a round before its runs; it does not read a finished one. An undecided comparison is
reported by its estimate and interval (experiments.stats.newcombe), never by the effect a test had
power against.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.stats import binom, hypergeom, norm


def fisher_power(p_a: float, p_b: float, n_a: int, n_b: int | None = None, alpha: float = 0.05) -> float:
    """Exact power of the one-sided Fisher test (A's share larger) at level alpha, when A's runs
    leave with probability p_a and B's with p_b: the chance of a table with p < alpha."""
    n_b = n_a if n_b is None else n_b
    x = np.arange(n_a + 1)[:, None]
    y = np.arange(n_b + 1)[None, :]
    p = hypergeom.sf(x - 1, n_a + n_b, x + y, n_a)
    chance = binom.pmf(x, n_a, p_a) * binom.pmf(y, n_b, p_b)
    return float(chance[p < alpha].sum())


def seeds_for_power(power: Callable[[int], float], target: float = 0.8, least: int = 2, most: int = 64) -> int | None:
    """The fewest runs per arm n in [least, most] with power(n) >= target; None if none does."""
    for n in range(least, most + 1):
        if power(n) >= target:
            return n
    return None


def loss_seeds_for_power(gap: float, sd_a: float, sd_b: float, alpha: float = 0.025, target: float = 0.8) -> int:
    """Runs per arm for a one-sided z-test of a difference of means |gap| at level alpha to have the
    target power: n = ceil((z_(1-alpha) + z_target)^2 (sd_a^2 + sd_b^2) / gap^2), at least 2. The
    decisive rules' "2 SE" is z_(1-alpha) = 2 (alpha about 0.023)."""
    if gap == 0:
        raise ValueError("no number of runs detects a zero gap")
    z = norm.isf(alpha) + norm.ppf(target)
    return max(2, math.ceil(z**2 * (sd_a**2 + sd_b**2) / gap**2))
