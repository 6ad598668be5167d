"""The stability map: a sweep's runs as one table, each arm's learning-rate sensitivity, the figure
and one verdict per promise of the figure's stability settings.

Method: Wortsman et al. 2023, *Small-scale proxies for large-scale Transformer training
instabilities* (arXiv 2309.14322), section 2: a mitigation is judged by its **LR sensitivity**,

    LR sensitivity = E_lr [ min(L(lr), L0) - L* ]

the mean over a log-spaced grid of peak learning rates of the final loss L(lr), capped at the loss at
initialisation L0 (a diverged run counts as L0), minus the lowest final loss over the grid L*.
Here L is the codebook-0 masked-prediction training loss in bits, final as `curves.final_loss`, L0
each run's first logged loss (step 1, before any update has moved the weights much), and the grid is
one arm's rates in one panel (a depth x precision of the sweep). With several seeds the sensitivity is
computed per seed and reported as the mean with its spread (claims.seed_spread).

The verdict rules are written in docs/stability.md ("The stability map: verdict rules"); `verdicts`
implements them as written there.

One module for the three map stages (`run_table`, `run_claims`, `run_figure`), a little over 500
lines, because they read one table through one set of definitions: its columns, the formulas, and
what a panel is (`panels`, `_in_panel`), which the statistics, the verdicts and the figure all use.
Its sections go in that order: formulas, the table, per arm and panel, verdicts, the figure.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm import curves
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.checked import read_csv_table
from acoustic_mlm.artifacts.run_summary import DIVERGED, SUMMARY, read_seed_summary
from acoustic_mlm.config.differ import first_difference
from acoustic_mlm.encodec import CODEBOOK_SIZE
from acoustic_mlm.errors import UserError
from acoustic_mlm.report.aggregate import check_runs_dir
from acoustic_mlm.report.runs import SeedRun, read_run_folder, seed_dir
from acoustic_mlm.train.precision import names_where
from acoustic_mlm.utils import FP16_MAX, atomic_path, write_json  # FP16_MAX: attention logits beyond it overflow

# The loss of a run that logged no finite loss at all (it diverged at its first update): that of a
# uniform guess over the codebook, log2(1024) = 10 bits, what an untrained model scores (DESIGN: the
# paper's curves start at 9.3-9.5). Its capped loss, so that it counts as failed, not as absent.
NO_LOSS_BITS = math.log2(CODEBOOK_SIZE)

log = logging.getLogger(__name__)

# precisions with fp32's exponent range: no float16 overflow (the other panels are fp16): fp32, bf16
FULL_RANGE = names_where(lambda tr: not tr.float16_range)
STABLE = "completed"  # a stable run: every step taken, no divergence, no skipped non-finite update
FIGURE_STEM = "lr_sensitivity"
COLUMNS = [
    "run",
    "arm",
    "role",
    "lr",
    "layers",
    "precision",
    M.SEED,
    "status",
    "diverged_at_step",
    "steps",
    "first_train_loss_cb0",
    "final_train_loss_cb0",
    "final_valid_loss_cb0",
    "capped_loss",
    "flattened",
    "late_change_share",
    "max_grad_norm",
    M.ATTN_LOGIT_MAX,
    M.ATTN_LOGIT_FP16_FRAC,
    "clipped_frac",
    "overflow_skips",
    "nonfinite_steps",
    "wall_time_s",
]


# ----------------------------------------------------------------------------- formulas


def capped_loss(final: float, initial: float) -> float:
    """min(L, L0); a run without a finite final loss (diverged) counts as L0, and one without any
    finite loss (diverged at its first update) as NO_LOSS_BITS, an untrained model's loss."""
    if not math.isfinite(initial):
        return NO_LOSS_BITS
    return float(initial) if not math.isfinite(final) else float(min(final, initial))


