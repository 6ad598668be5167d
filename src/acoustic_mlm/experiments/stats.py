"""The statistics a round's verdict states: Fisher's exact test, the family-wise control, and the
interval of a difference of shares.

    fisher_greater   one-sided Fisher exact p-value that A's share is the larger (scipy.stats.fisher_exact)
    holm             Holm's step-down adjusted p-values of a family (Holm 1979): the k-th smallest of m
                     raw p-values times (m - k + 1), made monotone, capped at 1
    newcombe         the difference of two shares with its Newcombe hybrid-score interval (Newcombe 1998,
                     method 10: the Wilson score intervals of each share, scipy.stats.binomtest's)
    equivalence_power  the chances that an equivalence round's Welch interval lies within or outside its
                     margin, by simulation (rules.judge_equivalence's readings)

An undecided comparison is reported by its estimate and interval: the interval says which differences
the data leave open, which the power a test had against some difference does not.
"""

from __future__ import annotations

import math

from scipy.stats import binomtest, fisher_exact


def fisher_greater(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """P(A's share is the larger) by Fisher's exact test, one-sided, on [[k_a, n_a - k_a], [k_b, n_b - k_b]]."""
    return float(fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]], alternative="greater")[1])


def holm(p: dict[str, float]) -> dict[str, float]:
    """Holm's adjusted p-value of each member of a family (keys: the members); reject at family alpha
    where the adjusted p is below it."""
    order = sorted(p, key=lambda k: (p[k], k))
    m, running, out = len(order), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[key]))
        out[key] = running
    return out


def _wilson(k: int, n: int, level: float) -> tuple[float, float]:
    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


def newcombe(k_a: int, n_a: int, k_b: int, n_b: int, level: float = 0.95) -> dict:
    """A's share minus B's, with its Newcombe interval at `level`: {estimate, low, high, level}."""
    pa, pb = k_a / n_a, k_b / n_b
    la, ua = _wilson(k_a, n_a, level)
    lb, ub = _wilson(k_b, n_b, level)
    d = pa - pb
    low = d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
    high = d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
    return {"estimate": d, "low": max(-1.0, low), "high": min(1.0, high), "level": level}


def equivalence_power(
    difference: float, sd: float, n: int, margin: float, level: float = 0.9, draws: int = 20000, seed: int = 0
) -> dict[str, float]:
    """The chances of an equivalence round's two readings (rules.judge_equivalence), by simulation: n normal
    final losses a side with the same sd, the sides' means `difference` apart; each draw's Welch interval
    at `level`. `equivalent`: the interval lies within (-margin, margin); `detected`: it lies outside
    [-margin, margin]."""
    import numpy as np
    from scipy.stats import t

    rng = np.random.default_rng(seed)
    a, b = rng.normal(difference, sd, (draws, n)), rng.normal(0.0, sd, (draws, n))
    va, vb = a.var(axis=1, ddof=1) / n, b.var(axis=1, ddof=1) / n
    df = (va + vb) ** 2 / (va**2 / (n - 1) + vb**2 / (n - 1))  # Welch-Satterthwaite
    half = t.ppf(0.5 + level / 2, df) * np.sqrt(va + vb)
    d = a.mean(axis=1) - b.mean(axis=1)
    low, high = d - half, d + half
    inside = (low > -margin) & (high < margin)
    outside = (low > margin) | (high < -margin)
    return {"equivalent": float(inside.mean()), "detected": float(outside.mean())}
