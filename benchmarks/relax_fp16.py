"""PB-Relax against plain attention in fp16, on the same weights and inputs: overflows and loss difference.

Two models that differ only in attention (the Pre-Norm arms `prenorm_clip1`, fused
`scaled_dot_product_attention`, and `prenorm_attnrelax_clip1`, CogView's PB-Relax; the same
seed gives them the same weights) run one forward and backward under fp16 autocast on one
fixed batch (random audio and codes, one fairseq span mask) at the preset's size. Overflow
needs large attention logits, which a fresh model does not have; as training grows them, the
query and key projections of every layer are multiplied by `--qk-scales` (1 = as initialised),
which multiplies the logits by the square. Per scale and variant:

- attention outputs with a non-finite element (layers of the encoder, counted by forward hooks),
- whether the loss and every gradient are finite (the fp16 loss scaler skips the step otherwise),
- the loss minus the fp32 loss of the same model (no autocast) on the same batch.

    python benchmarks/relax_fp16.py --config config/paper.yaml --device cuda --batch-size 4
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from acoustic_mlm import config as C
from acoustic_mlm.devices import pick_device
from acoustic_mlm.model.encoder import MultiheadSelfAttention
from acoustic_mlm.model.objective import AcousticMLM
from acoustic_mlm.preflight.measure import synthetic_batch
from acoustic_mlm.train.precision import autocast
from acoustic_mlm.utils import benchmark_header, set_threads, write_result

VARIANTS = {"plain": "prenorm_clip1", "relax": "prenorm_attnrelax_clip1"}
SEED = 0


def build(cfg: C.Config, run: str, qk_scale: float, device: torch.device) -> AcousticMLM:
    torch.manual_seed(SEED)
    model = AcousticMLM(cfg.model_for(run))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, MultiheadSelfAttention):
                module.q_proj.weight.mul_(qk_scale)
                module.k_proj.weight.mul_(qk_scale)
    return model.to(device).eval()  # eval: no dropout, so both variants see exactly the same computation


def one_pass(model: AcousticMLM, batch, device: torch.device, precision: str) -> dict:
    overflowed = []
    hooks = [
        m.register_forward_hook(lambda mod, i, out: overflowed.append(int(not torch.isfinite(out).all())))
        for m in model.modules()
        if isinstance(m, MultiheadSelfAttention)
    ]
    model.zero_grad(set_to_none=True)
    try:
        with autocast(device, precision):
            out = model(*batch)
        out.loss.backward()
    finally:
        for h in hooks:
            h.remove()
    grads_finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
    return {
        "loss": out.loss.item(),
        "loss_cb0_bits": float(out.bits[0]),
        "layers_overflowed": sum(overflowed),
        "layers": len(overflowed),
        "loss_finite": math.isfinite(out.loss.item()),
        "grads_finite": grads_finite,
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="config/paper.yaml", help="preset: model size and crop (default: %(default)s)")
    p.add_argument("--device", default="auto", help="cpu | cuda | auto (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=4, help="crops in the batch (default: %(default)s)")
    p.add_argument("--crop-seconds", type=float, default=None, help="override train.crop_seconds")
    p.add_argument(
        "--qk-scales", default="1,16,64,256", help="factors on the q and k projections (default: %(default)s)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: train.threads)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the results here")
    args = p.parse_args(argv)
    try:
        args.qk_scales = [float(x) for x in args.qk_scales.split(",") if x.strip()]
    except ValueError:
        p.error(f"--qk-scales: not a comma-separated list of numbers: {args.qk_scales!r}")
    if not args.qk_scales or min(args.qk_scales) <= 0 or args.batch_size < 1:
        p.error("--qk-scales must be positive numbers and --batch-size at least 1")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.crop_seconds is None:
        cfg = C.load(args.config)
    else:  # the file's mapping with the crop edited, as a user edits the file
        settings = C.read_yaml(args.config)
        settings["train"]["crop_seconds"] = args.crop_seconds
        cfg = C.from_mapping(settings, source=f"{args.config} with --crop-seconds")
    set_threads(args.threads if args.threads is not None else cfg.train.threads)
    device = pick_device(args.device)
    m, frames = cfg.model.with_arm("pre", "softmax"), cfg.crop_frames  # the batch: no arm's norm matters
    batch = synthetic_batch(m, args.batch_size, frames, device, seed=SEED)
    rows = []
    for scale in args.qk_scales:
        reference = None
        for variant, run in VARIANTS.items():
            model = build(cfg, run, scale, device)
            if reference is None:  # fp32, no autocast: the same function for both variants in exact arithmetic
                reference = one_pass(model, batch, device, "fp32")["loss"]
            row = {
                "qk_scale": scale,
                "variant": variant,
                **one_pass(model, batch, device, "fp16"),
                "fp32_loss": reference,
            }
            row["loss_minus_fp32"] = row["loss"] - reference
            rows.append(row)
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(
            f"  qk x{scale:g}: "
            + " ".join(
                f"{r['variant']}: loss {r['loss']:.4f}, {r['layers_overflowed']} layers overflowed" for r in rows[-2:]
            ),
            file=sys.stderr,
            flush=True,
        )
    print("| q, k scale | attention | fp16 loss | fp16 - fp32 | layers with inf/nan | loss finite | grads finite |")
    print("|---:|---|---:|---:|---:|---|---|")
    for r in rows:
        print(
            f"| {r['qk_scale']:g} | {r['variant']} | {r['loss']:.4f} | {r['loss_minus_fp32']:.2e} | "
            f"{r['layers_overflowed']} of {r['layers']} | {r['loss_finite']} | {r['grads_finite']} |"
        )
    result = {
        **benchmark_header(__file__, argv, device, config=str(args.config)),
        "batch_size": args.batch_size,
        "crop_frames": frames,
        "rows": rows,
    }
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
