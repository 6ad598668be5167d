"""The rules a round is judged by, one function per kind of round (a declaration's `rules:`), each
reading only the round's checked tables (experiments.record) and its declaration:

    pairs       promises between two arms in one cell: Fisher's exact test on the trained shares,
                one-sided at the promise's alpha; an A/A pair (role: calibration) beside them
    fp16_gains  PB-Relax against fairseq's unfused order in fp16 at a crossing and a low qk gain
    pilot       a pilot's runs and the low gain its rule takes from them
    sizing      the sizing procedure's verdict at one size: (a) learns, (b) an instability prevented,
                (c) fast enough
    decisive    the decisive map's rules (report.decisive), on its published runs.csv
    range       PB-Relax's float16 range over random instances (its instances.csv)

An undecided promise is stated with its estimate and the 95 % Newcombe interval of the difference of
shares; a promise in a family also gets its Holm-adjusted p (experiments.stats).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts.checked import ReadError, read_csv_table
from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import record as R
from acoustic_mlm.experiments.declaration import Promise, Round
from acoustic_mlm.experiments.stats import fisher_greater, newcombe

FP16_MAX = 65504.0


def interval(k_a: int, n_a: int, k_b: int, n_b: int) -> dict:
    """An undecided comparison's estimate and 95 % Newcombe interval of the difference of shares."""
    d = newcombe(k_a, n_a, k_b, n_b)
    return {"difference": round(d["estimate"], 4), "interval_95": [round(d["low"], 4), round(d["high"], 4)]}


def decide(p_for: float, p_against: float, alpha: float) -> str:
    """A one-sided promise's verdict: supported when its test's p is below alpha, contradicted when the
    reverse test's is, else undecided."""
    if p_for < alpha:
        return "supported"
    return "contradicted" if p_against < alpha else "undecided"


# ----------------------------------------------------------------------------- pairs


def _select(runs: pd.DataFrame, rnd: Round, arm: str, cell: str, seeds) -> pd.DataFrame:
    """A promise side's runs: one arm in one cell (at the cell's rate), the given seeds."""
    lr = rnd.cells[cell]["lr"]
    return runs[
        (runs["size"] == cell) & (runs["arm"] == arm) & np.isclose(runs["lr"], lr) & runs["seed"].isin(list(seeds))
    ]


def pairs_plan(rnd: Round) -> list[tuple[str, str, float, int]]:
    """Every run of a pairs or an equivalence round: each promise's two sides (the against arm in its own
    cell where the promise names one) with their seeds, in declaration order, and the sensitivity grid."""
    plan = []
    for p in rnd.promises:
        plan += [(p.cell, p.favoured, rnd.cells[p.cell]["lr"], s) for s in p.seeds]
        plan += [(p.cell_against, p.against, rnd.cells[p.cell_against]["lr"], s) for s in p.seeds_against]
    if rnd.sensitivity:
        sv = rnd.sensitivity
        plan += [(sv["cell"], arm, float(lr), sv["seed"]) for arm in sv["arms"] for lr in sv["rates"]]
    return list(dict.fromkeys(plan))


def reference_run(rnd: Round) -> tuple[float, float]:
    """Instability (iv)'s reference: one published run's last attention logit and final loss."""
    ref = rnd.reference
    path = Path(ref["tables"]) / "runs.csv"
    runs = R.read_runs(path)
    r = runs[
        (runs["size"] == ref["size"])
        & (runs["arm"] == ref["arm"])
        & np.isclose(runs["lr"], ref["lr"])
        & (runs["seed"] == ref["seed"])
    ]
    if len(r) != 1:
        raise ReadError(f"{path}: no single {ref['arm']} run at {ref['lr']:g}, seed {ref['seed']} (the reference)")
    return float(r["attn_logit_final"].iloc[0]), float(r["final_loss"].iloc[0])


