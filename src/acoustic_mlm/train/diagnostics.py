"""Stability diagnostics for the metrics rows: why a run spikes, stalls or overflows.

Measured only at the steps that get a metrics row (`train.diagnostics: true`), never on the
other steps, so training itself runs the same kernels (the fused attention included):

    update step (train_step, at a row step; fp16_fairseq: at an update that did not overflow)
        grad_norm_<block>      L2 norm of the block's gradient before clipping (fp16: unscaled;
                               fp16_fairseq: as the update sees it, divided by the masked frames)
        update_ratio_<block>   ||W_after - W_before|| / ||W_before||: the size of this update
        masked_frac            masked frames / frames in the step's batch
    validation pass (record, on the fixed held-out crops, after the update)
        attn_logit_max_l<i>    largest |q.k| / sqrt(hd) of layer i's attention (before softmax,
                               before PB-Relax's division): the quantity that overflows in fp16
        attn_logit_max         the largest over layers
        attn_logit_fp16_frac   attn_logit_max / 65504 (float16's largest finite value)
        valid_acc_cb0          codebook-0 accuracy (argmax of the cosine logits) on masked frames

Blocks partition the parameters: `conv` (the conv feature extractor), `embed` (feature
LayerNorm, projection, mask embedding, positional conv, the encoder's LayerNorm), `block<i>`
(transformer layer i), `heads` (per-codebook projections and codeword embeddings).

The validation-pass values come from hooks: a forward pre-hook on each attention module
recomputes q and k from the module's input in float32 (the attention kernel itself is not
touched), and hooks on the model and its heads count correct codebook-0 predictions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.utils import FP16_MAX

BLOCK_PATTERNS = (  # parameter-name prefix -> block (first match wins; everything else: embed)
    (re.compile(r"^encoder\.transformer\.blocks\.(\d+)\."), "block{}"),
    (re.compile(r"^encoder\.feature_extractor\."), "conv"),
    (re.compile(r"^heads\."), "heads"),
)


# ----------------------------------------------------------------------------- pure functions


def block_of(name: str) -> str:
    """The block a parameter belongs to, from its name in AcousticMLM.named_parameters()."""
    for pattern, block in BLOCK_PATTERNS:
        match = pattern.match(name)
        if match:
            return block.format(*match.groups())
    return "embed"


def param_blocks(model: nn.Module | Iterable[tuple[str, torch.Tensor]]) -> dict[str, list[torch.Tensor]]:
    """block -> its parameters (of a model, or of (name, tensor) pairs named as the model's
    parameters), blocks in model order (conv, embed, block0..N-1, heads)."""
    blocks: dict[str, list[torch.Tensor]] = {}
    named = model.named_parameters() if isinstance(model, nn.Module) else model
    for name, p in named:
        blocks.setdefault(block_of(name), []).append(p)
    layers = sorted((b for b in blocks if b.startswith("block")), key=lambda b: int(b[5:]))
    order = ["conv", "embed"] + layers + ["heads"]
    return {b: blocks[b] for b in order if b in blocks}


def _norms(groups: list[list[torch.Tensor]], device: torch.device) -> torch.Tensor:
    """L2 norm of each group of tensors in float32, (groups,) on `device`; an empty group is 0.
    One tensor: the caller copies all the norms to the host at once."""
    out = [
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.detach().float()) for t in g]))
        if g
        else torch.zeros((), device=device)
        for g in groups
    ]
    return torch.stack(out) if out else torch.zeros(0, device=device)


def _device(blocks: dict[str, list[torch.Tensor]]) -> torch.device:
    return next((p.device for ps in blocks.values() for p in ps), torch.device("cpu"))


def grad_norms(blocks: dict[str, list[torch.Tensor]], scale: float = 1.0) -> dict[str, float]:
    """grad_norm_<block>: each block's gradient norm divided by the loss scale (1 without one).

    A parameter without a gradient counts as zero; a block that overflowed reports inf.
    """
    grads = [[p.grad for p in ps if p.grad is not None] for ps in blocks.values()]
    values = (_norms(grads, _device(blocks)) / scale).tolist()
    return {M.grad_norm_column(b): float(v) for b, v in zip(blocks, values)}


def snapshot(blocks: dict[str, list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """A copy of every block's weights (taken before an update)."""
    return [[p.detach().clone() for p in ps] for ps in blocks.values()]


