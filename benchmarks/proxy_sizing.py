"""Sizing a proxy that learns and breaks: the sizing runs of docs/stability.md ("Sizing a proxy").

The decisive round's proxy (width 32, 2 layers, the default's codes) never left its unigram plateau,
so it could say nothing about instability. This script trains the package's own model (`train.run`,
config/proxy.yaml's settings with a size's overrides) on a corpus whose codes are learnable from
context, one run at a time, and publishes one row per run as it finishes:

    corpus  the rounds' tone corpus (acoustic_mlm.experiments.tone_corpus) in the package's layout (tones whose pitch is
            codebook 0's code, in runs of about 12 frames; 16 codes: the plateau is their unigram
            entropy, about 4 bits), CLIPS clips of FRAMES frames, the last held out
    sizes   SIZES below: model and budget overrides of config/proxy.yaml
    arms    ARMS below: the baseline (Pre-Norm, clip 10), clip 1, clipping off (the control), plain
            Post-Norm and DeepNorm (clip 1)

    python benchmarks/proxy_sizing.py --size S1 --arm prenorm_clip10 --lr 0.003 0.01 --seed 1 \
        --out data/reference/proxy_sizing --work /tmp/amlm_proxy_sizing
    python benchmarks/proxy_sizing.py --size S1 --procedure     # the rules' whole procedure at one size
    python benchmarks/proxy_sizing.py --size S1 --arm prenorm_clip1 --lr 0.05 --seed 1 --retime  # its CPU time

Each run appends (atomically rewrites) under --out:

    runs.csv     one row per run: size, arm, rate, seed, its settings, the outcomes of
                 report/decisive.run_outcomes against the corpus's plateau, the first step at which the
                 training loss is 1 bit below the plateau (`cross_step`), spikes, the largest attention
                 logit and gradient norm, the run's status and wall time
    curves.csv   every metrics row of every run (step, training and validation loss of codebook 0,
                 largest attention logit, gradient norm before clipping): anyone can re-judge
    spikes.csv   every spike (curves.detect_spikes, 0.5 bits above the running minimum, recovered
                 within 0.2), with onset, peak and recovery steps

A run already in runs.csv (same size, arm, rate and seed) is not trained again.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm import curves
from acoustic_mlm.experiments.runner import append, locked
from acoustic_mlm.experiments.tone_corpus import write_corpus
from acoustic_mlm.report import decisive
from acoustic_mlm.train import loop as train
from acoustic_mlm.utils import atomic_path

ROOT = Path(__file__).resolve().parents[1]
CLIPS, FRAMES = 24, 600  # 23 training clips of 8 s and one held out
MARGIN = 1.0  # bits below the plateau that count as having left it (criterion (a))

# Model and budget overrides of config/proxy.yaml, smallest first (docs/stability.md: the ladder).
SIZES: dict[str, dict] = {
    "S1": {"model.dim": 32, "model.layers": 2, "model.ffn_dim": 128, "train.steps": 600, "train.batch_size": 8},
    "S2": {"model.dim": 64, "model.layers": 2, "model.ffn_dim": 256, "train.steps": 600, "train.batch_size": 8},
    "S3": {"model.dim": 64, "model.layers": 4, "model.ffn_dim": 256, "train.steps": 800, "train.batch_size": 8},
    # round 2 (docs/stability.md): depth without warm-up, where Post-Norm is known to fail
    "D6": {
        "model.dim": 32,
        "model.layers": 6,
        "model.ffn_dim": 128,
        "train.steps": 600,
        "train.batch_size": 8,
        "train.warmup_steps": 0,
    },
    "D12": {
        "model.dim": 32,
        "model.layers": 12,
        "model.ffn_dim": 128,
        "train.steps": 600,
        "train.batch_size": 8,
        "train.warmup_steps": 0,
    },
}
COMMON = {"train.warmup_steps": 50, "train.log_interval": 25, "train.checkpoint_interval": 0, "train.threads": 1}
ARMS: dict[str, dict] = {
    "prenorm_clip10": {"norm": "pre", "attention": "softmax", "clip": 10.0},
    "prenorm_clip1": {"norm": "pre", "attention": "softmax", "clip": 1.0},
    "prenorm_noclip": {"norm": "pre", "attention": "softmax", "clip": 0.0},
    "postnorm_clip1": {"norm": "post", "attention": "softmax", "clip": 1.0},
    "postnorm_deepnorm_clip1": {"norm": "deepnorm", "attention": "softmax", "clip": 1.0},
}
ROUND = 2  # the sizing round new runs belong to (docs/stability.md); round 1's rows are backfilled with 1
RUN_COLUMNS = [
    "round",
    "size",
    "arm",
    "lr",
    "seed",
    "dim",
    "layers",
    "ffn_dim",
    "steps",
    "batch_size",
    "norm",
    "attention",
    "clip",
    "warmup_steps",
    "status",
    "plateau",
    "first_loss",
    "final_loss",
    "lowest_loss",
    "lowest_step",
    "cross_step",
    "left_plateau",
    "trained",
    "collapsed",
    "spikes",
    "largest_spike_bits",
    "late_spikes",
    "largest_late_spike_bits",
    "nonfinite_steps",
    "max_grad_norm",
    "attn_logit_max",
    "attn_logit_final",
    "wall_time_s",
]
CURVE_COLUMNS = ["size", "arm", "lr", "seed", "step", "train_loss_cb0", "valid_loss_cb0", "attn_logit_max", "grad_norm"]
SPIKE_COLUMNS = ["size", "arm", "lr", "seed", "onset_step", "peak_step", "peak_bits", "base_bits", "height_bits"]
SPIKE_COLUMNS += ["recovery_step"]


def settings_for(size: str, arm: str, lr: float, seed: int, arms: dict | None = None) -> C.Config:
    """config/proxy.yaml with the size's and the arm's settings (`arms`: ARMS), one arm, one seed, no
    sweep, validated and typed."""
    s = copy.deepcopy(C.read_yaml(ROOT / "config" / "proxy.yaml"))
    s.pop("sweep", None)
    for dotted, value in {**COMMON, **SIZES[size], "train.lr": lr}.items():
        section, key = dotted.split(".")
        if key not in s[section]:
            raise SystemExit(f"no key {dotted!r} in config/proxy.yaml")
        s[section][key] = value
    s["runs"] = {arm: {"label": arm, **(arms or ARMS)[arm], "seeds": [seed]}}
    return C.from_mapping(s, f"proxy sizing {size} {arm}")


def cross_step(steps, loss, line: float):
    """First metrics row whose loss is at or below `line` (None: never)."""
    below = np.flatnonzero(np.asarray(loss, dtype=float) <= line)
    return int(np.asarray(steps)[below[0]]) if len(below) else None


def warmup_of(size: str) -> int:
    return int({**COMMON, **SIZES[size]}["train.warmup_steps"])


def late_spikes(steps, loss, warmup: int) -> list[dict]:
    """Round 2's spikes: on the averaged rows only (multiples of the log interval), onset after warm-up."""
    steps, loss = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    keep = np.isfinite(loss) & (steps % COMMON["train.log_interval"] == 0)
    found = curves.detect_spikes(steps[keep], loss[keep], decisive.SPIKE_THRESHOLD, decisive.SPIKE_RECOVERY)
    return [s for s in found if s["onset_step"] > warmup]


