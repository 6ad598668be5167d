"""The backbone: parity with torch.nn.TransformerEncoderLayer, DeepNorm, PB-Relax, conv front end."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import NARROW_CONV, tiny_config

import acoustic_mlm.model.encoder as model_module
from acoustic_mlm.model.encoder import (
    AcousticEncoder,
    ConvFeatureExtractor,
    ConvPositionalEmbedding,
    EncoderBlock,
    MultiheadSelfAttention,
    TransformerEncoder,
    deepnorm_coefficients,
    deepnorm_scaled_parameters,
    receptive_field,
    relaxed_attention,
    total_stride,
    unfused_attention,
)

MERT_CONV = ((512, 10, 5),) + ((512, 3, 2),) * 4 + ((512, 2, 2),) * 2


# --- formulas ---------------------------------------------------------------------------------


def test_receptive_field_and_stride_of_mert_stack():
    assert receptive_field(MERT_CONV) == 400
    assert total_stride(MERT_CONV) == 320
    assert receptive_field(NARROW_CONV) == 345
    assert total_stride(NARROW_CONV) == 320


@pytest.mark.parametrize("n, alpha, beta", [(12, 2.2134, 0.3195), (24, 2.6321, 0.2686)])
def test_deepnorm_alpha_is_2n_to_the_quarter_and_beta_8n_to_minus_a_quarter(n, alpha, beta):
    a, b = deepnorm_coefficients(n)
    assert a == pytest.approx(alpha, abs=1e-4)
    assert b == pytest.approx(beta, abs=1e-4)
    assert a == pytest.approx((2 * n) ** 0.25) and b == pytest.approx((8 * n) ** -0.25)


# --- conv front end ---------------------------------------------------------------------------


@pytest.mark.parametrize("conv_layers", [MERT_CONV, NARROW_CONV], ids=["mert", "narrow"])
@pytest.mark.parametrize("frames", [1, 3, 10])
def test_feature_extractor_gives_one_frame_per_320_samples(conv_layers, frames):
    torch.manual_seed(0)
    fe = ConvFeatureExtractor(conv_layers)
    out = fe(torch.randn(2, 320 * frames))
    assert out.shape == (2, conv_layers[-1][0], frames)


def test_feature_extractor_is_seven_padded_bias_free_convs_with_one_group_norm():
    fe = ConvFeatureExtractor(MERT_CONV)
    assert fe.pad == (40, 40)
    assert ConvFeatureExtractor(NARROW_CONV).pad == (12, 13)  # odd total padding: the extra sample on the right
    convs = [m for m in fe.modules() if isinstance(m, nn.Conv1d)]
    assert len(convs) == 7 and all(c.bias is None for c in convs)
    norms = [m for m in fe.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 1 and norms[0].num_groups == 512 and norms[0].affine
    assert isinstance(fe.blocks[0][1], nn.GroupNorm)


@pytest.mark.parametrize("kernel", [4, 5])
def test_positional_conv_keeps_length(kernel):
    torch.manual_seed(0)
    pos = ConvPositionalEmbedding(dim=16, kernel=kernel, groups=4)
    assert hasattr(pos.conv, "parametrizations")  # weight norm
    assert pos.conv.parametrizations.weight.original0.shape == (1, 1, kernel)  # g over dim=2
    assert torch.all(pos.conv.bias == 0)
    y = pos(torch.randn(2, 9, 16))
    assert y.shape == (2, 9, 16)


# --- attention --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_relaxed_attention_equals_softmax_attention(dtype, atol):
    g = torch.Generator().manual_seed(0)
    q, k, v = (3 * torch.randn(2, 3, 7, 8, generator=g, dtype=dtype) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v)
    out = relaxed_attention(q, k, v, alpha=32.0)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref, atol=atol, rtol=0)


def test_relaxed_attention_stays_finite_in_float16_where_plain_overflows():
    g = torch.Generator().manual_seed(0)
    d = 16
    q, k = (300 + 30 * torch.randn(1, 2, 6, d, generator=g) for _ in range(2))  # logits ~ 9e4 > 65504
    v = torch.randn(1, 2, 6, d, generator=g)
    q16, k16, v16 = q.half(), k.half(), v.half()
    naive = torch.softmax(q16 @ k16.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v16
    assert not torch.isfinite(naive).all()
    relaxed = relaxed_attention(q16, k16, v16, alpha=32.0)
    assert relaxed.dtype == torch.float16
    assert torch.isfinite(relaxed).all()
    ref = F.scaled_dot_product_attention(q16.double(), k16.double(), v16.double())
    torch.testing.assert_close(relaxed.double(), ref, atol=2e-2, rtol=0)


def test_attention_uses_fused_kernel_unless_relaxed():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    plain = MultiheadSelfAttention(16, 4, relax_alpha=None)
    relax = MultiheadSelfAttention(16, 4, relax_alpha=32.0)
    relax.load_state_dict(plain.state_dict())
    sdpa = F.scaled_dot_product_attention
    with (
        mock.patch.object(F, "scaled_dot_product_attention", wraps=sdpa) as spy_sdpa,
        mock.patch.object(model_module, "relaxed_attention", wraps=model_module.relaxed_attention) as spy_relax,
    ):
        y_plain = plain(x)
        assert spy_sdpa.call_count == 1 and spy_relax.call_count == 0
        y_relax = relax(x)
        assert spy_sdpa.call_count == 1 and spy_relax.call_count == 1
    torch.testing.assert_close(y_relax, y_plain, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_unfused_attention_equals_the_fused_kernel(dtype, atol):
    g = torch.Generator().manual_seed(1)
    q, k, v = (3 * torch.randn(2, 3, 9, 8, generator=g, dtype=dtype) for _ in range(3))
    out = unfused_attention(q, k, v)
    assert out.dtype == dtype
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=atol, rtol=0)


def test_unfused_attention_overflows_in_float16_where_the_fused_kernel_and_pb_relax_do_not():
    """fairseq's order holds q.k / sqrt(d) in a float16 tensor: past 65504 it is inf, the softmax NaN."""
    g = torch.Generator().manual_seed(0)
    d = 16
    q, k = (300 + 30 * torch.randn(1, 2, 6, d, generator=g) for _ in range(2))  # logits ~ 9e4 > 65504
    v = torch.randn(1, 2, 6, d, generator=g)
    q16, k16, v16 = q.half(), k.half(), v.half()
    assert not torch.isfinite(unfused_attention(q16, k16, v16)).all()
    assert torch.isfinite(F.scaled_dot_product_attention(q16, k16, v16)).all()  # float32 accumulation inside
    assert torch.isfinite(relaxed_attention(q16, k16, v16, alpha=32.0)).all()
    small = unfused_attention(q16 / 30, k16 / 30, v16)  # logits ~ 100: finite, and the softmax ran in float32
    assert small.dtype == torch.float16 and torch.isfinite(small).all()


