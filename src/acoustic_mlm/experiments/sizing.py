"""The sizing procedure of docs/stability.md ("Sizing a proxy that learns and breaks", and its round 2):
what `amlm experiment run` does with a round whose rules are `sizing`. It is adaptive: each step picks
its runs from the runs before it, by the definitions judge reads the round with (experiments.rules:
best_rate, sizing_flags, prevents, spent_s), at the size the round judges (params.size):

    1. scan    the baseline at every rate of params.rates, on the procedure's first seed; its best rate
    2. (a)     the baseline at the best rate on the other seeds; the size is given up unless all train
    3. above   every arm at each rate above the best, on the first seed, rate by rate
    4. (b)     rate by rate above the best, pair by pair (params.pairs): where the first seed shows the
               pair's unstabilized arm unstable and its stabilized arm not (and, by rules 2, trained),
               both arms on the other seeds; the procedure stops at the first pair that prevents

No new rate or pair is started once the round's run time passes params.budget_s. (c) and the verdict are
judge's (rules.judge_sizing), from the tables. A run the tables hold, of this round or of an earlier
sizing round in the same tables, is never trained again: a stopped procedure resumes where it stopped,
and a finished one trains nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pandas as pd

from acoustic_mlm.experiments import judge as J
from acoustic_mlm.experiments import record as R
from acoustic_mlm.experiments import rules
from acoustic_mlm.experiments.declaration import Round

log = logging.getLogger(__name__)
Run = tuple[str, str, float, int]  # (cell, arm, rate, seed)


class _Limit(Exception):
    """The procedure trained as many runs as it was allowed."""


def current(rnd: Round) -> pd.DataFrame:
    """The runs the procedure reads: the tables' rows of this round and of the earlier ones, checked as
    judge checks them; none before the round's first run."""
    if not (rnd.tables / "runs.csv").exists():
        return pd.DataFrame({c.name: pd.Series(dtype=float if c.kind != "text" else object) for c in R.columns()})
    return J.read_round(rnd, partial=True)


def screen(runs: pd.DataFrame, flags: pd.Series, par: dict, bad: str, good: str, lr: float) -> bool:
    """Step 4's question on the first seed: the unstabilized arm unstable, the stabilized arm run, stable
    and (by rules 2) trained, so that the pair could prevent and is worth the other seeds."""
    first = runs["seed"] == par["seeds"][0]
    b_rows, g_rows = rules.at_rate(runs, par, bad, lr) & first, rules.at_rate(runs, par, good, lr) & first
    learned = par["rules"] == 1 or bool(runs.loc[g_rows, "trained"].all())
    return bool(flags[b_rows].any()) and bool(g_rows.any()) and not bool(flags[g_rows].any()) and learned


def steps(rnd: Round, par: dict, runs_of: Callable[[list[Run]], pd.DataFrame]) -> str:
    """Steps 1-4 at the size, `runs_of` training the runs asked for that the tables lack and returning the
    runs then; how the procedure ended."""
    size, base, (first, *rest) = par["size"], par["baseline"], par["seeds"]
    runs = runs_of([(size, base, lr, first) for lr in par["rates"]])
    best = rules.best_rate(runs, par)
    if best is None:
        return "no best rate: no run of the scan ended finite"
    runs = runs_of([(size, base, best, seed) for seed in rest])
    if not rules.baseline_learns(runs, par, best):
        return f"(a) fails at the best rate {best:g}: the size is given up"
    above = rules.rates_above(par, best)
    for lr in above:
        if rules.spent_s(runs, rnd.number) > par["budget_s"]:
            return f"budget of {par['budget_s']:g} s spent before every arm ran at {lr:g}"
        runs = runs_of([(size, arm, lr, first) for arm in sorted(rnd.arms)])
    for lr in above:
        for bad, good in par["pairs"]:
            if rules.spent_s(runs, rnd.number) > par["budget_s"]:
                return f"budget of {par['budget_s']:g} s spent before (b) was found"
            if not screen(runs, rules.sizing_flags(runs, par, best), par, bad, good, lr):
                continue
            runs = runs_of([(size, arm, lr, seed) for seed in rest for arm in (bad, good)])
            if rules.prevents(runs, rules.sizing_flags(runs, par, best), par, bad, good, lr):
                return f"(b) found: {good} prevents {bad}'s instability at {lr:g}"
    return "(b) not found at any rate above the best"


def procedure(rnd: Round, train: Callable[[Run], dict | None], limit: int | None = None) -> list[dict]:
    """Run the sizing procedure of the round, `train` training one run the tables lack and appending its
    record (its row, or None when the tables held it meanwhile); at most `limit` runs trained. The rows
    written."""
    par = rules.sizing_params(rnd)
    written: list[dict] = []

    def runs_of(wanted: list[Run]) -> pd.DataFrame:
        held = {(r.size, r.arm, f"{r.lr:.12g}", int(r.seed)) for r in current(rnd).itertuples()}
        for cell, arm, lr, seed in wanted:
            if (cell, arm, f"{lr:.12g}", seed) in held:
                continue
            if limit is not None and len(written) >= limit:
                raise _Limit
            row = train((cell, arm, lr, seed))
            if row is not None:
                written.append(row)
        return current(rnd)

    try:
        ended = steps(rnd, par, runs_of)
    except _Limit:
        ended = f"stopped after {limit} run(s) (--limit); run again to go on"
    log.info("%s: sizing procedure at %s: %s", rnd.name, par["size"], ended)
    return written
