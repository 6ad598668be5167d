"""The fp16 loss-scale trace with MERT's fp16 logits (`model.fp16_logits: true`) and with fp32 logits.

MERT rounds the cosine logits to fp16 before dividing by the temperature (mert_model.py,
compute_nce); their backward is about loss scale x (p - y) / logit_temp in fp16, which overflows
once the scale passes about 65504 x logit_temp (2^12.7 at temperature 0.1). This trains the
preset's model under `train.precision: fp16_fairseq` with `build_trainer` and `update` of `train/update.py`
(what `amlm train` runs) on fixed-seed synthetic batches (random audio and codes, fairseq span
masks), once per setting, and records the loss scale after every update.

fairseq's scale window here would be int(2^14 / accum_steps) updates, longer than a CPU run: the
window is set to `--window` (stated in the output) so that the scale climbs to its ceiling within
`--updates`; the ceiling, not the climb, is what the setting changes. With several `--accum`
values it also shows how the micro-batches accumulated in fp16 per update lower the ceiling
(paper-1node.yaml accumulates 64 per process where MERT's GPUs accumulated 8).

    python benchmarks/fp16_logits_scale.py --config config/smoke.yaml --updates 60 --window 4 --accum 1
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import torch

from acoustic_mlm import config as C
from acoustic_mlm.preflight.measure import synthetic_batch
from acoustic_mlm.train.schedule import lr_at
from acoustic_mlm.train.update import build_trainer, update
from acoustic_mlm.utils import benchmark_header, set_threads, write_result


def trace(cfg: C.Config, fp16_logits: bool, accum: int, updates: int, window: int, run: str) -> dict:
    """The loss scale after each update of one fp16_fairseq run (the first of `run`'s seeds)."""
    m = dataclasses.replace(cfg.model_for(run), fp16_logits=fp16_logits)
    t = dataclasses.replace(cfg.train_for(run), precision="fp16_fairseq", accum_steps=accum, compile=False)
    device = torch.device("cpu")
    tr = build_trainer(m, t, device)
    tr.precision.scaler.window = window  # stated: a short window, so the scale reaches its ceiling in a CPU run
    frames = cfg.crop_frames
    scales, overflows, losses, step, i = [], [], [], 0, 0
    for _ in range(updates):
        micro = [synthetic_batch(m, t.batch_size, frames, device, seed=i + j) for j in range(accum)]
        i += accum
        u = update(tr, micro, lr_at(step + 1, t))
        step += not u.overflow  # an overflow is not an update: the schedule does not move (fairseq)
        scales.append(tr.loss_scale)
        overflows.append(bool(u.overflow))
        losses.append(float(u.means[m.codebooks]))
    return {
        "fp16_logits": fp16_logits,
        "accum_steps": accum,
        "window": window,
        "loss_scale": scales,
        "overflow": overflows,
        "loss": losses,
        "max_scale": max(scales),
        "overflows": sum(overflows),
        "updates_taken": step,
        "final_scale": scales[-1],
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="config/smoke.yaml")
    p.add_argument("--run", default="prenorm_clip1", help="the arm whose model trains (default: %(default)s)")
    p.add_argument("--updates", type=int, default=60, help="update attempts per run (default: %(default)s)")
    p.add_argument(
        "--window", type=int, default=4, help="clean updates per doubling of the scale (default: %(default)s)"
    )
    p.add_argument("--accum", default="1", help="comma-separated accum_steps values (default: %(default)s)")
    p.add_argument(
        "--fp16-logits",
        choices=("both", "true", "false"),
        default="both",
        help="which model.fp16_logits settings to trace (default: %(default)s)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    set_threads(args.threads)
    cfg = C.load(args.config)
    rows = []
    for accum in [int(a) for a in args.accum.split(",")]:
        for fp16_logits in {"both": (False, True), "true": (True,), "false": (False,)}[args.fp16_logits]:
            r = trace(cfg, fp16_logits, accum, args.updates, args.window, args.run)
            rows.append(r)
            print(
                f"fp16_logits {str(fp16_logits).lower():5} accum {accum:3}: max scale "
                f"2^{np.log2(r['max_scale']):.0f}, "
                f"final 2^{np.log2(r['final_scale']):.0f}, {r['overflows']} overflows in {args.updates} attempts",
                flush=True,
            )
    print("| fp16_logits | accum_steps | max loss scale | final loss scale | overflows | updates taken |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {str(r['fp16_logits']).lower()} | {r['accum_steps']} | 2^{np.log2(r['max_scale']):.0f} | "
            f"2^{np.log2(r['final_scale']):.0f} | {r['overflows']} | {r['updates_taken']} |"
        )
    result = {
        **benchmark_header(__file__, argv),
        "config": args.config,
        "run": args.run,
        "rows": rows,
    }
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
