"""Model FLOPs of one training micro-batch (forward + backward), counted analytically.

Matmuls and convolutions only (the MFU convention: norms, activations, softmax and the
optimizer are not counted), the same count for every arm whatever kernel runs it. A matmul of
an (n x a) input by an (a x b) weight costs 2nab forward and 4nab backward (the gradients of
input and weight): 6nab. `torch.utils.flop_counter` gives the same numbers for ungrouped
convolutions and explicit-matmul attention (tests/benchmarks/test_train_throughput.py); it ignores
`groups` in a conv backward and so overcounts the grouped positional conv.

One function per part; `step_flops` sums them. Axes: B crops, T frames per crop.
"""

from __future__ import annotations

import functools
import warnings

from acoustic_mlm.config import ModelConfig


def conv_frontend_flops(m: ModelConfig, batch: int, frames: int) -> int:
    """The conv feature extractor: 2 c_in c_out k t per layer forward; backward twice that, except
    for the first layer, whose input (the waveform) needs no gradient: 4x forward there, 6x elsewhere."""
    lengths, t = [], frames  # each layer's output length, walked back from the last one (= frames)
    for _, kernel, stride in reversed(m.conv_layers):
        lengths.append(t)
        t = (t - 1) * stride + kernel
    lengths.reverse()
    total, c_in = 0, 1
    for i, ((channels, kernel, _), t_out) in enumerate(zip(m.conv_layers, lengths)):
        forward = 2 * c_in * channels * kernel * t_out * batch
        total += (2 if i == 0 else 3) * forward
        c_in = channels
    return total


def projection_flops(m: ModelConfig, batch: int, frames: int) -> int:
    """Linear(conv channels -> width) on every frame."""
    return 6 * m.conv_layers[-1][0] * m.dim * batch * frames


def pos_conv_flops(m: ModelConfig, batch: int, frames: int) -> int:
    """The grouped convolutional positional embedding; an even kernel yields one frame more (then dropped)."""
    out_frames = frames + 1 - m.pos_conv_kernel % 2
    return 6 * (m.dim // m.pos_conv_groups) * m.dim * m.pos_conv_kernel * out_frames * batch


def blocks_flops(m: ModelConfig, batch: int, frames: int) -> int:
    """The transformer blocks: q, k, v, out, fc1, fc2 projections (6 x params x tokens) and attention
    (Q K^T and P V: 4 T^2 D forward per layer and crop, 12 T^2 D with backward)."""
    block_params = 4 * m.dim * m.dim + 2 * m.dim * m.ffn_dim
    return m.layers * (6 * block_params * batch * frames + 12 * frames * frames * m.dim * batch)


def heads_flops(m: ModelConfig, batch: int, frames: int) -> int:
    """The codebook heads at every frame (the loss weights the unmasked ones 0): proj_k (D -> F) and
    the cosine logits against V codewords (F x V), per codebook."""
    return 6 * batch * frames * m.codebooks * m.final_dim * (m.dim + m.codebook_size)


def step_flops(m: ModelConfig, batch: int, frames: int, scope: str = "step") -> int:
    """One micro-batch of `batch` crops of `frames` frames, forward and backward.

    scope "step": the whole acoustic MLM; "transformer": the positional conv and the blocks only.
    """
    if scope == "transformer":
        return pos_conv_flops(m, batch, frames) + blocks_flops(m, batch, frames)
    if scope != "step":
        raise ValueError(f"scope must be 'step' or 'transformer', got {scope!r}")
    return (
        conv_frontend_flops(m, batch, frames)
        + projection_flops(m, batch, frames)
        + pos_conv_flops(m, batch, frames)
        + blocks_flops(m, batch, frames)
        + heads_flops(m, batch, frames)
    )


def lstm_flops(lstm, steps: int) -> int:
    """An `nn.LSTM`'s matmuls over `steps` time steps, forward: per layer and step, the four gates from the
    input and the hidden state, 2 x 4 x hidden x (input + hidden). torch's FLOP counter does not count
    `aten.lstm`, so the tokenizer's count adds this."""
    total, size = 0, lstm.input_size
    for _ in range(lstm.num_layers):
        total += 2 * 4 * lstm.hidden_size * (size + lstm.hidden_size) * steps
        size = lstm.hidden_size
    return total


@functools.lru_cache(maxsize=None)
def encodec_flops_per_second(bandwidth: float) -> float:
    """EnCodec 24 kHz's encode (SEANet encoder and the residual quantizer at `bandwidth` kbps), forward FLOPs per
    second of audio, counted on its architecture (`encodec_model_24khz(pretrained=False)`: no weights needed):
    convolutions and matmuls by `torch.utils.flop_counter` on one second of silence, plus the LSTM's
    (`lstm_flops`). About 3.1 GFLOP at 6 kbps."""
    import torch
    from encodec import EncodecModel
    from torch.utils.flop_counter import FlopCounterMode

    with warnings.catch_warnings():  # encodec's weight_norm deprecation warning
        warnings.simplefilter("ignore", FutureWarning)
        model = EncodecModel.encodec_model_24khz(pretrained=False)
    model.set_target_bandwidth(bandwidth)
    model.eval()
    rate = model.sample_rate
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.encode(torch.zeros(1, 1, rate))
    frames = -(-rate // model.encoder.hop_length)
    lstms = [m for m in model.encoder.modules() if isinstance(m, torch.nn.LSTM)]
    return float(counter.get_total_flops() + sum(lstm_flops(m, frames) for m in lstms))
