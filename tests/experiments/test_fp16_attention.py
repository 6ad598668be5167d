"""experiments.fp16_attention: the float64 reference is softmax attention, the relative error is
Frobenius', and in float16 past 65,504 the unfused order overflows where PB-Relax and the fused kernel
stay finite and on the reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from acoustic_mlm.experiments import fp16_attention as fa

SHAPE = (1, 2, 32, 16)


def _instance(logit: float):
    """Random q, k, v scaled so that the largest logit |q.k| / sqrt(hd) is `logit`, in float16, and an
    output gradient."""
    gen = torch.Generator().manual_seed(0)
    q0, k0, v0 = (torch.randn(*SHAPE, generator=gen, dtype=torch.float64) for _ in range(3))
    g = torch.randn(*SHAPE, generator=gen)
    s = math.sqrt(logit / float(((q0 @ k0.transpose(-2, -1)) / math.sqrt(SHAPE[-1])).abs().max()))
    return (q0 * s).half(), (k0 * s).half(), v0.half(), g


def test_the_reference_is_softmax_attention_in_float64():
    q, k, v, _ = (t.double() for t in _instance(30.0))
    ref = fa.reference(q, k, v)
    assert ref.dtype == torch.float64
    torch.testing.assert_close(ref, F.scaled_dot_product_attention(q, k, v), rtol=1e-12, atol=1e-12)


def test_rel_is_the_frobenius_error_and_nan_when_not_finite():
    b = torch.tensor([3.0, 4.0])
    assert fa.rel(torch.tensor([3.0, 4.5]), b) == pytest.approx(0.1)  # ||(0, 0.5)|| / 5
    assert fa.rel(b, b) == 0.0
    assert math.isnan(fa.rel(torch.tensor([3.0, math.inf]), b))


def test_past_float16s_range_the_unfused_order_overflows_and_pb_relax_does_not():
    q, k, v, g = _instance(1e5)
    ref = fa.reference(q.double(), k.double(), v.double())
    results = {name: fa.one(path, q, k, v, g) for name, path in fa.paths().items()}
    out, grads = results["unfused"]
    assert math.isnan(fa.rel(out, ref)) and not any(bool(torch.isfinite(x).all()) for x in grads)
    for name in ("pb_relax", "fused"):
        out, grads = results[name]
        assert fa.rel(out, ref) < 1e-3 and all(bool(torch.isfinite(x).all()) for x in grads), name


def test_within_range_every_path_is_near_the_reference_and_one_leaves_its_inputs_alone():
    q, k, v, g = _instance(100.0)
    ref = fa.reference(q.double(), k.double(), v.double())
    for name, path in fa.paths().items():
        out, grads = fa.one(path, q, k, v, g)
        assert out.dtype == torch.float16 and fa.rel(out, ref) < 5e-3, name
        assert [x.shape for x in grads] == [q.shape] * 3 and all(bool(torch.isfinite(x).all()) for x in grads)
    assert q.grad is None and not q.requires_grad  # one() differentiates copies