def test_attention_value_picks_the_path_and_qk_gain_scales_the_logits():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    fused = MultiheadSelfAttention(16, 4, attention="softmax")
    unfused = MultiheadSelfAttention(16, 4, attention="unfused")
    unfused.load_state_dict(fused.state_dict())
    with mock.patch.object(model_module, "unfused_attention", wraps=model_module.unfused_attention) as spy:
        y = unfused(x)
        assert spy.call_count == 1
    torch.testing.assert_close(y, fused(x), atol=1e-5, rtol=0)
    # qk_gain 1 multiplies nothing (bit-identical); a gain g scales every logit by g^2
    same = MultiheadSelfAttention(16, 4, attention="softmax", qk_gain=1.0)
    same.load_state_dict(fused.state_dict())
    assert torch.equal(same(x), fused(x))
    from acoustic_mlm.train.diagnostics import attention_logits

    base = attention_logits(x, fused.q_proj, fused.k_proj, 4)
    torch.testing.assert_close(attention_logits(x, fused.q_proj, fused.k_proj, 4, qk_gain=3.0), 9 * base)
    with pytest.raises(ValueError, match="attention must be one of"):
        MultiheadSelfAttention(16, 4, attention="flash")


def test_encoder_config_takes_unfused_and_qk_gain():
    from acoustic_mlm.model.encoder import TransformerEncoder

    enc = TransformerEncoder(tiny_config(attention="unfused", qk_gain=4.0))
    assert all(b.attn.attention == "unfused" and b.attn.qk_gain == 4.0 for b in enc.blocks)


def _qk_norm_attention(dim: int = 16, heads: int = 4, seed: int = 0, dtype=torch.float64, **kw):
    """attention qk_norm with random projections and random (not identity) LayerNorm gains and biases."""
    torch.manual_seed(seed)
    attn = MultiheadSelfAttention(dim, heads, attention="qk_norm", **kw).to(dtype)
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0.0, 0.1)
    return attn


