"""PB-Relax's arithmetic: one attention layer, forward and backward in float16, at growing logits.

q and k are scaled so that the largest logit |q.k| / sqrt(hd) is 1e2 ... 1e6; each attention path of
the package (`unfused`: fairseq's order, q.k^T in float16 then softmax in float32; `fused`: torch's
scaled_dot_product_attention; `pb_relax`: CogView's PB-Relax with alpha 32) runs on the same float16
inputs, and is compared with float64 attention of those same inputs: is the output finite, are the
gradients of q, k and v finite, and their relative errors (Frobenius norm of the difference over
the reference's). This is part 1 of the PB-Relax verdict (docs/stability.md, "Decisive
experiments"); `amlm decide --numerics` reads the table.

    python benchmarks/attention_fp16.py --out data/reference/decisive/attention_fp16.csv
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from acoustic_mlm.kernels import pin

pin()  # the same bits on every x86-64 CPU with AVX2, as the package's stages (before torch loads)

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from acoustic_mlm.experiments.fp16_attention import one, paths, reference, rel  # noqa: E402


def measure(logits, batch: int, heads: int, frames: int, head_dim: int, seed: int) -> pd.DataFrame:
    gen = torch.Generator().manual_seed(seed)
    q0, k0, v0 = (torch.randn(batch, heads, frames, head_dim, generator=gen, dtype=torch.float64) for _ in range(3))
    g = torch.randn(batch, heads, frames, head_dim, generator=gen)
    base = float(((q0 @ k0.transpose(-2, -1)) / math.sqrt(head_dim)).abs().max())
    rows = []
    for target in logits:
        s = math.sqrt(target / base)
        q16, k16, v16 = (q0 * s).half(), (k0 * s).half(), v0.half()
        qr, kr, vr = (t.double().requires_grad_(True) for t in (q16, k16, v16))
        ref = reference(qr, kr, vr)
        (ref * g.double()).sum().backward()
        ref_grads = [t.grad for t in (qr, kr, vr)]
        reached = float(((qr.detach() @ kr.detach().transpose(-2, -1)) / math.sqrt(head_dim)).abs().max())
        for name, path in paths().items():
            out, grads = one(path, q16, k16, v16, g)
            finite_out = bool(torch.isfinite(out).all())
            finite_grad = all(bool(torch.isfinite(x).all()) for x in grads)
            rows.append(
                {
                    "path": name,
                    "logit_max": target,
                    "logit_max_measured": reached,
                    "finite": finite_out and finite_grad,
                    "finite_output": finite_out,
                    "finite_grads": finite_grad,
                    "rel_error": rel(out, ref.detach()),
                    "grad_rel_error": max(rel(a, b) for a, b in zip(grads, ref_grads)) if finite_grad else math.nan,
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logits", type=float, nargs="+", default=[1e2, 1e3, 1e4, 1e5, 1e6])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--head-dim", type=int, default=64, help="MERT's: 1024 / 16 heads = 64")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results/attention_fp16.csv"))
    a = ap.parse_args()
    table = measure(a.logits, a.batch, a.heads, a.frames, a.head_dim, a.seed)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_name(a.out.name + ".tmp")
    table.to_csv(tmp, index=False)
    tmp.replace(a.out)
    with pd.option_context("display.width", 160):
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
