"""PB-Relax in float16 training (fairseq's fp16: `fp16_fairseq`): its runs and its verdicts
(docs/stability.md, "PB-Relax in fp16 training: the rules", and the confirming round's rules).

Every run is S1 of benchmarks/proxy_sizing.py (width 32, 2 layers, 8 crops of 1 s, the tone corpus,
one torch thread) trained for 800 updates at peak rate 1e-2 with clip 1 in `fp16_fairseq` (a half
model, fp32 master weights, fairseq's dynamic loss scaler), its queries and keys multiplied by
`model.qk_gain` (forced logit growth: logits x gain^2) at two gains, one whose largest attention
logit stays below float16's 65,504 and one whose logit crosses it. The two arms differ only in the
attention: fairseq's unfused order (q.k^T in float16, softmax in float32) and PB-Relax.

Round 4 ran at gains 48 and 128. Round 5 confirms it on fresh seeds; its low gain comes from a pilot
of full-length runs of the unfused order (`--pilot`), by `low_gain_from_pilot`.

    python benchmarks/pb_relax_training.py commands --round 5 --pilot > pilot.txt
    python benchmarks/pb_relax_training.py judge --round 5 --pilot   # pilot.json: the low gain
    python benchmarks/pb_relax_training.py commands --round 5 > queue.txt
    python benchmarks/run_queue.py queue.txt --log data/reference/pb_relax_confirm/queue_log.txt --jobs 2
    python benchmarks/pb_relax_training.py run --round 5 --gain 128 --arm prenorm_attnrelax_clip1 --seed 601
    python benchmarks/pb_relax_training.py judge --round 5   # verdict.json from the runs published so far
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.report import decisive
from acoustic_mlm.report.power import excluded_reading, fisher_greater
from acoustic_mlm.utils import atomic_path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "data" / "reference"
LR, STEPS, ALPHA = 1e-2, 800, 0.025
FP16_MAX = 65504.0
FAVOURED, OTHER = "prenorm_attnrelax_clip1", "prenorm_unfused_clip1"
PILOT_SEED = 1
# The pilot's rule for the low gain (docs/stability.md, the confirming round's rules): the largest pilot gain
# whose unfused run trained through all its updates with its largest logit at most FP16_MAX / PILOT_MARGIN.
# The margin is the spread of the largest logit over round 4's four runs at gain 48 (45,567 to 66,474: 1.46).
PILOT_MARGIN = 1.5


@dataclass(frozen=True)
class Round:
    """One round's plan: its gains, its seeds and where its tables go (`pilot_gains`: the gains its pilot
    tried for the low gain; `gain_low` None: the low gain is the pilot's, by `low_gain_from_pilot`)."""

    number: int
    gain_high: float
    seeds_high: tuple[int, ...]  # 4 per arm: the fewest at which 4/4 against 0/4 reaches p < 0.025
    seeds_low: tuple[int, ...]  # the control: does the unfused order train while its logits stay in range?
    out: Path
    gain_low: float | None = None
    pilot_gains: tuple[float, ...] = ()

    @property
    def pilot_out(self) -> Path:
        return self.out / "pilot"


ROUNDS = {
    4: Round(4, 128.0, (501, 502, 503, 504), (511, 512), REFERENCE / "pb_relax_training", gain_low=48.0),
    5: Round(5, 128.0, (601, 602, 603, 604), (611, 612), REFERENCE / "pb_relax_confirm", pilot_gains=(32.0, 24.0)),
}


sys.path.insert(0, str(ROOT / "benchmarks"))  # proxy_sizing.py is a sibling script, not a package module
import proxy_sizing as ps  # noqa: E402

ARMS = {
    FAVOURED: {"norm": "pre", "attention": "pb_relax", "clip": 1.0},
    OTHER: {"norm": "pre", "attention": "unfused", "clip": 1.0},
}


def size_name(gain: float) -> str:
    return f"S1-fp16-g{gain:g}"