def _qk_norm_by_hand(attn: MultiheadSelfAttention, x: torch.Tensor, qk_gain: float = 1.0) -> torch.Tensor:
    """qk-layernorm attention written out: per head, (q - mean) / sqrt(var + eps) * g + b over hd, the
    same for k, then softmax(q k^T / sqrt(hd)) v, heads concatenated, out projection."""
    B, T, D = x.shape
    H = attn.heads
    hd = D // H
    out = []
    for h in range(H):
        cols = slice(h * hd, (h + 1) * hd)
        q = x @ attn.q_proj.weight[cols].T + attn.q_proj.bias[cols]  # (B, T, hd)
        k = x @ attn.k_proj.weight[cols].T + attn.k_proj.bias[cols]
        v = x @ attn.v_proj.weight[cols].T + attn.v_proj.bias[cols]

        def ln(t, norm):
            mean = t.mean(-1, keepdim=True)
            var = ((t - mean) ** 2).mean(-1, keepdim=True)  # biased, as LayerNorm
            return (t - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias

        q, k = ln(q, attn.q_norm) * qk_gain, ln(k, attn.k_norm) * qk_gain
        p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd), dim=-1)  # (B, T, T)
        out.append(p @ v)
    return torch.cat(out, dim=-1) @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.mark.parametrize("qk_gain", [1.0, 3.0])
def test_qk_norm_attention_equals_the_formula_written_out(qk_gain):
    attn = _qk_norm_attention(qk_gain=qk_gain)
    assert attn.q_norm.normalized_shape == (4,) and attn.k_norm.normalized_shape == (4,)  # hd, shared by heads
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    y = attn(x)
    assert y.shape == (3, 7, 16) and y.dtype == torch.float64
    torch.testing.assert_close(y, _qk_norm_by_hand(attn, x, qk_gain), atol=1e-12, rtol=0)
    # the logits the diagnostics record are the ones this kernel exponentiates (the gain included)
    from acoustic_mlm.train.diagnostics import attention_logits

    logits = attention_logits(x, attn.q_proj, attn.k_proj, 4, qk_gain, attn.q_norm, attn.k_norm)  # (B, H, T, T)
    v = attn.v_proj(x).view(3, 7, 4, 4).transpose(1, 2)
    y_from_logits = attn.out_proj((logits.double().softmax(-1) @ v).transpose(1, 2).reshape(3, 7, 16))
    torch.testing.assert_close(y_from_logits, y, atol=1e-6, rtol=0)  # attention_logits computes in float32


def test_qk_norm_logits_stay_bounded_when_the_projections_grow():
    """With unit gains a normalised q or k has norm sqrt(hd) (less by eps): |q.k| / sqrt(hd) <= sqrt(hd),
    and scaling the q and k projections by 1000 changes neither the logits nor the output."""
    from acoustic_mlm.train.diagnostics import attention_logits

    torch.manual_seed(0)
    attn = MultiheadSelfAttention(16, 4, attention="qk_norm").double().requires_grad_(False)
    plain = MultiheadSelfAttention(16, 4, attention="softmax").double().requires_grad_(False)
    plain.load_state_dict(attn.state_dict(), strict=False)  # the same projections, no norms
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    y = attn(x)
    with torch.no_grad():
        for m in (attn, plain):
            for proj in (m.q_proj, m.k_proj):
                proj.weight.mul_(1000.0)
                proj.bias.mul_(1000.0)
    grown = attention_logits(x, plain.q_proj, plain.k_proj, 4)
    normed = attention_logits(x, attn.q_proj, attn.k_proj, 4, 1.0, attn.q_norm, attn.k_norm)
    assert float(grown.detach().abs().max()) > 1e4  # without the norms the logits grew a million-fold
    assert float(normed.detach().abs().max()) <= math.sqrt(4) + 1e-6  # sqrt(hd), hd = 4
    torch.testing.assert_close(attn(x), y, atol=1e-3, rtol=0)  # equal up to LayerNorm's eps (1e-5 of the variance)


def test_qk_norm_gradients_reach_every_parameter_and_pass_gradcheck():
    attn = _qk_norm_attention(dim=8, heads=2)
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(attn, (x,))
    attn(x).pow(2).sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert {"q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias"} <= dict(attn.named_parameters()).keys()


