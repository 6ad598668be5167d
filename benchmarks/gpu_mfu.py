"""MFU of the GPU presets' training step before and after issue 34's changes, on the GPU at hand.

For each preset and precision, the first arm's model is measured three ways, each built and stepped by
preflight's `measure_arm` (train.build_trainer and train.update, as `amlm train` steps them) at one
process's micro-batch of the preset's crops:

- `before`: the CQT target by nnAudio's convolutions (`model.cqt_impl: nnaudio`), the conv front end by
  cuDNN convolutions (`ConvFeatureExtractor.as_matmul = False`): the code issue 34 measured;
- `cqt_fft`: the CQT target by FFT (`model.cqt_impl: fft`), the front end still convolutions;
- `after`: the CQT target by FFT and the front end as matmuls (the presets' and CUDA's defaults now).

MFU = counted model FLOPs of one micro-batch (`acoustic_mlm.preflight.flops.step_flops`) / its median time /
the device's dense peak for the precision (preflight's table; `--peak-tflops` overrides). First, per
preset, the two CQT paths are compared on this device (`cqt_agreement`). The optimizer
step is timed apart and reported with the update it amortises over (micro-batches per update x micro-batch
+ step). One model is on the device at a time. A run of both presets in two precisions takes a few minutes
on an H200 (not yet run).

    python benchmarks/gpu_mfu.py --json results/gpu_check/mfu.json
    python benchmarks/gpu_mfu.py --presets config/gpu-small.yaml --precisions bf16 --variants before,after
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from acoustic_mlm import config as C
from acoustic_mlm.devices import pick_device
from acoustic_mlm.model.encoder import ConvFeatureExtractor
from acoustic_mlm.preflight.flops import step_flops
from acoustic_mlm.preflight.measure import MemoryProbe, Plan, measure_arm
from acoustic_mlm.preflight.project import micro_batches_per_update, peak_tflops
from acoustic_mlm.utils import benchmark_header, set_threads, write_result

VARIANTS = {"before": ("nnaudio", False), "cqt_fft": ("fft", False), "after": ("fft", None)}  # (cqt_impl, as_matmul)


def measure(cfg: C.Config, path: str, precision: str, variant: str, device: torch.device, args) -> dict:
    """One variant of the first arm's model of the preset `path` (`cfg`: its settings, with any overrides)."""
    run = next(iter(cfg.runs))
    impl, as_matmul = VARIANTS[variant]
    m = dataclasses.replace(cfg.model_for(run), cqt_impl=impl)
    t = cfg.train_for(run)
    mb = args.batch_size or t.batch_size // t.world
    frames = cfg.crop_frames
    n_micro = micro_batches_per_update(t.batch_size, t.accum_steps, t.world, mb)
    plan = Plan(mb, args.micro_batches, 1, args.warmup, full_update=False)
    before = ConvFeatureExtractor.as_matmul
    ConvFeatureExtractor.as_matmul = as_matmul  # class-wide: the model measure_arm builds takes it
    try:
        t0 = time.perf_counter()
        res = measure_arm(m, t, device, precision, frames, plan, n_micro, MemoryProbe(device))
    finally:
        ConvFeatureExtractor.as_matmul = before
    peak = args.peak_tflops or (
        peak_tflops(torch.cuda.get_device_name(device), precision) if device.type == "cuda" else None
    )
    flops = step_flops(m, mb, frames)
    micro_ms = res["ms_per_micro_batch"]
    update_ms = n_micro * micro_ms + res["ms_optimizer_step"]
    tflops = flops / (micro_ms / 1000) / 1e12
    return {
        "config": path,
        "run": run,
        "precision": precision,
        "variant": variant,
        "cqt_impl": impl,
        "front_end": "matmul" if (as_matmul is None and device.type == "cuda") or as_matmul else "conv",
        "micro_batch": mb,
        "frames": frames,
        "ms_per_micro_batch": micro_ms,
        "ms_per_micro_batch_all": res["ms_per_micro_batch_all"],
        "ms_optimizer_step": res["ms_optimizer_step"],
        "micro_batches_per_update": n_micro,
        "ms_per_update": update_ms,
        "model_flops_per_micro_batch": flops,
        "tflops": tflops,
        "peak_tflops": peak,
        "mfu": tflops / peak if peak else None,
        "mfu_update": n_micro * flops / (update_ms / 1000) / 1e12 / peak if peak else None,
        "peak_memory_gb": res["peak_memory_gb"],
        "losses_finite": res["losses_finite"],
        "seconds": time.perf_counter() - t0,
    }