def compare_pair(runs: pd.DataFrame, rnd: Round, p: Promise, flags: pd.Series) -> dict:
    """One promise (or the A/A pair) by the round's rules; `finished` False until every run is in."""
    a = _select(runs, rnd, p.favoured, p.cell, p.seeds)
    b = _select(runs, rnd, p.against, p.cell_against, p.seeds_against)
    out = {"id": p.id, "promise": p.says, "size": p.cell, "lr": rnd.cells[p.cell]["lr"], "a": p.favoured}
    out |= {"size_b": p.cell_against} if p.cell_against != p.cell else {}  # the against arm in another cell
    out |= {"b": p.against, "n_a": len(a), "n_b": len(b)} | ({"role": p.role} if p.role == "secondary" else {})
    out["finished"] = bool(len(a) == len(p.seeds) and len(b) == len(p.seeds_against))
    if not out["finished"]:
        return {**out, "verdict": "not finished"}
    ta, tb = int(R.trained(a).sum()), int(R.trained(b).sum())
    p_for, p_against = fisher_greater(ta, len(a), tb, len(b)), fisher_greater(tb, len(b), ta, len(a))
    out |= {"trained_a": ta, "trained_b": tb, "unstable_a": int(flags[a.index].sum())}
    out |= {"unstable_b": int(flags[b.index].sum()), "p_for": p_for, "p_against": p_against}
    if p.role == "secondary":
        return {**out, **interval(ta, len(a), tb, len(b)), "verdict": "estimated (secondary: no verdict)"}
    verdict = decide(p_for, p_against, p.alpha)
    if verdict == "undecided":
        out |= interval(ta, len(a), tb, len(b))
    return {**out, "verdict": verdict}


def judge_pairs(rnd: Round, runs: pd.DataFrame) -> dict:
    ref_logit, ref_loss = reference_run(rnd)
    flags = R.unstable(runs, ref_logit, ref_loss) if len(runs) else pd.Series(dtype=bool)
    confirm = [p for p in rnd.promises if p.role == "confirmatory"]
    alphas = {p.alpha for p in confirm}
    result = {"round": rnd.number, "alpha": alphas.pop() if len(alphas) == 1 else sorted(alphas)}
    result["verdicts"] = [compare_pair(runs, rnd, p, flags) for p in confirm]
    secondary = [compare_pair(runs, rnd, p, flags) for p in rnd.promises if p.role == "secondary"]
    result |= {"secondary": secondary} if secondary else {}
    for p in rnd.promises:
        if p.role != "calibration":
            continue
        aa = compare_pair(runs, rnd, p, flags)
        aa["calibrated"] = None if not aa["finished"] else bool(aa["verdict"] == "undecided")
        if aa["finished"]:  # what this A/A pair can show: its test's chance to reject between identical arms
            from acoustic_mlm.report.power import fisher_power

            share = (aa["trained_a"] + aa["trained_b"]) / (aa["n_a"] + aa["n_b"])
            aa["rejects_identical_arms"] = fisher_power(share, share, aa["n_a"], aa["n_b"], alpha=p.alpha)
        result["aa"] = aa
        if aa["calibrated"] is False:
            result["note"] = "the A/A pair was decided: every verdict of this round is not calibrated"
    return result


def pairs_raw_p(rnd: Round, runs: pd.DataFrame) -> dict[str, float]:
    """Each confirmatory promise's raw one-sided p (NaN until finished)."""
    out = {}
    for v in judge_pairs(rnd, runs)["verdicts"]:
        out[v["id"]] = v.get("p_for", math.nan)
    return out


# ----------------------------------------------------------------------------- the LR sensitivity


def sensitivity(rnd: Round, runs: pd.DataFrame) -> pd.DataFrame:
    """Each sensitivity arm's final loss at each grid rate (one seed) and Wortsman et al.'s LR sensitivity
    E_lr[min(L, L0) - L*] over the grid (stability_map.lr_sensitivity); an arm is summarised only once
    its whole grid is in."""
    from acoustic_mlm.report import stability_map

    sv = rnd.sensitivity
    rows = []
    for arm in sv["arms"]:
        r = runs[(runs["size"] == sv["cell"]) & (runs["arm"] == arm) & (runs["seed"] == sv["seed"])]
        r = r.sort_values("lr")
        done = len(r) == len(sv["rates"])
        finals = r["final_loss"].to_numpy(dtype=float)
        best = float(np.nanmin(finals)) if done and np.isfinite(finals).any() else math.nan
        value = stability_map.lr_sensitivity(finals, r["first_loss"].to_numpy(dtype=float)) if done else math.nan
        for lr, final in zip(r["lr"], finals):
            rows.append({"arm": arm, "lr": float(lr), "final_loss": float(final)})
        rows.append({"arm": arm, "lr": math.nan, "final_loss": best, "lr_sensitivity": value, "finished": done})
    return pd.DataFrame(rows, columns=["arm", "lr", "final_loss", "lr_sensitivity", "finished"])


