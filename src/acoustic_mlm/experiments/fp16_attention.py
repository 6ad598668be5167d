"""One attention layer in float16 against float64: what PB-Relax's measurements compare.

The package's three attention paths on the same float16 q, k, v (B, H, T, hd): `unfused` (fairseq's
order: q.k^T in float16, the softmax in float32), `fused` (torch's scaled_dot_product_attention) and
`pb_relax` (CogView's PB-Relax at MERT's alpha), each run forward and backward; plain softmax attention
in float64 of those same inputs is the reference, and `rel` the relative (Frobenius) error against it.
benchmarks/attention_fp16.py (the decisive round's numerics) and benchmarks/attention_fp16_range.py
(the range round's instances) measure with these.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from acoustic_mlm.model.encoder import relaxed_attention, unfused_attention

ALPHA = 32.0  # PB-Relax's alpha in MERT-330M's config and CogView


def paths() -> dict:
    """The attention paths compared, by name: q, k, v -> the attention's output."""
    return {
        "unfused": lambda q, k, v: unfused_attention(q, k, v),
        "fused": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "pb_relax": lambda q, k, v: relaxed_attention(q, k, v, ALPHA),
    }


def reference(q, k, v):
    """Plain softmax attention in float64."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    return s.softmax(-1) @ v


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (Frobenius, in float64); NaN when a is not finite."""
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return math.nan
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def one(path, q16, k16, v16, g):
    """One path forward and backward on copies of q, k, v, the output's gradient `g`: its output and
    the gradients of q, k and v."""
    q, k, v = (t.clone().requires_grad_(True) for t in (q16, k16, v16))
    out = path(q, k, v)
    (out.float() * g).sum().backward()
    return out.detach(), [t.grad for t in (q, k, v)]