def size_of(gain: float) -> dict:
    """S1 at 800 updates in fp16_fairseq at one gain (a proxy_sizing size entry)."""
    return {**ps.SIZES["S1"], "train.steps": STEPS, "train.precision": "fp16_fairseq", "model.qk_gain": gain}


def low_gain_from_pilot(pilot: pd.DataFrame) -> float | None:
    """The low gain by the pilot's rule: the largest gain whose run trained through with its largest
    attention logit at most FP16_MAX / PILOT_MARGIN; None when no pilot run qualifies."""
    ok = trained_through(pilot) & (pilot["attn_logit_max"] <= FP16_MAX / PILOT_MARGIN)
    return float(pilot.loc[ok, "qk_gain"].max()) if ok.any() else None


def read_runs(folder: Path) -> pd.DataFrame:
    """A folder's published runs.csv, empty when nothing is published yet."""
    path = folder / "runs.csv"
    return pd.read_csv(path) if path.exists() else pd.DataFrame(columns=RUN_COLUMNS)


def gain_low(rnd: Round) -> float:
    """The round's low gain: stated in its plan, or derived from its published pilot."""
    if rnd.gain_low is not None:
        return rnd.gain_low
    gain = low_gain_from_pilot(read_runs(rnd.pilot_out))
    if gain is None:
        raise SystemExit(f"{rnd.pilot_out / 'runs.csv'}: no pilot run qualifies for round {rnd.number}'s low gain yet")
    return gain


def runs_planned(rnd: Round, low: float) -> list[tuple[float, str, int]]:
    """(gain, arm, seed) of every run of a round at low gain `low`, the crossing gain first."""
    return [(rnd.gain_high, arm, s) for arm in (FAVOURED, OTHER) for s in rnd.seeds_high] + [
        (low, arm, s) for arm in (FAVOURED, OTHER) for s in rnd.seeds_low
    ]


def pilot_planned(rnd: Round) -> list[tuple[float, str, int]]:
    return [(g, OTHER, PILOT_SEED) for g in rnd.pilot_gains]


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


def _select(runs: pd.DataFrame, gain: float, arm: str, seeds) -> pd.DataFrame:
    return runs[(runs["size"] == size_name(gain)) & (runs["arm"] == arm) & runs["seed"].isin(list(seeds))]


def trained_through(runs: pd.DataFrame) -> pd.Series:
    """The primary outcome: the run went through all its updates (not stopped by the loss scaler's
    floor or by a streak of non-finite losses; skipped updates are reported beside) and ended at least a
    bit below the plateau. A run stopped early is not trained, whatever its last finite loss was."""
    completed = runs["status"].isin(["completed", "completed_with_nonfinite"]) & (runs["updates"] == STEPS)
    return completed & runs["trained"].astype(bool)


def judge_runs(runs: pd.DataFrame, rnd: Round, low: float) -> dict:
    """A round's verdict by its rules (docs/stability.md: round 4's, which round 5 keeps), its low gain `low`."""
    n_high, n_low = len(rnd.seeds_high), len(rnd.seeds_low)
    high_a, high_b = (_select(runs, rnd.gain_high, arm, rnd.seeds_high) for arm in (FAVOURED, OTHER))
    low_a, low_b = (_select(runs, low, arm, rnd.seeds_low) for arm in (FAVOURED, OTHER))
    finished = (len(high_a), len(high_b), len(low_a), len(low_b)) == (n_high, n_high, n_low, n_low)
    out: dict = {"round": rnd.number, "alpha": ALPHA, "gains": [low, rnd.gain_high], "finished": finished}
    if not finished:
        return {**out, "verdict": "not finished"}
    trained = lambda r: int(trained_through(r).sum())  # noqa: E731
    ta, tb = trained(high_a), trained(high_b)
    out |= {"trained_high": {FAVOURED: ta, OTHER: tb}, "trained_low": {FAVOURED: trained(low_a), OTHER: trained(low_b)}}
    out |= {"p_for": fisher_greater(ta, n_high, tb, n_high), "p_against": fisher_greater(tb, n_high, ta, n_high)}
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
    if verdict.startswith("undecided") and rnd.number >= 5:  # round 5's rules report what it excludes
        out |= excluded_reading(tb / n_high, n_high, n_high, "share trained through", alpha=ALPHA)
    return {**out, "verdict": verdict}


