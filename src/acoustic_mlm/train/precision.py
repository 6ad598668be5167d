"""fairseq-style fp16 training (`train.precision: fp16_fairseq`): an fp16 model, fp32 master weights
and a dynamic loss scaler, as MERT trained (`common.fp16: true` in
yizhilll/MERT mert_fairseq/config/pretrain/MERT_RVQ-VAE_CQT_330M.yaml).

What fairseq (facebookresearch/fairseq, 2022-2023) does, and this module reproduces:

- fairseq/trainer.py (Trainer.__init__): with `common.fp16` the model and the criterion are
  converted with `.half()`: every layer, LayerNorm and the attention softmax included, computes in
  fp16; `_prepare_sample` casts the floating-point inputs to half. The exceptions are the modules
  written to compute in fp32: wav2vec2's conv feature extractor normalises its first layer with
  `Fp32GroupNorm` in `extractor_mode: default` (fairseq/models/wav2vec/wav2vec2.py,
  ConvFeatureExtractionModel; fairseq/modules/fp32_group_norm.py), the mode MERT uses.
- fairseq/optim/fp16_optimizer.py (FP16Optimizer): an fp32 copy of every parameter is what the
  optimizer updates. The loss is multiplied by the loss scale before backward; the fp16 gradients
  are copied to the fp32 copies and multiplied by 1 / scale; the total norm is taken on them; a norm
  above `clip_norm` multiplies the gradients by clip_norm / norm (no epsilon); a non-finite norm is
  an overflow. After the step the fp32 weights are copied back into the fp16 model.
- fairseq/optim/dynamic_loss_scaler.py (DynamicLossScaler): an overflow divides the scale by 2
  (with `fp16_scale_tolerance` 0, every overflow); after `scale_window` updates without an
  overflow it is multiplied by 2; an overflow that would take the scale to `min_loss_scale` or
  below stops training (FloatingPointError, "Minimum loss scale reached").
- fairseq/dataclass/configs.py (CommonConfig): `fp16_init_scale` 2**7, `fp16_scale_window` None,
  `fp16_scale_tolerance` 0.0, `min_loss_scale` 1e-4, `threshold_loss_scale` None; MERT sets none
  of them. With `fp16_scale_window` None, FP16Optimizer uses
  int(2**14 / data-parallel world size / update_freq): 32 for MERT-330M (64 GPUs, update_freq 8).
- fairseq/trainer.py (train_step): on an overflow the gradients are dropped ("gradient overflow
  detected, ignoring gradient"), the update counter is not advanced (so the learning-rate schedule
  does not move) and the step's statistics are not logged.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

INIT_SCALE = 2.0**7  # fairseq/dataclass/configs.py: fp16_init_scale
MIN_LOSS_SCALE = 1e-4  # fairseq/dataclass/configs.py: min_loss_scale
SCALE_FACTOR = 2.0  # fairseq/optim/dynamic_loss_scaler.py: scale_factor
WINDOW_NUMERATOR = 2**14  # fairseq/optim/fp16_optimizer.py: the default scale window's numerator


def scale_window(world: int, update_freq: int) -> int:
    """fairseq's scale window when `fp16_scale_window` is not set (fairseq/optim/fp16_optimizer.py):
    int(2**14 / data-parallel world size / update_freq); at least 1 here, where fairseq would fail."""
    return max(1, int(WINDOW_NUMERATOR / world / update_freq))


class MinLossScaleError(FloatingPointError):
    """The loss scale would fall to min_loss_scale: fairseq stops training here."""


class LossScaler:
    """fairseq's DynamicLossScaler rule (fairseq/optim/dynamic_loss_scaler.py), counted in optimizer
    steps: `overflow()` after a step whose gradients overflowed, `clean()` after a step taken."""

    def __init__(self, window: int, init_scale: float = INIT_SCALE, min_scale: float = MIN_LOSS_SCALE,
                 factor: float = SCALE_FACTOR, tolerance: float = 0.0):
        if window < 1:
            raise ValueError(f"loss-scale window must be at least 1, got {window}")
        self.window, self.min_scale, self.factor, self.tolerance = window, min_scale, factor, tolerance
        self.scale = float(init_scale)
        self.iter = 0  # steps seen, overflowed or not
        self.last_overflow = -1  # the step of the last overflow
        self.last_rescale = -1  # the step of the last change of scale
        self.overflows_since_rescale = 0

    def clean(self) -> None:
        """A step without overflow: the scale doubles every `window` clean steps since the last overflow."""
        if (self.iter - self.last_overflow) % self.window == 0:
            self.scale *= self.factor
            self.last_rescale = self.iter
        self.iter += 1

    def overflow(self) -> None:
        """A step whose gradients were not finite: halve the scale (with tolerance 0, every time);
        raise MinLossScaleError, scale unchanged, when that would reach min_scale."""
        previous = self.scale
        self.overflows_since_rescale += 1
        self.last_overflow = self.iter
        if self.overflows_since_rescale / (self.iter - self.last_rescale) >= self.tolerance:
            self.scale /= self.factor
            self.last_rescale = self.iter
            self.overflows_since_rescale = 0
        if self.scale <= self.min_scale:
            self.scale = previous
            raise MinLossScaleError(f"loss scale reached min_loss_scale ({self.min_scale:g}): the loss is exploding")
        self.iter += 1

    def state_dict(self) -> dict:
        return {"scale": self.scale, "iter": self.iter, "last_overflow": self.last_overflow,
                "last_rescale": self.last_rescale, "overflows_since_rescale": self.overflows_since_rescale,
                "window": self.window}

    def load_state_dict(self, st: dict) -> None:
        self.scale, self.iter, self.window = float(st["scale"]), int(st["iter"]), int(st["window"])
        self.last_overflow, self.last_rescale = int(st["last_overflow"]), int(st["last_rescale"])
        self.overflows_since_rescale = int(st["overflows_since_rescale"])


class Fp32GroupNorm(nn.GroupNorm):
    """GroupNorm computed in fp32 whatever the parameters' and input's dtype, the output cast back
    (fairseq/modules/fp32_group_norm.py; wav2vec2's first conv layer in extractor_mode default)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        return F.group_norm(x.float(), self.num_groups, w, b, self.eps).type_as(x)


def _inputs_to_half(_module, args, kwargs):
    """fairseq's Trainer._prepare_sample casts floating-point inputs to half under fp16."""
    def half(x):
        return x.half() if torch.is_tensor(x) and x.is_floating_point() else x
    return tuple(half(a) for a in args), {k: half(v) for k, v in kwargs.items()}


def half_model(model: nn.Module) -> nn.Module:
    """Convert a model as fairseq's trainer does under fp16: `.half()` everywhere, GroupNorm computed
    in fp32 (Fp32GroupNorm), floating-point inputs cast to half. In place; returns the model."""
    for module in model.modules():
        if type(module) is nn.GroupNorm:
            module.__class__ = Fp32GroupNorm  # same parameters and state_dict, fp32 arithmetic
    model.half()
    model.register_forward_pre_hook(_inputs_to_half, with_kwargs=True)
    return model


class StepOutcome(NamedTuple):
    grad_norm: float  # total norm of the unscaled gradients before clipping (inf or nan on overflow)
    clipped: bool  # the norm was above the clip and the gradients were scaled down
    overflow: bool  # the gradients overflowed: no update was taken


class FP16Optimizer:
    """fp32 master weights for an fp16 model (fairseq/optim/fp16_optimizer.py, FP16Optimizer).

    `make_optimizer` builds the fp32 optimizer over the master copies; `backward` scales the loss;
    `step(clip)` unscales, clips and steps, or, on overflow, drops the gradients and lets the
    scaler halve the scale (MinLossScaleError when that reaches the minimum).
    """

    def __init__(self, named_params: Iterable[tuple[str, nn.Parameter]],
                 make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer], scaler: LossScaler):
        named = [(n, p) for n, p in named_params if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.master = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.optimizer = make_optimizer(self.master)
        self.scaler = scaler

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scaler.scale

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None

    def step(self, clip: float, multiplier: float = 1.0) -> StepOutcome:
        """Unscale the fp16 gradients into the fp32 copies and multiply them by `multiplier` (fairseq's
        trainer: data-parallel size / sample size, turning summed losses into a mean), clip to `clip`
        (0: no clipping), step, copy back; or, when they overflowed, drop them and halve the scale."""
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float() if p.grad is not None else torch.zeros_like(m)
        factor = multiplier / self.scaler.scale
        norm = float(torch.nn.utils.get_total_norm([m.grad for m in self.master])) * factor
        if not math.isfinite(norm):
            self.zero_grad()
            self.scaler.overflow()  # may raise MinLossScaleError
            return StepOutcome(norm, False, True)
        clipped = clip > 0 and norm > clip
        if clipped:
            factor *= clip / norm
        torch._foreach_mul_([m.grad for m in self.master], factor)
        self.optimizer.step()
        self.scaler.clean()
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)
        return StepOutcome(norm, clipped, False)

    def fp32_state_dict(self, model: nn.Module) -> dict:
        """The model's state_dict with the fp32 master weights in place of the fp16 parameters and
        every other floating-point tensor in fp32: what a checkpoint keeps."""
        state = {k: (v.float() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
        for name, m in zip(self.names, self.master):
            state[name] = m.detach().clone()
        return state

    def state_dict(self) -> dict:
        return {"master": [m.detach().cpu() for m in self.master], "scaler": self.scaler.state_dict()}

    def load_state_dict(self, st: dict) -> None:
        """Restore the master weights and the scaler (the fp32 optimizer's own state is loaded
        separately) and copy the masters into the fp16 model."""
        with torch.no_grad():
            for p, m, saved in zip(self.params, self.master, st["master"]):
                m.copy_(saved)
                p.copy_(m)
        self.scaler.load_state_dict(st["scaler"])
