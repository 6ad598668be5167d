"""The masked-prediction objective: span masks, cosine logits, loss in bits, and a few training steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import tiny_config

from acoustic_mlm.model.config import ModelConfig
from acoustic_mlm.model.objective import (
    LN2,
    AcousticMLM,
    CodebookHeads,
    MLMOutput,
    compute_mask_indices,
    cosine_logits,
    masked_cross_entropy,
    nats_to_bits,
)


def batch(cfg: ModelConfig, B: int = 2, T: int = 20, seed: int = 0):
    """A waveform, codes and fairseq span masks for B crops of T frames."""
    g = torch.Generator().manual_seed(seed)
    wav = torch.randn(B, 320 * T, generator=g)
    codes = torch.randint(0, cfg.codebook_size, (B, cfg.codebooks, T), generator=g)
    mask = compute_mask_indices((B, T), cfg.mask_prob, cfg.mask_length, cfg.mask_min_masks, np.random.default_rng(seed))
    return wav, codes, torch.from_numpy(mask)


# --- units ------------------------------------------------------------------------------------


def test_bits_are_nats_over_ln_2():
    assert LN2 == math.log(2)
    assert nats_to_bits(math.log(1024)) == pytest.approx(10.0, abs=1e-12)


def test_constant_logits_score_exactly_10_bits():
    logits = torch.full((50, 3, 1024), 1.7)  # (N, K, V)
    targets = torch.randint(0, 1024, (50, 3))
    bits = nats_to_bits(masked_cross_entropy(logits, targets))
    torch.testing.assert_close(bits, torch.full((3,), 10.0), atol=1e-5, rtol=0)


def test_zero_projection_is_a_uniform_predictor_of_10_bits():
    torch.manual_seed(0)
    cfg = tiny_config(codebook_size=1024, codebooks=3)
    model = AcousticMLM(cfg)
    with torch.no_grad():
        model.heads.proj.weight.zero_()
        model.heads.proj.bias.zero_()
    wav, codes, mask = batch(cfg)
    out = model(wav, codes, mask)
    assert isinstance(out, MLMOutput)
    torch.testing.assert_close(out.bits, torch.full((3,), 10.0), atol=1e-5, rtol=0)
    expected = 3 * math.log(1024) + cfg.feature_penalty * out.feature_penalty.item()
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)


def test_cosine_logits_are_cosines_over_the_temperature():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])  # (N=3, F=2)
    e = torch.tensor([[3.0, 0.0], [1.0, 1.0], [0.0, -1.0]])  # (V=3, F=2)
    expected = torch.tensor([[1.0, 2**-0.5, 0.0], [0.0, 2**-0.5, -1.0], [0.0, 0.0, 0.0]]) / 0.1
    torch.testing.assert_close(cosine_logits(x, e, 0.1), expected)


def test_codebook_heads_give_one_logit_per_codebook_and_code():
    heads = CodebookHeads(dim=32, final_dim=8, codebooks=4, codebook_size=16)
    assert heads.codewords.shape == (4, 16, 8)
    assert heads.proj.out_features == 32
    assert heads(torch.randn(10, 32), temp=0.1).shape == (10, 4, 16)  # (N, K, V)


# --- masks ------------------------------------------------------------------------------------


def test_masks_same_count_per_row_and_deterministic():
    m1 = compute_mask_indices((6, 200), 0.8, 5, 2, np.random.default_rng(3))
    m2 = compute_mask_indices((6, 200), 0.8, 5, 2, np.random.default_rng(3))
    m3 = compute_mask_indices((6, 200), 0.8, 5, 2, np.random.default_rng(4))
    assert m1.dtype == bool and m1.shape == (6, 200)
    assert len(set(m1.sum(axis=1).tolist())) == 1
    assert np.array_equal(m1, m2) and not np.array_equal(m1, m3)


def test_masks_rows_may_differ_without_require_same_masks():
    m = compute_mask_indices((16, 200), 0.8, 5, 2, np.random.default_rng(0), require_same_masks=False)
    assert len(set(m.sum(axis=1).tolist())) > 1


def test_masks_hold_at_least_min_masks_spans():
    m = compute_mask_indices((8, 100), 0.0, 1, 3, np.random.default_rng(0))
    assert (m.sum(axis=1) == 3).all()  # 3 distinct spans of one frame each
    m = compute_mask_indices((8, 100), 0.0, 5, 2, np.random.default_rng(0), require_same_masks=False)
    assert (m.sum(axis=1) >= 6).all()  # two distinct starts of 5-frame spans cover at least 6 frames


def test_masks_fraction_on_long_sequences():
    # overlapping spans: about 1 - (1 - 0.8/5)^5 = 0.58 of frames (close to 1 - exp(-0.8) = 0.55)
    m = compute_mask_indices((8, 5000), 0.8, 5, 2, np.random.default_rng(0))
    assert 0.52 < m.mean() < 0.64


def test_sequences_shorter_than_two_spans_still_get_masks_in_every_row():
    for T in (6, 8, 10):
        m = compute_mask_indices((4, T), 0.8, 5, 2, np.random.default_rng(T))
        assert m.shape == (4, T) and m.any(axis=1).all()


# --- the loss ---------------------------------------------------------------------------------


def test_loss_counts_only_masked_frames():
    torch.manual_seed(0)
    cfg = tiny_config()
    model = AcousticMLM(cfg).eval()
    wav, codes, mask = batch(cfg)
    assert 0 < mask.sum() < mask.numel()
    out = model(wav, codes, mask)
    assert out.n_masked == int(mask.sum())
    assert out.bits.shape == (cfg.codebooks,) and not out.bits.requires_grad
    assert not out.feature_penalty.requires_grad and out.loss.requires_grad
    expected = out.bits.sum() * LN2 + cfg.feature_penalty * out.feature_penalty
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)

    unmasked = (~mask).unsqueeze(1).expand_as(codes)  # (B, K, T)
    other = codes.clone()
    other[unmasked] = (codes[unmasked] + 1) % cfg.codebook_size
    assert torch.equal(model(wav, other, mask).loss, out.loss)
    other = codes.clone()
    other[~unmasked] = (codes[~unmasked] + 1) % cfg.codebook_size
    assert not torch.equal(model(wav, other, mask).loss, out.loss)


def test_bad_inputs_are_refused():
    cfg = tiny_config()
    model = AcousticMLM(cfg)
    wav, codes, mask = batch(cfg)
    # no masked frame: the loss is 0 / 0 (no data-dependent check, no host sync); training skips it
    assert torch.isnan(model(wav, codes, torch.zeros_like(mask)).loss)
    with pytest.raises(ValueError, match="frames"):
        model(wav[:, :-320], codes, mask)


ARMS = {
    "pre": dict(norm="pre"),
    "pre_attn_relax": dict(norm="pre", attention="pb_relax"),
    "pre_qk_norm": dict(norm="pre", attention="qk_norm"),
    "post_deepnorm": dict(norm="deepnorm"),
    "post": dict(norm="post"),
}


@pytest.fixture
def one_thread():
    """Scoped single-threaded torch: tiny ops with 2 threads on a shared 2-core box run ~100x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("arm", list(ARMS))
def test_a_few_adam_steps_lower_the_loss(arm, one_thread):
    torch.manual_seed(0)
    cfg = tiny_config(**ARMS[arm])
    model = AcousticMLM(cfg)
    wav, codes, mask = batch(cfg, B=2, T=20)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, bits = [], []
    for _ in range(12):
        out = model(wav, codes, mask)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
        bits.append(out.bits.sum().item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.9 * losses[0]
    assert bits[-1] < bits[0]
