"""Precision as one object: `make_precision` gives the trainer its policy for `train.precision`, and
the update calls it without knowing which it is (the calls: `Precision`'s docstring).

- `AutocastPrecision`: fp32 (as it is), bf16 (autocast), fp16 (autocast and torch's GradScaler,
  which skips an update whose gradients overflowed; that update still counts as a step).
- `FairseqPrecision`: fairseq-style fp16 training (`train.precision: fp16_fairseq`): an fp16 model,
  fp32 master weights and a dynamic loss scaler, as MERT trained (`common.fp16: true` in
  yizhilll/MERT mert_fairseq/config/pretrain/MERT_RVQ-VAE_CQT_330M.yaml); an overflow is not an
  update (`retries_overflows`).

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

import contextlib
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

    def __init__(
        self,
        window: int,
        init_scale: float = INIT_SCALE,
        min_scale: float = MIN_LOSS_SCALE,
        factor: float = SCALE_FACTOR,
        tolerance: float = 0.0,
    ):
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

    # the saved state: the scale (a float) and the step counters (ints)
    SAVED = ("scale", "iter", "last_overflow", "last_rescale", "overflows_since_rescale", "window")

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.SAVED}

    def load_state_dict(self, st: dict) -> None:
        for k in self.SAVED:
            setattr(self, k, float(st[k]) if k == "scale" else int(st[k]))


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


class Traits(NamedTuple):
    """What other modules ask of a `train.precision` value (preflight's projections, autocast), so
    that none of them branches on its name."""

    autocast_dtype: torch.dtype | None  # forwards run under autocast to this dtype; None: as the model is
    matmul_dtype: torch.dtype  # the dtype the matmuls compute in (which of a GPU's peaks applies)
    half_model: bool  # the model in fp16 (weights, gradients, activations), fp32 master weights beside it

    @property
    def tensor_cores(self) -> bool:
        """Matmuls in a 16-bit type: a GPU's tensor-core peak applies."""
        return self.matmul_dtype != torch.float32

    @property
    def float16_range(self) -> bool:
        """Matmuls in float16: an attention logit beyond float16's largest value overflows."""
        return self.matmul_dtype == torch.float16

    @property
    def weight_bytes(self) -> int:
        """Bytes of one of the model's weights, and of its gradient (what DDP all-reduces)."""
        return 2 if self.half_model else 4


TRAITS: dict[str, Traits] = {
    "fp32": Traits(None, torch.float32, False),
    "bf16": Traits(torch.bfloat16, torch.bfloat16, False),
    "fp16": Traits(torch.float16, torch.float16, False),
    "fp16_fairseq": Traits(None, torch.float16, True),  # `half_model` and fairseq's FP16Optimizer
}
FP32 = "fp32"  # the precision a CPU measures in place of a GPU's half precision


def names_where(test: Callable[[Traits], bool]) -> tuple[str, ...]:
    """The `train.precision` values whose traits pass `test`, in TRAITS' order (for reports' tables)."""
    return tuple(name for name, tr in TRAITS.items() if test(tr))


def traits(name: str) -> Traits:
    """The traits of the `train.precision` value `name` (a validated configuration holds one of TRAITS)."""
    return TRAITS[name]


def autocast(device: torch.device, precision: str):
    """The context a forward of `precision` runs in: autocast for bf16 and fp16; fp32 and fp16_fairseq
    (a half model, `half_model`) run as they are."""
    dtype = traits(precision).autocast_dtype
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class StepOutcome(NamedTuple):
    grad_norm: float  # total norm of the unscaled gradients before clipping (inf or nan on overflow)
    clipped: bool  # the norm was above the clip and the gradients were scaled down
    overflow: bool  # the gradients overflowed: no step may be taken


Optimizer = torch.optim.Optimizer
MakeOptimizer = Callable[[Iterable[nn.Parameter]], Optimizer]


class Precision:
    """One trainer's floating-point policy, built by `make_precision`. An update calls, in order:

        precision.zero_grad()
        with precision.autocast():                          # each micro-batch, then
            out = model(...)
        precision.backward(out.loss, out.n_masked, n)       # of n micro-batches
        # all losses finite:
        outcome = precision.unscale_and_clip(max_norm, masked, world)  # masked frames of all processes
        skipped = outcome.overflow or precision.step()      # step: whether the loss scaler skipped it
        # a loss not finite:
        overflow = precision.skip_nonfinite()

    While the trainer is built: `prepare(model)` (the model as the precision computes) and
    `build_optimizer(model, make_optimizer)` (the optimizer over what it updates). Read by the
    loop: `loss_scale` (NaN without a scaler), `retries_overflows`, `state_dict()` /
    `load_state_dict()` (the resumable state's 'scaler' and 'fp16' entries), `state_problem(state)`
    and `fp32_state_dict()` (the final checkpoint's weights). Read by the update's probe
    (diagnostics.UpdateProbe): `grad_scale(masked, world)` and `named_weights()`.
    """

    name: str  # the train.precision value
    device: torch.device
    # an overflowing update is not an update: the step counter, the schedule and the means skip it and the
    # loop draws new micro-batches (fairseq); False: it counts as a step the loss scaler skipped
    retries_overflows: bool = False

    def autocast(self):
        """The context every forward runs in (training and validation)."""
        return autocast(self.device, self.name)

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model as this precision computes: as it is."""
        return model

    def build_optimizer(self, model: nn.Module, make_optimizer: MakeOptimizer) -> Optimizer:
        raise NotImplementedError

    @property
    def loss_scale(self) -> float:
        """The loss scale now (NaN without one), as fairseq logs `loss_scale`."""
        raise NotImplementedError

    def zero_grad(self) -> None:
        raise NotImplementedError

    def backward(self, loss: torch.Tensor, n_masked: torch.Tensor, micro_batches: int) -> None:
        """Backward of one micro-batch's loss (its `n_masked` frames; one of `micro_batches`), scaled."""
        raise NotImplementedError

    def grad_scale(self, masked: float, world: int) -> float:
        """What the gradients in place divide by to become the update's (before clipping)."""
        raise NotImplementedError

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """(name, tensor) of the weights the optimizer updates, named as the model's parameters."""
        raise NotImplementedError

    def unscale_and_clip(self, max_norm: float, masked: float, world: int) -> StepOutcome:
        """Unscale the gradients and clip their total norm to `max_norm` (0: no clipping; the norm is
        measured all the same); `masked`: the update's masked frames over its `world` processes."""
        raise NotImplementedError

    def step(self) -> bool:
        """The optimizer step after `unscale_and_clip`; True when the loss scaler skipped it."""
        raise NotImplementedError

    def skip_nonfinite(self) -> bool:
        """No step: a micro-batch's loss (or, under fairseq's, the gradients) was not finite. True when
        that is an overflow: the scale halves (MinLossScaleError when that reaches the minimum)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """{'scaler': torch's GradScaler's state ({} when disabled), 'fp16': fairseq's masters and
        scaler (None otherwise)}: the resumable state's entries, as before precision was one object."""
        raise NotImplementedError

    def load_state_dict(self, st: dict) -> None:
        """Restore from a mapping holding `state_dict`'s entries (a whole resumable state will do)."""
        raise NotImplementedError

    def state_problem(self, state: dict) -> str | None:
        """Why a resumable state lacks this precision's part, or None."""
        return None

    def fp32_state_dict(self) -> dict:
        """The model's weights as a checkpoint keeps them."""
        raise NotImplementedError


class AutocastPrecision(Precision):
    """fp32, bf16 and fp16: the model in fp32, forwards under autocast (bf16, fp16), one torch
    GradScaler (enabled under fp16 only: disabled, each of its calls passes through). The loss is the
    mean over micro-batches; an fp16 overflow skips the optimizer step and halves the scale."""

    def __init__(self, name: str, device: torch.device):
        self.name, self.device = name, device
        # torch's loss scaler where the forward autocasts to float16
        self.scaler = torch.amp.GradScaler(device.type, enabled=traits(name).autocast_dtype == torch.float16)
        self.model: nn.Module | None = None
        self.optimizer: Optimizer | None = None

    def build_optimizer(self, model: nn.Module, make_optimizer: MakeOptimizer) -> Optimizer:
        self.model, self.optimizer = model, make_optimizer(model.parameters())
        return self.optimizer

    @property
    def loss_scale(self) -> float:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else float("nan")

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, n_masked: torch.Tensor, micro_batches: int) -> None:
        self.scaler.scale(loss / micro_batches).backward()

    def grad_scale(self, masked: float, world: int) -> float:
        return self.scaler.get_scale() if self.scaler.is_enabled() else 1.0

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return self.model.named_parameters()

    def unscale_and_clip(self, max_norm: float, masked: float, world: int) -> StepOutcome:
        """The overflow, if any, is the GradScaler's to find in `step`."""
        max_norm = max_norm if max_norm > 0 else math.inf
        self.scaler.unscale_(self.optimizer)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        return StepOutcome(grad_norm, math.isfinite(grad_norm) and grad_norm > max_norm, False)

    def step(self) -> bool:
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        self.scaler.step(self.optimizer)  # skips the update itself when fp16 gradients overflowed
        self.scaler.update()
        return self.scaler.is_enabled() and self.scaler.get_scale() < scale_before

    def skip_nonfinite(self) -> bool:
        return False  # the update is skipped (the loop counts it as non-finite); the scale stays

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "fp16": None}

    def load_state_dict(self, st: dict) -> None:
        self.scaler.load_state_dict(st["scaler"])

    def fp32_state_dict(self) -> dict:
        return self.model.state_dict()