def late_spike_columns(steps, loss, warmup: int) -> dict:
    found = late_spikes(steps, loss, warmup)
    return {"late_spikes": len(found), "largest_late_spike_bits": max((s["height_bits"] for s in found), default=0.0)}


def one_run(
    size: str,
    arm: str,
    lr: float,
    seed: int,
    prepared: Path,
    codes: Path,
    plateau: float,
    work: Path,
    arms: dict | None = None,
    round_: int = ROUND,
):
    """Train one run; its runs.csv row, its curve rows and its spikes (round_: the round it belongs to)."""
    cfg = settings_for(size, arm, lr, seed, arms)
    name = f"{size}__{arm}__lr-{lr:g}__seed-{seed}"
    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    train.run(cfg, arm, prepared, codes, out, threads=1)
    wall = time.perf_counter() - t0
    [row] = decisive.read_run(out, plateau)
    m = pd.read_csv(out / "metrics.csv")
    steps, loss = m["step"].to_numpy(), m["train_loss_cb0"].to_numpy()
    finite = np.isfinite(loss)
    spikes = curves.detect_spikes(steps[finite], loss[finite], decisive.SPIKE_THRESHOLD, decisive.SPIKE_RECOVERY)
    key = {"size": size, "arm": arm, "lr": lr, "seed": seed}
    crossed = cross_step(steps[finite], loss[finite], plateau - MARGIN)
    model = SIZES[size]
    logits = m["attn_logit_max"].dropna()
    run = {
        "round": round_,
        **key,
        "dim": model["model.dim"],
        "layers": model["model.layers"],
        "ffn_dim": model["model.ffn_dim"],
        "steps": model["train.steps"],
        "batch_size": model["train.batch_size"],
        **{k: row[k] for k in ("norm", "attention", "clip", "status", "plateau", "first_loss", "final_loss")},
        **{k: row[k] for k in ("lowest_loss", "lowest_step", "trained", "collapsed", "nonfinite_steps")},
        "cross_step": crossed,
        "left_plateau": crossed is not None,
        "spikes": len(spikes),
        "largest_spike_bits": max((s["height_bits"] for s in spikes), default=0.0),
        **late_spike_columns(steps, loss, warmup_of(size)),
        "warmup_steps": warmup_of(size),
        "max_grad_norm": row["max_grad_norm"],
        "attn_logit_max": row["attn_logit_max"],
        "attn_logit_final": float(logits.iloc[-1]) if len(logits) else math.nan,
        "wall_time_s": round(wall, 1),
    }
    curve = pd.DataFrame(
        {
            **{k: [v] * len(m) for k, v in key.items()},
            "step": m["step"],
            "train_loss_cb0": m["train_loss_cb0"],
            "valid_loss_cb0": m["valid_loss_cb0"],
            "attn_logit_max": m["attn_logit_max"],
            "grad_norm": m["grad_norm_max"],
        }
    )
    spike_rows = [{**key, **{k: s[k] for k in SPIKE_COLUMNS if k in s}} for s in spikes]
    return run, curve, spike_rows