def lr_sensitivity(finals, initials) -> float:
    """Wortsman et al.'s LR sensitivity over one grid of rates: mean of min(L, L0) - L*, where L* is
    the lowest capped final loss of the grid. NaN for an empty grid."""
    capped = np.array([capped_loss(f, i) for f, i in zip(finals, initials)], dtype=float)
    if not len(capped):
        return math.nan
    return float(np.mean(capped - capped.min()))


def spread(values, how: str) -> float:
    """The seed spread of a statistic: range (max - min) or 2std (two sample standard deviations)."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    if len(v) < 2:
        return 0.0
    return float(v.max() - v.min()) if how == "range" else float(2 * v.std(ddof=1))


def relax_reach(relax_alpha: float) -> float:
    """The attention logit above which PB-Relax changes float16 arithmetic: it divides q.k by alpha
    before the row maximum is subtracted, so logits below FP16_MAX / alpha are never at risk either way."""
    return FP16_MAX / relax_alpha


# ----------------------------------------------------------------------------- the table


def check_trained_as_point(cfg: C.Config, run_dir: Path, name: str, seeds) -> None:
    """Each seed's summary.json in `run_dir` says it was trained with the settings of sweep point `name`
    (train.state.fingerprint, as train decides a seed is complete); else one UserError line naming the
    run, the first setting that differs (a swept one first) and the stage to rerun."""
    from acoustic_mlm.train.state import fingerprint

    want = fingerprint(cfg.point(name), name, 1)["settings"]
    swept = dict(cfg.points[name].values)  # a differing swept value is named first
    for seed in seeds:
        path = seed_dir(run_dir, seed) / SUMMARY
        got = C.renamed_settings(read_seed_summary(path)["fingerprint"].get("settings", {}))
        d = first_difference(got, want, first=swept)
        if d is not None:
            raise UserError(
                f"{path}: run {name} was trained with {d.key} {d.mine!r}, but its sweep point sets {d.theirs!r}"
                f"{d.and_more('settings differ')}; rerun the train stage for {name} (snakemake --forcerun train, "
                f"or amlm train {name})"
            )


def _late_share(rows: pd.DataFrame) -> float:
    """curves.late_change over the curve's whole fall: what `flattened` compares with FLAT_TOLERANCE."""
    if len(rows) < 3:
        return math.nan
    steps, loss = rows[M.STEP].to_numpy(float), rows[M.FIGURE_LOSS].to_numpy(float)
    fall = loss[0] - curves.final_loss(steps, loss)
    return float(curves.late_change(steps, loss) / fall) if fall > 0 else math.nan


def _point_row(one: SeedRun, arm: str, role: str, settings: dict) -> dict:
    """A seed of a sweep point as a row of the map (COLUMNS): from its summary and its metrics rows."""
    finite = one.rows[np.isfinite(one.rows[M.FIGURE_LOSS])]
    logit = one.attn_logit_max()
    diverged = one.status == DIVERGED
    final, first = one.number("final_train_loss_cb0"), one.number("first_train_loss_cb0")
    final = math.nan if diverged else final
    return {
        "run": one.run,
        "arm": arm,
        "role": role,  # the arm's role in the figure
        "lr": settings["train.lr"],
        "layers": settings["model.layers"],
        "precision": settings["train.precision"],
        M.SEED: one.seed,
        "status": one.status,
        "diverged_at_step": one.summary.get("diverged_at_step"),
        "steps": one.whole("steps"),
        "first_train_loss_cb0": first,
        "final_train_loss_cb0": final,
        "final_valid_loss_cb0": math.nan if diverged else one.number("final_valid_loss_cb0"),
        "capped_loss": capped_loss(final, first),
        "flattened": bool(
            not diverged and len(finite) >= 3 and curves.flattened(finite[M.STEP], finite[M.FIGURE_LOSS])
        ),
        "late_change_share": _late_share(finite) if not diverged else math.nan,
        "max_grad_norm": one.number("max_grad_norm"),
        M.ATTN_LOGIT_MAX: logit,
        M.ATTN_LOGIT_FP16_FRAC: logit / FP16_MAX,
        "clipped_frac": one.number("clipped_frac"),
        "overflow_skips": one.whole("overflow_skips"),
        "nonfinite_steps": one.whole("nonfinite_steps"),
        "wall_time_s": one.number("wall_time_s"),
    }


