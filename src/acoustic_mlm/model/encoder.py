"""The acoustic-MLM backbone: waveform -> conv features -> transformer states.

Reads top to bottom: formulas (receptive field, DeepNorm coefficients, PB-Relax attention),
the conv front end, the positional convolution, attention, feed-forward, the block, the
encoder stack and finally `AcousticEncoder`, the whole backbone. The masked-prediction
objective (masks, cosine logits, loss in bits) lives apart, in `objective.py`.

Architecture after MERT (Li et al. 2023, arXiv 2306.00107), itself HuBERT / wav2vec 2.0 in
fairseq. Axes: B batch, L waveform samples, C conv channels, T frames, D width, H heads,
hd head width.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from acoustic_mlm.model.config import ATTENTIONS, NORMS, ModelConfig, receptive_field, total_stride

# ---------------------------------------------------------------------------------------------
# Pure functions: one per formula


def deepnorm_coefficients(n_layers: int) -> tuple[float, float]:
    """DeepNorm's (alpha, beta) for an encoder-only stack of N layers.

    Wang et al. 2022, "DeepNet", arXiv 2203.00555, Table 1 (encoder-only):
    alpha = (2N)^(1/4) scales the residual, beta = (8N)^(-1/4) scales the init of the FFN and
    attention value / output projections. N=12: (2.213, 0.3195); N=24: (2.632, 0.2686).
    """
    if n_layers < 1:
        raise ValueError(f"deepnorm_coefficients needs n_layers >= 1, got {n_layers}")
    return (2.0 * n_layers) ** 0.25, (8.0 * n_layers) ** -0.25


def relaxed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: float, dropout_p: float = 0.0, training: bool = False
) -> torch.Tensor:
    """Softmax attention with CogView's PB-Relax; q, k, v (B, H, T, hd) -> (B, H, T, hd).

    Ding et al. 2021, "CogView", arXiv 2105.13290, Sec. 2.4:
        softmax(Q K^T / sqrt(d)) = softmax((Q K^T / (alpha sqrt(d)) - rowmax) * alpha)
    Equal in exact arithmetic (softmax is shift invariant). In float16 the left side overflows
    once |Q K^T| > 65504; the right side divides Q by alpha*sqrt(d) before the matmul, so the
    product stays alpha times smaller, and the softmax runs in float32 (float64 stays float64).
    """
    scale = 1.0 / (alpha * math.sqrt(q.size(-1)))
    scores = (q * scale) @ k.transpose(-2, -1)  # (B, H, T, T), alpha times below the usual logits
    # float16 -> float32 (float64 stays): (x - max) * alpha may leave float16's range
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    scores = (scores - scores.amax(dim=-1, keepdim=True).detach()) * alpha  # (B, H, T, T), <= 0
    probs = scores.softmax(dim=-1).to(v.dtype)  # (B, H, T, T)
    probs = F.dropout(probs, p=dropout_p, training=training)
    return probs @ v  # (B, H, T, hd)


def unfused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0, training: bool = False
) -> torch.Tensor:
    """Softmax attention in fairseq's unfused order; q, k, v (B, H, T, hd) -> (B, H, T, hd).

    fairseq's MultiheadAttention (its path without torch's fused function): q is scaled by
    hd^-0.5, then q.k^T is one matmul *in the model's dtype* (a float16 tensor under fp16), the
    softmax runs in float32 and is cast back. Equal to the fused kernel in exact arithmetic; in
    float16 the logits tensor overflows to inf once |q.k| / sqrt(hd) > 65504, which the fused
    kernels (float32 accumulation) never do. This is the arithmetic PB-Relax guards against.
    """
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-2, -1)  # (B, H, T, T) in q's dtype
    probs = scores.float().softmax(dim=-1).to(v.dtype) if scores.dtype != torch.float64 else scores.softmax(dim=-1)
    probs = F.dropout(probs, p=dropout_p, training=training)  # (B, H, T, T)
    return probs @ v  # (B, H, T, hd)


# ---------------------------------------------------------------------------------------------
# Front end: waveform -> frames


class ConvFeatureExtractor(nn.Module):
    """wav2vec 2.0 / HuBERT "default" conv feature extractor, (B, L) -> (B, C, T).

    Conv1d without bias per (channels, kernel, stride); GroupNorm (one group per channel)
    after the first conv only; GELU after each. Unlike fairseq, the waveform is padded
    centrally by (receptive field - stride) samples, so T == L // stride exactly whenever L is
    a multiple of the stride: every EnCodec frame gets one feature frame.

    Two ways to run the same convolutions (`as_matmul`; None: on CUDA only). On CPU: `F.conv1d`,
    as always (the CPU presets' numbers do not change). On CUDA: each layer as one matrix product
    of its unfolded input (im2col: (B, T_out, C_in k) @ (C_in k, C_out)), time-major between layers,
    which runs on tensor cores in the step's autocast or half precision. Issue 34's H200 profile found
    the front end's 1-D convolutions on cuDNN's non-tensor-core `implicit_convolve_sgemm` and
    `precomputed_convolve_sgemm` kernels with layout conversions around them (the front end alone,
    forward and backward in bf16: 14 ms of a 57 ms gpu-small micro-batch without the CQT loss);
    the matmul path's time there is not yet measured on a GPU. Equal in exact arithmetic; in float32
    the two differ by rounding (tests/model/test_encoder.py). Its backward keeps the unfolded input,
    k / stride times the layer's input (1.5x for MERT's kernel-3 stride-2 layers).
    """

    as_matmul: bool | None = None  # None: the matmul path on CUDA, F.conv1d elsewhere

    def __init__(self, conv_layers):
        super().__init__()
        self.conv_layers = tuple(tuple(layer) for layer in conv_layers)
        self.stride = total_stride(self.conv_layers)
        pad = receptive_field(self.conv_layers) - self.stride
        if pad < 0:
            raise ValueError("conv_layers: receptive field is smaller than the total stride")
        self.pad = (pad // 2, pad - pad // 2)  # (left, right); MERT's stack: (40, 40)
        blocks = []
        in_ch = 1
        for i, (channels, kernel, stride) in enumerate(self.conv_layers):
            conv = nn.Conv1d(in_ch, channels, kernel, stride=stride, bias=False)
            nn.init.kaiming_normal_(conv.weight)  # fairseq's init
            norm = [nn.GroupNorm(channels, channels, affine=True)] if i == 0 else []
            blocks.append(nn.Sequential(conv, *norm, nn.GELU()))
            in_ch = channels
        self.blocks = nn.ModuleList(blocks)
        self.out_channels = in_ch

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        x = F.pad(wav.unsqueeze(1), self.pad)  # (B, 1, L + receptive_field - stride)
        matmul = self.as_matmul if self.as_matmul is not None else x.is_cuda
        if matmul:
            return self._forward_matmul(x)
        for block in self.blocks:
            x = block(x)  # (B, C_i, T_i)
        return x  # (B, C, T)

    def _forward_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """The same layers, each conv as one matmul of its unfolded input; (B, 1, L') -> (B, C, T)."""
        x = x.transpose(1, 2)  # (B, L', 1): time-major
        for block in self.blocks:
            conv, *rest = block
            k, s = conv.kernel_size[0], conv.stride[0]
            cols = x.unfold(1, k, s).flatten(2)  # (B, T_i, C_in k): (channel, tap) as the weight's order
            x = cols @ conv.weight.flatten(1).t()  # (B, T_i, C_i); autocast: the step's precision
            for layer in rest:  # GroupNorm over time per channel (channels-first), then GELU
                x = layer(x.transpose(1, 2)).transpose(1, 2) if isinstance(layer, nn.GroupNorm) else layer(x)
        return x.transpose(1, 2)  # (B, C, T), a view of the time-major result


class ConvPositionalEmbedding(nn.Module):
    """wav2vec 2.0's relative positional embedding: a wide grouped conv over time, (B, T, D) -> (B, T, D).

    Weight-normalised over the kernel axis (dim=2), init normal std sqrt(4 / (kernel * D)),
    bias 0; an even kernel produces one frame too many, which is dropped (fairseq's SamePad).
    Returns the embedding only; the caller adds it to its input.
    """

    def __init__(self, dim: int, kernel: int, groups: int):
        super().__init__()
        conv = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=groups)
        nn.init.normal_(conv.weight, mean=0.0, std=math.sqrt(4.0 / (kernel * dim)))
        nn.init.constant_(conv.bias, 0.0)
        self.conv = nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)
        self.remove = 1 if kernel % 2 == 0 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.transpose(1, 2))  # (B, D, T + 1 - remove)
        if self.remove:
            y = y[:, :, : -self.remove]  # (B, D, T)
        return F.gelu(y).transpose(1, 2)  # (B, T, D)


