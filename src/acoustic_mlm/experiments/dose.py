"""A breakdown-rate dose-response: the share of runs trained against the peak learning rate, two arms.

The model, one formula: P(trained | rate, arm) = sigmoid(slope * (log rate - midpoint - shift * favoured)),
with `favoured` 1 for the favoured arm and 0 for the other. `midpoint` is the other arm's breakdown rate
(in log rate: where half its runs train), `shift` how much further the favoured arm's breakdown rate lies,
in log rate (exp(shift) is the ratio of the two breakdown rates). A stabilizer that helps has shift > 0.

    fit              the maximum-likelihood slope, midpoint and shift (scipy.optimize), with `separated`
                     True where the data do not bound them (every run of a side trained or none did)
    shift_interval   the profile-likelihood interval of the shift (the shift's likelihood-ratio test
                     inverted: every shift within chi2(1) / 2 of the best log-likelihood)
    exact_shift_p    the decision's test: the exact conditional test that the favoured arm trains more,
                     the rates as strata (the one-sided exact test of the arm's coefficient in a logistic
                     model with one level per rate: conditional on each rate's trained count, the favoured
                     arm's trained count is hypergeometric; their sum's tail). It holds its level whatever
                     the curve's shape and when the runs separate, where the fit's test would not.
    power            the decision's power at a design (rates, seeds per cell) against a true curve, by
                     simulation from that curve

Logistic dose-response and the exact conditional test: Cox, "Analysis of Binary Data" (1970); the
stratified exact test of a common odds ratio: Mehta, Patel and Gray (1985).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit
from scipy.stats import chi2, hypergeom

CHI2_95 = float(chi2.ppf(0.95, 1))


def curve(log_rate, favoured, slope: float, midpoint: float, shift: float):
    """P(trained) under the model (module docstring)."""
    return expit(slope * (np.asarray(log_rate) - midpoint - shift * np.asarray(favoured)))


def _loglik(params, x, g, y) -> float:
    slope, midpoint, shift = params
    z = slope * (x - midpoint - shift * g)
    return float(np.sum(y * log_expit(z) + (1 - y) * log_expit(-z)))


def _best(x, g, y, shift: float | None, start) -> tuple[float, np.ndarray]:
    """The largest log-likelihood over (slope, midpoint[, shift]) with `shift` fixed where given."""

    def nll(p):
        full = (p[0], p[1], shift) if shift is not None else p
        return -_loglik(full, x, g, y)

    res = minimize(
        nll,
        start if shift is None else start[:2],
        method="Nelder-Mead",
        options={"xatol": 1e-7, "fatol": 1e-10, "maxiter": 20000, "maxfev": 40000},
    )
    full = np.array([res.x[0], res.x[1], shift]) if shift is not None else res.x
    return -float(res.fun), full


def _arrays(log_rate, favoured, trained):
    x = np.asarray(log_rate, dtype=float)
    g = np.asarray(favoured, dtype=float)
    y = np.asarray(trained, dtype=float)
    if not (x.shape == g.shape == y.shape) or x.ndim != 1:
        raise ValueError("log_rate, favoured and trained must be 1-D and of one length")
    return x, g, y


def separated(log_rate, favoured, trained) -> bool:
    """True where the maximum-likelihood curve does not exist (is a step): an arm whose runs all trained
    or none did, or both arms each a clean step in one direction (every trained run below every untrained
    one, or every one above)."""
    x, g, y = _arrays(log_rate, favoured, trained)
    falls, rises = [], []
    for arm in (0.0, 1.0):
        xs, ys = x[g == arm], y[g == arm]
        if ys.all() or not ys.any():
            return True
        falls.append(xs[ys == 1].max() < xs[ys == 0].min())
        rises.append(xs[ys == 0].max() < xs[ys == 1].min())
    return all(falls) or all(rises)


def fit(log_rate, favoured, trained) -> dict:
    """Maximum-likelihood slope, midpoint and shift, and whether the data bound them (`separated`)."""
    x, g, y = _arrays(log_rate, favoured, trained)
    start = np.array([-5.0, float(np.median(x)), 0.0])
    loglik, (slope, midpoint, shift) = _best(x, g, y, None, start)
    return {
        "slope": float(slope),
        "midpoint": float(midpoint),
        "shift": float(shift),
        "loglik": loglik,
        "separated": separated(x, g, y),
    }


def shift_interval(log_rate, favoured, trained, best: dict, span: float = 3.0, points: int = 601) -> dict:
    """The 95 % profile-likelihood interval of the shift: the grid of `points` shifts within `span` of the
    estimate, each end the outermost grid shift whose profile stays within chi2(1) / 2 of the best
    log-likelihood; an end the grid reaches is open (`low_open`/`high_open`: the data bound it no further).

    The set of shifts inside is one interval around the estimate (the model is linear in (slope,
    slope * midpoint, slope * shift), the likelihood concave there, and the shift a ratio of two of them,
    which maps a convex set onto an interval), so each end is found by bisection on the grid: about 20
    profile fits in place of `points`, each grid shift's profile computed as it would be in a full scan."""
    x, g, y = _arrays(log_rate, favoured, trained)
    grid = np.linspace(best["shift"] - span, best["shift"] + span, points)
    start = np.array([best["slope"], best["midpoint"], best["shift"]])
    known: dict[int, bool] = {}

    def inside(i: int) -> bool:
        if i not in known:
            ll, _ = _best(x, g, y, float(grid[i]), start)
            known[i] = bool(2 * (best["loglik"] - ll) <= CHI2_95)
        return known[i]

    centre = int(np.argmin(np.abs(grid - best["shift"])))
    if not inside(centre):  # not the estimate's own profile: no interval around it to bisect
        found = [i for i in range(points) if inside(i)]
        if not found:
            return {"low": math.nan, "high": math.nan, "low_open": True, "high_open": True}
        low, high = found[0], found[-1]
    else:
        low, high = _edge(inside, centre, 0), _edge(inside, centre, points - 1)
    return {
        "low": float(grid[low]),
        "high": float(grid[high]),
        "low_open": bool(low == 0),
        "high_open": bool(high == points - 1),
    }


