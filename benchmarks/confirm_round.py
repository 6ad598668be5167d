"""The confirmatory round on the sized proxy S1: its runs and its verdicts (docs/stability.md, "The
confirmatory round on S1: the rules").

Every run is S1 of benchmarks/proxy_sizing.py (the same model, budget, corpus and one torch thread),
at the round's peak rate, with fresh seeds; its row, curve and spikes go to the same tables as the
sizing's, with `round` 3, under --out:

    python benchmarks/confirm_round.py commands > queue.txt    # every run of the round, part by part
    python benchmarks/run_queue.py queue.txt --log data/reference/confirm_round/queue_log.txt --jobs 2
    python benchmarks/confirm_round.py run --arm prenorm_clip1 --lr 0.05 --seed 101   # one run (the queue's)
    python benchmarks/confirm_round.py judge   # verdicts.json and sensitivity.csv from the runs so far
    python benchmarks/confirm_round.py judge --figure docs/lr_sensitivity_s1.png   # and the curves drawn

`judge` gives a verdict only for a part whose runs are all published; the rest is "not finished".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm.report import decisive, stability_map
from acoustic_mlm.report.power import excluded_reading, fisher_greater
from acoustic_mlm.utils import atomic_path

ROOT = Path(__file__).resolve().parents[1]
ROUND, SIZE, LR = 3, "S1", 0.05
ALPHA = 0.025  # report.power.excluded_effect takes the same level, 80 % power and steps of 0.05
OUT = ROOT / "data" / "reference" / "confirm_round"
SIZING = ROOT / "data" / "reference" / "proxy_sizing"


def _sizing():
    spec = importlib.util.spec_from_file_location("proxy_sizing", ROOT / "benchmarks" / "proxy_sizing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ps = _sizing()
ARMS = {**ps.ARMS, "prenorm_attnrelax_clip1": {"norm": "pre", "attention": "pb_relax", "clip": 1.0}}
FIGURE_ARMS = ["prenorm_clip10", "prenorm_clip1", "postnorm_deepnorm_clip1", "prenorm_attnrelax_clip1"]
SEEDS = list(range(101, 113))  # 12 per arm: the power analysis of docs/stability.md
AA_SEEDS = list(range(201, 211))  # the A/A arm's 10, against prenorm_clip1's 101-110
SENSITIVITY_SEED = 401
SENSITIVITY_RATES = [1e-3, 3e-3, 1e-2, 3e-2, 5e-2, 7e-2, 1e-1, 3e-1]

# P3's cell, by the amendment of docs/stability.md: D12 (12 layers, no warm-up) at 1e-2
P3_SIZE, P3_LR = "D12", 1e-2

# (id, promise, arm A (favoured), A's seeds, arm B, B's seeds, size, peak rate)
PROMISES = [
    ("P1", "clipping prevents the collapse", "prenorm_clip1", SEEDS, "prenorm_noclip", SEEDS, SIZE, LR),
    ("P2", "clip 1 survives where clip 10 fails", "prenorm_clip1", SEEDS, "prenorm_clip10", SEEDS, SIZE, LR),
    ("P3", "DeepNorm trains Post-Norm where plain Post-Norm fails", "postnorm_deepnorm_clip1", SEEDS,
     "postnorm_clip1", SEEDS, P3_SIZE, P3_LR),
]  # fmt: skip
AA = ("AA", "A/A calibration", "prenorm_attnrelax_clip1", AA_SEEDS, "prenorm_clip1", SEEDS[:10], SIZE, LR)


def parts() -> list[tuple[str, list[tuple[str, str, float, int]]]]:
    """The round's runs (size, arm, rate, seed), part by part, in the order they run."""
    at = lambda arm, seeds, size=SIZE, lr=LR: [(size, arm, lr, s) for s in seeds]  # noqa: E731
    p3 = at("postnorm_deepnorm_clip1", SEEDS, P3_SIZE, P3_LR) + at("postnorm_clip1", SEEDS, P3_SIZE, P3_LR)
    return [
        ("P1", at("prenorm_clip1", SEEDS) + at("prenorm_noclip", SEEDS)),
        ("P2", at("prenorm_clip10", SEEDS)),
        ("AA", at("prenorm_attnrelax_clip1", AA_SEEDS)),
        ("P3", p3),
        ("sensitivity", [(SIZE, arm, lr, SENSITIVITY_SEED) for arm in FIGURE_ARMS for lr in SENSITIVITY_RATES]),
    ]


def reference(sizing_runs: pd.DataFrame) -> tuple[float, float]:
    """Instability (iv)'s reference: the baseline at S1's best rate (1e-2), seed 1, of round 2's sizing:
    its last attention logit and its final loss."""
    r = sizing_runs[
        (sizing_runs["size"] == SIZE)
        & (sizing_runs["arm"] == ps.BASELINE)
        & np.isclose(sizing_runs["lr"], 1e-2)
        & (sizing_runs["seed"] == 1)
    ]
    if len(r) != 1:
        raise SystemExit(f"{SIZING / 'runs.csv'}: no single {ps.BASELINE} run at 1e-2, seed 1")
    return float(r["attn_logit_final"].iloc[0]), float(r["final_loss"].iloc[0])


