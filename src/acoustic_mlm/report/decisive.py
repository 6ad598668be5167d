"""The decisive experiments: the stability map's edge cells with seeds, two budgets and an A/A pair,
judged by rules written before their runs (docs/stability.md, "Decisive experiments: the rules").

`amlm decide` reads every run folder of a sweep (results/runs/<point>/: metrics.csv and summary.json),
takes each run's settings from its own summary.json, and writes three tables and the verdicts:

    runs.csv     one row per run and seed: settings, final / capped / lowest loss, late fall, spikes,
                 trained, collapsed, failures
    cells.csv    one row per comparison, cell and budget: the gap, its resolution (2 SE, the A/A
                 difference), the catch-up guard, Fisher's exact test, the verdict at that budget
    decisive.json, decisive.md   each promise's verdict with the numbers that decide it

Arms are recognised by their settings (norm, attention, clip), never by their names, so a user's own
arms are judged by the same rules. Every number here has one formula, in the order the rules state
them: run outcomes, one comparison, a cell across budgets, the promises.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm

from acoustic_mlm import curves
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.checked import ReadError, read_csv_table, short_value
from acoustic_mlm.artifacts.codes import SUMMARY as CODES_SUMMARY
from acoustic_mlm.artifacts.codes import read_tokenizer_summary
from acoustic_mlm.artifacts.run_summary import DIVERGED, SEED_STATUSES
from acoustic_mlm.config.differ import first_difference
from acoustic_mlm.errors import UserError
from acoustic_mlm.report import power
from acoustic_mlm.report.decisive_markdown import to_markdown
from acoustic_mlm.report.decisive_pb_relax import forced_logit_verdict, numerics_verdict
from acoustic_mlm.report.runs import finished_run_folders, read_run_folder
from acoustic_mlm.report.stability_map import NO_LOSS_BITS  # a run with no finite loss: an untrained model's
from acoustic_mlm.report.verdicts import INCONCLUSIVE, MIN_SEEDS, MIXED, NOT_SUPPORTED, SUPPORTED
from acoustic_mlm.train.precision import TRAITS, names_where
from acoustic_mlm.utils import atomic_group, write_json

log = logging.getLogger(__name__)

# The rules' fixed numbers (docs/stability.md): not settings, so that no run can move them.
PLATEAU_MARGIN = 1.0  # bits below the codes' unigram entropy that count as trained
SIGNIFICANCE = 0.05  # Fisher's exact test, one-sided
MIN_GAP = 0.02  # bits: no resolution is finer than this
SPIKE_THRESHOLD, SPIKE_RECOVERY = 0.5, 0.2  # curves.detect_spikes, as claim (d)

CELL_KEYS = ["layers", "lr", "precision", "warmup_steps", "feature_grad_mult", "qk_gain"]
RUN_COLUMNS = [
    "run",
    "arm",
    M.SEED,
    *CELL_KEYS,
    "steps",
    "norm",
    "attention",
    "clip",
    "status",
    "first_loss",
    "final_loss",
    "capped_loss",
    "lowest_loss",
    "lowest_step",
    "late_fall",
    "spikes",
    "plateau",
    "trained",
    "collapsed",
    "failed",
    "nonfinite_steps",
    "overflow_skips",
    "max_grad_norm",
    M.ATTN_LOGIT_MAX,
    "wall_time_s",
]


# ----------------------------------------------------------------------------- arms by their settings


@dataclass(frozen=True)
class Kind:
    """An arm's stability settings, as its summary records them."""

    norm: str
    attention: str
    clip: float


def kind_name(norm: str, attention: str, clip: float) -> str | None:
    """The rules' names for the arms they compare; None for any other arm."""
    table = {
        ("pre", "softmax", 1.0): "clip1",
        ("pre", "softmax", 10.0): "clip10",
        ("deepnorm", "softmax", 1.0): "deepnorm",
        ("post", "softmax", 1.0): "postnorm",
        ("pre", "pb_relax", 1.0): "pb_relax",
        ("pre", "unfused", 1.0): "unfused",
    }
    return table.get((norm, attention, float(clip)))