def table(cfg: C.Config, runs_dir: Path) -> pd.DataFrame:
    """One row per sweep point and seed (COLUMNS, then any other swept key by its dotted name).

    What each run was (its rate, depth, precision and other swept settings) is read from its
    summary.json (`settings`, what it was trained with), after check_trained_as_point has held every
    seed to its point; the configuration gives the points, their arms and the arms' roles."""
    pts = cfg.points
    if not pts:
        raise UserError("config: no 'sweep:' section; the stability map needs a sweep of training settings")
    extra = sorted({k for p in pts.values() for k, _ in p.values} - {"train.lr", "model.layers", "train.precision"})
    check_runs_dir(Path(runs_dir))  # a missing folder is named as such, not as runs to train
    for name, p in pts.items():  # before anything is read: a run trained as another point is refused by name
        check_trained_as_point(cfg, Path(runs_dir) / name, name, p.seeds)
    rows = []
    for name, p in pts.items():
        folder = read_run_folder(Path(runs_dir) / name, renamed=True, required={"per_seed": dict})
        settings = folder.settings
        lacking = [k for k in ("train.lr", "model.layers", "train.precision", *extra) if k not in settings]
        if lacking:
            raise UserError(f"{folder.summary_path}: 'settings' lacks {lacking[0]}; rerun the train stage for {name}")
        for seed in p.seeds:
            one = folder.seed_run(seed)
            rows.append({**_point_row(one, p.arm, cfg.runs[p.arm].role, settings), **{k: settings[k] for k in extra}})
    return pd.DataFrame(rows, columns=COLUMNS + extra)


def run_table(cfg: C.Config, runs_dir: Path, out: Path) -> Path:
    t = table(cfg, runs_dir)
    with atomic_path(Path(out)) as tmp:
        t.to_csv(tmp, index=False)
    log.info("map: %d runs of %d points -> %s", len(t), t["run"].nunique(), out)
    return Path(out)


def read_map(path: Path) -> pd.DataFrame:
    """results/stability_map.csv through the shared CSV reader: the columns, numbers where numbers
    belong, a rate and an initial loss in every row."""
    t = read_csv_table(
        Path(path),
        "stability map",
        "map",
        COLUMNS,
        ints=["layers", M.SEED, "steps"],
        numbers=[
            "lr",
            "first_train_loss_cb0",
            "final_train_loss_cb0",
            "final_valid_loss_cb0",
            "capped_loss",
            "late_change_share",
            "max_grad_norm",
            M.ATTN_LOGIT_MAX,
            M.ATTN_LOGIT_FP16_FRAC,
            "clipped_frac",
            "wall_time_s",
            "diverged_at_step",
            "overflow_skips",
            "nonfinite_steps",
        ],
        finite=["lr", "capped_loss"],  # first_train_loss_cb0: empty for a run with no finite loss
        choices={"flattened": ("True", "False")},
    )
    t["flattened"] = t["flattened"] == "True"
    t["role"] = t["role"].where(t["role"] != "", None)
    return t


# ----------------------------------------------------------------------------- per arm and panel


def panel_columns(t: pd.DataFrame) -> list[str]:
    """What makes a panel: depth, precision and every other swept setting but the rate (the columns
    after COLUMNS in the map)."""
    return ["layers", "precision"] + [c for c in t.columns if c not in COLUMNS]


def panel_label(values: dict) -> str:
    extra = [
        f"{k.rsplit('.', 1)[-1]}={v:g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]}={v}"
        for k, v in values.items()
        if k not in ("layers", "precision")
    ]
    return ", ".join([f"{int(values['layers'])} layers", str(values["precision"])] + extra)