# ----------------------------------------------------------------------------- fp16 gains and the pilot


def gains(rnd: Round) -> tuple[float, float]:
    """(low, high) qk gain: the low cell's own, or the one its pilot's rule takes from the pilot's tables."""
    high = rnd.cells["high"]["gain"]
    if "gain" in rnd.cells["low"]:
        return rnd.cells["low"]["gain"], high
    from acoustic_mlm.experiments import declaration

    pilot = declaration.load(rnd.pilot)
    low = low_gain(pilot, R.read_runs(pilot.tables / "runs.csv", fp16=True))
    if low is None:
        raise ReadError(f"{pilot.tables / 'runs.csv'}: no pilot run qualifies for round {rnd.number}'s low gain yet")
    return low, high


def size_name(rnd: Round, gain: float) -> str:
    return f"{rnd.params.get('size', 'S1')}-fp16-g{gain:g}"


def fp16_plan(rnd: Round) -> list[tuple[str, str, float, int]]:
    low, high = gains(rnd)
    lr = rnd.cells["high"]["lr"]
    arms = list(rnd.arms)
    hi = rnd.seeds["high"]
    lo = rnd.seeds["low"]
    return [(size_name(rnd, high), a, lr, s) for a in arms for s in hi] + [
        (size_name(rnd, low), a, lr, s) for a in arms for s in lo
    ]


def judge_fp16(rnd: Round, runs: pd.DataFrame) -> dict:
    """A round's verdict by round 4's rules (round 5 keeps them): PB-Relax (the promise's favoured arm)
    trains through more often than the unfused order at the crossing gain, while at the low gain the
    logits stay in float16's range and the unfused order trains (the cells are as the rules need)."""
    (p,) = rnd.promises
    fav, other = p.favoured, p.against
    steps = int(rnd.params["steps"])
    low, high = gains(rnd)
    n_high, n_low = len(rnd.seeds["high"]), len(rnd.seeds["low"])

    def sel(gain, arm, seeds):
        return runs[(runs["size"] == size_name(rnd, gain)) & (runs["arm"] == arm) & runs["seed"].isin(list(seeds))]

    high_a, high_b = (sel(high, arm, rnd.seeds["high"]) for arm in (fav, other))
    low_a, low_b = (sel(low, arm, rnd.seeds["low"]) for arm in (fav, other))
    finished = (len(high_a), len(high_b), len(low_a), len(low_b)) == (n_high, n_high, n_low, n_low)
    out: dict = {"round": rnd.number, "alpha": p.alpha, "gains": [low, high], "finished": finished}
    if not finished:
        return {**out, "verdict": "not finished"}
    trained = lambda r: int(R.trained_through(r, steps).sum())  # noqa: E731
    ta, tb = trained(high_a), trained(high_b)
    out |= {"trained_high": {fav: ta, other: tb}, "trained_low": {fav: trained(low_a), other: trained(low_b)}}
    out |= {"p_for": fisher_greater(ta, n_high, tb, n_high), "p_against": fisher_greater(tb, n_high, ta, n_high)}
    crossed = bool((high_a["attn_logit_max"] > FP16_MAX).any())
    in_range = bool((pd.concat([low_a, low_b])["attn_logit_max"] < FP16_MAX).all())
    control = trained(low_b) >= 1
    out |= {"high_gain_crossed": crossed, "low_gain_in_range": in_range, "unfused_trains_in_range": control}
    if out["p_against"] < p.alpha:
        verdict = "contradicted"
    elif out["p_for"] < p.alpha and crossed and in_range and control:
        verdict = "supported"
    elif out["p_for"] < p.alpha:
        verdict = "undecided: the cells are not as the rules need"
    else:
        verdict = "undecided"
    if verdict == "undecided":
        out |= interval(ta, n_high, tb, n_high)
    return {**out, "verdict": verdict}