def update_ratios(blocks: dict[str, list[torch.Tensor]], before: list[list[torch.Tensor]]) -> dict[str, float]:
    """update_ratio_<block>: ||W_after - W_before|| / ||W_before|| over the block's weights.

    0 when the update was skipped (fp16 overflow); NaN for a block whose weights were all zero.
    """
    diffs = [[p.detach() - b for p, b in zip(ps, bs)] for ps, bs in zip(blocks.values(), before)]
    dev = _device(blocks)
    ratio = (_norms(diffs, dev) / _norms(before, dev)).tolist()
    return {M.update_ratio_column(b): float(r) if math.isfinite(r) else math.nan for b, r in zip(blocks, ratio)}


def attention_logits(
    x: torch.Tensor,
    q_proj: nn.Linear,
    k_proj: nn.Linear,
    heads: int,
    qk_gain: float = 1.0,
    q_norm: nn.LayerNorm | None = None,
    k_norm: nn.LayerNorm | None = None,
) -> torch.Tensor:
    """The pre-softmax logits q.k / sqrt(hd) of self-attention on input x (B, T, D), in float32:
    (B, H, T, T). What a plain softmax kernel exponentiates; PB-Relax divides them by alpha first.
    qk_gain: the attention's forced logit growth (q and k each multiplied by it); q_norm, k_norm:
    attention qk_norm's per-head LayerNorms (applied before the gain, as the attention does)."""
    B, T, D = x.shape
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = x.float()
        q = F.linear(x, q_proj.weight.float(), None if q_proj.bias is None else q_proj.bias.float())
        k = F.linear(x, k_proj.weight.float(), None if k_proj.bias is None else k_proj.bias.float())
        q = q.view(B, T, heads, D // heads).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, heads, D // heads).transpose(1, 2)  # (B, H, T, hd)
        if q_norm is not None:
            q = F.layer_norm(q, q_norm.normalized_shape, q_norm.weight.float(), q_norm.bias.float(), q_norm.eps)
            k = F.layer_norm(k, k_norm.normalized_shape, k_norm.weight.float(), k_norm.bias.float(), k_norm.eps)
        if qk_gain != 1.0:
            q, k = q * qk_gain, k * qk_gain
        return (q @ k.transpose(-2, -1)) / math.sqrt(D // heads)  # (B, H, T, T)


def fp16_fraction(value: float) -> float:
    """A magnitude as a fraction of float16's largest finite value (1 or more: overflow)."""
    return value / FP16_MAX


def masked_fraction(n_masked: int, frames: int) -> float:
    """Masked frames / frames (NaN for no frames)."""
    return n_masked / frames if frames else math.nan


def codebook_correct(logits: torch.Tensor, targets: torch.Tensor, codebook: int = 0) -> torch.Tensor:
    """Correct argmax predictions of one codebook: logits (N, K, V), targets (N, K) -> scalar count."""
    return (logits[:, codebook].argmax(dim=-1) == targets[:, codebook]).sum()


# ----------------------------------------------------------------------------- hooks and probes


class UpdateProbe:
    """Per-block gradient norms and a weight snapshot before an update; update ratios after it.
    (The loss scale is in every row already: train/loop.py's `loss_scale`, NaN without a scaler.)

        probe = UpdateProbe(model, scale)   # gradients in place, not yet unscaled or clipped
        ...optimizer step...
        row = probe.finish()
    """

    def __init__(self, model: nn.Module, scale: float = 1.0, weights: dict[str, list[torch.Tensor]] | None = None):
        """`scale`: what the gradients are divided by (the precision's `grad_scale`: the loss scale, or 1);
        `weights`: the tensors whose update is measured, by block (default: the model's parameters;
        precision fp16_fairseq passes its fp32 master weights, which fp16 would round)."""
        self.blocks = param_blocks(model)
        self.grads = grad_norms(self.blocks, scale)  # scaled gradients / scale = unscaled
        self.weights = weights if weights is not None else self.blocks
        self.before = snapshot(self.weights)

    def finish(self) -> dict[str, float]:
        row = {**self.grads, **update_ratios(self.weights, self.before)}
        self.before = []
        return row


class ValidProbe:
    """Hooks for one validation pass: attention logit maxima per layer and codebook-0 accuracy.

        with ValidProbe(model) as probe:
            evaluate(model, ...)
        row.update(probe.values())

    `model` is an AcousticMLM (not a DDP or compiled wrapper). The sums stay on the device until
    values() is called.
    """

    def __init__(self, model: nn.Module):
        from acoustic_mlm.model.encoder import MultiheadSelfAttention

        self.model = model
        self.attention = [m for m in model.modules() if isinstance(m, MultiheadSelfAttention)]
        self.logit_max: list[torch.Tensor | None] = [None] * len(self.attention)
        self.correct, self.total = None, None  # device scalars, summed over the pass's chunks
        self._codes = self._mask = None
        self._handles = []

    def __enter__(self) -> "ValidProbe":
        for i, attn in enumerate(self.attention):
            self._handles.append(attn.register_forward_pre_hook(self._attention_hook(i)))
        self._handles.append(self.model.register_forward_pre_hook(self._inputs_hook, with_kwargs=True))
        self._handles.append(self.model.heads.register_forward_hook(self._heads_hook))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _attention_hook(self, i: int):
        def hook(module, args):
            with torch.no_grad():
                m = attention_logits(
                    args[0], module.q_proj, module.k_proj, module.heads, module.qk_gain, module.q_norm, module.k_norm
                )
                m = m.abs().amax()
            self.logit_max[i] = m if self.logit_max[i] is None else torch.maximum(self.logit_max[i], m)

        return hook

    def _inputs_hook(self, module, args, kwargs):
        names = ("wav", "codes", "mask")
        given = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
        self._codes, self._mask = given["codes"], given["mask"]  # (B, K, T), (B, T)

    def _heads_hook(self, module, args, logits):
        codes, mask = self._codes, self._mask
        if hasattr(module, "target_ids"):  # codes -> the heads' class ids (special symbols first)
            codes = module.target_ids(codes)
        with torch.no_grad():
            if logits.shape[0] == mask.numel():  # static shapes: every frame scored, unmasked ones weighted 0
                flat = mask.reshape(-1)  # (B T,)
                targets = codes.transpose(1, 2).reshape(flat.shape[0], -1)  # (B T, K)
                c = ((logits[:, 0].argmax(dim=-1) == targets[:, 0]) & flat).sum()
                n = flat.sum()
            else:  # the masked frames only, as h[mask] selected them
                c = codebook_correct(logits, codes.transpose(1, 2)[mask])
                n = torch.tensor(logits.shape[0], device=c.device)
        self.correct = c if self.correct is None else self.correct + c
        self.total = n if self.total is None else self.total + n

    def values(self) -> dict[str, float]:
        row = {}
        maxima = [float(m) if m is not None else math.nan for m in self.logit_max]
        for i, m in enumerate(maxima):
            row[M.attn_logit_max_column(i)] = m
        top = max((m for m in maxima if not math.isnan(m)), default=math.nan)
        row[M.ATTN_LOGIT_MAX] = top
        row[M.ATTN_LOGIT_FP16_FRAC] = fp16_fraction(top)
        total = int(self.total) if self.total is not None else 0
        row[M.VALID_ACC_CB0] = float(self.correct) / total if total else math.nan
        return row