def _edge(inside, start: int, end: int) -> int:
    """The grid index furthest from `start` towards `end` that is inside, `start` inside and the inside
    indices contiguous: bisection between the last index known inside and the first known outside."""
    if inside(end):
        return end
    good, bad = start, end
    while abs(bad - good) > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if inside(mid) else (good, mid)
    return good


def exact_shift_p(strata: list[tuple[int, int, int, int]]) -> float:
    """One-sided exact conditional p that the favoured arm trains more, the rates as strata. Each stratum
    is (trained_favoured, n_favoured, trained_other, n_other)."""
    dist = np.array([1.0])
    observed = 0
    for k_a, n_a, k_b, n_b in strata:
        total, t = n_a + n_b, k_a + k_b
        lo, hi = max(0, t - n_b), min(t, n_a)
        pmf = hypergeom.pmf(np.arange(lo, hi + 1), total, t, n_a)
        dist = np.convolve(np.concatenate([np.zeros(lo), pmf]), dist) if lo else np.convolve(pmf, dist)
        observed += k_a
    return float(min(1.0, dist[observed:].sum()))


def strata_of(log_rate, favoured, trained) -> list[tuple[int, int, int, int]]:
    """The runs as exact_shift_p's strata, one per rate."""
    x, g, y = _arrays(log_rate, favoured, trained)
    out = []
    for r in np.unique(x):
        at = x == r
        a, b = at & (g == 1), at & (g == 0)
        out.append((int(y[a].sum()), int(a.sum()), int(y[b].sum()), int(b.sum())))
    return out


def power(truth: dict, log_rates, seeds: int, alpha: float, sims: int = 4000, seed: int = 0) -> float:
    """The share of `sims` simulated rounds (each rate, each arm, `seeds` runs drawn from `truth`'s curve)
    in which exact_shift_p is below alpha."""
    rng = np.random.default_rng(seed)
    rates = np.asarray(log_rates, dtype=float)
    p_fav = curve(rates, 1, truth["slope"], truth["midpoint"], truth["shift"])
    p_oth = curve(rates, 0, truth["slope"], truth["midpoint"], truth["shift"])
    hits = 0
    for _ in range(sims):
        k_a, k_b = rng.binomial(seeds, p_fav), rng.binomial(seeds, p_oth)
        strata = [(int(a), seeds, int(b), seeds) for a, b in zip(k_a, k_b)]
        hits += exact_shift_p(strata) < alpha
    return hits / sims