def low_gain(pilot: Round, runs: pd.DataFrame) -> float | None:
    """The pilot's rule: the largest gain whose run trained through with its largest attention logit at
    most FP16_MAX / margin; None when no pilot run qualifies."""
    margin, steps = float(pilot.params["margin"]), int(pilot.params["steps"])
    ok = R.trained_through(runs, steps) & (runs["attn_logit_max"] <= FP16_MAX / margin)
    return float(runs.loc[ok, "qk_gain"].max()) if ok.any() else None


def pilot_plan(rnd: Round) -> list[tuple[str, str, float, int]]:
    (arm,) = rnd.arms
    (seed,) = rnd.seeds["pilot"]
    return [
        (size_name(rnd, c["gain"]), arm, c["lr"], seed) for c in sorted(rnd.cells.values(), key=lambda c: -c["gain"])
    ]


def judge_pilot(rnd: Round, runs: pd.DataFrame) -> dict:
    steps, margin = int(rnd.params["steps"]), float(rnd.params["margin"])
    rows = [
        {
            "qk_gain": float(r.qk_gain),
            "attn_logit_max": float(r.attn_logit_max),
            "updates": int(r.updates),
            "trained_through": bool(t),
            "final_loss": float(r.final_loss),
        }
        for r, t in zip(runs.itertuples(), R.trained_through(runs, steps))
    ]
    finished = {float(g) for g in runs["qk_gain"]} >= {c["gain"] for c in rnd.cells.values()}
    return {
        "round": rnd.number,
        "margin": margin,
        "limit": FP16_MAX / margin,
        "runs": rows,
        "finished": finished,
        "gain_low": low_gain(rnd, runs) if len(runs) else None,
    }


# ----------------------------------------------------------------------------- the sizing procedure


def sizing_plan(rnd: Round) -> list[tuple[str, str, float, int]]:
    """Every run the sizing procedure may train (it is adaptive: a finished round holds a subset)."""
    rates = [float(x) for x in rnd.params["rates"]]
    return [(c, a, lr, s) for c in rnd.cells for a in rnd.arms for lr in rates for s in rnd.seeds["procedure"]]


def sizing_params(rnd: Round) -> dict:
    """A sizing round's params, checked against its declaration: the size it judges (a cell), the rules
    (1: every spike counts; 2: late spikes only, the stabilized arm must train), the baseline and the
    pairs (unstabilized, stabilized: arms of the round), the rates (rising), the procedure's seeds (the
    first scans, the others repeat), the budget of run seconds and (c)'s limit. A fault is one UserError
    line naming the key."""
    par = rnd.params

    def need(key: str, ok: bool, what: str) -> None:
        if not ok:
            raise UserError(f"{rnd.path}: 'params.{key}' is {par.get(key)!r}: {what}")

    for key in ("size", "rules", "baseline", "rates", "pairs", "budget_s", "c_limit_s"):
        need(key, key in par, "missing; a sizing round names it")
    need("size", par["size"] in rnd.cells, "not a cell of the round")
    need("rules", par["rules"] in (1, 2), "not 1 or 2 (the sizing rules of round 1 or round 2)")
    need("baseline", par["baseline"] in rnd.arms, "not an arm of the round")
    pairs = par["pairs"] if isinstance(par["pairs"], list) else []
    ok = bool(pairs) and all(isinstance(x, list) and len(x) == 2 and set(x) <= set(rnd.arms) for x in pairs)
    need("pairs", ok, "not a list of [unstabilized arm, stabilized arm] pairs of the round's arms")
    rates = par["rates"] if isinstance(par["rates"], list) else []
    ok = len(rates) > 1 and all(isinstance(x, (int, float)) and x > 0 for x in rates)
    need("rates", ok, "not a list of two or more positive rates")
    for key in ("budget_s", "c_limit_s"):
        need(key, isinstance(par[key], (int, float)) and par[key] > 0, "not a positive number of seconds")
    seeds = rnd.seeds.get("procedure", ())
    if len(seeds) < 2:
        raise UserError(f"{rnd.path}: 'seeds.procedure' is {list(seeds)}: the procedure needs two seeds or more")
    return {
        "size": par["size"],
        "rules": int(par["rules"]),
        "baseline": par["baseline"],
        "pairs": [tuple(x) for x in pairs],
        "rates": sorted(float(x) for x in rates),
        "seeds": tuple(seeds),
        "budget_s": float(par["budget_s"]),
        "c_limit_s": float(par["c_limit_s"]),
    }


