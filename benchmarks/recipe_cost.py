"""Compute cost of a preset's training run at its true batch, from counted FLOPs (no timing).

    python benchmarks/recipe_cost.py --config config/paper.yaml config/gpu-small.yaml --util 0.3 0.4

FLOPs per crop are acoustic_mlm.preflight.flops.step_flops (matmuls and convolutions, forward and backward;
norms, softmax and the optimizer not counted) at the preset's crop length, with the masked frames
of the preset's own masks (compute_mask_indices on 64 micro-batches). An arm is train.steps updates
of batch_size x accum_steps crops; the figure is its arms. GPU-days at a stated share ("util") of
a peak, by default 989 TFLOP/s: H100/H200 SXM dense fp16/bf16 tensor-core peak.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from acoustic_mlm import config as C
from acoustic_mlm.model.objective import compute_mask_indices
from acoustic_mlm.preflight.flops import step_flops
from acoustic_mlm.preflight.project import peak_tflops

H200_BF16_DENSE_TFLOPS = peak_tflops("H200", "bf16")  # 989: preflight.project's table, NVIDIA's datasheet


def masked_share(m: C.ModelConfig, crops: int, frames: int, draws: int = 64, seed: int = 0) -> float:
    """Mean share of frames masked by the preset's masks, over `draws` micro-batches of `crops`."""
    rng = np.random.default_rng(seed)
    shares = [
        compute_mask_indices((crops, frames), m.mask_prob, m.mask_length, m.mask_min_masks, rng).mean()
        for _ in range(draws)
    ]
    return float(np.mean(shares))


def cost(cfg: C.Config, utils: list[float], peak_tflops: float) -> dict:
    run = next(iter(cfg.runs))
    m, t = cfg.model_for(run), cfg.train_for(run)
    frames = cfg.crop_frames
    share = masked_share(m, max(1, t.batch_size // t.world), frames)
    per_crop = step_flops(m, 1, frames)  # on a GPU the heads score every frame (static shapes)
    arm = per_crop * t.crops_per_update * t.steps
    arms = len(cfg.runs) * max(len(r.seeds) for r in cfg.runs.values())
    gpu_days = {f"{u:.0%}": arm / (peak_tflops * 1e12 * u) / 86400 for u in utils}
    return {
        "crop_frames": frames,
        "masked_share": share,
        "tflop_per_crop": per_crop / 1e12,
        "crops_per_update": t.crops_per_update,
        "pflop_per_update": per_crop * t.crops_per_update / 1e15,
        "steps": t.steps,
        "zflop_per_arm": arm / 1e21,
        "gpus": t.world,
        "arms": arms,
        "gpu_days_per_arm": gpu_days,
        "gpu_days_per_figure": {k: v * arms for k, v in gpu_days.items()},
        "wall_days_per_arm": {k: v / t.world for k, v in gpu_days.items()},
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", nargs="+", default=["config/paper.yaml"])
    p.add_argument("--util", nargs="+", type=float, default=[0.3, 0.4], help="shares of the peak")
    p.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS)
    args = p.parse_args(argv)
    out = {path: cost(C.load(path), args.util, args.peak_tflops) for path in args.config}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
