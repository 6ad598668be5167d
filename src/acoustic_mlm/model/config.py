"""The model's configuration and the formulas that follow from it, owned by the model.

`ModelSection` is the configuration file's `model:` section; `ModelConfig` is that section with one
arm's norm and attention, which is what builds an `AcousticMLM`. The formulas here (the conv stack's
stride and receptive field, the mask groups, the CQT bins' frequencies) are the model's; the
configuration's checks import them to refuse a file before any work, never the other way round.
Each key is declared once, with acoustic_mlm.declare.setting (config/schema.py writes the JSON schema from
it). Standard library and numpy only: Snakemake and the configuration import this without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from acoustic_mlm.declare import setting

NORMS = ("pre", "post", "deepnorm")  # pre: x + F(LN(x)); post: LN(x + F(x)); deepnorm: LN(alpha x + F(x)), scaled init
# fused kernel | PB-Relax with relax_alpha | fairseq's order | q and k layer-normalised per head, then the fused kernel
ATTENTIONS = ("softmax", "pb_relax", "unfused", "qk_norm")
# The smallest logit temperature: cosine logits are at most 1 / logit_temp, which must stay within float16's
# largest finite value (65,504) so that they never overflow where they are held in fp16 (fp16_logits, as
# MERT's compute_nce) and the loss and its gradient stay finite (1e-30 gave 4e29-bit losses, infinite norms).
LOGIT_TEMP_MIN = 1 / 65504
CQT_IMPLS = ("nnaudio", "fft")  # nnAudio's convolutions (as MERT) | the same kernels by FFT (model/cqt.py)


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The `model:` section: the architecture and the objective, the same for every arm."""

    conv_layers: tuple[tuple[int, int, int], ...] = setting(  # (channels, kernel, stride) per conv layer
        minItems=1,
        items={"minItems": 3, "maxItems": 3, "items": {"minimum": 1}},
    )
    dim: int = setting(minimum=1)  # transformer width
    layers: int = setting(minimum=1)  # transformer blocks
    heads: int = setting(minimum=1)  # attention heads
    ffn_dim: int = setting(minimum=1)  # feed-forward hidden size
    dropout: float = setting(minimum=0, maximum=1)  # residual dropout
    attention_dropout: float = setting(minimum=0, maximum=1)  # dropout on attention probabilities
    activation_dropout: float = setting(minimum=0, maximum=1)  # FFN hidden dropout (fairseq activation_dropout)
    encoder_layerdrop: float = setting(  # probability of skipping each block in training (LayerDrop)
        minimum=0,
        exclusiveMaximum=1,
    )
    dropout_input: float = setting(minimum=0, maximum=1)  # dropout on the projected features, before masking
    feature_grad_mult: float = setting(minimum=0)  # gradient scale into the conv front end (0: frozen)
    pos_conv_kernel: int = setting(minimum=2)  # convolutional positional embedding kernel
    pos_conv_groups: int = setting(minimum=1)  # ... and groups
    final_dim: int = setting(minimum=1)  # per-codebook projection size for cosine logits
    logit_temp: float = setting(minimum=LOGIT_TEMP_MIN)  # cosine logits / logit_temp; logits <= 1/logit_temp <= 65,504
    fp16_logits: bool = setting()  # cosine logits rounded to the model's dtype before / logit_temp (MERT's compute_nce)
    relax_alpha: float = setting(minimum=1)  # PB-Relax alpha (used only when attention is pb_relax)
    qk_gain: float = setting(  # q and k each multiplied by this (forced logit growth); 1: off
        exclusiveMinimum=0,
        doc="q and k each multiplied by this before attention (forced logit growth; logits x qk_gain^2); 1: off",
    )
    feature_penalty: float = setting(minimum=0)  # weight of the L2 penalty on conv features
    mask_prob: float = setting(exclusiveMinimum=0, maximum=1)  # fairseq span-mask probability
    mask_length: int = setting(minimum=1)  # span length in frames
    mask_min_masks: int = setting(minimum=0)  # minimum spans per sequence
    codebooks: int = setting(minimum=1, maximum=32)  # codebooks predicted
    codebook_size: int = setting(minimum=2)  # codes per codebook
    special_symbols: int = setting(minimum=0)  # extra never-target classes per codebook (fairseq's Dictionary: 4)
    cqt_loss_weight: float = setting(minimum=0)  # weight of the CQT reconstruction loss on masked frames (0: off)
    cqt_bins: int = setting(minimum=1)  # CQT bins predicted
    cqt_bins_per_octave: int = setting(minimum=1)  # CQT resolution
    cqt_fmin: float = setting(exclusiveMinimum=0)  # lowest CQT bin's centre frequency, Hz
    mixture_prob: float = setting(minimum=0, maximum=1)  # share of training crops mixed with in-batch noise (0: off)
    mixture_segments: tuple[int, int] = setting(items={"minimum": 1})  # noise segments per mixed crop, inclusive range
    mixture_samples: tuple[int, int] = setting(items={"minimum": 1})  # samples per noise segment, inclusive range
    mixture_volume: float = setting(minimum=0)  # noise gain
    cqt_impl: str = setting(  # the one optional key: a file without it computes the CQT as MERT does
        "nnaudio",
        optional=True,
        enum=CQT_IMPLS,
        doc="how the CQT target is computed: nnaudio (nnAudio's convolutions, as MERT; the default) | fft (the same "
        "kernels by FFT, equal to float32 rounding, a small fraction of the cost)",
    )

    @classmethod
    def from_mapping(cls, section: dict) -> "ModelSection":
        """The section as the configuration file holds it (lists where this holds tuples)."""
        m = {k: v for k, v in section.items() if k in _names(cls)}
        m["conv_layers"] = tuple(tuple(layer) for layer in m["conv_layers"])
        m["mixture_segments"], m["mixture_samples"] = tuple(m["mixture_segments"]), tuple(m["mixture_samples"])
        return cls(**m)

    def with_arm(self, norm: str, attention: str) -> "ModelConfig":
        """This section with one arm's norm and attention: the configuration of that arm's model."""
        return ModelConfig(
            **{f.name: getattr(self, f.name) for f in fields(ModelSection)}, norm=norm, attention=attention
        )

    @property
    def stride(self) -> int:
        """Samples between consecutive frames of the conv front end."""
        return total_stride(self.conv_layers)