def best_rate(runs: pd.DataFrame, par: dict) -> float | None:
    """The baseline's best rate at the size: the rate of the lowest final loss of its first seed's runs (the
    lower rate within 0.02 bits); None while it has no finite final loss."""
    first = runs[(runs["size"] == par["size"]) & (runs["arm"] == par["baseline"]) & (runs["seed"] == par["seeds"][0])]
    first = first[np.isfinite(first["final_loss"].to_numpy(dtype=float))].sort_values("lr")
    if first.empty:
        return None
    return float(first[first["final_loss"] <= first["final_loss"].min() + 0.02]["lr"].iloc[0])


def rates_above(par: dict, best: float) -> list[float]:
    """The scan's rates above the best one, rising: where (b) looks."""
    return [lr for lr in par["rates"] if lr > best * 1.0001]


def at_rate(runs: pd.DataFrame, par: dict, arm: str, lr: float) -> pd.Series:
    """The rows of one arm at one rate of the size."""
    return (runs["size"] == par["size"]) & (runs["arm"] == arm) & np.isclose(runs["lr"], lr)


def baseline_learns(runs: pd.DataFrame, par: dict, best: float) -> bool:
    """(a): the baseline at its best rate ran on every procedure seed and trained on each."""
    at_best = runs[at_rate(runs, par, par["baseline"], best)]
    return bool(len(at_best) == len(par["seeds"]) and at_best["trained"].all())


def sizing_flags(runs: pd.DataFrame, par: dict, best: float) -> pd.Series:
    """Each run's instability (record.unstable), (iv)'s reference the baseline's best-rate run of the same
    seed; by rules 1 every spike counts, by rules 2 only late ones."""
    base = runs[at_rate(runs, par, par["baseline"], best)].set_index("seed")
    ref_logit, ref_loss = runs["seed"].map(base["attn_logit_final"]), runs["seed"].map(base["final_loss"])
    return R.unstable(runs, ref_logit, ref_loss, late_only=par["rules"] > 1)


def prevents(runs: pd.DataFrame, flags: pd.Series, par: dict, bad: str, good: str, lr: float) -> dict | None:
    """(b) at one rate and pair: `bad` (without the stabilizer) unstable in at least 2 of the procedure's
    seeds, `good` (with it) in none and, by rules 2, trained in all; each arm run on every seed. The pair's
    entry of the verdict, or None."""
    n = len(par["seeds"])
    b_rows, g_rows = at_rate(runs, par, bad, lr), at_rate(runs, par, good, lr)
    if b_rows.sum() < n or g_rows.sum() < n:
        return None
    learned = par["rules"] == 1 or bool(runs.loc[g_rows, "trained"].all())
    if int(flags[b_rows].sum()) >= 2 and not bool(flags[g_rows].any()) and learned:
        return {"lr": lr, "without": bad, "with": good, "unstable_without": int(flags[b_rows].sum())}
    return None


def spent_s(runs: pd.DataFrame, number: int) -> float:
    """The round's run time so far: the wall seconds of its own runs, every size."""
    return float(runs.loc[runs["round"] == number, "wall_time_s"].sum())


