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
from acoustic_mlm.experiments import record as R
from acoustic_mlm.experiments.declaration import Promise, Round
from acoustic_mlm.experiments.stats import fisher_greater, newcombe

FP16_MAX = 65504.0


def interval(k_a: int, n_a: int, k_b: int, n_b: int) -> dict:
    """An undecided comparison's estimate and 95 % Newcombe interval of the difference of shares."""
    d = newcombe(k_a, n_a, k_b, n_b)
    return {"difference": round(d["estimate"], 4), "interval_95": [round(d["low"], 4), round(d["high"], 4)]}


# ----------------------------------------------------------------------------- pairs


def _select(runs: pd.DataFrame, rnd: Round, arm: str, cell: str, seeds) -> pd.DataFrame:
    lr = rnd.cells[cell]["lr"]
    return runs[
        (runs["size"] == cell) & (runs["arm"] == arm) & np.isclose(runs["lr"], lr) & runs["seed"].isin(list(seeds))
    ]


def pairs_plan(rnd: Round) -> list[tuple[str, str, float, int]]:
    """Every run of a pairs round: each promise's two arms with their seeds, and the sensitivity grid."""
    plan = []
    for p in rnd.promises:
        lr = rnd.cells[p.cell]["lr"]
        plan += [(p.cell, p.favoured, lr, s) for s in p.seeds] + [(p.cell, p.against, lr, s) for s in p.seeds_against]
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
    b = _select(runs, rnd, p.against, p.cell, p.seeds_against)
    out = {"id": p.id, "promise": p.says, "size": p.cell, "lr": rnd.cells[p.cell]["lr"], "a": p.favoured}
    out |= {"b": p.against, "n_a": len(a), "n_b": len(b)}
    out["finished"] = bool(len(a) == len(p.seeds) and len(b) == len(p.seeds_against))
    if not out["finished"]:
        return {**out, "verdict": "not finished"}
    ta, tb = int(R.trained(a).sum()), int(R.trained(b).sum())
    p_for, p_against = fisher_greater(ta, len(a), tb, len(b)), fisher_greater(tb, len(b), ta, len(a))
    out |= {"trained_a": ta, "trained_b": tb, "unstable_a": int(flags[a.index].sum())}
    out |= {"unstable_b": int(flags[b.index].sum()), "p_for": p_for, "p_against": p_against}
    if p_for < p.alpha:
        verdict = "supported"
    elif p_against < p.alpha:
        verdict = "contradicted"
    else:
        verdict = "undecided"
        out |= interval(ta, len(a), tb, len(b))
    return {**out, "verdict": verdict}


def judge_pairs(rnd: Round, runs: pd.DataFrame) -> dict:
    ref_logit, ref_loss = reference_run(rnd)
    flags = R.unstable(runs, ref_logit, ref_loss) if len(runs) else pd.Series(dtype=bool)
    confirm = [p for p in rnd.promises if p.role == "confirmatory"]
    alphas = {p.alpha for p in confirm}
    result = {"round": rnd.number, "alpha": alphas.pop() if len(alphas) == 1 else sorted(alphas)}
    result["verdicts"] = [compare_pair(runs, rnd, p, flags) for p in confirm]
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


def judge_sizing(rnd: Round, runs: pd.DataFrame) -> dict:
    """docs/stability.md's sizing procedure re-read from its runs at one size: the baseline's best rate
    (seed 1, lowest final loss, the lower rate within 0.02 bits), (a) the baseline trained in 3 of 3 seeds
    there, (b) the first rate above it and pair where the stabilizer prevents an instability (the
    unstabilized arm unstable in at least 2 of 3 seeds, the stabilized in none and, by rules 2, trained in
    all 3), (c) the longest run within params.c_limit_s seconds."""
    par = rnd.params
    size = par["size"]
    rules, baseline = int(par["rules"]), par["baseline"]
    pairs = [tuple(x) for x in par["pairs"]]
    rates = sorted(float(x) for x in par["rates"])
    runs = runs[(runs["round"] <= rnd.number) & (runs["size"] == size)]
    verdict: dict = {"size": size} | ({"rules": rules} if rules > 1 else {})
    seed1 = runs[(runs["arm"] == baseline) & (runs["seed"] == 1)].sort_values("lr")
    seed1 = seed1[np.isfinite(seed1["final_loss"])]
    best = float(seed1[seed1["final_loss"] <= seed1["final_loss"].min() + 0.02]["lr"].iloc[0])
    verdict["best_rate"] = best
    at_best = runs[(runs["arm"] == baseline) & np.isclose(runs["lr"], best)]
    verdict["a_trained"] = f"{int(at_best['trained'].sum())} of {len(at_best)}"
    verdict["a"] = bool(len(at_best) == 3 and at_best["trained"].all())
    if not verdict["a"]:
        return verdict
    base = at_best.set_index("seed")
    flags = R.unstable(
        runs, runs["seed"].map(base["attn_logit_final"]), runs["seed"].map(base["final_loss"]), late_only=rules > 1
    )
    prevented = []
    for lr in [x for x in rates if x > best * 1.0001]:
        here = np.isclose(runs["lr"], lr)
        for bad, good in pairs:
            if prevented:
                break
            b_rows, g_rows = here & (runs["arm"] == bad), here & (runs["arm"] == good)
            if b_rows.sum() < 3 or g_rows.sum() < 3:
                continue
            learned = rules == 1 or bool(runs.loc[g_rows, "trained"].all())
            if int(flags[b_rows].sum()) >= 2 and not bool(flags[g_rows].any()) and learned:
                prevented.append({"lr": lr, "without": bad, "with": good, "unstable_without": int(flags[b_rows].sum())})
    verdict["b_prevented"] = prevented
    verdict["b"] = bool(prevented)
    spent = float(runs.loc[runs["round"] == rnd.number, "wall_time_s"].sum())
    verdict["stopped_at_budget"] = bool(not prevented and spent > float(par["budget_s"]))
    verdict["c_longest_run_s"] = float(runs["wall_time_s"].max())
    verdict["c"] = bool(runs["wall_time_s"].max() <= float(par["c_limit_s"]))
    return verdict


# ----------------------------------------------------------------------------- the fp16 range


def judge_range(rnd: Round) -> dict:
    """PB-Relax's range promise from its instances: a path holds at a logit when every instance is finite
    (output and gradients) within `tolerance` times the float16-mantissa baseline's error + `floor`
    (the `holds` column); its range is the largest logit up to which it holds at every tested logit."""
    path = rnd.tables / "instances.csv"
    cols = ["path", "logit_max", "instance", "finite_output", "finite_grads", "rel_error", "baseline_rel_error"]
    table = read_csv_table(
        path,
        "the range's instances",
        "benchmarks/attention_fp16_range.py",
        [*cols, "holds"],
        ints=["instance"],
        finite=["logit_max"],
        numbers=["rel_error", "baseline_rel_error"],
        choices={c: R.BOOLS for c in ("finite_output", "finite_grads", "holds")},
    )
    for c in ("finite_output", "finite_grads", "holds"):
        table[c] = table[c] == "True"
    if table.duplicated(["path", "logit_max", "instance"]).any():
        i = int(np.flatnonzero(table.duplicated(["path", "logit_max", "instance"]).to_numpy())[0])
        raise ReadError(f"{path}: row {i + 2} repeats a path, logit and instance; each is measured once")
    tol, floor = float(rnd.params["tolerance"]), float(rnd.params["floor"])
    table["holds_forward"] = table["finite_output"] & (table["rel_error"] <= tol * table["baseline_rel_error"] + floor)
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