# Each promise: (its id, the arm it favours, the arm it is judged against, what it says)
PROMISES = [
    ("deepnorm", "deepnorm", "postnorm", "DeepNorm trains Post-Norm where plain Post-Norm fails"),
    ("clipping", "clip1", "clip10", "gradient clip 1 survives higher learning rates than clip 10"),
]
AA_PAIR = ("pb_relax", "clip1")  # identical in exact arithmetic: their gap in fp32 is rounding alone


# ----------------------------------------------------------------------------- one run


def run_outcomes(steps, loss, plateau: float, margin: float = PLATEAU_MARGIN) -> dict:
    """A run's curve against the plateau: final, capped and lowest loss, late fall, spikes, and
    trained (final <= plateau - margin), collapsed (its lowest reached that line, its final did
    not), both False: it never left the plateau. Non-finite rows are left out."""
    steps, loss = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    keep = np.isfinite(loss)
    steps, loss = steps[keep], loss[keep]
    if not len(loss):  # diverged before any finite loss: failed, at an untrained model's loss
        return {
            "first_loss": math.nan,
            "final_loss": math.nan,
            "capped_loss": NO_LOSS_BITS,
            "lowest_loss": math.nan,
            "lowest_step": math.nan,
            "late_fall": math.nan,
            "spikes": 0,
            "trained": False,
            "collapsed": False,
        }
    first, final = float(loss[0]), curves.final_loss(steps, loss)
    low = int(np.argmin(loss))
    line = plateau - margin
    trained = bool(final <= line)
    return {
        "first_loss": first,
        "final_loss": final,
        "capped_loss": float(min(final, first)),
        "lowest_loss": float(loss[low]),
        "lowest_step": float(steps[low]),
        "late_fall": curves.late_change(steps, loss) if len(loss) >= 3 else math.nan,
        "spikes": len(curves.detect_spikes(steps, loss, SPIKE_THRESHOLD, SPIKE_RECOVERY)),
        "trained": trained,
        "collapsed": bool(not trained and loss[low] <= line),
    }


def _setting(settings: dict, key: str, default=None):
    """A dotted key of a summary's settings; runs.<name>.<key> matched whatever the run's name."""
    if key in settings:
        return settings[key]
    if key.startswith("runs.*."):
        tail = key[len("runs.*.") :]
        for k, v in settings.items():
            if k.startswith("runs.") and k.endswith("." + tail):
                return v
    return default


def read_run(run_dir: Path, plateau: float) -> list[dict]:
    """One row per seed of a run folder (runs.read_run_folder), every setting read from its summary.json."""
    folder = read_run_folder(run_dir)
    settings, where = folder.settings, folder.summary_path
    norm, attention = _setting(settings, "runs.*.norm"), _setting(settings, "runs.*.attention")
    clip = _setting_number(settings, "runs.*.clip", where)
    rows = []
    for one in folder.seed_runs():
        m = one.rows
        if m.empty:
            raise UserError(
                f"{folder.path / M.METRICS}: no rows of seed {one.seed}; rerun the train stage for {folder.name}"
            )
        out = run_outcomes(m[M.STEP], m[M.FIGURE_LOSS], plateau)
        nonfinite = one.whole("nonfinite_steps")
        rows.append(
            {
                "run": folder.name,
                "arm": kind_name(norm, attention, clip),
                M.SEED: one.seed,
                "layers": int(_setting_number(settings, "model.layers", where)),
                "lr": _setting_number(settings, "train.lr", where),
                "precision": _setting(settings, "train.precision"),
                "warmup_steps": int(_setting_number(settings, "train.warmup_steps", where)),
                "feature_grad_mult": _setting_number(settings, "model.feature_grad_mult", where, 1.0),
                "qk_gain": _setting_number(settings, "model.qk_gain", where, 1.0),
                "steps": int(_setting_number(settings, "train.steps", where)),
                "norm": norm,
                "attention": attention,
                "clip": clip,
                "status": one.status,
                **out,
                "plateau": plateau,
                "failed": bool(one.status == DIVERGED or nonfinite > 0),
                "nonfinite_steps": nonfinite,
                "overflow_skips": one.whole("overflow_skips"),
                "max_grad_norm": one.number("max_grad_norm"),
                M.ATTN_LOGIT_MAX: one.attn_logit_max(),
                "wall_time_s": one.number("wall_time_s"),
                "_settings": settings,  # for check_pooled; not a column
            }
        )
    return rows