# ---------------------------------------------------------------------------------------------
# Transformer


class MultiheadSelfAttention(nn.Module):
    """Self-attention with separate q/k/v/out projections (DeepNorm scales v and out only).

    attention "softmax": PyTorch's fused scaled_dot_product_attention; "pb_relax": PB-Relax with
    relax_alpha; "unfused": fairseq's unfused order (q.k^T in the model's dtype, softmax in float32);
    "qk_norm": qk-layernorm, each head's query and key layer-normalised over the head width (one
    LayerNorm for queries and one for keys, shared by the heads, gain 1 and bias 0 at init) before the
    fused kernel (Dehghani et al. 2023, ViT-22B, arXiv 2302.05442; Wortsman et al. 2023, arXiv
    2309.14322, as the remedy for attention-logit growth). A normalised q or k has norm sqrt(hd)
    (less by eps), so at the initial gains |q.k| / sqrt(hd) <= sqrt(hd) whatever the projections'
    scale: the logits cannot grow with the weights, only with the norms' gains.
    qk_gain multiplies q and k (so the logits by its square): forced logit growth, as Wortsman et al.
    2023 (arXiv 2309.14322) transplant it; 1 leaves the attention as it is. Under qk_norm it acts after
    the norms, so the logits still grow by its square.
    No padding mask: every crop in a batch has the same length.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dropout: float = 0.0,
        relax_alpha: float | None = None,
        attention: str | None = None,
        qk_gain: float = 1.0,
    ):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        self.heads = heads
        self.dropout = dropout  # on attention probabilities
        self.attention = attention or ("softmax" if relax_alpha is None else "pb_relax")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.attention == "pb_relax" and relax_alpha is None:
            raise ValueError("attention pb_relax needs relax_alpha")
        self.relax_alpha = relax_alpha if self.attention == "pb_relax" else None
        self.qk_gain = float(qk_gain)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        # qk-layernorm over each head's hd features; None for the other attentions (no parameters)
        qk_norm = self.attention == "qk_norm"
        self.q_norm = nn.LayerNorm(dim // heads, eps=1e-5) if qk_norm else None
        self.k_norm = nn.LayerNorm(dim // heads, eps=1e-5) if qk_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape

        def split(t):  # (B, T, D) -> (B, H, T, hd)
            return t.view(B, T, self.heads, D // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))  # (B, H, T, hd)
        if self.q_norm is not None:  # qk_norm: per head, over hd
            q, k = self.q_norm(q), self.k_norm(k)  # (B, H, T, hd), each row of norm ~sqrt(hd) at init
        if self.qk_gain != 1.0:  # forced logit growth (1: not applied, so no rounding either)
            q, k = q * self.qk_gain, k * self.qk_gain
        p = self.dropout if self.training else 0.0
        if self.attention in ("softmax", "qk_norm"):  # qk_norm: normalised above, then the fused kernel
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # (B, H, T, hd)
        elif self.attention == "unfused":
            y = unfused_attention(q, k, v, dropout_p=p, training=self.training)  # (B, H, T, hd)
        else:
            y = relaxed_attention(q, k, v, self.relax_alpha, dropout_p=p, training=self.training)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.out_proj(y)


class FeedForward(nn.Module):
    """fc1 -> GELU -> dropout -> fc2, (B, T, D) -> (B, T, D).

    The hidden dropout is fairseq's `activation_dropout` (dropout2 of wav2vec2.py's
    TransformerSentenceEncoderLayer), apart from the residual `dropout` (dropout1 and dropout3).
    """

    def __init__(self, dim: int, ffn_dim: int, activation_dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.dropout = nn.Dropout(activation_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(F.gelu(self.fc1(x))))


class EncoderBlock(nn.Module):
    """One transformer layer, (B, T, D) -> (B, T, D).

    norm "pre":      x = x + F(LN(x))             (final LN after the stack, in the encoder)
    norm "post":     x = LN(x + F(x))             Post-Norm (Vaswani et al. 2017)
    norm "deepnorm": x = LN(alpha * x + F(x))     alpha = (2N)^(1/4) (arXiv 2203.00555), passed in
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        ffn_dim: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        norm: str = "pre",
        deepnorm_alpha: float = 1.0,
        relax_alpha: float | None = None,
        activation_dropout: float | None = None,
        attention: str | None = None,
        qk_gain: float = 1.0,
    ):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        self.norm = norm
        self.alpha = deepnorm_alpha if norm == "deepnorm" else 1.0  # the residual scale; 1 but for DeepNorm
        self.attn = MultiheadSelfAttention(dim, heads, attention_dropout, relax_alpha, attention, qk_gain)
        # FFN hidden dropout: fairseq's activation_dropout; None keeps it equal to the residual dropout
        self.ffn = FeedForward(dim, ffn_dim, dropout if activation_dropout is None else activation_dropout)
        self.ln1 = nn.LayerNorm(dim, eps=1e-5)
        self.ln2 = nn.LayerNorm(dim, eps=1e-5)
        self.dropout = nn.Dropout(dropout)  # on each residual branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm == "pre":
            x = x + self.dropout(self.attn(self.ln1(x)))
            x = x + self.dropout(self.ffn(self.ln2(x)))
        else:
            x = self.ln1(self.alpha * x + self.dropout(self.attn(x)))
            x = self.ln2(self.alpha * x + self.dropout(self.ffn(x)))
        return x