def panels(t: pd.DataFrame) -> list[dict]:
    """The panels of the map, fp32 first, shallow first: {column: value} each, with its 'label'."""
    cols = panel_columns(t)
    out = [dict(zip(cols, vals)) for vals in t[cols].drop_duplicates().itertuples(index=False)]
    for p in out:
        p["label"] = panel_label(p)
    return sorted(
        out, key=lambda p: (p["precision"] not in FULL_RANGE, str(p["precision"]), int(p["layers"]), p["label"])
    )


def _in_panel(t: pd.DataFrame, panel: dict) -> pd.Series:
    keep = pd.Series(True, index=t.index)
    for k, v in panel.items():
        if k != "label":
            keep &= t[k] == v
    return keep


def seed_spread(g: pd.DataFrame, per_seed: list[float], how: str) -> float:
    """The seed spread of one arm's panel: with every seed at every rate, the spread of the per-seed
    values; otherwise the largest spread of the capped loss at a rate run with several seeds (the
    noise of one point, in the same bits); 0 with one seed everywhere."""
    rates = g.groupby("lr")[M.SEED].nunique()
    if len(per_seed) > 1 and (rates == len(per_seed)).all():
        return spread(per_seed, how)
    several = rates[rates > 1].index
    return max((spread(g[g["lr"] == lr]["capped_loss"], how) for lr in several), default=0.0)


def arm_stats(t: pd.DataFrame, how: str = "range") -> pd.DataFrame:
    """One row per arm and panel: LR sensitivity and mean capped loss (each the mean over the seeds
    that ran every rate of the panel, seed_spread beside it), best rate (lowest mean capped loss) and
    its loss, whether every run at the best rate flattened and how many seeds it had, the largest
    stable rate (every seed completed), diverged runs, the lowest rate's loss, the largest attention
    logit."""
    out = []
    for panel in panels(t):
        pt = t[_in_panel(t, panel)]
        for arm, g in pt.groupby("arm", sort=False):
            rates = sorted(g["lr"].unique())
            full = [s for s, gs in g.groupby(M.SEED) if sorted(gs["lr"].unique()) == rates]
            per_seed, expected = [], []
            for s in full:
                gs = g[g[M.SEED] == s]
                per_seed.append(lr_sensitivity(gs["final_train_loss_cb0"], gs["first_train_loss_cb0"]))
                expected.append(float(gs["capped_loss"].mean()))
            by_rate = g.groupby("lr")
            mean_capped = by_rate["capped_loss"].mean()
            best = float(mean_capped.idxmin())
            stable = [float(lr) for lr, gr in by_rate if (gr["status"] == STABLE).all()]
            out.append(
                {
                    "arm": arm,
                    "role": g["role"].iloc[0] if g["role"].notna().any() else None,
                    "panel": panel["label"],
                    "layers": int(panel["layers"]),
                    "precision": panel["precision"],
                    "seeds": int(g[M.SEED].nunique()),
                    "rates": len(rates),
                    "sensitivity": float(np.mean(per_seed)) if per_seed else math.nan,
                    "sensitivity_spread": seed_spread(g, per_seed, how),
                    "sensitivity_per_seed": [round(x, 4) for x in per_seed],
                    "mean_capped_loss": float(np.mean(expected)) if expected else math.nan,
                    "mean_capped_loss_spread": seed_spread(g, expected, how),
                    "best_lr": best,
                    "best_loss": float(mean_capped.min()),
                    "best_flattened": bool(g[g["lr"] == best]["flattened"].all()),
                    "best_seeds": int(g[g["lr"] == best][M.SEED].nunique()),
                    "largest_stable_lr": max(stable) if stable else math.nan,
                    "diverged_runs": int((g["status"] == DIVERGED).sum()),
                    "lowest_lr_loss": float(mean_capped.iloc[0]),
                    M.ATTN_LOGIT_MAX: float(g[M.ATTN_LOGIT_MAX].max()),
                }
            )
    return pd.DataFrame(out)