def backfill(out: Path) -> None:
    """Round 1's rows get round 2's columns from their published curves (nothing is trained)."""
    path = out / "runs.csv"
    if not path.exists():
        return
    runs = pd.read_csv(path)
    missing = [c for c in RUN_COLUMNS if c not in runs.columns]
    if not missing:
        return
    if set(missing) - {"round", "warmup_steps", "late_spikes", "largest_late_spike_bits"}:
        raise SystemExit(f"{path}: columns {missing} cannot be filled from the curves")
    curves_ = pd.read_csv(out / "curves.csv")
    filled = []
    for _, run in runs.iterrows():
        c = curves_[
            (curves_["size"] == run["size"])
            & (curves_["arm"] == run["arm"])
            & np.isclose(curves_["lr"], run["lr"])
            & (curves_["seed"] == run["seed"])
        ]
        warmup = warmup_of(run["size"])
        late = late_spike_columns(c["step"], c["train_loss_cb0"], warmup)
        filled.append({"round": 1, "warmup_steps": warmup, **late})
    for column in missing:
        runs[column] = [row[column] for row in filled]
    with atomic_path(path) as tmp:
        runs[RUN_COLUMNS].to_csv(tmp, index=False)


RATES = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
# round 2's scan per size (docs/stability.md): S1 gets two rates where its arms could part
SIZE_RATES = {"S1": sorted([*RATES, 5e-2, 7e-2])}
BASELINE = "prenorm_clip10"
# (unstabilized arm, stabilized arm): the stabilizer is what differs between them
PAIRS = [
    ("prenorm_noclip", "prenorm_clip1"),
    ("prenorm_noclip", "prenorm_clip10"),
    ("prenorm_clip10", "prenorm_clip1"),
    ("postnorm_clip1", "postnorm_deepnorm_clip1"),
]
LOGIT_GROWTH, LOGIT_LOSS_COST = 10.0, 0.5


