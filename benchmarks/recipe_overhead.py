"""Cost of MERT's model-side recipe switches per training step, against the same model without them.

Variants, all at the configuration's shapes (width, depth, batch, crop) on one fixed random batch:

- `off`: every switch of docs/recipe.md "Model, objective and data" off (no CQT loss, 1,024
  classes, no LayerDrop, dropout_input 0, feature_grad_mult 1): the baseline;
- `cqt`: the CQT reconstruction loss on (`--cqt-bins`, `--cqt-bins-per-octave`, `--cqt-fmin`:
  MERT's 336 / 48 / 32.7 Hz by default), nothing else;
- `recipe`: every switch as the configuration sets it, the CQT loss forced on.

One step is one `train.update` (what `amlm train` runs): forward, backward, clipping, AdamW. Repetitions are
interleaved (off, cqt, recipe, off, ...); each ratio is the median of per-repetition ratios of
step times, so drift on a shared machine cancels. Noise mixing runs in the data path, not in the
step: its cost is timed apart, as milliseconds per micro-batch for `augment.draw_mixture` and
`augment.apply_mixture` (groups of `train.mask_group`, segments of `model.mixture_samples`, or a
quarter of a crop when those do not fit).

    python benchmarks/recipe_overhead.py --config config/smoke.yaml --threads 2
    python benchmarks/recipe_overhead.py --config config/paper.yaml --device cuda --precision fp16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import numpy as np
import torch

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.devices import pick_device
from acoustic_mlm.model.objective import compute_group_masks, mask_groups
from acoustic_mlm.train.augment import apply_mixture, draw_mixture
from acoustic_mlm.train.update import Trainer, build_trainer, update
from acoustic_mlm.utils import machine_info, set_threads

RUN = "prenorm_clip1"
SEED = 0


def variants(cfg: C.Config, args) -> dict[str, C.ModelConfig]:
    m = cfg.model_for(RUN)
    cqt = dict(
        cqt_loss_weight=1.0,
        cqt_bins=args.cqt_bins,
        cqt_bins_per_octave=args.cqt_bins_per_octave,
        cqt_fmin=args.cqt_fmin,
    )
    off = dataclasses.replace(
        m,
        activation_dropout=m.dropout,
        encoder_layerdrop=0.0,
        dropout_input=0.0,
        feature_grad_mult=1.0,
        special_symbols=0,
        cqt_loss_weight=0.0,
    )
    return {"off": off, "cqt": dataclasses.replace(off, **cqt), "recipe": dataclasses.replace(m, **cqt)}


def step_seconds(tr: Trainer, batch, device) -> float:
    """One update of one micro-batch, as `amlm train` steps it (`train.update`)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    update(tr, [batch], 1e-4)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="config/smoke.yaml")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=C.PRECISIONS)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--cqt-bins", type=int, default=336)
    p.add_argument("--cqt-bins-per-octave", type=int, default=48)
    p.add_argument("--cqt-fmin", type=float, default=32.7)
    args = p.parse_args(argv)
    set_threads(args.threads)
    cfg = C.load(args.config)
    t = cfg.train_for(RUN)
    device = pick_device(args.device)
    T = cfg.crop_frames
    L = T * encodec.HOP
    B = t.batch_size // t.processes  # one process's micro-batch
    rng = np.random.default_rng(SEED)
    m0 = cfg.model_for(RUN)
    torch.manual_seed(SEED)
    wav = (0.1 * torch.randn(B, L)).to(device)
    codes = torch.randint(0, m0.codebook_size, (B, m0.codebooks, T)).to(device)
    mask = torch.from_numpy(
        compute_group_masks(B, T, m0.mask_prob, m0.mask_length, m0.mask_min_masks, rng, t.mask_group)
    ).to(device)
    models = {}
    ts = dataclasses.replace(t, seed=SEED, precision=args.precision, compile=False)
    for name, m in variants(cfg, args).items():
        models[name] = build_trainer(m, ts, device)
        step_seconds(models[name], (wav, codes, mask), device)  # warm-up (CQT kernels, allocator)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.reps):
        for name, tr in models.items():
            times[name].append(step_seconds(tr, (wav, codes, mask), device))
    ratios = {name: statistics.median(a / b for a, b in zip(times[name], times["off"])) for name in models}

    groups = mask_groups(B, t.mask_group)
    samples = m0.mixture_samples if m0.mixture_samples[1] <= L else (L // 8, L // 4)
    host = wav.cpu().numpy()
    mix_ms = []
    for i in range(args.reps):
        t0 = time.perf_counter()
        plan = draw_mixture(np.random.default_rng([SEED, i]), groups, L, 0.5, m0.mixture_segments, samples)
        apply_mixture(host, np.arange(B), groups, plan, m0.mixture_volume)
        mix_ms.append(1e3 * (time.perf_counter() - t0))

    result = {
        "config": args.config,
        "device": str(device),
        "precision": args.precision,
        "threads": args.threads,
        "batch": B,
        "crop_samples": L,
        "cqt": [args.cqt_bins, args.cqt_bins_per_octave, args.cqt_fmin],
        "step_s_median": {k: statistics.median(v) for k, v in times.items()},
        "ratio_to_off": ratios,
        "mixture_ms_per_microbatch": statistics.median(mix_ms),
        "mixture_samples": list(samples),
        "machine": machine_info(device),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
