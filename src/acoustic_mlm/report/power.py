"""Survival statistics and power for the stability experiments (docs/stability.md).

Whether a run leaves the plateau, and when, is the outcome the decisive experiments and the
confirmatory round compare between two arms:

    fisher_greater      Fisher's exact test, one-sided, on the 2 x 2 table of runs that left (trained)
    fisher_power        its exact power for true shares p_a, p_b with n_a, n_b runs (sum over both
                        binomial outcomes: no simulation)
    logrank             the Mantel-Haenszel log-rank test of the time to leave the plateau, each run
                        censored at its budget when it never left: one-sided Z (A leaves sooner) and
                        its p-value, the observed and expected events of arm A and the variance
    logrank_power       its power by simulation, drawing each arm's runs with replacement from a
                        pilot's (time, left) pairs
    seeds_for_power     the fewest runs per arm whose power reaches a target (0.8)
    loss_seeds_for_power  the same for a difference of mean losses by a one-sided z-test
    excluded_effect     what an undecided Fisher comparison excludes: the smallest difference of
                        shares (steps of 0.05) its test had 80 % power against
    excluded_reading    that effect and the sentence a verdict table gives for it

The log-rank statistic is the standard one (Mantel 1966; Peto and Peto 1972): at every distinct
event time t_j, with n_j runs still at risk (n_aj of them in A) and d_j leaving at t_j (d_aj of A),

    E_A = sum_j d_j n_aj / n_j,    V = sum_j d_j (n_aj / n_j) (1 - n_aj / n_j) (n_j - d_j) / (n_j - 1),
    Z = (O_A - E_A) / sqrt(V),

O_A = sum_j d_aj; a run censored at t is at risk at every event time <= t (a run that left at t is
at risk at t). Z > 0 when A leaves the plateau sooner than B; the one-sided p-value is 1 - Phi(Z).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import binom, hypergeom, norm


def fisher_greater(left_a: int, n_a: int, left_b: int, n_b: int) -> float:
    """One-sided Fisher exact p-value that A's share is the larger: P(X >= left_a), X hypergeometric
    with the table's margins (the same as scipy.stats.fisher_exact(..., alternative='greater'))."""
    return float(hypergeom.sf(left_a - 1, n_a + n_b, left_a + left_b, n_a))


def fisher_power(p_a: float, p_b: float, n_a: int, n_b: int | None = None, alpha: float = 0.05) -> float:
    """Exact power of the one-sided Fisher test (A's share larger) at level alpha, when A's runs
    leave with probability p_a and B's with p_b: the chance of a table with p < alpha."""
    n_b = n_a if n_b is None else n_b
    x = np.arange(n_a + 1)[:, None]
    y = np.arange(n_b + 1)[None, :]
    p = hypergeom.sf(x - 1, n_a + n_b, x + y, n_a)
    chance = binom.pmf(x, n_a, p_a) * binom.pmf(y, n_b, p_b)
    return float(chance[p < alpha].sum())


def logrank(times_a, left_a, times_b, left_b) -> dict:
    """Mantel-Haenszel log-rank test of A against B. times: the step each run left the plateau, or
    its budget when it did not (left False: censored there). Returns z, p (one-sided, A sooner),
    observed_a, expected_a, variance. With no event at all: z 0 and p 0.5 would claim a draw that
    was never measured, so z and p are NaN."""
    t = np.concatenate([np.asarray(times_a, dtype=float), np.asarray(times_b, dtype=float)])
    e = np.concatenate([np.asarray(left_a, dtype=bool), np.asarray(left_b, dtype=bool)])
    in_a = np.concatenate([np.ones(len(times_a), dtype=bool), np.zeros(len(times_b), dtype=bool)])
    observed = expected = variance = 0.0
    for tj in np.unique(t[e]):
        at_risk = t >= tj
        n, n_a = int(at_risk.sum()), int((at_risk & in_a).sum())
        d = int((e & (t == tj)).sum())
        observed += int((e & (t == tj) & in_a).sum())
        expected += d * n_a / n
        if n > 1:
            variance += d * (n_a / n) * (1 - n_a / n) * (n - d) / (n - 1)
    if variance <= 0:
        z = p = math.nan
    else:
        z = (observed - expected) / math.sqrt(variance)
        p = float(norm.sf(z))
    return {"z": z, "p": p, "observed_a": observed, "expected_a": expected, "variance": variance}


def logrank_power(
    pilot_a: Sequence[tuple[float, bool]],
    pilot_b: Sequence[tuple[float, bool]],
    n: int,
    alpha: float = 0.05,
    sims: int = 2000,
    seed: int = 0,
) -> float:
    """Power of the one-sided log-rank test (A sooner) at level alpha with n runs per arm, by
    simulation: each arm's n runs are drawn with replacement from its pilot's (time, left) pairs.
    A draw without any event is not a rejection."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(pilot_a, dtype=float), np.asarray(pilot_b, dtype=float)
    hits = 0
    for _ in range(sims):
        da, db = a[rng.integers(0, len(a), n)], b[rng.integers(0, len(b), n)]
        p = logrank(da[:, 0], da[:, 1] > 0, db[:, 0], db[:, 1] > 0)["p"]
        hits += bool(p < alpha)
    return hits / sims


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


def excluded_effect(
    q: float, n_a: int, n_b: int, alpha: float = 0.025, target: float = 0.8, step: float = 0.05
) -> float | None:
    """The smallest difference of shares d (steps of `step`) against which the one-sided Fisher test at
    these n has the target power, shares q + d against q (q: the share of the arm the promise says is
    worse, q + d capped at 1); None when even q + d = 1 falls short."""
    k = 1
    while q + k * step <= 1 + 1e-9:
        d = round(k * step, 2)
        if fisher_power(min(1.0, q + d), q, n_a, n_b, alpha=alpha) >= target:
            return d
        k += 1
    return None


def excluded_reading(q: float, n_a: int, n_b: int, outcome: str, alpha: float = 0.025) -> dict:
    """An undecided comparison's `excluded_effect` and its reading, for `outcome` (what the shares count)."""
    x = excluded_effect(q, n_a, n_b, alpha=alpha)
    reading = (
        f"no effect larger than {x:g} ({outcome}) excluded at n = {n_a} per arm"
        if x is not None
        else f"no effect size excluded at n = {n_a} per arm"
    )
    return {"excluded_effect": x, "reading": reading}