def judge_sizing(rnd: Round, runs: pd.DataFrame) -> dict:
    """docs/stability.md's sizing procedure re-read from its runs at one size: the baseline's best rate
    (best_rate), (a) the baseline trained on every procedure seed there, (b) the first rate above it and
    pair where the stabilizer prevents an instability (prevents), whether the round's run time passed its
    budget without (b), (c) the longest run within params.c_limit_s seconds."""
    par = sizing_params(rnd)
    size, rules = par["size"], par["rules"]
    runs = runs[runs["round"] <= rnd.number]
    spent = spent_s(runs, rnd.number)
    runs = runs[runs["size"] == size]
    verdict: dict = {"size": size} | ({"rules": rules} if rules > 1 else {})
    best = best_rate(runs, par)
    verdict["best_rate"] = best
    at_best = runs[at_rate(runs, par, par["baseline"], best)] if best is not None else runs.iloc[:0]
    verdict["a_trained"] = f"{int(at_best['trained'].sum())} of {len(at_best)}"
    verdict["a"] = best is not None and baseline_learns(runs, par, best)
    if not verdict["a"]:
        return verdict
    flags = sizing_flags(runs, par, best)
    prevented = []
    for lr in rates_above(par, best):
        for bad, good in par["pairs"]:
            entry = None if prevented else prevents(runs, flags, par, bad, good, lr)
            prevented += [entry] if entry else []
    verdict["b_prevented"] = prevented
    verdict["b"] = bool(prevented)
    verdict["stopped_at_budget"] = bool(not prevented and spent > par["budget_s"])
    verdict["c_longest_run_s"] = float(runs["wall_time_s"].max())
    verdict["c"] = bool(runs["wall_time_s"].max() <= par["c_limit_s"])
    return verdict


# ----------------------------------------------------------------------------- the fp16 range


def range_holds(table: pd.DataFrame, tolerance: float, floor: float, forward_only: bool = False) -> pd.Series:
    """The range round's rule, per instance: the output finite and its relative error within `tolerance`
    times the float16-mantissa baseline's + `floor`; unless `forward_only`, the gradients too (finite, and
    their largest relative error within the same bound of the baseline's gradient error)."""
    ok = table["finite_output"].astype(bool) & (table["rel_error"] <= tolerance * table["baseline_rel_error"] + floor)
    if forward_only:
        return ok
    grads = table["grad_rel_error"] <= tolerance * table["baseline_grad_rel_error"] + floor
    return ok & table["finite_grads"].astype(bool) & grads


def judge_range(rnd: Round) -> dict:
    """PB-Relax's range promise from its measured instances: a path holds at a logit when every instance
    holds by `range_holds` (the rule, applied here from the measured errors); its range is the largest logit
    up to which it holds at every tested logit."""
    path = rnd.tables / "instances.csv"
    cols = ["path", "logit_max", "instance", "finite_output", "finite_grads", "rel_error", "baseline_rel_error"]
    cols += ["grad_rel_error", "baseline_grad_rel_error"]
    table = read_csv_table(
        path,
        "the range's instances",
        "benchmarks/attention_fp16_range.py",
        cols,
        ints=["instance"],
        finite=["logit_max"],
        numbers=["rel_error", "baseline_rel_error", "grad_rel_error", "baseline_grad_rel_error"],
        choices={c: R.BOOLS for c in ("finite_output", "finite_grads")},
    )
    for c in ("finite_output", "finite_grads"):
        table[c] = table[c] == "True"
    if table.duplicated(["path", "logit_max", "instance"]).any():
        i = int(np.flatnonzero(table.duplicated(["path", "logit_max", "instance"]).to_numpy())[0])
        raise ReadError(f"{path}: row {i + 2} repeats a path, logit and instance; each is measured once")
    tol, floor = float(rnd.params["tolerance"]), float(rnd.params["floor"])
    table["holds"] = range_holds(table, tol, floor)
    table["holds_forward"] = range_holds(table, tol, floor, forward_only=True)
    ranges, forward = {}, {}
    for name, rows in table.groupby("path"):
        per = rows.groupby("logit_max").agg(n=("instance", "size"), h=("holds", "sum"), f=("holds_forward", "sum"))
        for out, column in ((ranges, "h"), (forward, "f")):
            held = (per[column] == per["n"]).to_numpy()
            upto = held.argmin() if not held.all() else len(held)
            out[name] = float(per.index[upto - 1]) if upto > 0 else None
    relax, unfused = ranges.get("pb_relax"), ranges.get("unfused")
    return {
        "instances": int(table["instance"].nunique()),
        "logits": sorted(float(x) for x in table["logit_max"].unique()),
        "tolerance": f"<= {tol} x the float16-mantissa baseline's error + {floor}",
        "range": ranges,
        "range_forward_only": forward,
        "verdict": "supported" if (relax or 0) > (unfused or 0) else "not supported",
    }


# ----------------------------------------------------------------------------- the dose-response