@dataclass(frozen=True, kw_only=True)
class ModelConfig(ModelSection):
    """The model of one arm: the `model:` section plus the arm's norm and attention."""

    norm: str  # one of NORMS
    attention: str  # one of ATTENTIONS


def _names(cls) -> set[str]:
    return {f.name for f in fields(cls)}


# ----------------------------------------------------------------------------- formulas


def total_stride(conv_layers) -> int:
    """Samples between consecutive frames of a (channels, kernel, stride) conv stack: the product
    of its strides (encodec.HOP = 320 in every valid config)."""
    return math.prod(stride for _, _, stride in conv_layers)


def receptive_field(conv_layers) -> int:
    """Input samples that one output frame of a (channels, kernel, stride) conv stack sees:
    1 + sum over layers of (kernel - 1) x the strides before it (MERT's stack: 400)."""
    field, jump = 1, 1
    for _, kernel, stride in conv_layers:
        field += (kernel - 1) * jump
        jump *= stride
    return field


def mask_groups(batch: int, group: int) -> list:
    """The rows of a micro-batch of `batch` crops split into ceil(batch / group) groups of about
    `group` crops (0: one group). Group j holds rows j, j + n, j + 2n, ... (n groups), so the
    rows r, r + P, ... that process r of P keeps hold whole groups whenever P divides n."""
    n = 1 if group <= 0 else -(-batch // group)
    return [np.arange(j, batch, n) for j in range(n)]


def cqt_bin_frequency(k, fmin: float, bins_per_octave: int):
    """Centre frequency of CQT bin k: fmin * 2^(k / bins_per_octave) (nnAudio create_cqt_kernels)."""
    return fmin * 2.0 ** (k / bins_per_octave)


def cqt_top_frequency(fmin: float, bins: int, bins_per_octave: int) -> float:
    """Centre frequency of the highest bin; must stay below Nyquist (MERT: 32.7 Hz, 336, 48 -> 4,126 Hz)."""
    return cqt_bin_frequency(bins - 1, fmin, bins_per_octave)