# ----------------------------------------------------------------------------- verdicts


SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"


def _pick(stats: pd.DataFrame, role_or_arm: str, panel: str) -> dict | None:
    g = stats[((stats["role"] == role_or_arm) | (stats["arm"] == role_or_arm)) & (stats["panel"] == panel)]
    return g.iloc[0].to_dict() if len(g) else None


def _stat_panels(stats: pd.DataFrame) -> list[tuple[str, int, str]]:
    """(label, layers, precision) of the panels in `stats`, in their order."""
    seen = stats[["panel", "layers", "precision"]].drop_duplicates()
    return [(p, int(layer), str(prec)) for p, layer, prec in seen.itertuples(index=False)]


def _pair(a: dict, b: dict, floor: float) -> tuple[str, float, float]:
    """Compare a's sensitivity with b's: 'lower', 'higher' or 'tie' beyond the larger seed spread
    (at least `floor` bits); returns (outcome, difference a - b, the resolution used)."""
    diff = a["sensitivity"] - b["sensitivity"]
    res = max(a["sensitivity_spread"], b["sensitivity_spread"], floor)
    return ("lower" if diff < -res else "higher" if diff > res else "tie"), diff, res


def _numbers(*arms: dict) -> dict:
    keys = (
        "sensitivity",
        "sensitivity_spread",
        "mean_capped_loss",
        "mean_capped_loss_spread",
        "best_lr",
        "best_loss",
        "best_flattened",
        "best_seeds",
        "largest_stable_lr",
        "diverged_runs",
        "lowest_lr_loss",
        M.ATTN_LOGIT_MAX,
    )
    return {f"{a['arm']} ({a['panel']})": {k: _round(a[k]) for k in keys} for a in arms}


def _round(x):
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (float, np.floating)):
        return None if not math.isfinite(x) else float(f"{x:.4g}")
    return x


def _combine(outcomes: list[str]) -> str:
    if not outcomes:
        return INCONCLUSIVE
    if NOT_SUPPORTED in outcomes:
        return NOT_SUPPORTED
    return SUPPORTED if all(o == SUPPORTED for o in outcomes) else INCONCLUSIVE


def verdict_clipping(stats: pd.DataFrame, floor: float) -> dict:
    """Clipping: in every full-range (fp32, bf16) panel, clip 1's LR sensitivity is lower than clip 10's by more
    than the seed spread (supported); higher by more than it in any panel: not supported; else inconclusive.
    A panel whose best-rate runs of either arm have not flattened is inconclusive."""
    outcomes, arms, notes = [], [], []
    for panel, _layers, precision in _stat_panels(stats):
        if precision not in FULL_RANGE:
            continue
        a, b = _pick(stats, "clip1", panel), _pick(stats, "clip10", panel)
        if a is None or b is None:
            continue
        arms += [a, b]
        if not (a["best_flattened"] and b["best_flattened"]):
            outcomes.append(INCONCLUSIVE)
            notes.append(f"{panel}: a best-rate run has not flattened")
            continue
        how, diff, res = _pair(a, b, floor)
        outcomes.append({"lower": SUPPORTED, "higher": NOT_SUPPORTED}.get(how, INCONCLUSIVE))
        notes.append(
            f"{panel}: clip 1 - clip 10 sensitivity {diff:+.3f} bits (resolution {res:.3f}); "
            f"largest stable rate {a['largest_stable_lr']:g} vs {b['largest_stable_lr']:g}; at the lowest "
            f"rate clip 1 ends {a['lowest_lr_loss'] - b['lowest_lr_loss']:+.3f} bits from clip 10"
        )
    return {
        "id": "clipping",
        "promise": "gradient clip 1 survives higher learning rates than clip 10",
        "verdict": _combine(outcomes),
        "notes": notes,
        "measured": _numbers(*arms),
    }