class FairseqPrecision(Precision):
    """fp16_fairseq: a half model (`half_model`) whose fp32 master weights the optimizer updates
    (fairseq/optim/fp16_optimizer.py, FP16Optimizer), with fairseq's dynamic loss scaler.

    The loss is summed over masked frames (fairseq's criterion) and `unscale_and_clip` multiplies the
    gradients by processes / masked frames of all processes (fairseq/trainer.py), unscales them into
    the fp32 copies and clips them; on overflow (a non-finite norm, or a non-finite loss) it drops
    them and the scaler halves the scale (MinLossScaleError when that reaches the minimum). `step`
    steps the masters and copies them back into the fp16 model.
    """

    retries_overflows = True

    def __init__(self, device: torch.device, scaler: LossScaler):
        self.name, self.device = "fp16_fairseq", device
        self.scaler = scaler
        self.model: nn.Module | None = None
        self.names: list[str] = []
        self.params: list[nn.Parameter] = []  # the fp16 model's, those that train
        self.master: list[nn.Parameter] = []  # their fp32 copies
        self.optimizer: Optimizer | None = None

    def prepare(self, model: nn.Module) -> nn.Module:
        return half_model(model)  # as fairseq's trainer under common.fp16

    def build_optimizer(self, model: nn.Module, make_optimizer: MakeOptimizer) -> Optimizer:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.model = model
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.master = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.optimizer = make_optimizer(self.master)
        return self.optimizer

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None

    def backward(self, loss: torch.Tensor, n_masked: torch.Tensor, micro_batches: int) -> None:
        # fairseq's criterion sums over masked frames; unscale_and_clip divides by their count
        (loss * n_masked * self.scaler.scale).backward()

    def grad_scale(self, masked: float, world: int) -> float:
        return self.scaler.scale * masked / world

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return zip(self.names, self.master)  # the fp32 masters, which fp16 would round

    def unscale_and_clip(self, max_norm: float, masked: float, world: int) -> StepOutcome:
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float() if p.grad is not None else torch.zeros_like(m)
        factor = world / masked / self.scaler.scale
        norm = float(torch.nn.utils.get_total_norm([m.grad for m in self.master])) * factor
        if not math.isfinite(norm):
            return StepOutcome(norm, False, self.skip_nonfinite())
        clipped = max_norm > 0 and norm > max_norm
        if clipped:
            factor *= max_norm / norm
        torch._foreach_mul_([m.grad for m in self.master], factor)
        return StepOutcome(norm, clipped, False)

    def step(self) -> bool:
        self.optimizer.step()
        self.scaler.clean()
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)
        return False

    def skip_nonfinite(self) -> bool:
        self.zero_grad()
        self.scaler.overflow()  # may raise MinLossScaleError
        return True

    def state_dict(self) -> dict:
        return {
            "scaler": {},
            "fp16": {"master": [m.detach().cpu() for m in self.master], "scaler": self.scaler.state_dict()},
        }

    def load_state_dict(self, st: dict) -> None:
        """Restore the master weights and the scaler (the fp32 optimizer's own state is loaded
        separately) and copy the masters into the fp16 model."""
        with torch.no_grad():
            for p, m, saved in zip(self.params, self.master, st["fp16"]["master"]):
                m.copy_(saved)
                p.copy_(m)
        self.scaler.load_state_dict(st["fp16"]["scaler"])

    def state_problem(self, state: dict) -> str | None:
        return None if isinstance(state["fp16"], dict) else "lacks 'fp16' (the fp16_fairseq optimizer's state)"

    def fp32_state_dict(self) -> dict:
        """The model's state_dict with the fp32 master weights in place of the fp16 parameters and
        every other floating-point tensor in fp32: what a checkpoint keeps."""
        state = {k: (v.float() if v.is_floating_point() else v) for k, v in self.model.state_dict().items()}
        for name, m in zip(self.names, self.master):
            state[name] = m.detach().clone()
        return state


def make_precision(name: str, device: torch.device, world: int = 1, accum_steps: int = 1) -> Precision:
    """The policy of `train.precision` `name` on `device`; fp16_fairseq's loss-scale window from the
    processes and the micro-batches per update (`scale_window`)."""
    if traits(name).half_model:
        return FairseqPrecision(device, LossScaler(scale_window(world, accum_steps)))
    return AutocastPrecision(name, device)
