"""PB-Relax's range in float16, over random instances, against a float16-mantissa baseline.

`benchmarks/attention_fp16.py` measured one random instance and judged PB-Relax by an absolute
error (under 1 % at a logit of 1e5); that error is float16's mantissa, not its range: any attention
whose logits are float16 numbers has it. This script asks the range question fairly:

    instances   INSTANCES random q, k, v (B 2, H 4, T 128, hd 64, as attention_fp16.py), seeds 0..19,
                each scaled so that its largest logit |q.k| / sqrt(hd) is each of LOGITS (1e2 to 2e6)
    paths       unfused (fairseq's order), fused (torch's scaled_dot_product_attention) and pb_relax
                (alpha 32), forward and backward in float16, on the same float16 inputs
    reference   float64 attention of those float16 inputs
    baseline    the float16-mantissa floor: the float64 reference with its logits rounded to 11
                significant bits (float16's precision) and no exponent limit; its output error, and the
                error of the float64 backward taken through those rounded probabilities

A path **holds** at a logit when, in every instance, its output and its gradients of q, k and v are
finite and its relative errors (Frobenius) are at most `tolerance` times the baseline's of that instance
(plus `floor`, for instances whose baseline error is 0): the round's rule, whose two numbers are
config/experiments/pb_relax_range.yaml's params, read from there. This script measures (the `holds`
column of each instance and range.csv's counts per path and logit); the verdict (each path's range, the
largest tested logit up to which it holds at every tested logit, and PB-Relax's promise) is
`amlm experiment judge`'s, from instances.csv alone (experiments.rules.judge_range). The gradients'
relative errors are large for every path, the baseline's too, once the softmax is nearly one-hot (from
about 6e4): the exact gradients are then tiny, so the finite counts say more than those ratios.

    python benchmarks/attention_fp16_range.py --out data/reference/pb_relax_range
        # instances.csv: one row per path, logit and instance; range.csv: one row per path and logit
    amlm experiment judge config/experiments/pb_relax_range.yaml --out data/reference/pb_relax_range
        # verdict.json: each path's range and the verdict
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from acoustic_mlm.kernels import pin

pin()  # the same bits on every x86-64 CPU with AVX2, as the package's stages (before numpy and torch load)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from acoustic_mlm.experiments import declaration as D  # noqa: E402
from acoustic_mlm.experiments import fp16_attention as fa  # noqa: E402
from acoustic_mlm.experiments import rules  # noqa: E402
from acoustic_mlm.utils import atomic_path  # noqa: E402

LOGITS = [1e2, 1e3, 1e4, 3e4, 6e4, 1e5, 2e5, 5e5, 1e6, 2e6]
INSTANCES = 20
ROUND = Path(__file__).resolve().parents[1] / "config" / "experiments" / "pb_relax_range.yaml"


def rule() -> tuple[float, float]:
    """The round's tolerance and floor (its declaration's params): what `holds` is measured against."""
    params = D.load(ROUND).params
    return float(params["tolerance"]), float(params["floor"])


def round_mantissa(x: torch.Tensor, bits: int = 11) -> torch.Tensor:
    """x (float64) rounded to `bits` significant bits, with no exponent limit (float16: 11)."""
    m, e = np.frexp(x.numpy())  # x = m 2^e, 0.5 <= |m| < 1
    return torch.from_numpy(np.ldexp(np.round(m * 2.0**bits) / 2.0**bits, e))


def baseline(q, k, v, g) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output and gradients (q, k, v) of float64 attention whose logits carry float16's mantissa
    error only: the forward's logits rounded to 11 bits, the backward exact through those
    probabilities."""
    d = q.size(-1)
    s = round_mantissa((q @ k.transpose(-2, -1)) / math.sqrt(d))
    p = (s - s.amax(-1, keepdim=True)).softmax(-1)
    out = p @ v
    dp = g @ v.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return out, [ds @ k / math.sqrt(d), ds.transpose(-2, -1) @ q / math.sqrt(d), p.transpose(-2, -1) @ g]


def measure(logits=LOGITS, instances: int = INSTANCES, shape=(2, 4, 128, 64)) -> pd.DataFrame:
    rows = []
    for seed in range(instances):
        gen = torch.Generator().manual_seed(seed)
        q0, k0, v0 = (torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3))
        g = torch.randn(*shape, generator=gen)
        base = float(((q0 @ k0.transpose(-2, -1)) / math.sqrt(shape[-1])).abs().max())
        for target in logits:
            s = math.sqrt(target / base)
            q16, k16, v16 = (q0 * s).half(), (k0 * s).half(), v0.half()
            qr, kr, vr = (t.double().requires_grad_(True) for t in (q16, k16, v16))
            ref = fa.reference(qr, kr, vr)
            (ref * g.double()).sum().backward()
            ref_grads = [t.grad for t in (qr, kr, vr)]
            b_out, b_grads = baseline(qr.detach(), kr.detach(), vr.detach(), g.double())
            b_err = fa.rel(b_out, ref.detach())
            b_grad_err = max(fa.rel(x, y) for x, y in zip(b_grads, ref_grads))
            for name, path in fa.paths().items():
                out, grads = fa.one(path, q16, k16, v16, g)
                finite_out = bool(torch.isfinite(out).all())
                finite_grad = all(bool(torch.isfinite(x).all()) for x in grads)
                err = fa.rel(out, ref.detach())
                grad_err = max(fa.rel(x, y) for x, y in zip(grads, ref_grads)) if finite_grad else math.nan
                rows.append(
                    {
                        "path": name,
                        "logit_max": target,
                        "instance": seed,
                        "finite_output": finite_out,
                        "finite_grads": finite_grad,
                        "rel_error": err,
                        "grad_rel_error": grad_err,
                        "baseline_rel_error": b_err,
                        "baseline_grad_rel_error": b_grad_err,
                    }
                )
    table = pd.DataFrame(rows)
    tolerance, floor = rule()
    return table.assign(holds=rules.range_holds(table, tolerance, floor))  # the round's rule, for range.csv's counts


def per_logit(table: pd.DataFrame) -> pd.DataFrame:
    """range.csv: per path and logit, the instances, how many were finite and held, and the errors."""
    tolerance, floor = rule()
    forward = rules.range_holds(table, tolerance, floor, forward_only=True)
    return (
        table.assign(holds_forward=forward)
        .groupby(["path", "logit_max"], sort=True)
        .agg(
            instances=("instance", "size"),
            finite_output=("finite_output", "sum"),
            finite_grads=("finite_grads", "sum"),
            holds=("holds", "sum"),
            rel_error_median=("rel_error", "median"),
            rel_error_max=("rel_error", "max"),
            baseline_rel_error_median=("baseline_rel_error", "median"),
            grad_rel_error_median=("grad_rel_error", "median"),
            grad_rel_error_max=("grad_rel_error", "max"),
            baseline_grad_rel_error_median=("baseline_grad_rel_error", "median"),
            holds_forward=("holds_forward", "sum"),
        )
        .reset_index()
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=INSTANCES)
    ap.add_argument("--out", type=Path, default=Path("results/pb_relax_range"))
    args = ap.parse_args(argv)
    table = measure(instances=args.instances)
    per = per_logit(table)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, frame in (("instances.csv", table), ("range.csv", per)):
        with atomic_path(args.out / name) as tmp:
            frame.to_csv(tmp, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(per.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print(f"-> {args.out}; the verdict: amlm experiment judge {ROUND.relative_to(ROUND.parents[2])} --out {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