def init_bert_params(module: nn.Module) -> None:
    """fairseq's init_bert_params: Linear weights N(0, 0.02), biases 0; LayerNorm 1 / 0."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


DEEPNORM_SCALED = ("ffn.fc1.weight", "ffn.fc2.weight", "attn.v_proj.weight", "attn.out_proj.weight")


def deepnorm_scaled_parameters(model: nn.Module) -> list[str]:
    """Names (as in model.named_parameters()) of the weights DeepNorm's init multiplies by beta.

    Exactly fc1, fc2, v_proj and out_proj of every EncoderBlock; Q, K, biases and norms untouched.
    """
    names = []
    for prefix, module in model.named_modules():
        if isinstance(module, EncoderBlock):
            names += [f"{prefix}.{suffix}" if prefix else suffix for suffix in DEEPNORM_SCALED]
    return names


class TransformerEncoder(nn.Module):
    """Positional conv + N blocks, (B, T, D) -> (B, T, D); wav2vec 2.0's TransformerEncoder.

    Post-Norm and DeepNorm normalise right after adding positions (fairseq
    layer_norm_first=False); Pre-Norm normalises after the last block instead.
    LayerDrop (Fan et al. 2019, arXiv 1909.11556): in training each block is skipped with
    probability `encoder_layerdrop`, drawn per block and forward pass (fairseq
    wav2vec2.py TransformerEncoder.extract_features: a layer runs when U[0, 1) > layerdrop).
    Skipped blocks are computed and their output discarded (5 % of the blocks' work at MERT-95M's
    0.05), which costs less than what skipping them for real would cost under torch.compile and DDP.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {cfg.norm!r}")
        if cfg.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {cfg.attention!r}")
        self.norm = cfg.norm
        alpha, beta = deepnorm_coefficients(cfg.layers) if cfg.norm == "deepnorm" else (1.0, 1.0)
        relax = cfg.relax_alpha if cfg.attention == "pb_relax" else None
        self.pos_conv = ConvPositionalEmbedding(cfg.dim, cfg.pos_conv_kernel, cfg.pos_conv_groups)
        self.layer_norm = nn.LayerNorm(cfg.dim, eps=1e-5)  # after positions (post) or after the stack (pre)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layerdrop = cfg.encoder_layerdrop
        self.blocks = nn.ModuleList(
            EncoderBlock(
                cfg.dim,
                cfg.heads,
                cfg.ffn_dim,
                cfg.dropout,
                cfg.attention_dropout,
                cfg.norm,
                alpha,
                relax,
                cfg.activation_dropout,
                cfg.attention,
                cfg.qk_gain,
            )
            for _ in range(cfg.layers)
        )
        self.apply(init_bert_params)  # Linear and LayerNorm only; the positional conv keeps its init
        if cfg.norm == "deepnorm":
            with torch.no_grad():
                for name in deepnorm_scaled_parameters(self):
                    self.get_parameter(name).mul_(beta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.pos_conv(x)  # (B, T, D)
        if self.norm != "pre":
            x = self.layer_norm(x)
        x = self.dropout(x)
        keep = None  # LayerDrop: one draw per block from torch's generator (seeded and saved with the run)
        if self.training and self.layerdrop > 0:
            keep = torch.rand(len(self.blocks), device=x.device) > self.layerdrop  # (N,) bool
        for i, block in enumerate(self.blocks):
            y = block(x)  # (B, T, D)
            # a dropped block is computed and discarded: static graphs, no unused parameters under
            # DDP, and zero gradients for it, as fairseq's FP16Optimizer gives (it zero-fills
            # missing gradients, fairseq/optim/fp16_optimizer.py) and Adam then still steps
            x = y if keep is None else torch.where(keep[i], y, x)
        if self.norm == "pre":
            x = self.layer_norm(x)
        return x


# ---------------------------------------------------------------------------------------------
# The backbone


class GradMultiply(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by `scale` (fairseq/modules/grad_multiply.py)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class AcousticEncoder(nn.Module):
    """MERT / HuBERT backbone: (B, L) waveform and (B, T) mask -> (B, T, D) states and feature penalty.

    conv features -> gradient scale -> L2 penalty -> LayerNorm -> Linear(C, D) -> dropout_input ->
    masked frames replaced by a learned embedding -> TransformerEncoder.

    feature_grad_mult scales the gradient that reaches the conv front end (HuBERT and MERT
    `forward_features`: GradMultiply when != 1, no gradient at all when 0; mert_model.py). The
    penalty is taken after the scaling, so its gradient into the convs is scaled too.
    dropout_input acts after the projection and before masking (hubert.py / mert_model.py
    `forward`). fairseq's `dropout_features` is not here: HuBERT and MERT apply it to
    `unmasked_features`, which nothing reads afterwards (wav2vec 2.0 uses it for its quantizer
    targets), so it changes nothing in their training.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.feature_extractor = ConvFeatureExtractor(cfg.conv_layers)
        channels = self.feature_extractor.out_channels
        self.layer_norm = nn.LayerNorm(channels, eps=1e-5)
        self.post_extract_proj = nn.Linear(channels, cfg.dim)  # PyTorch default init, as fairseq
        self.mask_emb = nn.Parameter(torch.empty(cfg.dim).uniform_())  # U(0, 1), as fairseq
        self.transformer = TransformerEncoder(cfg)
        self.feature_grad_mult = cfg.feature_grad_mult
        self.dropout_input = nn.Dropout(cfg.dropout_input)

    def forward(self, wav: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.feature_grad_mult > 0:
            features = self.feature_extractor(wav)  # (B, C, T)
            if self.feature_grad_mult != 1.0:
                features = GradMultiply.apply(features, self.feature_grad_mult)
        else:  # a frozen front end, as fairseq (no_grad; fairseq also switches it to eval, a no-op here)
            with torch.no_grad():
                features = self.feature_extractor(wav)  # (B, C, T)
        # fairseq HuBERT takes the penalty before the LayerNorm (after it, it would only see LN's gain)
        feature_penalty = features.float().pow(2).mean()  # scalar
        x = self.layer_norm(features.transpose(1, 2))  # (B, T, C)
        x = self.dropout_input(self.post_extract_proj(x))  # (B, T, D)
        if mask is not None:
            if mask.shape != x.shape[:2]:
                raise ValueError(f"mask shape {tuple(mask.shape)} != (B, T) {tuple(x.shape[:2])}")
            x = torch.where(mask.unsqueeze(-1), self.mask_emb.to(x.dtype), x)  # (B, T, D)
        return self.transformer(x), feature_penalty