def best_rate(runs: pd.DataFrame, size: str) -> float | None:
    """The baseline's seed-1 rate of lowest final loss (the lower rate within 0.02 bits)."""
    r = runs[(runs["size"] == size) & (runs["arm"] == BASELINE) & (runs["seed"] == 1)].sort_values("lr")
    r = r[np.isfinite(r["final_loss"])]
    if r.empty:
        return None
    low = float(r["final_loss"].min())
    return float(r[r["final_loss"] <= low + 0.02]["lr"].iloc[0])


def instabilities(runs: pd.DataFrame, size: str, best: float, rules: int = 2) -> pd.Series:
    """Per run of the size: True when it shows an instability (docs/stability.md, (i)-(iv)); rules 1
    counts every spike, rules 2 (round 2) only those on averaged rows after the warm-up."""
    r = runs[runs["size"] == size]
    base = r[(r["arm"] == BASELINE) & np.isclose(r["lr"], best)].set_index("seed")
    ref_logit = r["seed"].map(base["attn_logit_final"])
    ref_loss = r["seed"].map(base["final_loss"])
    growth = (r["attn_logit_final"] >= LOGIT_GROWTH * ref_logit) & (r["final_loss"] >= ref_loss + LOGIT_LOSS_COST)
    failed = (r["status"] != "completed") | (r["nonfinite_steps"] > 0)
    collapsed = r["left_plateau"].astype(bool) & ~r["trained"].astype(bool)
    spike = r["largest_spike_bits" if rules == 1 else "largest_late_spike_bits"] >= decisive.SPIKE_THRESHOLD
    return spike | failed | collapsed | growth.fillna(False)


def prevents(runs: pd.DataFrame, size: str, best: float, bad: str, good: str, lr: float, rules: int = 2) -> bool:
    """The stabilizer (what `good` has and `bad` lacks) prevents an instability at `lr`: `bad` unstable
    in at least 2 of 3 seeds, `good` in none; by round 2's rules `good` also trained in all 3."""
    r = runs[(runs["size"] == size) & np.isclose(runs["lr"], lr)]
    flags = instabilities(runs, size, best, rules)
    bad_rows, good_rows = r["arm"] == bad, r["arm"] == good
    if bad_rows.sum() < 3 or good_rows.sum() < 3:
        return False
    learned = rules == 1 or bool(r.loc[good_rows, "trained"].astype(bool).all())
    return (
        int(flags[bad_rows.reindex(flags.index, fill_value=False)].sum()) >= 2
        and not bool(flags[good_rows.reindex(flags.index, fill_value=False)].any())
        and learned
    )


def _unstable(runs: pd.DataFrame, size: str, best: float, arm: str, lr: float) -> pd.Series:
    """The instability flags of one arm's runs at one rate of the size."""
    r = runs[runs["size"] == size]
    flags = instabilities(runs, size, best)
    return flags[(r["arm"] == arm) & np.isclose(r["lr"], lr)]


def _trained(runs: pd.DataFrame, size: str, arm: str, lr: float) -> bool:
    r = runs[(runs["size"] == size) & (runs["arm"] == arm) & np.isclose(runs["lr"], lr)]
    return bool(len(r)) and bool(r["trained"].astype(bool).all())


