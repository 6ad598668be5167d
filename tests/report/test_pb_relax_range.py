"""benchmarks/attention_fp16_range.py: the float16-mantissa baseline and the range rule, on hand-made
tables (the full measurement is a benchmark, its table in data/reference/pb_relax_range/)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def test_mantissa_rounding_is_float16s_where_float16_has_the_range():
    r = load_benchmark("attention_fp16_range")
    # float32 values (float64 -> float16 in torch may round twice, through float32), none subnormal
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 1000
    x = x[x.abs() > 1e-3]
    assert torch.equal(r.round_mantissa(x.double()), x.half().double())
    # beyond 65504 float16 overflows; the baseline keeps 11 bits and any exponent
    big = torch.tensor([1e5, 2e6, -3.3e7], dtype=torch.float64)
    assert torch.isinf(big.half()).all()
    rounded = r.round_mantissa(big)
    assert torch.isfinite(rounded).all()
    assert ((rounded - big).abs() / big.abs() <= 2.0**-11).all()
    assert r.round_mantissa(torch.tensor([1 + 2.0**-12], dtype=torch.float64)).item() == 1.0


def test_the_baseline_matches_float64_attention_up_to_the_rounding():
    r = load_benchmark("attention_fp16_range")
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(1, 2, 16, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    ref = ((qr @ kr.transpose(-2, -1)) / 8**0.5).softmax(-1) @ vr
    (ref * g).sum().backward()
    out, grads = r.baseline(q, k, v, g)
    assert (out - ref.detach()).norm() / ref.norm() < 1e-3  # logits of order 1: 11 bits, errors about 1e-4
    for got, want in zip(grads, (qr.grad, kr.grad, vr.grad)):
        assert (got - want).norm() / want.norm() < 1e-2
    # with logits already 11-bit numbers (multiples of 1/8 of small size) the baseline is exact
    q8, k8 = torch.round(q * 4) / 4, torch.round(k * 4) / 4
    qr, kr = q8.clone().requires_grad_(True), k8.clone().requires_grad_(True)
    ref = ((qr @ kr.transpose(-2, -1)) / 8**0.5).softmax(-1) @ v  # /sqrt(8) is not exact: compare loosely
    assert (r.baseline(q8, k8, v, g)[0] - ref.detach()).norm() / ref.norm() < 1e-3


def test_the_range_is_the_last_logit_held_at_every_instance_up_to_it():
    r = load_benchmark("attention_fp16_range")
    rows = []
    for path, holds in {"unfused": [1, 1, 0, 0], "pb_relax": [1, 1, 1, 0], "fused": [1, 0, 1, 1]}.items():
        for logit, h in zip([1e2, 1e4, 1e5, 2e6], holds):
            for instance in range(2):
                ok = bool(h) or instance == 0  # one instance failing is enough to break the range
                rows.append(
                    {
                        "path": path,
                        "logit_max": logit,
                        "instance": instance,
                        "finite_output": ok,
                        "finite_grads": ok,
                        "rel_error": 0.01,
                        "grad_rel_error": 0.02,
                        "baseline_rel_error": 0.01,
                        "baseline_grad_rel_error": 0.02,
                        "holds": ok,
                    }
                )
    per, verdict = r.summarise(pd.DataFrame(rows))
    assert verdict["range"] == {"unfused": 1e4, "pb_relax": 1e5, "fused": 1e2}  # fused: not past its first failure
    assert verdict["verdict"] == "supported"
    assert per.loc[(per["path"] == "unfused") & (per["logit_max"] == 1e5), "holds"].item() == 1
    table = pd.DataFrame(rows)
    table.loc[table["path"] == "pb_relax", "holds"] = table.loc[table["path"] == "unfused", "holds"].to_numpy()
    assert r.summarise(table)[1]["verdict"] == "not supported"
    # the forward-only range ignores the gradients
    table = pd.DataFrame(rows).assign(finite_grads=False, holds=False)
    assert r.summarise(table)[1]["range_forward_only"]["pb_relax"] == pytest.approx(1e5)