def dose_plan(rnd: Round) -> list[tuple[str, str, float, int]]:
    """Every run of a dose-response round, promise by promise in declaration order (the primary first);
    within a promise seed by seed, each seed at every rate in both arms, so that a round stopped midway
    holds whole seeds of both arms."""
    plan = []
    for p in rnd.promises:
        for s_fav, s_against in zip(p.seeds, p.seeds_against):
            for lr in rnd.cells[p.cell]["rates"]:
                plan.append((p.cell, p.favoured, lr, s_fav))
            for lr in rnd.cells[p.cell_against]["rates"]:
                plan.append((p.cell_against, p.against, lr, s_against))
    return list(dict.fromkeys(plan))


def _dose_rows(runs: pd.DataFrame, rnd: Round, arm: str, cell: str, seeds) -> pd.DataFrame:
    rates = rnd.cells[cell]["rates"]
    at = np.isclose(runs["lr"].to_numpy(dtype=float)[:, None], np.array(rates)[None, :]).any(axis=1)
    return runs[(runs["size"] == cell) & (runs["arm"] == arm) & at & runs["seed"].isin(list(seeds))]


def compare_dose(runs: pd.DataFrame, rnd: Round, p: Promise) -> dict:
    """One dose-response promise: the favoured arm's breakdown rate against the other's (experiments.dose).
    The decision is the exact conditional test, one-sided at the promise's alpha (a secondary promise is
    estimated, not decided); the estimate is the fitted shift in log rate with its 95 % profile interval,
    and each arm's breakdown rate (where half its runs train)."""
    from acoustic_mlm.experiments import dose

    a = _dose_rows(runs, rnd, p.favoured, p.cell, p.seeds)
    b = _dose_rows(runs, rnd, p.against, p.cell_against, p.seeds_against)
    n_a = len(p.seeds) * len(rnd.cells[p.cell]["rates"])
    n_b = len(p.seeds_against) * len(rnd.cells[p.cell_against]["rates"])
    out = {"id": p.id, "promise": p.says, "role": p.role, "a": f"{p.favoured} ({p.cell})"}
    out |= {"b": f"{p.against} ({p.cell_against})", "n_a": len(a), "n_b": len(b)}
    out |= {"seeds_per_rate": len(p.seeds), "finished": bool(len(a) == n_a and len(b) == n_b)}
    if not out["finished"]:
        return {**out, "verdict": "not finished"}
    both = pd.concat([a.assign(favoured=1), b.assign(favoured=0)])
    x, g, y = np.log(both["lr"].to_numpy(dtype=float)), both["favoured"].to_numpy(), R.trained(both).to_numpy()
    table = []
    for lr in sorted(set(rnd.cells[p.cell]["rates"]) | set(rnd.cells[p.cell_against]["rates"])):
        at = np.isclose(both["lr"], lr)
        table.append(
            {
                "lr": lr,
                "trained_a": int(y[at & (g == 1)].sum()),
                "n_a": int((at & (g == 1)).sum()),
                "trained_b": int(y[at & (g == 0)].sum()),
                "n_b": int((at & (g == 0)).sum()),
            }
        )
    strata = [(t["trained_a"], t["n_a"], t["trained_b"], t["n_b"]) for t in table if t["n_a"] and t["n_b"]]
    reverse = [(kb, nb, ka, na) for ka, na, kb, nb in strata]
    p_for, p_against = dose.exact_shift_p(strata), dose.exact_shift_p(reverse)
    best = dose.fit(x, g, y)
    out |= {"by_rate": table, "p_for": p_for, "p_against": p_against}
    out |= {"trained_a": int(y[g == 1].sum()), "trained_b": int(y[g == 0].sum())}
    if best["separated"]:  # no shift to estimate: the shares trained over every rate, with their interval
        reading = "an arm's runs are separated by rate: no curve is estimable; the difference of the shares trained"
        out |= {"shift_log_rate": None, "reading": reading + " over every rate instead"}
        out |= interval(out["trained_a"], len(a), out["trained_b"], len(b))
    else:
        ci = dose.shift_interval(x, g, y, best)
        out |= {
            "shift_log_rate": round(best["shift"], 4),
            "shift_interval_95": [round(ci["low"], 4), round(ci["high"], 4)],
            "interval_open": [ci["low_open"], ci["high_open"]],
            "breakdown_rate_ratio": round(math.exp(best["shift"]), 4),
            "breakdown_rate_a": round(math.exp(best["midpoint"] + best["shift"]), 5),
            "breakdown_rate_b": round(math.exp(best["midpoint"]), 5),
            "slope": round(best["slope"], 3),
        }
    if p.role == "secondary":
        return {**out, "verdict": "estimated (secondary: no verdict)"}
    return {**out, "alpha": p.alpha, "verdict": decide(p_for, p_against, p.alpha)}