def _pair_mean(a: dict, b: dict, floor: float) -> tuple[str, float, float]:
    """a's mean capped loss over the rates against b's, beyond the larger seed spread (and `floor`)."""
    diff = a["mean_capped_loss"] - b["mean_capped_loss"]
    res = max(a["mean_capped_loss_spread"], b["mean_capped_loss_spread"], floor)
    return ("lower" if diff < -res else "higher" if diff > res else "tie"), diff, res


def verdict_deepnorm(stats: pd.DataFrame, floor: float, control: str | None) -> dict:
    """DeepNorm at depth, in the deepest full-range panel (16+ layers), against plain Post-Norm (the control
    arm: norm post, softmax, no role). An arm that fails at every rate alike is insensitive, so the
    sensitivity cannot say Post-Norm failed; the two architectures are compared on the mean capped
    loss over the rates, E_lr[min(L, L0)] = L* + sensitivity. Supported: DeepNorm's is lower beyond the
    resolution; not supported: higher beyond it; otherwise (or unflattened best-rate runs, no control,
    no deep panel) inconclusive."""
    fp32 = [p for p in _stat_panels(stats) if p[2] in FULL_RANGE]
    deepest = max((p[1] for p in fp32), default=None)
    base = {
        "id": "deepnorm",
        "promise": "DeepNorm trains Post-Norm at depths where plain Post-Norm fails",
        "verdict": INCONCLUSIVE,
        "notes": [],
        "measured": {},
    }
    if control is None or deepest is None or deepest < 16:
        base["notes"].append("needs a plain Post-Norm control arm and a full-range panel of 16 or more layers")
        return base
    panel = next(p for p, layers, _ in fp32 if layers == deepest)
    a, b = _pick(stats, "deepnorm", panel), _pick(stats, control, panel)
    if a is None or b is None:
        base["notes"].append(f"DeepNorm or the Post-Norm control did not run at {deepest} layers in fp32")
        return base
    base["measured"] = _numbers(a, b)
    if not (a["best_flattened"] and b["best_flattened"]):
        base["notes"].append(f"{panel}: a best-rate run has not flattened")
        return base
    how, diff, res = _pair_mean(a, b, floor)
    base["verdict"] = {"lower": SUPPORTED, "higher": NOT_SUPPORTED}.get(how, INCONCLUSIVE)
    base["notes"].append(
        f"{panel}: DeepNorm - Post-Norm mean capped loss over the rates {diff:+.3f} bits "
        f"(resolution {res:.3f}); sensitivity {a['sensitivity']:.3f} vs {b['sensitivity']:.3f}; "
        f"best loss {a['best_loss']:.3f} vs {b['best_loss']:.3f}; largest stable rate "
        f"{a['largest_stable_lr']:g} vs {b['largest_stable_lr']:g}"
    )
    return base


def verdict_pb_relax(stats: pd.DataFrame, floor: float, reach: float) -> dict:
    """PB-Relax in fp16: inconclusive unless a softmax clip-1 fp16 run's attention logits reached
    `reach` (FP16_MAX / relax_alpha, where PB-Relax starts to change float16 arithmetic). Then, in each
    fp16 panel where they did: Attn. Relax's LR sensitivity lower than clip 1's by more than the spread,
    or a larger stable rate: supported; otherwise not supported (the limit was reached and relaxing did
    not help)."""
    outcomes, arms, notes = [], [], []
    for panel, _layers, precision in _stat_panels(stats):
        if precision in FULL_RANGE:
            continue
        a, b = _pick(stats, "attn_relax", panel), _pick(stats, "clip1", panel)
        if a is None or b is None:
            continue
        arms += [a, b]
        if not b[M.ATTN_LOGIT_MAX] >= reach:
            notes.append(
                f"{panel}: softmax logits reached {b[M.ATTN_LOGIT_MAX]:.4g}, below {reach:.4g} where PB-Relax matters"
            )
            continue
        how, diff, res = _pair(a, b, floor)
        larger = a["largest_stable_lr"] > b["largest_stable_lr"] or (
            math.isfinite(a["largest_stable_lr"]) and not math.isfinite(b["largest_stable_lr"])
        )
        outcomes.append(SUPPORTED if how == "lower" or larger else NOT_SUPPORTED)
        notes.append(
            f"{panel}: Attn. Relax - clip 1 sensitivity {diff:+.3f} bits "
            f"(resolution {res:.3f}); largest stable rate {a['largest_stable_lr']:g} vs "
            f"{b['largest_stable_lr']:g}"
        )
    if not arms:
        notes.append("no fp16 panel holds both the clip-1 and the Attn. Relax arm")
    return {
        "id": "pb_relax",
        "promise": "PB-Relax keeps fp16 training stable where attention logits near float16's limit",
        "verdict": _combine(outcomes) if outcomes else INCONCLUSIVE,
        "notes": notes,
        "measured": _numbers(*arms),
    }