def cqt_agreement(cfg: C.Config, path: str, device: torch.device, crops: int = 4) -> dict:
    """The two CQT paths on this device, on crops of the preset's length (tones over noise, a click train):
    max abs error over the largest magnitude (CPU, librosa's recordings: 6.8e-6; BENCHMARKS.md)."""
    from acoustic_mlm import encodec
    from acoustic_mlm.model.cqt import CQTTarget

    m = cfg.model  # the CQT's settings: the `model:` section's, the same for every arm
    n = cfg.crop_frames * encodec.HOP
    g = torch.Generator().manual_seed(0)
    t = torch.arange(n, dtype=torch.float64) / encodec.SAMPLE_RATE
    wav = torch.stack(
        [
            sum(
                torch.rand(1, generator=g).item()
                * torch.sin(2 * torch.pi * (40 + 4000 * torch.rand(1, generator=g).item() ** 2) * t)
                for _ in range(6)
            )
            + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)
            for _ in range(crops)
        ]
    ).float()
    wav[-1] = 0.0
    wav[-1, :: 2 * encodec.HOP + 37] = 1.0
    wav = wav.to(device)
    ref = CQTTarget(m.cqt_bins, m.cqt_bins_per_octave, m.cqt_fmin, impl="nnaudio")(wav)
    new = CQTTarget(m.cqt_bins, m.cqt_bins_per_octave, m.cqt_fmin, impl="fft")(wav)
    err = (new - ref).abs()
    large = ref > 1e-3 * ref.max()
    return {
        "config": path,
        "crops": crops,
        "frames": cfg.crop_frames,
        "largest": float(ref.max()),
        "max_abs": float(err.max()),
        "max_abs_over_max": float(err.max() / ref.max()),
        "rel_max_large": float((err[large] / ref[large]).max()),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| preset | precision | variant | CQT | front end | ms per micro-batch | vs before | TFLOP/s | MFU | "
        "MFU of an update | peak GB |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = {(r["config"], r["precision"]): r["ms_per_micro_batch"] for r in rows if r["variant"] == "before"}
    for r in rows:
        b = base.get((r["config"], r["precision"]))

        def pct(x):
            return "n/a" if x is None else f"{100 * x:.1f}%"

        speed = "n/a" if b is None else f"{b / r['ms_per_micro_batch']:.2f}x"
        lines.append(
            f"| {Path(r['config']).stem} | {r['precision']} | {r['variant']} | {r['cqt_impl']} | "
            f"{r['front_end']} | {r['ms_per_micro_batch']:.1f} | {speed} | {r['tflops']:.3g} | "
            f"{pct(r['mfu'])} | {pct(r['mfu_update'])} | {r['peak_memory_gb']:.1f} |"
        )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="config/gpu-small.yaml,config/paper.yaml", help="comma-separated configs")
    p.add_argument(
        "--precisions",
        default="fp16_fairseq,bf16",
        help="comma-separated (default: %(default)s: the GPU presets' fp16_fairseq and proxy-gpu's bf16)",
    )
    p.add_argument("--variants", default="before,cqt_fft,after", help=f"comma-separated of {', '.join(VARIANTS)}")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=int, default=None, help="crops per micro-batch (default: one process's share)")
    p.add_argument("--crop-seconds", type=float, default=None, help="override train.crop_seconds (CPU checks)")
    p.add_argument("--cqt-loss-weight", type=float, default=None, help="override model.cqt_loss_weight (CPU checks)")
    p.add_argument(
        "--micro-batches", type=int, default=6, help="timed micro-batches per variant (default: %(default)s)"
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed updates first (default: %(default)s)")
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    for prec in args.precisions.split(","):
        if prec not in C.PRECISIONS:
            p.error(f"--precisions: unknown '{prec}' (choose from {', '.join(C.PRECISIONS)})")
    for v in args.variants.split(","):
        if v not in VARIANTS:
            p.error(f"--variants: unknown '{v}' (choose from {', '.join(VARIANTS)})")
    if args.micro_batches < 1 or args.warmup < 0:
        p.error("--micro-batches must be at least 1 and --warmup at least 0")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = pick_device(args.device)
    rows, agreements = [], []
    for path in args.presets.split(","):
        settings = C.read_yaml(path)  # the file's mapping: the overrides edit it as a user edits the file
        if args.crop_seconds is not None:
            settings["train"]["crop_seconds"] = args.crop_seconds
        if args.cqt_loss_weight is not None:
            settings["model"]["cqt_loss_weight"] = args.cqt_loss_weight
        cfg = C.from_mapping(settings, source=f"{path} with overrides")
        set_threads(args.threads if args.threads is not None else cfg.train.threads)
        agree = cqt_agreement(cfg, path, device)
        agreements.append(agree)
        print(
            f"  {Path(path).stem} CQT on {device.type}: fft vs nnaudio max abs {agree['max_abs']:.3g} "
            f"({agree['max_abs_over_max']:.3g} of the largest), relative on large magnitudes "
            f"{agree['rel_max_large']:.3g}",
            file=sys.stderr,
            flush=True,
        )
        for prec in args.precisions.split(","):
            for variant in args.variants.split(","):
                row = measure(cfg, path, prec, variant, device, args)
                rows.append(row)
                mfu = "n/a" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
                print(
                    f"  {Path(path).stem} {prec} {variant}: {row['ms_per_micro_batch']:.1f} ms per micro-batch of "
                    f"{row['micro_batch']}, MFU {mfu} ({row['seconds']:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    print(table(rows))
    result = {
        **benchmark_header(__file__, argv, device),
        "cqt_agreement": agreements,
        "rows": rows,
    }
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