def judge_dose(rnd: Round, runs: pd.DataFrame) -> dict:
    """A dose-response round: each promise compared (compare_dose), the primary ones first."""
    return {"round": rnd.number, "verdicts": [compare_dose(runs, rnd, p) for p in rnd.promises]}


# ----------------------------------------------------------------------------- equivalence (an A/A that can fail)


def welch_interval(a, b, level: float) -> dict:
    """mean(a) - mean(b) with its Welch t interval at `level` (scipy.stats.ttest_ind, unequal variances)."""
    from scipy.stats import ttest_ind

    ci = ttest_ind(a, b, equal_var=False).confidence_interval(confidence_level=level)
    return {"difference": float(np.mean(a) - np.mean(b)), "low": float(ci.low), "high": float(ci.high)}


def judge_equivalence(rnd: Round, runs: pd.DataFrame) -> dict:
    """An A/A pair that can fail, with its positive control. The outcome is each run's final codebook-0
    loss (bits); each promise's statistic is the difference of its sides' means with its Welch interval at
    params.level (0.90: two one-sided tests at 0.05, Schuirmann 1987). The A/A pair (role calibration) is
    *equivalent* when its whole interval lies within (-margin, margin), else the round is not calibrated;
    the positive control (role control: the same arm at a planted difference) is *detected* when its whole
    interval lies outside [-margin, margin], else the test could not see a difference of that size and the
    A/A's equivalence calibrates nothing. The verdict: calibrated only when both hold."""
    margin, level = float(rnd.params["margin"]), float(rnd.params["level"])
    out: dict = {"round": rnd.number, "outcome": "final_loss", "margin_bits": margin, "level": level, "pairs": []}
    state = {}
    for p in rnd.promises:
        a = _select(runs, rnd, p.favoured, p.cell, p.seeds)
        b = _select(runs, rnd, p.against, p.cell_against, p.seeds_against)
        row = {"id": p.id, "promise": p.says, "role": p.role, "a": f"{p.favoured} ({p.cell})"}
        row |= {"b": f"{p.against} ({p.cell_against})", "n_a": len(a), "n_b": len(b)}
        finished = len(a) == len(p.seeds) and len(b) == len(p.seeds_against)
        if not finished:
            out["pairs"].append({**row, "reading": "not finished"})
            state[p.role] = None
            continue
        w = welch_interval(a["final_loss"].to_numpy(float), b["final_loss"].to_numpy(float), level)
        row |= {"mean_a": float(a["final_loss"].mean()), "mean_b": float(b["final_loss"].mean())}
        row |= {"sd_a": float(a["final_loss"].std(ddof=1)), "sd_b": float(b["final_loss"].std(ddof=1))}
        row |= {
            "difference": round(w["difference"], 5),
            f"interval_{round(level * 100)}": [round(w["low"], 5), round(w["high"], 5)],
        }
        if p.role == "calibration":
            held = bool(-margin < w["low"] and w["high"] < margin)
            row["reading"] = "equivalent within the margin" if held else "not shown equivalent: the A/A pair failed"
        else:
            held = bool(w["low"] > margin or w["high"] < -margin)
            row["reading"] = "detected: outside the margin" if held else "not detected: the test cannot see it"
        state[p.role] = held
        out["pairs"].append(row)
    if None in state.values():
        out["verdict"] = "not finished"
    elif state.get("calibration") and state.get("control"):
        out["verdict"] = "calibrated: the A/A pair is equivalent and the planted difference is detected"
    elif not state.get("calibration"):
        out["verdict"] = "not calibrated: the A/A pair is not shown equivalent"
    else:
        out["verdict"] = "uninformative: the A/A pair is equivalent but the planted difference is not detected"
    return out