def _run(size, arms, lrs, seeds, out, work) -> pd.DataFrame:
    args = ["--size", size, "--arm", *arms, "--lr", *map(str, lrs), "--seed", *map(str, seeds)]
    main([*args, "--out", str(out), "--work", str(work)])
    return pd.read_csv(out / "runs.csv")


def spent(out: Path) -> float:
    """Wall seconds of this round's runs published so far."""
    path = out / "runs.csv"
    if not path.exists():
        return 0.0
    runs = pd.read_csv(path)
    return float(runs.loc[runs["round"] == ROUND, "wall_time_s"].sum()) if "round" in runs else 0.0


def procedure(size: str, out: Path, work: Path, budget_s: float = math.inf) -> dict:
    """docs/stability.md's procedure at one size: rate scan, (a), above the best rate, (b), (c)."""
    verdict = {"size": size, "rules": 2}
    rates = SIZE_RATES.get(size, RATES)
    runs = _run(size, [BASELINE], rates, [1], out, work)
    best = best_rate(runs, size)
    verdict["best_rate"] = best
    runs = _run(size, [BASELINE], [best], [2, 3], out, work)
    at_best = runs[(runs["size"] == size) & (runs["arm"] == BASELINE) & np.isclose(runs["lr"], best)]
    verdict["a_trained"] = f"{int(at_best['trained'].sum())} of {len(at_best)}"
    verdict["a"] = bool(len(at_best) == 3 and at_best["trained"].all())
    if not verdict["a"]:
        return verdict
    above = [lr for lr in rates if lr > best * 1.0001]
    for lr in above:
        if spent(out) > budget_s:
            break
        runs = _run(size, sorted(ARMS), [lr], [1], out, work)
    prevented = []
    for lr in above:  # stops at the first pair and rate that pass (b): the rules ask for one
        for bad, good in PAIRS:
            if prevented or spent(out) > budget_s:
                break
            screen = _unstable(runs, size, best, bad, lr).any() and not _unstable(runs, size, best, good, lr).any()
            if not (screen and _trained(runs, size, good, lr)):  # seed 1 already rules the pair out
                continue
            runs = _run(size, [bad, good], [lr], [2, 3], out, work)
            if prevents(runs, size, best, bad, good, lr):
                n_bad = int(_unstable(runs, size, best, bad, lr).sum())
                prevented.append({"lr": lr, "without": bad, "with": good, "unstable_without": n_bad})
    verdict["b_prevented"] = prevented
    verdict["b"] = bool(prevented)
    verdict["stopped_at_budget"] = bool(not prevented and spent(out) > budget_s)
    r = runs[runs["size"] == size]
    verdict["c_longest_run_s"] = float(r["wall_time_s"].max())
    verdict["c"] = bool(r["wall_time_s"].max() <= 300)
    return verdict