def control_arm(cfg: C.Config) -> str | None:
    """The plain Post-Norm control: an arm with norm post, softmax attention and no role."""
    for name, r in cfg.runs.items():
        if r.norm == "post" and r.attention == "softmax" and r.role is None:
            return name
    return None


def verdicts(cfg: C.Config, t: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    th = cfg.claims
    stats = arm_stats(t, th.seed_spread)
    floor = th.min_final_gap
    return stats, [
        verdict_clipping(stats, floor),
        verdict_deepnorm(stats, floor, control_arm(cfg)),
        verdict_pb_relax(stats, floor, relax_reach(cfg.model.relax_alpha)),
    ]


def _md(stats: pd.DataFrame, vs: list[dict], t: pd.DataFrame) -> str:
    lines = [
        "# The stability map: LR sensitivity of each arm",
        "",
        f"{len(t)} runs ({t['run'].nunique()} points); LR sensitivity after Wortsman et al. 2023 "
        "(arXiv 2309.14322): the mean over the rates of min(L, L0) - L*, in bits of codebook-0 training "
        "loss; lower is less sensitive. Rules of the verdicts: docs/stability.md.",
        "",
        "| arm | panel | LR sensitivity (seed spread) | mean capped loss | best rate | loss there | "
        "flattened there (seeds) | largest stable rate | diverged runs | largest attention logit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in stats.itertuples():
        lines.append(
            f"| {r.arm} | {r.panel} | {r.sensitivity:.3f} ({r.sensitivity_spread:.3f}) | "
            f"{r.mean_capped_loss:.3f} | {r.best_lr:g} | {r.best_loss:.3f} | "
            f"{'yes' if r.best_flattened else 'no'} ({r.best_seeds}) | "
            f"{r.largest_stable_lr:g} | {r.diverged_runs} | {r.attn_logit_max:.4g} |"
        )
    lines += ["", "| promise | verdict | numbers |", "| --- | --- | --- |"]
    for v in vs:
        lines.append(f"| {v['promise']} | **{v['verdict']}** | {'; '.join(v['notes']) or '-'} |")
    return "\n".join(lines) + "\n"


def run_claims(cfg: C.Config, map_path: Path, out_json: Path, out_md: Path) -> dict:
    """The sweep's verdicts: results/map_claims.json ({"kind": "stability_map", runs, points, arms: one
    object per arm and panel, verdicts: a list of {id, promise, verdict, notes, measured}}) and
    results/map_claims.md. Named apart from the figure's claims.{json,md} (report.claims: another
    schema), docs/stability.md."""
    t = read_map(map_path)
    stats, vs = verdicts(cfg, t)
    result = {
        "kind": "stability_map",
        "runs": len(t),
        "points": int(t["run"].nunique()),
        "arms": [{k: _round(v) for k, v in r.items()} for r in stats.to_dict("records")],
        "verdicts": vs,
    }
    write_json(Path(out_json), result)
    with atomic_path(Path(out_md)) as tmp:
        tmp.write_text(_md(stats, vs, t))
    for v in vs:
        log.info("map-claims: %s: %s", v["id"], v["verdict"])
    return result