def judge_pilot(pilot: pd.DataFrame, rnd: Round) -> dict:
    """The pilot's outcome: each gain's run, and the low gain the rule takes from them."""
    rows = [
        {
            "qk_gain": float(r.qk_gain),
            "attn_logit_max": float(r.attn_logit_max),
            "updates": int(r.updates),
            "trained_through": bool(t),
            "final_loss": float(r.final_loss),
        }
        for r, t in zip(pilot.itertuples(), trained_through(pilot))
    ]
    finished = {float(g) for g in pilot["qk_gain"]} >= set(rnd.pilot_gains)
    return {
        "round": rnd.number,
        "margin": PILOT_MARGIN,
        "limit": FP16_MAX / PILOT_MARGIN,
        "runs": rows,
        "finished": finished,
        "gain_low": low_gain_from_pilot(pilot) if len(pilot) else None,
    }


def run_one(gain: float, arm: str, seed: int, rnd: Round, out: Path, work: Path) -> None:
    corpus = work / "data"
    with ps._locked(work):
        if not (corpus / "codes" / "tokenizer.json").exists():
            shutil.rmtree(corpus, ignore_errors=True)
            ps._forced_spike().write_corpus(corpus, clips=ps.CLIPS, frames=ps.FRAMES, seed=0)
    done = read_runs(out)
    if len(_select(done, gain, arm, [seed])):
        print(f"already run: gain {gain:g} {arm} seed {seed}", flush=True)
        return
    size = size_name(gain)
    ps.SIZES[size] = size_of(gain)
    plateau = decisive.plateau_bits(corpus / "codes")
    run, curve, spikes = ps.one_run(
        size, arm, LR, seed, corpus / "prepared", corpus / "codes", plateau, work, arms=ARMS, round_=rnd.number
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
    r.add_argument("--gain", required=True, type=float)
    r.add_argument("--arm", required=True, choices=sorted(ARMS))
    r.add_argument("--seed", required=True, type=int)
    sub.add_parser("judge", help="verdict.json (pilot.json with --pilot) from the runs published so far")
    for q in sub.choices.values():
        q.add_argument("--round", type=int, choices=sorted(ROUNDS), default=max(ROUNDS))
        q.add_argument("--pilot", action="store_true", help="the round's pilot for its low gain")
        q.add_argument("--out", type=Path, help="the tables' folder (default: the round's, or its pilot's)")
        q.add_argument("--work", type=Path, default=Path("/tmp/amlm_proxy_sizing"))
    args = p.parse_args(argv)
    rnd = ROUNDS[args.round]
    if args.pilot and not rnd.pilot_gains:
        p.error(f"--pilot: round {rnd.number} has no pilot")
    out = args.out or (rnd.pilot_out if args.pilot else rnd.out)
    if args.command == "commands":
        plan = pilot_planned(rnd) if args.pilot else runs_planned(rnd, gain_low(rnd))
        flags = f"--round {rnd.number}" + (" --pilot" if args.pilot else "")
        for gain, arm, seed in plan:
            print(
                f"cd {ROOT} && python benchmarks/pb_relax_training.py run {flags} --gain {gain:g} --arm {arm}"
                f" --seed {seed} --out {out} --work {args.work}"
            )
        return 0
    if args.command == "run":
        allowed = pilot_planned(rnd) if args.pilot else runs_planned(rnd, gain_low(rnd))
        if (args.gain, args.arm, args.seed) not in allowed:
            p.error(f"gain {args.gain:g} {args.arm} seed {args.seed} is not in round {rnd.number}'s plan")
        out.mkdir(parents=True, exist_ok=True)
        run_one(args.gain, args.arm, args.seed, rnd, out, args.work)
        return 0
    runs = read_runs(out)
    result = judge_pilot(runs, rnd) if args.pilot else judge_runs(runs, rnd, gain_low(rnd))
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / ("pilot.json" if args.pilot else "verdict.json")) as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