def retime(size: str, arm: str, lr: float, seed: int, out: Path, work: Path) -> dict:
    """Train a published run again, alone: its CPU seconds (the core-time criterion (c) is about, which
    a shared machine's wall time only bounds) and whether its curve is the published one to the bit."""
    corpus = work / "data"
    plateau = decisive.plateau_bits(corpus / "codes")
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    run, curve, _ = one_run(size, arm, lr, seed, corpus / "prepared", corpus / "codes", plateau, work / "retime")
    after = resource.getrusage(resource.RUSAGE_SELF)
    published = pd.read_csv(out / "curves.csv")
    p = published[
        (published["size"] == size)
        & (published["arm"] == arm)
        & np.isclose(published["lr"], lr)
        & (published["seed"] == seed)
    ]
    row = {
        "size": size,
        "arm": arm,
        "lr": lr,
        "seed": seed,
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "same_curve": bool(np.array_equal(p["train_loss_cb0"].to_numpy(), curve["train_loss_cb0"].to_numpy())),
        "final_loss": run["final_loss"],
    }
    with locked(out):
        append(out / "retime.csv", pd.DataFrame([row]), list(row))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", nargs="+", required=True, choices=sorted(SIZES), help="with --procedure: in order")
    p.add_argument("--procedure", action="store_true", help="run the rules' whole procedure at --size")
    p.add_argument("--retime", action="store_true", help="train one published run again, alone, for its CPU time")
    p.add_argument("--arm", nargs="+", choices=sorted(ARMS))
    p.add_argument("--budget-minutes", type=float, default=150.0, help="--procedure: this round's run time, at most")
    p.add_argument("--lr", nargs="+", type=float)
    p.add_argument("--seed", nargs="+", type=int, default=[1])
    p.add_argument("--out", type=Path, default=ROOT / "data" / "reference" / "proxy_sizing")
    p.add_argument("--work", type=Path, default=Path("/tmp/amlm_proxy_sizing"))
    args = p.parse_args(argv)
    if args.procedure:  # the sizes in order, up to the first that passes (a), (b) and (c)
        for size in args.size:
            if spent(args.out) > args.budget_minutes * 60:
                print(f"budget of {args.budget_minutes} minutes spent before size {size}", flush=True)
                break
            verdict = procedure(size, args.out, args.work, args.budget_minutes * 60)
            print(json.dumps(verdict), flush=True)
            with atomic_path(args.out / f"verdict_{size}_r2.json") as tmp:
                tmp.write_text(json.dumps(verdict, indent=2) + "\n")
            if all(verdict.get(k) for k in ("a", "b", "c")):
                break
        return 0
    if len(args.size) != 1:
        p.error("one --size without --procedure")
    args.size = args.size[0]
    if not (args.arm and args.lr):
        p.error("--arm and --lr are needed without --procedure")
    if args.retime:
        for arm in args.arm:
            for lr in args.lr:
                for seed in args.seed:
                    print(json.dumps(retime(args.size, arm, lr, seed, args.out, args.work)), flush=True)
        return 0
    corpus = args.work / "data"
    with locked(args.work):  # two procedures side by side share one corpus
        if not (corpus / "codes" / "tokenizer.json").exists():
            shutil.rmtree(corpus, ignore_errors=True)
            write_corpus(corpus, clips=CLIPS, frames=FRAMES, seed=0)
    prepared, codes = corpus / "prepared", corpus / "codes"
    plateau = decisive.plateau_bits(codes)
    args.out.mkdir(parents=True, exist_ok=True)
    with locked(args.out):
        backfill(args.out)
    done = pd.read_csv(args.out / "runs.csv") if (args.out / "runs.csv").exists() else None
    for seed in args.seed:
        for lr in args.lr:
            for arm in args.arm:
                if (
                    done is not None
                    and (
                        (done["size"] == args.size)
                        & (done["arm"] == arm)
                        & np.isclose(done["lr"], lr)
                        & (done["seed"] == seed)
                    ).any()
                ):
                    print(f"already run: {args.size} {arm} {lr:g} seed {seed}", flush=True)
                    continue
                run, curve, spikes = one_run(args.size, arm, lr, seed, prepared, codes, plateau, args.work)
                with locked(args.out):
                    append(args.out / "runs.csv", pd.DataFrame([run]), RUN_COLUMNS)
                    append(args.out / "curves.csv", curve, CURVE_COLUMNS)
                    append(args.out / "spikes.csv", pd.DataFrame(spikes, columns=SPIKE_COLUMNS), SPIKE_COLUMNS)
                print(
                    f"{args.size} {arm} lr {lr:g} seed {seed}: final {run['final_loss']:.3f} "
                    f"(plateau {plateau:.3f}), cross {run['cross_step']}, spikes {run['spikes']} "
                    f"(largest {run['largest_spike_bits']:.2f}), logit {run['attn_logit_max']:.1f}, "
                    f"status {run['status']}, {run['wall_time_s']} s",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