def unstable(runs: pd.DataFrame, ref_logit: float, ref_loss: float) -> pd.Series:
    """Round 2's instabilities (i)-(iv) of each run, (iv) against one reference run for every seed."""
    spike = runs["largest_late_spike_bits"] >= decisive.SPIKE_THRESHOLD
    failed = (runs["status"] != "completed") | (runs["nonfinite_steps"] > 0)
    collapsed = runs["left_plateau"].astype(bool) & ~runs["trained"].astype(bool)
    growth = (runs["attn_logit_final"] >= ps.LOGIT_GROWTH * ref_logit) & (
        runs["final_loss"] >= ref_loss + ps.LOGIT_LOSS_COST
    )
    return spike | failed | collapsed | growth.fillna(False)


def _select(runs: pd.DataFrame, arm: str, seeds: list[int], lr: float = LR, size: str = SIZE) -> pd.DataFrame:
    return runs[(runs["size"] == size) & (runs["arm"] == arm) & np.isclose(runs["lr"], lr) & runs["seed"].isin(seeds)]


def compare(runs: pd.DataFrame, spec, flags: pd.Series) -> dict:
    """One promise (or the A/A pair) judged by the round's rules; `finished` False until every run is in."""
    pid, promise, arm_a, seeds_a, arm_b, seeds_b, size, lr = spec
    a, b = _select(runs, arm_a, seeds_a, lr, size), _select(runs, arm_b, seeds_b, lr, size)
    out = {"id": pid, "promise": promise, "size": size, "lr": lr, "a": arm_a, "b": arm_b}
    out |= {"n_a": len(a), "n_b": len(b)}
    out["finished"] = bool(len(a) == len(seeds_a) and len(b) == len(seeds_b))
    if not out["finished"]:
        return {**out, "verdict": "not finished"}
    ta, tb = int(a["trained"].astype(bool).sum()), int(b["trained"].astype(bool).sum())
    p_for, p_against = fisher_greater(ta, len(a), tb, len(b)), fisher_greater(tb, len(b), ta, len(a))
    out |= {"trained_a": ta, "trained_b": tb, "unstable_a": int(flags[a.index].sum())}
    out |= {"unstable_b": int(flags[b.index].sum()), "p_for": p_for, "p_against": p_against}
    if p_for < ALPHA:
        verdict = "supported"
    elif p_against < ALPHA:
        verdict = "contradicted"
    else:
        verdict = "undecided"
        out |= excluded_reading(tb / len(b), len(a), len(b), "share trained", alpha=ALPHA)
    return {**out, "verdict": verdict}


def sensitivity(runs: pd.DataFrame) -> pd.DataFrame:
    """Each figure arm's final loss at each grid rate (seed 401) and Wortsman et al.'s LR sensitivity
    E_lr[min(L, L0) - L*] over the grid; an arm is summarised only once its whole grid is in."""
    rows = []
    for arm in FIGURE_ARMS:
        r = runs[(runs["size"] == SIZE) & (runs["arm"] == arm) & (runs["seed"] == SENSITIVITY_SEED)]
        r = r.sort_values("lr")
        done = len(r) == len(SENSITIVITY_RATES)
        finals = r["final_loss"].to_numpy(dtype=float)
        best = float(np.nanmin(finals)) if done and np.isfinite(finals).any() else math.nan
        # L* is the lowest capped final loss: the lowest final loss whenever one rate ends below its L0
        value = stability_map.lr_sensitivity(finals, r["first_loss"].to_numpy(dtype=float)) if done else math.nan
        for lr, final in zip(r["lr"], finals):
            rows.append({"arm": arm, "lr": float(lr), "final_loss": float(final)})
        rows.append({"arm": arm, "lr": math.nan, "final_loss": best, "lr_sensitivity": value, "finished": done})
    return pd.DataFrame(rows, columns=["arm", "lr", "final_loss", "lr_sensitivity", "finished"])