def plateau_bits(codes_dir: Path) -> float:
    """U: the codebook-0 unigram entropy of the training codes (tokenizer.json), in bits."""
    path = Path(codes_dir) / CODES_SUMMARY
    entropy = read_tokenizer_summary(path).get("unigram_entropy_bits")
    if not (
        isinstance(entropy, list)
        and entropy
        and isinstance(entropy[0], (int, float))
        and math.isfinite(entropy[0])
        and entropy[0] > 0
    ):
        raise UserError(
            f"{path}: 'unigram_entropy_bits' must list a positive number per codebook; rerun the tokenize stage"
        )
    return float(entropy[0])


# ----------------------------------------------------------------------------- what decide trusts
#
# decide pools the seeds of every run folder it finds by the settings their summaries record; a folder
# it must not pool (one still training, a copy of another, runs of one cell trained differently) or a
# damaged field is one line naming the folder, file or key, before any verdict is written.

DECIDE_FILES = ("runs.csv", "cells.csv", "decisive.json", "decisive.md")  # one judgement: written as a whole


def _setting_number(settings: dict, key: str, path: Path, default=None) -> float:
    """A numeric setting of a summary's settings; a missing or damaged one is one ReadError line."""
    value = _setting(settings, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReadError(f"{path}: 'settings.{key}' is {short_value(value)}, not a finite number; rerun the train stage")
    return float(value)


def check_pooled(rows: list[dict], runs_dir: Path) -> None:
    """The folders whose seeds decide pools (one arm, cell and budget) were trained with the same
    settings, and no seed is in two of them (a backup copy of a folder); else one UserError line."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["arm"], *(r[k] for k in CELL_KEYS), r["steps"]), []).append(r)
    for rs in groups.values():
        first = rs[0]
        where = f"arm {first['arm']} at {cell_label(first)} and {first['steps']} updates"
        own = _pooled_settings(first["_settings"])
        for r in rs[1:]:
            if r["run"] == first["run"]:
                continue
            d = first_difference(_pooled_settings(r["_settings"]), own)
            if d is not None:
                raise UserError(
                    f"{runs_dir / r['run']}: pooled with {first['run']} as {where}, but trained with {d.key} "
                    f"{d.mine!r} where it has {d.theirs!r}{d.and_more('settings differ')}; decide pools runs "
                    f"of one setting: move one of them out of {runs_dir}"
                )
        seen: dict[int, str] = {}
        for r in rs:
            if r[M.SEED] in seen and seen[r[M.SEED]] != r["run"]:
                raise UserError(
                    f"{runs_dir / r['run']}: holds seed {r[M.SEED]} of {where}, as {seen[r[M.SEED]]} does, "
                    f"with the same settings (a copy of a run folder?); decide counts each seed once: move one "
                    f"of them out of {runs_dir}"
                )
            seen[r[M.SEED]] = r["run"]


def _pooled_settings(settings: dict) -> dict:
    """A run's settings under names that do not carry its run name (runs.<name>.clip -> runs.*.clip)."""
    return {re.sub(r"^runs\.[^.]+\.", "runs.*.", k): v for k, v in settings.items()}


def without_spread(result: dict) -> dict:
    """`compare`'s result when an arm has fewer than MIN_SEEDS seeds: no standard error, no loss
    outcome, no verdict and no seeds-needed estimate from one seed (its spread is unknown, not 0)."""
    if min(result["n_a"], result["n_b"]) >= MIN_SEEDS:
        return {**result, "too_few_seeds": False}
    return {
        **result,
        "se": math.nan,
        "resolution": math.nan,
        "loss_outcome": "unresolved",
        "void": False,
        "verdict": INCONCLUSIVE,
        "seeds_for_survival": None,
        "seeds_for_loss": None,
        "too_few_seeds": True,
    }


def run_table(runs_dir: Path, codes_dir: Path) -> pd.DataFrame:
    """Every run folder under runs_dir that holds a summary.json, one row per seed (RUN_COLUMNS)."""
    folders = finished_run_folders(Path(runs_dir), "decide")
    plateau = plateau_bits(codes_dir)
    rows = [row for folder in folders for row in read_run(folder, plateau)]
    check_pooled(rows, Path(runs_dir))
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


# ----------------------------------------------------------------------------- one comparison


def resolution(a, b, aa: float) -> tuple[float, float]:
    """(r, SE): r = max(2 SE, AA, MIN_GAP), SE = sqrt(s_a^2 / n_a + s_b^2 / n_b) over the seeds
    (sample standard deviations; a single seed contributes no spread). A NaN AA is left out."""

    def var_over_n(x):
        x = np.asarray(x, dtype=float)
        return float(np.var(x, ddof=1)) / len(x) if len(x) > 1 else 0.0

    se = math.sqrt(var_over_n(a) + var_over_n(b))
    return max(2 * se, aa if math.isfinite(aa) else 0.0, MIN_GAP), se


def fisher_one_sided(trained_a: int, n_a: int, trained_b: int, n_b: int) -> tuple[float, float]:
    """Fisher's exact test on the 2 x 2 table of trained runs: (p that A trains more often, p that B does)."""
    from scipy.stats import fisher_exact

    table = [[trained_a, n_a - trained_a], [trained_b, n_b - trained_b]]
    return float(fisher_exact(table, alternative="greater")[1]), float(fisher_exact(table, alternative="less")[1])


def mean_of_known(values) -> float:
    """np.nanmean without its warning: the mean of the values that are not nan; nan when none is (a seed with
    no finite loss has no late fall)."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.mean()) if len(x) else math.nan


def catch_up_void(gap: float, late_fall_a, late_fall_b) -> bool:
    """The catch-up guard: a 'lower' outcome is void when the losing arm's mean late fall is at least
    |gap| (it was still falling by as much as it trails)."""
    fall = mean_of_known(late_fall_b if gap < 0 else late_fall_a)
    return bool(math.isfinite(fall) and fall >= abs(gap))


def seeds_to_decide(a: pd.DataFrame, b: pd.DataFrame, aa: float, most: int = 64) -> dict:
    """How many seeds per arm a fresh comparison (new seeds, not pooled with these) needs for 80 %
    power (report/power.py), if the observed numbers were the truth: for survival, the fewest n at
    which the one-sided Fisher test at SIGNIFICANCE rejects with chance 0.8 at the observed trained
    shares (exact); for the loss, the fewest n at which a gap of the observed size clears 2 SE (a
    one-sided z at 2) with chance 0.8, when |gap| clears the A/A floor and MIN_GAP (else none: no
    number of seeds separates rounding). Survival: None beyond `most`."""
    share_a, share_b = float(a["trained"].mean()), float(b["trained"].mean())
    survival = None
    if share_a != share_b:
        hi, lo = max(share_a, share_b), min(share_a, share_b)
        survival = power.seeds_for_power(lambda n: power.fisher_power(hi, lo, n, alpha=SIGNIFICANCE), most=most)
    gap = abs(float(a["capped_loss"].mean() - b["capped_loss"].mean()))
    sd = [float(np.std(x, ddof=1)) if len(x) > 1 else 0.0 for x in (a["capped_loss"], b["capped_loss"])]
    loss = None
    if gap > max(aa if math.isfinite(aa) else 0.0, MIN_GAP):
        loss = power.loss_seeds_for_power(gap, *sd, alpha=float(norm.sf(2.0)))
    return {"seeds_for_survival": survival, "seeds_for_loss": loss}


def compare(a: pd.DataFrame, b: pd.DataFrame, aa: float) -> dict:
    """Arm A (favoured) against arm B in one cell at one budget, by the rules' steps 1-4."""
    gap = float(a["capped_loss"].mean() - b["capped_loss"].mean())
    r, se = resolution(a["capped_loss"], b["capped_loss"], aa)
    loss = "A lower" if gap < -r else "B lower" if gap > r else "tie"
    void = loss != "tie" and catch_up_void(gap, a["late_fall"], b["late_fall"])
    p_a, p_b = fisher_one_sided(int(a["trained"].sum()), len(a), int(b["trained"].sum()), len(b))
    survival = "A survives" if p_a < SIGNIFICANCE else "B survives" if p_b < SIGNIFICANCE else "no difference"
    for_a = (loss == "A lower" and not void) or survival == "A survives"
    for_b = (loss == "B lower" and not void) or survival == "B survives"
    verdict = SUPPORTED if for_a and not for_b else NOT_SUPPORTED if for_b and not for_a else INCONCLUSIVE
    sides = {"a": a, "b": b}
    return {
        **{f"n_{k}": len(s) for k, s in sides.items()},
        **{f"mean_{k}": float(s["capped_loss"].mean()) for k, s in sides.items()},
        **{"gap": gap, "se": se, "aa": aa, "resolution": r, "loss_outcome": loss},
        "loser_late_fall": mean_of_known((b if gap < 0 else a)["late_fall"]),
        "void": void,
        **{f"trained_{k}": int(s["trained"].sum()) for k, s in sides.items()},
        **{"p_a": p_a, "p_b": p_b, "survival": survival, "verdict": verdict},
        "run_seconds": float(pd.concat([a, b])["wall_time_s"].mean()) if "wall_time_s" in a else math.nan,
        **(
            seeds_to_decide(a, b, aa)
            if verdict == INCONCLUSIVE
            else {"seeds_for_survival": None, "seeds_for_loss": None}
        ),
    }


# ----------------------------------------------------------------------------- the A/A floor


def aa_difference(runs: pd.DataFrame, layers: int, lr: float, steps: int) -> float:
    """|mean capped loss of the A/A arm - that of clip 1| over their common seeds in fp32 at this
    depth and rate: at this budget if measured there, else at any budget (warm-up as measured)."""
    fp32 = runs[
        runs["precision"].isin(names_where(lambda tr: not tr.tensor_cores))  # fp32
        & (runs["layers"] == layers)
        & np.isclose(runs["lr"], lr)
        & np.isclose(runs["qk_gain"], 1.0)
    ]
    for pick in (fp32[fp32["steps"] == steps], fp32):
        x, y = pick[pick["arm"] == AA_PAIR[0]], pick[pick["arm"] == AA_PAIR[1]]
        for budget in sorted(set(x["steps"]) & set(y["steps"]), reverse=True):
            xs, ys = x[x["steps"] == budget], y[y["steps"] == budget]
            xs, ys = [g[g["warmup_steps"] == g["warmup_steps"].max()] for g in (xs, ys)]
            seeds = sorted(set(xs[M.SEED]) & set(ys[M.SEED]))
            if seeds:
                return abs(
                    float(
                        xs[xs[M.SEED].isin(seeds)]["capped_loss"].mean()
                        - ys[ys[M.SEED].isin(seeds)]["capped_loss"].mean()
                    )
                )
    return math.nan


# ----------------------------------------------------------------------------- cells and promises


def cell_label(cell: dict) -> str:
    parts = [f"{int(cell['layers'])} layers", f"lr {cell['lr']:g}", str(cell["precision"])]
    parts += [f"warm-up {int(cell['warmup_steps'])}"] if cell["warmup_steps"] != 100 else []
    parts += [f"qk_gain {cell['qk_gain']:g}"] if cell["qk_gain"] != 1.0 else []
    return ", ".join(parts)


def cell_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per promise, cell and budget where both of its arms ran."""
    out = []
    for promise, arm_a, arm_b, _ in PROMISES:
        sub = runs[runs["arm"].isin([arm_a, arm_b])]
        for key, g in sub.groupby(CELL_KEYS + ["steps"], sort=True):
            a, b = g[g["arm"] == arm_a], g[g["arm"] == arm_b]
            if a.empty or b.empty:
                continue
            cell = dict(zip(CELL_KEYS + ["steps"], key))
            aa = aa_difference(runs, cell["layers"], cell["lr"], cell["steps"])
            out.append({"promise": promise, "cell": cell_label(cell), **cell, **without_spread(compare(a, b, aa))})
    return pd.DataFrame(out)


def cell_verdicts(cells: pd.DataFrame) -> pd.DataFrame:
    """Each cell's verdict: its verdict at two budgets when they agree (supported or not supported);
    otherwise, or with one budget, inconclusive (the one budget's verdict kept as an indication)."""
    out = []
    for (promise, cell), g in cells.groupby(["promise", "cell"], sort=False):
        budgets = sorted(g["steps"])
        at = dict(zip(g["steps"], g["verdict"]))
        agree = len(budgets) >= 2 and len(set(at.values())) == 1 and g["verdict"].iloc[0] != INCONCLUSIVE
        out.append(
            {
                "promise": promise,
                "cell": cell,
                "budgets": budgets,
                "at_budget": at,
                "verdict": g["verdict"].iloc[0] if agree else INCONCLUSIVE,
                "two_budgets": len(budgets) >= 2,
            }
        )
    return pd.DataFrame(out)


def combine(verdicts: list[str]) -> str:
    """A promise over its two-budget cells: supported / not supported when every decided cell says
    so, mixed when they disagree, inconclusive when none is decided."""
    decided = [v for v in verdicts if v != INCONCLUSIVE]
    if not decided:
        return INCONCLUSIVE
    if all(v == SUPPORTED for v in decided):
        return SUPPORTED
    return NOT_SUPPORTED if all(v == NOT_SUPPORTED for v in decided) else MIXED


def judge(runs: pd.DataFrame, numerics: pd.DataFrame | None = None) -> dict:
    """Every promise's verdict with its cells' numbers."""
    cells = cell_table(runs)
    per_cell = (
        cell_verdicts(cells) if len(cells) else pd.DataFrame(columns=["promise", "cell", "verdict", "two_budgets"])
    )
    promises = []
    for promise, arm_a, arm_b, text in PROMISES:
        mine = per_cell[per_cell["promise"] == promise]
        two = mine[mine["two_budgets"].astype(bool)]  # an empty table (no cell holds both arms): no rows
        promises.append(
            {
                "id": promise,
                "promise": text,
                "favoured": arm_a,
                "against": arm_b,
                "verdict": combine(list(two["verdict"])),
                "cells": [_clean(r) for r in mine.to_dict("records")],
                "rows": [_clean(r) for r in cells[cells["promise"] == promise].to_dict("records")]
                if len(cells)
                else [],
            }
        )
    promises.append(numerics_verdict(numerics))
    promises.append(forced_logit_verdict(runs))
    return {
        "rules": "docs/stability.md#decisive-experiments-the-rules-written-before-the-runs",
        "plateau_bits": float(runs["plateau"].iloc[0]) if len(runs) else math.nan,
        "plateau_margin": PLATEAU_MARGIN,
        "promises": promises,
    }


def _clean(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if isinstance(v, (np.floating, float)):
            out[k] = None if not math.isfinite(float(v)) else round(float(v), 4)
        elif isinstance(v, np.integer):
            out[k] = int(v)
        elif isinstance(v, np.bool_):
            out[k] = bool(v)
        elif isinstance(v, dict):
            out[k] = {str(kk): vv for kk, vv in v.items()}
        elif isinstance(v, list):
            out[k] = [int(x) if isinstance(x, np.integer) else x for x in v]
        else:
            out[k] = v
    return out


BOOL_COLUMNS = ("trained", "collapsed", "failed")  # runs.csv's True/False columns
TEXT_COLUMNS = ("run", "arm", "precision", "norm", "attention", "status")  # the rest are numbers


def read_run_table(path: Path) -> pd.DataFrame:
    """A published runs.csv (decide's own, e.g. data/reference/decisive/runs.csv), checked for its
    meaning: every RUN_COLUMNS column, whole counts whole, the capped loss and settings finite, the
    package's words in precision and status, True/False in the flags, and no (run, seed) twice; so
    that anyone can judge the published runs again by today's rules without their run folders."""
    whole = (M.SEED, "layers", "steps", "warmup_steps", "spikes", "nonfinite_steps", "overflow_skips")
    finite = ("lr", "feature_grad_mult", "qk_gain", "clip", "capped_loss", "plateau")
    table = read_csv_table(
        Path(path),
        "table of decisive runs",
        "decide",
        RUN_COLUMNS,
        ints=whole,
        finite=finite,
        numbers=[c for c in RUN_COLUMNS if c not in (*TEXT_COLUMNS, *BOOL_COLUMNS, *whole, *finite)],
        choices={**{c: ("True", "False") for c in BOOL_COLUMNS}, "precision": tuple(TRAITS), "status": SEED_STATUSES},
    )
    twice = table.duplicated(["run", M.SEED]).to_numpy()
    if twice.any():
        i = int(np.flatnonzero(twice)[0])
        raise ReadError(
            f"{path}: row {i + 2} repeats run {table['run'].iloc[i]} seed {table[M.SEED].iloc[i]}; decide "
            "counts each seed once: remove the repeated row"
        )
    for c in BOOL_COLUMNS:
        table[c] = table[c] == "True"
    return table[RUN_COLUMNS]


def run(
    runs_dir: Path, codes_dir: Path, out_dir: Path, numerics: Path | None = None, runs_table: Path | None = None
) -> dict:
    """`amlm decide`: runs.csv, cells.csv, decisive.json and decisive.md into out_dir, from the run
    folders (their summaries and metrics) or from a published runs.csv (`runs_table`)."""
    runs = read_run_table(runs_table) if runs_table is not None else run_table(Path(runs_dir), Path(codes_dir))
    table = None
    if numerics is not None:
        table = read_csv_table(
            Path(numerics),
            "attention numerics table",
            "benchmarks/attention_fp16.py",
            ["path", "logit_max", "finite", "rel_error"],
            numbers=["logit_max", "rel_error"],
            choices={"finite": ("True", "False")},
        )
        table["finite"] = table["finite"] == "True"
    result = judge(runs, table)
    cells = cell_table(runs)
    with atomic_group(Path(out_dir), DECIDE_FILES) as tmp:  # the four files change together or not at all
        runs.to_csv(tmp / "runs.csv", index=False)
        cells.to_csv(tmp / "cells.csv", index=False)
        write_json(tmp / "decisive.json", result)
        (tmp / "decisive.md").write_text(to_markdown(result))
    for p in result["promises"]:
        log.info("decide: %s: %s", p["id"], p["verdict"])
    return result