def test_qk_norm_stays_finite_in_float16_where_unfused_overflows():
    """Projections that give plain logits beyond 65504: fairseq's unfused order overflows in float16,
    qk_norm keeps its logits at most sqrt(hd) and its float16 output close to the float64 one."""
    torch.manual_seed(0)
    qk = MultiheadSelfAttention(16, 4, attention="qk_norm")
    unfused = MultiheadSelfAttention(16, 4, attention="unfused")
    with torch.no_grad():
        for proj in (qk.q_proj, qk.k_proj):
            proj.weight.normal_(0.0, 100.0)  # q, k ~ 400 per feature: plain logits ~ 400^2 * 4 / 2 = 3e5
    unfused.load_state_dict(qk.state_dict(), strict=False)
    x = torch.randn(2, 6, 16)
    assert not torch.isfinite(unfused.half()(x.half())).all()
    ref = qk.double()(x.double())
    y16 = qk.half()(x.half())
    assert y16.dtype == torch.float16 and torch.isfinite(y16).all()
    torch.testing.assert_close(y16.double(), ref, atol=5e-2, rtol=2e-2)


def test_encoder_config_takes_qk_norm_and_only_it_has_the_norms():
    hd = 32 // 4
    plain, qk = TransformerEncoder(tiny_config()), TransformerEncoder(tiny_config(attention="qk_norm"))
    assert all(b.attn.attention == "qk_norm" and b.attn.q_norm is not None for b in qk.blocks)
    assert all(b.attn.q_norm is None and b.attn.k_norm is None for b in plain.blocks)
    extra = sum(p.numel() for p in qk.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == 2 * 4 * hd  # layers x (q and k) x (gain and bias) x hd
    norm = qk.blocks[0].attn.q_norm
    assert torch.equal(norm.weight, torch.ones(hd)) and torch.equal(norm.bias, torch.zeros(hd))  # identity at init


# --- the block against PyTorch's reference layer ------------------------------------------------


def _copy_from_torch_layer(block: EncoderBlock, ref: nn.TransformerEncoderLayer) -> None:
    D = ref.self_attn.embed_dim
    wq, wk, wv = ref.self_attn.in_proj_weight.split(D)
    bq, bk, bv = ref.self_attn.in_proj_bias.split(D)
    pairs = [
        (block.attn.q_proj, wq, bq), (block.attn.k_proj, wk, bk), (block.attn.v_proj, wv, bv),
        (block.attn.out_proj, ref.self_attn.out_proj.weight, ref.self_attn.out_proj.bias),
        (block.ffn.fc1, ref.linear1.weight, ref.linear1.bias), (block.ffn.fc2, ref.linear2.weight, ref.linear2.bias),
        (block.ln1, ref.norm1.weight, ref.norm1.bias), (block.ln2, ref.norm2.weight, ref.norm2.bias),
    ]  # fmt: skip
    with torch.no_grad():
        for mod, w, b in pairs:
            mod.weight.copy_(w)
            mod.bias.copy_(b)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_block_matches_torch_transformer_encoder_layer(norm):
    torch.manual_seed(0)
    D, H, FF = 16, 4, 32
    ref = nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, activation="gelu", batch_first=True, norm_first=(norm == "pre"), dtype=torch.float64
    )
    with torch.no_grad():  # random biases and norm gains, so that every copied tensor matters
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    block = EncoderBlock(D, H, FF, norm=norm).double()
    _copy_from_torch_layer(block, ref)
    ref.eval(), block.eval()
    x = torch.randn(3, 7, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(block(x), ref(x), atol=1e-10, rtol=1e-10)


def test_deepnorm_residual_is_scaled_by_alpha():
    torch.manual_seed(0)
    D, H, FF, a = 16, 4, 32, 2.5
    block = EncoderBlock(D, H, FF, norm="deepnorm", deepnorm_alpha=a).double().eval()
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 5, D, dtype=torch.float64)

    def lin(m, t):
        return t @ m.weight.T + m.bias

    def attn(t):  # by hand: (B, T, D) -> (B, H, T, hd) -> softmax -> (B, T, D)
        B, T, _ = t.shape
        a_ = block.attn
        q, k, v = (lin(m, t).view(B, T, H, D // H).transpose(1, 2) for m in (a_.q_proj, a_.k_proj, a_.v_proj))
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D // H), dim=-1)
        return lin(block.attn.out_proj, (w @ v).transpose(1, 2).reshape(B, T, D))

    def ln(m, t):
        return F.layer_norm(t, (D,), m.weight, m.bias, 1e-5)

    y = ln(block.ln1, a * x + attn(x))
    expected = ln(block.ln2, a * y + lin(block.ffn.fc2, F.gelu(lin(block.ffn.fc1, y))))
    with torch.no_grad():
        torch.testing.assert_close(block(x), expected, atol=1e-12, rtol=0)


# --- the encoder: init and DeepNorm -----------------------------------------------------------


def test_deepnorm_scales_exactly_v_out_fc1_fc2_by_beta():
    cfg = tiny_config(norm="post", layers=3)
    torch.manual_seed(0)
    plain = TransformerEncoder(cfg)
    torch.manual_seed(0)
    deep = TransformerEncoder(tiny_config(norm="deepnorm", layers=3))
    alpha, beta = deepnorm_coefficients(3)
    scaled = deepnorm_scaled_parameters(deep)
    suffixes = ("ffn.fc1.weight", "ffn.fc2.weight", "attn.v_proj.weight", "attn.out_proj.weight")
    expected = {f"blocks.{i}.{s}" for i in range(3) for s in suffixes}
    assert set(scaled) == expected and len(scaled) == 12
    plain_params = dict(plain.named_parameters())
    for name, p in deep.named_parameters():
        if name in expected:
            assert torch.equal(p, plain_params[name] * beta), name
        else:
            assert torch.equal(p, plain_params[name]), name
    assert all(b.alpha == pytest.approx(alpha) for b in deep.blocks)
    assert all(b.alpha == 1.0 for b in plain.blocks)


def test_bert_init_draws_weights_at_std_0_02_and_zeroes_biases():
    torch.manual_seed(0)
    enc = TransformerEncoder(tiny_config(dim=64, ffn_dim=256))
    w = enc.blocks[0].ffn.fc1.weight
    assert w.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.all(enc.blocks[0].attn.q_proj.bias == 0)
    assert torch.all(enc.blocks[0].ln1.weight == 1) and torch.all(enc.layer_norm.bias == 0)


def test_residual_scale_only_under_deepnorm_and_unknown_axes_refused():
    """The norm axis is one value: a DeepNorm alpha handed to a Pre- or Post-Norm block is ignored,
    so no combination of settings can build a Pre-Norm block with a scaled residual."""
    assert EncoderBlock(16, 4, 32, norm="pre", deepnorm_alpha=2.0).alpha == 1.0
    assert EncoderBlock(16, 4, 32, norm="post", deepnorm_alpha=2.0).alpha == 1.0
    assert EncoderBlock(16, 4, 32, norm="deepnorm", deepnorm_alpha=2.0).alpha == 2.0
    with pytest.raises(ValueError, match="norm must be"):
        EncoderBlock(16, 4, 32, norm="sandwich")
    with pytest.raises(ValueError, match="norm must be"):
        TransformerEncoder(tiny_config(norm="sandwich"))
    with pytest.raises(ValueError, match="attention must be"):
        TransformerEncoder(tiny_config(attention="flash"))


@pytest.mark.parametrize("norm", ["pre", "post", "deepnorm"])
def test_pre_norm_ends_on_a_layer_norm_and_post_norm_normalises_the_first_input(norm):
    """Pre-Norm ends on a LayerNorm; Post-Norm normalises the input of the first block."""
    torch.manual_seed(0)
    enc = TransformerEncoder(tiny_config(norm=norm, layers=1)).eval()
    seen = {}
    enc.blocks[0].register_forward_pre_hook(lambda m, args: seen.__setitem__("in", args[0]))
    out = enc(5 * torch.randn(2, 6, 32) + 3)
    rms_in = seen["in"].pow(2).mean(-1)
    rms_out = out.pow(2).mean(-1)
    if norm != "pre":
        torch.testing.assert_close(rms_in, torch.ones_like(rms_in), atol=1e-3, rtol=0)
    else:
        torch.testing.assert_close(rms_out, torch.ones_like(rms_out), atol=1e-3, rtol=0)


# --- the backbone -----------------------------------------------------------------------------


def test_acoustic_encoder_shapes_mask_and_penalty():
    torch.manual_seed(0)
    enc = AcousticEncoder(tiny_config()).eval()
    wav = torch.randn(2, 320 * 12)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[:, 3:8] = True
    h, pen = enc(wav, mask)
    assert h.shape == (2, 12, 32)
    assert pen.ndim == 0 and pen.dtype == torch.float32 and pen.item() > 0
    features = enc.feature_extractor(wav)
    assert pen.item() == pytest.approx(features.pow(2).mean().item())
    # masked frames see the mask embedding only: changing the audio under them leaves their input unchanged
    captured = []
    enc.transformer.register_forward_pre_hook(lambda m, args: captured.append(args[0]))
    enc(wav, mask)
    wav2 = wav.clone()
    wav2[:, 320 * 5 : 320 * 6] += 1.0
    enc(wav2, mask)
    torch.testing.assert_close(captured[0][:, 5], captured[1][:, 5], atol=0, rtol=0)
    torch.testing.assert_close(captured[0][:, 5], enc.mask_emb.expand(2, -1), atol=0, rtol=0)
    h_nomask, _ = enc(wav, None)
    assert not torch.allclose(h_nomask, h)


# ----------------------------------------------------------------------------- the front end as matmuls (CUDA's path)


@pytest.mark.parametrize("conv_layers", [MERT_CONV, NARROW_CONV])
def test_front_end_as_matmuls_equals_the_convolutions_in_float32(conv_layers):
    """The CUDA path (each conv as one matmul of its unfolded input) against F.conv1d, on CPU in
    float32: outputs and gradients agree to rounding; the CPU default stays on F.conv1d, bit for bit."""
    torch.manual_seed(0)
    fe = ConvFeatureExtractor(conv_layers)
    wav = torch.randn(2, 320 * 12)
    assert fe.as_matmul is None  # on CPU: the convolutions
    ref = fe(wav)
    x = F.pad(wav.unsqueeze(1), fe.pad)
    for block in fe.blocks:
        x = block(x)
    assert torch.equal(ref, x)  # the default path is the plain module chain, unchanged
    fe.as_matmul = True
    out = fe(wav)
    assert out.shape == ref.shape == (2, conv_layers[-1][0], 12)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = []
    for flag in (False, True):
        fe.as_matmul = flag
        fe.zero_grad()
        (fe(wav) ** 2).mean().backward()
        grads.append([p.grad.clone() for p in fe.parameters()])
    for g_conv, g_mm in zip(*grads):
        torch.testing.assert_close(g_mm, g_conv, rtol=1e-4, atol=1e-6)


def test_front_end_as_matmuls_under_bf16_autocast_stays_close():
    torch.manual_seed(1)
    fe = ConvFeatureExtractor(NARROW_CONV)
    wav = torch.randn(2, 320 * 8)
    ref = fe(wav)
    fe.as_matmul = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fe(wav)
    assert out.dtype == torch.bfloat16  # the step's precision, as the tensor cores run it on CUDA
    torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)


def test_the_validation_probe_records_qk_norms_logits():
    """train.diagnostics' attention logit maximum under qk_norm is the normalised logits' (at most
    sqrt(hd) at unit gains), not the projections' however large they grow."""
    import numpy as np

    from acoustic_mlm.model.objective import AcousticMLM, compute_mask_indices
    from acoustic_mlm.train import diagnostics as D

    torch.manual_seed(0)
    cfg = tiny_config(attention="qk_norm")
    model = AcousticMLM(cfg).eval()
    with torch.no_grad():
        for block in model.encoder.transformer.blocks:
            block.attn.q_proj.weight.mul_(1000.0)
            block.attn.k_proj.weight.mul_(1000.0)
    B, T = 2, 20
    wav, codes = torch.randn(B, 320 * T), torch.randint(0, cfg.codebook_size, (B, cfg.codebooks, T))
    mask = torch.from_numpy(compute_mask_indices((B, T), 0.8, 5, 2, np.random.default_rng(0)))
    inputs = []
    hooks = [
        b.attn.register_forward_pre_hook(lambda mod, args: inputs.append((mod, args[0])))
        for b in model.encoder.transformer.blocks
    ]
    with torch.no_grad(), D.ValidProbe(model) as probe:
        model(wav, codes, mask)
    for h in hooks:
        h.remove()
    row = probe.values()
    with torch.no_grad():
        normed = [float(D.attention_logits(x, m.q_proj, m.k_proj, m.heads, 1.0, m.q_norm, m.k_norm).abs().amax())
                  for m, x in inputs]  # fmt: skip
        raw = [float(D.attention_logits(x, m.q_proj, m.k_proj, m.heads).abs().amax()) for m, x in inputs]
    assert [row[f"attn_logit_max_l{i}"] for i in range(cfg.layers)] == pytest.approx(normed, rel=1e-6)
    assert max(normed) <= math.sqrt(cfg.dim // cfg.heads) + 1e-5 < 1e3 < min(raw)
