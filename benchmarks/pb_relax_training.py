"""PB-Relax in float16 training (fairseq's fp16: `fp16_fairseq`): its runs and its verdict
(docs/stability.md, "PB-Relax in fp16 training: the rules").

Every run is S1 of benchmarks/proxy_sizing.py (width 32, 2 layers, 8 crops of 1 s, the tone corpus,
one torch thread) trained for 800 updates at peak rate 1e-2 with clip 1 in `fp16_fairseq` (a half
model, fp32 master weights, fairseq's dynamic loss scaler), its queries and keys multiplied by
`model.qk_gain` (forced logit growth: logits x gain^2) at two gains, one whose largest attention
logit stays below float16's 65,504 and one whose logit crosses it. The two arms differ only in the
attention: fairseq's unfused order (q.k^T in float16, softmax in float32) and PB-Relax.

    python benchmarks/pb_relax_training.py commands > queue.txt
    python benchmarks/run_queue.py queue.txt --log data/reference/pb_relax_training/queue_log.txt --jobs 2
    python benchmarks/pb_relax_training.py run --gain 128 --arm prenorm_attnrelax_clip1 --seed 501
    python benchmarks/pb_relax_training.py judge   # verdict.json from the runs published so far
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.report import decisive
from acoustic_mlm.report.power import fisher_greater
from acoustic_mlm.utils import atomic_path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "reference" / "pb_relax_training"
ROUND, LR, STEPS, ALPHA = 4, 1e-2, 800, 0.025
FP16_MAX = 65504.0
GAIN_LOW, GAIN_HIGH = 48.0, 128.0  # from the pilot (docs/stability.md): below and across 65,504
SEEDS_HIGH = [501, 502, 503, 504]  # 4 per arm: the fewest at which 4/4 against 0/4 reaches p < 0.025
SEEDS_LOW = [511, 512]  # the control: does the unfused order train while its logits stay in range?
FAVOURED, OTHER = "prenorm_attnrelax_clip1", "prenorm_unfused_clip1"


sys.path.insert(0, str(ROOT / "benchmarks"))  # proxy_sizing.py is a sibling script, not a package module
import proxy_sizing as ps  # noqa: E402

ARMS = {
    FAVOURED: {"norm": "pre", "attention": "pb_relax", "clip": 1.0},
    OTHER: {"norm": "pre", "attention": "unfused", "clip": 1.0},
}


def size_name(gain: float) -> str:
    return f"S1-fp16-g{gain:g}"


def sizes() -> dict[str, dict]:
    """S1 at 800 updates in fp16_fairseq, one entry per gain (proxy_sizing's size keys)."""
    return {
        size_name(g): {**ps.SIZES["S1"], "train.steps": STEPS, "train.precision": "fp16_fairseq", "model.qk_gain": g}
        for g in (GAIN_LOW, GAIN_HIGH)
    }


ps.SIZES.update(sizes())


def runs_planned() -> list[tuple[float, str, int]]:
    """(gain, arm, seed) of every run, the crossing gain first."""
    return [(GAIN_HIGH, arm, s) for arm in (FAVOURED, OTHER) for s in SEEDS_HIGH] + [
        (GAIN_LOW, arm, s) for arm in (FAVOURED, OTHER) for s in SEEDS_LOW
    ]


def fp16_columns(folder: Path) -> dict:
    """What fp16_fairseq did in a run folder: the lowest loss scale, the overflow skips, the stop reason."""
    m = pd.read_csv(folder / "metrics.csv")
    summary = json.loads((folder / "summary.json").read_text())
    (seed,) = summary["per_seed"].values()
    scale = m[M.LOSS_SCALE].dropna() if M.LOSS_SCALE in m else pd.Series(dtype=float)
    skips = m[M.OVERFLOW_SKIPS].dropna() if M.OVERFLOW_SKIPS in m else pd.Series(dtype=float)
    return {
        "updates": int(m[M.STEP].max()),
        "lowest_loss_scale": float(scale.min()) if len(scale) else float("nan"),
        "overflow_skips": int(skips.iloc[-1]) if len(skips) else 0,
        "stop_reason": seed.get("stop_reason") or "",
    }


def _select(runs: pd.DataFrame, gain: float, arm: str, seeds: list[int]) -> pd.DataFrame:
    return runs[(runs["size"] == size_name(gain)) & (runs["arm"] == arm) & runs["seed"].isin(seeds)]


def trained_through(runs: pd.DataFrame) -> pd.Series:
    """The primary outcome: the run went through all its updates (not stopped by the loss scaler's
    floor or by a streak of non-finite losses; skipped updates are reported beside) and ended at least a
    bit below the plateau. A run stopped early is not trained, whatever its last finite loss was."""
    completed = runs["status"].isin(["completed", "completed_with_nonfinite"]) & (runs["updates"] == STEPS)
    return completed & runs["trained"].astype(bool)


def judge_runs(runs: pd.DataFrame) -> dict:
    """The verdict by the rules of docs/stability.md ("PB-Relax in fp16 training: the rules")."""
    high_a, high_b = _select(runs, GAIN_HIGH, FAVOURED, SEEDS_HIGH), _select(runs, GAIN_HIGH, OTHER, SEEDS_HIGH)
    low_a, low_b = _select(runs, GAIN_LOW, FAVOURED, SEEDS_LOW), _select(runs, GAIN_LOW, OTHER, SEEDS_LOW)
    finished = (len(high_a), len(high_b), len(low_a), len(low_b)) == (4, 4, 2, 2)
    out: dict = {"round": ROUND, "alpha": ALPHA, "gains": [GAIN_LOW, GAIN_HIGH], "finished": finished}
    if not finished:
        return {**out, "verdict": "not finished"}
    trained = lambda r: int(trained_through(r).sum())  # noqa: E731
    ta, tb = trained(high_a), trained(high_b)
    out |= {"trained_high": {FAVOURED: ta, OTHER: tb}, "trained_low": {FAVOURED: trained(low_a), OTHER: trained(low_b)}}
    out |= {"p_for": fisher_greater(ta, 4, tb, 4), "p_against": fisher_greater(tb, 4, ta, 4)}
    # the cells are what the rules need: the high gain crosses 65,504, the low gain does not
    crossed = bool((high_a["attn_logit_max"] > FP16_MAX).any())
    in_range = bool((pd.concat([low_a, low_b])["attn_logit_max"] < FP16_MAX).all())
    control = trained(low_b) >= 1
    out |= {"high_gain_crossed": crossed, "low_gain_in_range": in_range, "unfused_trains_in_range": control}
    if out["p_against"] < ALPHA:
        verdict = "contradicted"
    elif out["p_for"] < ALPHA and crossed and in_range and control:
        verdict = "supported"
    elif out["p_for"] < ALPHA:
        verdict = "undecided: the cells are not as the rules need"
    else:
        verdict = "undecided"
    return {**out, "verdict": verdict}


def run_one(gain: float, arm: str, seed: int, out: Path, work: Path) -> None:
    corpus = work / "data"
    with ps._locked(work):
        if not (corpus / "codes" / "tokenizer.json").exists():
            shutil.rmtree(corpus, ignore_errors=True)
            ps._forced_spike().write_corpus(corpus, clips=ps.CLIPS, frames=ps.FRAMES, seed=0)
    done = pd.read_csv(out / "runs.csv") if (out / "runs.csv").exists() else None
    if done is not None and len(_select(done, gain, arm, [seed])):
        print(f"already run: gain {gain:g} {arm} seed {seed}", flush=True)
        return
    size = size_name(gain)
    plateau = decisive.plateau_bits(corpus / "codes")
    run, curve, spikes = ps.one_run(
        size, arm, LR, seed, corpus / "prepared", corpus / "codes", plateau, work, arms=ARMS, round_=ROUND
    )
    folder = work / "runs" / f"{size}__{arm}__lr-{LR:g}__seed-{seed}"
    run = {**run, "qk_gain": gain, **fp16_columns(folder)}
    m = pd.read_csv(folder / "metrics.csv")
    curve["loss_scale"] = m[M.LOSS_SCALE].to_numpy() if M.LOSS_SCALE in m else np.nan
    with ps._locked(out):
        ps._append(out / "runs.csv", pd.DataFrame([run]), RUN_COLUMNS)
        ps._append(out / "curves.csv", curve, CURVE_COLUMNS)
        ps._append(out / "spikes.csv", pd.DataFrame(spikes, columns=ps.SPIKE_COLUMNS), ps.SPIKE_COLUMNS)
    print(f"gain {gain:g} {arm} seed {seed}: final {run['final_loss']:.3f}, trained {run['trained']}", flush=True)


RUN_COLUMNS = ps.RUN_COLUMNS + ["qk_gain", "updates", "lowest_loss_scale", "overflow_skips", "stop_reason"]
CURVE_COLUMNS = ps.CURVE_COLUMNS + ["loss_scale"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("commands", help="print every run as a queue command, the crossing gain first")
    r = sub.add_parser("run", help="one run")
    r.add_argument("--gain", required=True, type=float, choices=[GAIN_LOW, GAIN_HIGH])
    r.add_argument("--arm", required=True, choices=sorted(ARMS))
    r.add_argument("--seed", required=True, type=int)
    sub.add_parser("judge", help="verdict.json from the runs published so far")
    for q in sub.choices.values():
        q.add_argument("--out", type=Path, default=OUT)
        q.add_argument("--work", type=Path, default=Path("/tmp/amlm_proxy_sizing"))
    args = p.parse_args(argv)
    if args.command == "commands":
        for gain, arm, seed in runs_planned():
            print(
                f"cd {ROOT} && python benchmarks/pb_relax_training.py run --gain {gain:g} --arm {arm} --seed {seed}"
                f" --out {args.out} --work {args.work}"
            )
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "run":
        run_one(args.gain, args.arm, args.seed, args.out, args.work)
        return 0
    runs = pd.read_csv(args.out / "runs.csv") if (args.out / "runs.csv").exists() else pd.DataFrame(columns=RUN_COLUMNS)
    result = judge_runs(runs)
    with atomic_path(args.out / "verdict.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
