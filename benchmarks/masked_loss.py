"""The cost of the static masked loss: every frame scored and weighted, against the masked-frames-only selection.

On a GPU and under torch.compile, `AcousticMLM.forward` scores every frame and weights the
unmasked ones 0, so no shape depends on the mask and nothing is read back to the host (one
compiled graph for every batch, no GPU sync). Eager on CPU it selects the masked frames,
`h[mask]`, and runs the heads on those only (about 58 % of the frames at mask_prob 0.8,
mask_length 5; 44 % on the default's 1 s crops). `static_shapes` forces either path. Both variants share one
model's weights and run one training step (forward, backward; no optimizer, whose cost is the
same) on the same fixed batch; repetitions are interleaved and the ratio is the median of the
per-repetition ratios static / selection of ms per step (above 1: the static loss is slower).

    python benchmarks/masked_loss.py --config config/config.yaml --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from acoustic_mlm import config as C
from acoustic_mlm.devices import pick_device
from acoustic_mlm.model.objective import AcousticMLM
from acoustic_mlm.preflight.measure import synthetic_batch
from acoustic_mlm.train.precision import autocast
from acoustic_mlm.utils import benchmark_header, set_threads, write_result


def loss_fn(static: bool):
    def fn(model: AcousticMLM, wav, codes, mask) -> torch.Tensor:
        model.static_shapes = static
        return model(wav, codes, mask).loss

    return fn


VARIANTS = {"selection": loss_fn(False), "static": loss_fn(True)}


def time_steps(fn, model, batch, device, precision: str, steps: int) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = fn(model, *batch)
        loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 1000 * (time.perf_counter() - t0) / steps


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="config/config.yaml", help="preset (default: %(default)s)")
    p.add_argument("--run", default="prenorm_clip1", help="arm (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto (default: %(default)s)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"), help="(default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant and repetition (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=10, help="interleaved repetitions (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: train.threads)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the results here")
    args = p.parse_args(argv)
    if min(args.steps, args.repeats) < 1 or args.warmup < 0:
        p.error("--steps and --repeats must be at least 1, --warmup at least 0")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg = C.load(args.config)
    set_threads(args.threads if args.threads is not None else cfg.train.threads)
    device = pick_device(args.device)
    m, t = cfg.model_for(args.run), cfg.train_for(args.run)
    torch.manual_seed(0)
    model = AcousticMLM(m).to(device)
    batch = synthetic_batch(m, t.batch_size, cfg.crop_frames, device)
    model.eval()  # no dropout: both variants compute the same loss
    with torch.no_grad():
        losses = {name: float(fn(model, *batch)) for name, fn in VARIANTS.items()}
    model.train()
    for fn in VARIANTS.values():
        time_steps(fn, model, batch, device, args.precision, args.warmup) if args.warmup else None
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(args.repeats):
        order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
        for name in order:
            times[name].append(time_steps(VARIANTS[name], model, batch, device, args.precision, args.steps))
    ratios = [s / b for s, b in zip(times["static"], times["selection"])]
    result = {
        **benchmark_header(__file__, argv, device, config=str(args.config)),
        "precision": args.precision,
        "batch_size": t.batch_size,
        "crop_frames": cfg.crop_frames,
        "masked_frames": int(batch[2].sum()),
        "loss": losses,
        "ms_per_step": {k: statistics.median(v) for k, v in times.items()},
        "ms_per_step_all": times,
        "ratio_static_to_selection": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    print(
        f"selection {result['ms_per_step']['selection']:.1f} ms/step, static {result['ms_per_step']['static']:.1f} "
        f"ms/step: static / selection {result['ratio_static_to_selection']:.3f} "
        f"({result['ratio_min']:.3f}-{result['ratio_max']:.3f}); losses {losses}"
    )
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