def sensitivity_figure(runs: pd.DataFrame, path: Path) -> Path:
    """The sensitivity runs drawn: each figure arm's final loss against the peak rate (log x), capped at
    the run's first loss as the sensitivity caps it, with the plateau's line (U, and U - 1: trained)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {arm: run.label for arm, run in C.load(ROOT / "config" / "config.yaml").runs.items()}
    r = runs[(runs["size"] == SIZE) & runs["arm"].isin(FIGURE_ARMS) & (runs["seed"] == SENSITIVITY_SEED)]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    for arm, marker in zip(FIGURE_ARMS, "osD^"):
        a = r[r["arm"] == arm].sort_values("lr")
        capped = [stability_map.capped_loss(f, i) for f, i in zip(a["final_loss"], a["first_loss"])]
        ax.plot(a["lr"], capped, marker=marker, label=labels[arm])
    plateau = float(r["plateau"].median())
    ax.axhline(plateau, color="0.4", linestyle="--", linewidth=1, label=f"unigram plateau U = {plateau:.2f}")
    ax.axhline(plateau - ps.MARGIN, color="0.4", linestyle=":", linewidth=1, label="U - 1 (trained)")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final codebook-0 loss (bits)")
    ax.set_title(f"S1, seed {SENSITIVITY_SEED}: final loss against the peak rate", fontsize=10)
    ax.legend(fontsize=7)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip("."), dpi=150)
    plt.close(fig)
    return path


def judge(out: Path, sizing: Path) -> dict:
    runs = pd.read_csv(out / "runs.csv") if (out / "runs.csv").exists() else pd.DataFrame(columns=ps.RUN_COLUMNS)
    runs = runs[runs["round"] == ROUND] if len(runs) else runs
    ref_logit, ref_loss = reference(pd.read_csv(sizing / "runs.csv"))
    flags = unstable(runs, ref_logit, ref_loss) if len(runs) else pd.Series(dtype=bool)
    verdicts = [compare(runs, spec, flags) for spec in PROMISES]
    aa = compare(runs, AA, flags)
    aa["calibrated"] = None if not aa["finished"] else bool(aa["verdict"] == "undecided")
    result = {"round": ROUND, "alpha": ALPHA, "verdicts": verdicts, "aa": aa}
    if aa["calibrated"] is False:
        result["note"] = "the A/A pair was decided: every verdict of this round is not calibrated"
    with atomic_path(out / "verdicts.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    with atomic_path(out / "sensitivity.csv") as tmp:
        sensitivity(runs).to_csv(tmp, index=False)
    return result


def run_one(size: str, arm: str, lr: float, seed: int, out: Path, work: Path) -> None:
    corpus = work / "data"
    with ps._locked(work):
        if not (corpus / "codes" / "tokenizer.json").exists():
            shutil.rmtree(corpus, ignore_errors=True)
            ps._forced_spike().write_corpus(corpus, clips=ps.CLIPS, frames=ps.FRAMES, seed=0)
    done = pd.read_csv(out / "runs.csv") if (out / "runs.csv").exists() else None
    if done is not None and len(_select(done, arm, [seed], lr, size)):
        print(f"already run: {arm} {lr:g} seed {seed}", flush=True)
        return
    plateau = decisive.plateau_bits(corpus / "codes")
    run, curve, spikes = ps.one_run(
        size, arm, lr, seed, corpus / "prepared", corpus / "codes", plateau, work, arms=ARMS, round_=ROUND
    )
    with ps._locked(out):
        ps._append(out / "runs.csv", pd.DataFrame([run]), ps.RUN_COLUMNS)
        ps._append(out / "curves.csv", curve, ps.CURVE_COLUMNS)
        ps._append(out / "spikes.csv", pd.DataFrame(spikes, columns=ps.SPIKE_COLUMNS), ps.SPIKE_COLUMNS)
    print(f"{size} {arm} lr {lr:g} seed {seed}: final {run['final_loss']:.3f}, trained {run['trained']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("commands", help="print the round's runs as queue commands, part by part")
    r = sub.add_parser("run", help="one run of the round")
    r.add_argument("--size", default=SIZE, choices=[SIZE, P3_SIZE])
    r.add_argument("--arm", required=True, choices=sorted(ARMS))
    r.add_argument("--lr", required=True, type=float)
    r.add_argument("--seed", required=True, type=int)
    j = sub.add_parser("judge", help="verdicts.json and sensitivity.csv from the runs published so far")
    j.add_argument("--figure", type=Path, help="also draw the sensitivity curves to this image")
    for q in sub.choices.values():
        q.add_argument("--out", type=Path, default=OUT)
        q.add_argument("--work", type=Path, default=Path("/tmp/amlm_proxy_sizing"))
    args = p.parse_args(argv)
    if args.command == "commands":
        for name, runs in parts():
            print(f"# part {name}")
            for size, arm, lr, seed in runs:
                print(
                    f"cd {ROOT} && python benchmarks/confirm_round.py run --size {size} --arm {arm} --lr {lr:g}"
                    f" --seed {seed}"
                    f" --out {args.out} --work {args.work}"
                )
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "run":
        run_one(args.size, args.arm, args.lr, args.seed, args.out, args.work)
        return 0
    print(json.dumps(judge(args.out, SIZING), indent=2))
    if args.figure is not None:
        print(sensitivity_figure(pd.read_csv(args.out / "runs.csv"), args.figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
