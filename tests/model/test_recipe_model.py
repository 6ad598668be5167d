"""MERT's recipe on the model, objective and data side: each switch does what it says.

Dropouts (activation_dropout, encoder_layerdrop, dropout_input), feature_grad_mult, the CQT
reconstruction target and loss, in-batch noise mixing, sample-level crops with MERT's label
offset, masks equalised per group of crops, and the 1,028-way softmax. Facts are from
yizhilll/MERT and fairseq (sources in the modules' docstrings and docs/recipe.md).
"""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import tiny_config

import acoustic_mlm.config as C
from acoustic_mlm.model.config import cqt_bin_frequency, cqt_top_frequency
from acoustic_mlm.model.cqt import CQTTarget
from acoustic_mlm.model.encoder import AcousticEncoder, EncoderBlock, FeedForward, TransformerEncoder
from acoustic_mlm.model.objective import (
    AcousticMLM,
    compute_group_masks,
    compute_mask_indices,
    mask_groups,
    uniform_bits,
)
from acoustic_mlm.train.augment import apply_mixture, draw_mixture
from acoustic_mlm.train.crops import CropData, label_offset

SR, HOP = 24000, 320


@pytest.fixture(scope="module")
def mert_cqt():
    return CQTTarget(bins=336, bins_per_octave=48, fmin=32.7)  # MERT's settings (mert_model.py model_cqt_pred)


# ----------------------------------------------------------------------------- CQT target


def test_mert_cqt_spans_seven_octaves_below_nyquist():
    assert cqt_top_frequency(32.7, 336, 48) == pytest.approx(32.7 * 2 ** (335 / 48))
    assert 4100 < cqt_top_frequency(32.7, 336, 48) < 4150 < SR / 2


@pytest.mark.parametrize("k", [60, 180, 300])
def test_cqt_peak_bin_of_a_pure_tone_is_the_tone_bin(mert_cqt, k):
    freq = cqt_bin_frequency(k, 32.7, 48)
    t = torch.arange(3 * SR, dtype=torch.float64) / SR
    wav = torch.sin(2 * math.pi * freq * t).float()[None, : 225 * HOP]  # (1, L), T = 225
    spec = mert_cqt(wav)  # (1, T, 336)
    assert spec.shape == (1, 225, 336)
    middle = spec[0, 100:125]  # far from the zero-padded edges for every bin's window
    assert (middle.argmax(-1) == k).all()


def test_cqt_frames_are_centred_on_code_frames(mert_cqt):
    # An impulse at the centre of code frame 40 (sample 320 * 40 + 160): the top bins, whose
    # windows are shortest, peak at frame 40 exactly.
    T = 80
    wav = torch.zeros(1, T * HOP)
    wav[0, 40 * HOP + HOP // 2] = 1.0
    spec = mert_cqt(wav)[0]  # (T, 336)
    assert spec.shape == (T, 336)
    assert int(spec[:, -12:].sum(-1).argmax()) == 40
    assert spec[40, -1] > 10 * spec[39, -1] and spec[40, -1] > 10 * spec[41, -1]


def test_cqt_target_is_float32_under_autocast(mert_cqt):
    wav = torch.randn(2, 30 * HOP)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        spec = mert_cqt(wav)
    assert spec.dtype == torch.float32
    torch.testing.assert_close(spec, mert_cqt(wav))


def test_cqt_loss_is_the_masked_mse_of_a_linear_head_and_adds_with_its_weight():
    torch.manual_seed(0)
    cfg = tiny_config(cqt_loss_weight=1.0, cqt_bins=24, cqt_bins_per_octave=12, cqt_fmin=261.6)
    model = AcousticMLM(cfg)
    B, T = 2, 30
    wav, codes = torch.randn(B, T * HOP), torch.randint(0, 32, (B, 2, T))
    mask = torch.from_numpy(compute_mask_indices((B, T), 0.8, 5, 2, np.random.default_rng(0)))
    out = model(wav, codes, mask)
    h, _ = model.encoder(wav, mask)
    target = model.cqt.target(wav)  # (B, T, 24)
    expected = torch.nn.functional.mse_loss(model.cqt.proj(h)[mask], target[mask])  # MERT: nn.MSELoss on masked frames
    torch.testing.assert_close(out.cqt_loss, expected.detach())
    ce_nats = out.bits.sum() * math.log(2)
    torch.testing.assert_close(out.loss.detach(), ce_nats + 10.0 * out.feature_penalty + 1.0 * out.cqt_loss)
    # the target comes from the clean crops when given (noise mixing changes the input only)
    out_clean = model(wav + 0.5 * torch.randn_like(wav), codes, mask, clean=wav)
    assert out_clean.cqt_loss != out.cqt_loss  # the input changed ...
    target_clean = model.cqt.target(wav)
    torch.testing.assert_close(target_clean, target)  # ... the target did not
    # the constant CQT kernels are not model state (checkpoints, DDP broadcasts)
    assert all(not k.startswith("cqt.target") for k in model.state_dict())
    assert set(k for k in model.state_dict() if k.startswith("cqt.")) == {"cqt.proj.weight", "cqt.proj.bias"}


def test_cqt_loss_off_by_default():
    model = AcousticMLM(tiny_config())
    assert model.cqt is None
    wav, codes = torch.randn(1, 20 * HOP), torch.randint(0, 32, (1, 2, 20))
    mask = torch.zeros(1, 20, dtype=torch.bool)
    mask[0, :5] = True
    assert model(wav, codes, mask).cqt_loss is None


# ----------------------------------------------------------------------------- 1,028-way softmax


def test_fairseq_dictionary_softmax_has_1028_classes():
    assert uniform_bits(1024) == 10.0
    assert uniform_bits(1024, 4) == pytest.approx(10.0056, abs=5e-5)
    assert uniform_bits(1024, 4) == pytest.approx(math.log2(1028), rel=1e-12)


def test_special_symbols_offset_targets_and_uniform_logits_score_log2_1028():
    torch.manual_seed(0)
    model = AcousticMLM(tiny_config(codebook_size=1024, special_symbols=4))
    assert model.heads.codewords.shape == (2, 1028, 16)
    codes = torch.randint(0, 1024, (2, 2, 20))
    assert (model.heads.target_ids(codes) == codes + 4).all()  # Dictionary: bos, pad, eos, unk first
    with torch.no_grad():  # zero projections: every cosine logit is 0, a uniform guess
        model.heads.proj.weight.zero_()
        model.heads.proj.bias.zero_()
    mask = torch.ones(2, 20, dtype=torch.bool)
    out = model(torch.randn(2, 20 * HOP), codes, mask)
    torch.testing.assert_close(out.bits, torch.full((2,), math.log2(1028)))
    # the special entries are scored as classes: raising one of them raises the loss
    with torch.no_grad():
        model.heads.proj.bias.fill_(1.0)
        model.heads.codewords[:, :4] = 1.0
    assert (model(torch.randn(2, 20 * HOP), codes, mask).bits > math.log2(1028)).all()


def test_special_symbols_default_keeps_1024_classes():
    model = AcousticMLM(tiny_config(codebook_size=1024))
    assert model.heads.codewords.shape == (2, 1024, 16)
    codes = torch.randint(0, 1024, (1, 2, 5))
    assert (model.heads.target_ids(codes) == codes).all()


# ----------------------------------------------------------------------------- dropouts


def test_activation_dropout_acts_on_the_ffn_hidden_units_only():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 32)
    ffn = FeedForward(32, 64, activation_dropout=1.0).train()
    torch.testing.assert_close(ffn(x), ffn.fc2.bias.expand(2, 7, 32))  # every hidden unit dropped
    block = EncoderBlock(32, 4, 64, dropout=0.3, activation_dropout=0.0)
    assert block.ffn.dropout.p == 0.0 and block.dropout.p == 0.3
    assert EncoderBlock(32, 4, 64, dropout=0.3).ffn.dropout.p == 0.3  # None: as the residual dropout
    enc = TransformerEncoder(tiny_config(dropout=0.1, activation_dropout=0.25))
    assert all(b.ffn.dropout.p == 0.25 and b.dropout.p == 0.1 for b in enc.blocks)


def test_encoder_layerdrop_drops_the_drawn_blocks_in_training_only():
    cfg = tiny_config(layers=6, dim=8, heads=2, ffn_dim=8, encoder_layerdrop=0.4)
    torch.manual_seed(0)
    enc = TransformerEncoder(cfg).train()
    x = torch.randn(1, 5, 8)
    torch.manual_seed(3)
    keep = torch.rand(6) > 0.4  # the draws the forward will make, one per block
    assert 0 < int(keep.sum()) < 6
    torch.manual_seed(3)
    y = enc(x)
    ref = x + enc.pos_conv(x)  # Pre-Norm: positions, the kept blocks, the final LayerNorm
    for i, block in enumerate(enc.blocks):
        if keep[i]:
            ref = block(ref)
    torch.testing.assert_close(y, enc.layer_norm(ref))
    (y * torch.randn_like(y)).sum().backward()  # (a plain sum has no gradient through the LayerNorm)
    for i, block in enumerate(enc.blocks):  # a dropped block gets zero gradients, as in fairseq fp16
        g = block.ffn.fc1.weight.grad
        assert bool(g.abs().sum() > 0) == bool(keep[i])
    enc.eval()
    ref = x + enc.pos_conv(x)
    for block in enc.blocks:
        ref = block(ref)
    torch.testing.assert_close(enc(x), enc.layer_norm(ref))  # evaluation: every block


def test_encoder_layerdrop_keeps_each_block_with_probability_one_minus_the_rate():
    enc = TransformerEncoder(tiny_config(layers=2, dim=8, heads=2, ffn_dim=8, encoder_layerdrop=0.3)).train()
    x = torch.randn(1, 3, 8)
    torch.manual_seed(1)
    kept = []
    for _ in range(300):
        state = torch.get_rng_state()
        enc(x)
        torch.set_rng_state(state)
        kept.append(torch.rand(2) > 0.3)  # replays the forward's draws
        enc(x)  # keep the stream as the forward leaves it
    assert abs(torch.stack(kept).float().mean().item() - 0.7) < 0.05


def test_layerdrop_draws_follow_torch_seed():
    enc = TransformerEncoder(tiny_config(layers=6, encoder_layerdrop=0.5)).train()
    x = torch.randn(1, 10, 32)
    torch.manual_seed(5)
    a = enc(x)
    torch.manual_seed(5)
    torch.testing.assert_close(enc(x), a)


def test_dropout_input_zeroes_the_projected_features_before_masking():
    torch.manual_seed(0)
    enc = AcousticEncoder(tiny_config(dropout_input=1.0)).train()
    seen = []
    enc.transformer.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    mask = torch.zeros(2, 20, dtype=torch.bool)
    mask[:, 3:8] = True
    enc(torch.randn(2, 20 * HOP), mask)
    x = seen[0]  # (B, T, D) into the transformer
    assert (x[~mask] == 0).all()  # dropped
    torch.testing.assert_close(x[mask], enc.mask_emb.expand(10, -1))  # masking comes after: untouched
    enc.eval()
    enc(torch.randn(2, 20 * HOP), mask)
    assert (seen[1][~mask] != 0).any()


@pytest.mark.parametrize("mult", [0.1, 0.5])
def test_feature_grad_mult_scales_conv_gradients_by_exactly_that_factor(mult):
    B, T = 2, 20
    wav, codes = torch.randn(B, T * HOP, dtype=torch.float64), torch.randint(0, 32, (B, 2, T))
    mask = torch.from_numpy(compute_mask_indices((B, T), 0.8, 5, 2, np.random.default_rng(0)))
    grads = {}
    for m in (1.0, mult):
        torch.manual_seed(0)
        model = AcousticMLM(tiny_config(feature_grad_mult=m)).double()  # float64: rounding far below the tolerance
        model(wav, codes, mask).loss.backward()
        grads[m] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name, g in grads[1.0].items():
        if name.startswith("encoder.feature_extractor."):
            torch.testing.assert_close(grads[mult][name], mult * g, rtol=1e-9, atol=1e-15)
        else:
            torch.testing.assert_close(grads[mult][name], g, rtol=1e-9, atol=1e-15)


def test_feature_grad_mult_zero_freezes_the_front_end():
    torch.manual_seed(0)
    model = AcousticMLM(tiny_config(feature_grad_mult=0.0))
    wav, codes = torch.randn(1, 20 * HOP), torch.randint(0, 32, (1, 2, 20))
    mask = torch.zeros(1, 20, dtype=torch.bool)
    mask[0, 2:9] = True
    model(wav, codes, mask).loss.backward()
    assert all(p.grad is None for p in model.encoder.feature_extractor.parameters())
    assert model.encoder.post_extract_proj.weight.grad is not None


# ----------------------------------------------------------------------------- masks per group


def test_mask_groups_are_strided_so_processes_hold_whole_groups():
    groups = mask_groups(28, 7)
    assert [g.tolist() for g in groups] == [
        [0, 4, 8, 12, 16, 20, 24],
        [1, 5, 9, 13, 17, 21, 25],
        [2, 6, 10, 14, 18, 22, 26],
        [3, 7, 11, 15, 19, 23, 27],
    ]
    assert [len(g) for g in mask_groups(32, 7)] == [7, 7, 6, 6, 6]  # ceil(32 / 7) groups
    assert [g.tolist() for g in mask_groups(5, 0)] == [[0, 1, 2, 3, 4]]
    # process r of 2 keeps rows r, r + 2, ...: groups 0, 2 on process 0 and 1, 3 on process 1
    assert set(range(0, 28, 2)) == set(np.concatenate([groups[0], groups[2]]).tolist())


def test_masks_are_equalised_within_each_group_and_not_across():
    rng = np.random.default_rng(3)
    counts_differ = False
    for _ in range(20):
        mask = compute_group_masks(28, 384, 0.8, 5, 2, rng, group=7)
        per_group = [set(mask[g].sum(1).tolist()) for g in mask_groups(28, 7)]
        assert all(len(c) == 1 for c in per_group)
        counts_differ |= len(set.union(*per_group)) > 1
    assert counts_differ


def test_group_zero_draws_exactly_the_whole_batch_masks():
    a = compute_group_masks(8, 50, 0.8, 5, 2, np.random.default_rng(7), group=0)
    b = compute_mask_indices((8, 50), 0.8, 5, 2, np.random.default_rng(7))
    assert (a == b).all()


def test_masked_share_per_7_crop_group_vs_per_32_crop_batch():
    # MERT-330M crops: 384 frames, mask_prob 0.8, mask_length 5, min_masks 2. Equalising to the
    # smallest row loses more frames in a larger group: 53.2 % masked per 32 crops, 55.0 % per 7.
    rng = np.random.default_rng(11)
    share7 = np.mean([compute_group_masks(28, 384, 0.8, 5, 2, rng, group=7).mean() for _ in range(60)])
    share32 = np.mean([compute_group_masks(32, 384, 0.8, 5, 2, rng, group=0).mean() for _ in range(60)])
    assert share7 == pytest.approx(0.550, abs=0.003)
    assert share32 == pytest.approx(0.532, abs=0.003)


# ----------------------------------------------------------------------------- noise mixing


def _groups(batch=14, group=7):
    return mask_groups(batch, group)


def test_mixture_draws_counts_lengths_and_positions_in_range():
    L = 122880
    plan = draw_mixture(np.random.default_rng(0), _groups(), L, 0.5, (1, 3), (12000, 36000))
    per_row: dict[int, int] = {}
    for seg in plan:
        per_row[seg.row] = per_row.get(seg.row, 0) + 1
        assert 12000 <= seg.length <= 36000
        assert 0 <= seg.position <= L - seg.length
        assert 0 <= seg.pool_start <= 6 * L - 36000  # MERT bounds the start with len_max
    assert all(1 <= n <= 3 for n in per_row.values())
    # over many micro-batches: half the crops mixed, counts and lengths spanning their ranges
    rng = np.random.default_rng(1)
    mixed, counts, lengths = 0, [], []
    for _ in range(300):
        plan = draw_mixture(rng, _groups(), L, 0.5, (1, 3), (12000, 36000))
        rows = [s.row for s in plan]
        mixed += len(set(rows))
        counts += [rows.count(r) for r in set(rows)]
        lengths += [s.length for s in plan]
    assert abs(mixed / (300 * 14) - 0.5) < 0.03
    assert set(counts) == {1, 2, 3} and abs(np.mean(counts) - 2.0) < 0.05
    assert min(lengths) < 13000 and max(lengths) > 35000 and abs(np.mean(lengths) - 24000) < 500


def test_mixture_is_deterministic_per_seed_and_step():
    a = draw_mixture(np.random.default_rng([1, 40]), _groups(), 24000, 0.5, (1, 3), (2000, 6000))
    b = draw_mixture(np.random.default_rng([1, 40]), _groups(), 24000, 0.5, (1, 3), (2000, 6000))
    c = draw_mixture(np.random.default_rng([1, 41]), _groups(), 24000, 0.5, (1, 3), (2000, 6000))
    assert a == b and a != c


def test_mixture_adds_clean_segments_of_the_other_crops_of_the_group():
    L = 1000
    wav = np.random.default_rng(0).standard_normal((4, L)).astype(np.float32)
    groups = mask_groups(4, 2)  # [0, 2], [1, 3]
    plan = draw_mixture(np.random.default_rng(2), groups, L, 1.0, (1, 1), (100, 300))
    out = apply_mixture(wav, np.arange(4), groups, plan, volume=0.5)
    assert len(plan) == 4
    partner = {0: 2, 2: 0, 1: 3, 3: 1}
    for seg in plan:  # a pool of one crop: the partner's own samples
        expect = wav[seg.row].copy()
        noise = wav[partner[seg.row], seg.pool_start : seg.pool_start + seg.length]
        expect[seg.position : seg.position + seg.length] += 0.5 * noise
        np.testing.assert_array_equal(out[seg.row], expect)
    # applied on one process's rows only (rows 0 and 2 of a 2-process split): the same crops
    local = apply_mixture(wav[[0, 2]], np.array([0, 2]), groups, plan, volume=0.5)
    np.testing.assert_array_equal(local, out[[0, 2]])


def test_mixture_rejects_impossible_draws():
    with pytest.raises(ValueError, match="do not fit"):
        draw_mixture(np.random.default_rng(0), _groups(), 10000, 0.5, (1, 3), (12000, 36000))
    with pytest.raises(ValueError, match="cannot supply"):
        draw_mixture(np.random.default_rng(0), mask_groups(4, 1), 50000, 0.5, (1, 3), (12000, 36000))


# ----------------------------------------------------------------------------- crops


@pytest.mark.parametrize(
    "sample,frame", [(0, 0), (159, 0), (160, 0), (161, 1), (479, 1), (480, 2), (800, 2), (122880, 384)]
)
def test_label_offset_rounds_as_mert(sample, frame):
    # mert_dataset.py collater_frm_label: int(round(start * label_rate / sample_rate)), halves to even
    assert label_offset(sample) == frame


class _Corpus:
    """Three clips in two shards; audio = the sample index within its clip, codes = the frame index."""

    def __init__(self, clip_frames=(100, 140, 90)):
        rows, audio = [], {0: [], 1: []}
        for c, frames in enumerate(clip_frames):
            shard = c % 2
            offset = sum(len(a) for a in audio[shard])
            audio[shard].append(np.arange(frames * HOP, dtype=np.float32))  # the sample index within the clip
            rows.append(dict(split="train", num_frames=frames, shard=shard, offset=offset))
        self.manifest = pd.DataFrame(rows)
        self._audio = {k: np.concatenate(v) for k, v in audio.items()}
        self.codes = {
            k: np.stack([np.concatenate([np.arange(len(a) // HOP) for a in v])] * 2) for k, v in audio.items()
        }

    def audio(self, shard):
        return self._audio[shard]


class _Crops(CropData):
    def codes(self, shard):
        return self.corpus.codes[shard]


def _crops(unit, mixture=False, cfg=None, batch=6, group=3, rank=0, world=1):
    corpus = _Corpus()
    m = cfg or tiny_config(mixture_prob=0.5, mixture_samples=(500, 2000))
    return _Crops(
        corpus,
        "unused",
        "train",
        30,
        batch,
        m,
        seed=4,
        rank=rank,
        world=world,
        crop_unit=unit,
        mask_group=group,
        mixture=mixture,
    )


def test_sample_crops_start_anywhere_and_codes_start_at_the_rounded_frame():
    data = _crops("sample")
    offsets = []
    for i in range(40):
        wav, codes, mask = data[i]
        start = wav[:, 0].numpy().astype(np.int64)  # the audio holds its sample index within the clip
        assert (wav.numpy() == start[:, None] + np.arange(30 * HOP)).all()
        assert (codes[:, 0, 0].numpy() == [label_offset(int(s)) for s in start]).all()
        assert (codes[:, 0].numpy() == codes[:, 0, :1].numpy() + np.arange(30)).all()
        offsets += (start % HOP).tolist()
    assert len(set(offsets)) > 100  # not on frame boundaries


def test_frame_crops_start_on_frames_and_are_the_default():
    data = _crops("frame")
    wav, codes, _ = data[0]
    start = wav[:, 0].numpy().astype(np.int64)
    assert (start % HOP == 0).all() and (codes[:, 0, 0].numpy() == start // HOP).all()


def test_crop_data_with_mixture_returns_mixed_and_clean_crops_deterministically():
    data, plain = _crops("frame", mixture=True), _crops("frame", mixture=False)
    wav, codes, mask, clean = data[3]
    wav0, codes0, mask0 = plain[3]
    torch.testing.assert_close(clean, wav0)  # the clean crops: as without mixing
    assert (codes == codes0).all() and (mask == mask0).all()  # targets and masks untouched
    assert not torch.equal(wav, clean)
    again = data[3]
    torch.testing.assert_close(again[0], wav)  # a pure function of (seed, step)
    assert not torch.equal(data[4][0], wav)
    # with two processes each holds whole groups and mixes its crops as the single process does
    halves = [_crops("frame", mixture=True, rank=r, world=2)[3] for r in (0, 1)]
    torch.testing.assert_close(halves[0][0], wav[0::2])
    torch.testing.assert_close(halves[1][0], wav[1::2])


def test_validation_crops_are_never_mixed():
    data = _crops("frame", mixture=False)
    assert len(data[0]) == 3


# ----------------------------------------------------------------------------- configuration


def _cfg(root, **changes):
    cfg = C.read_yaml(root / "config" / "smoke.yaml")
    for key, value in changes.items():
        section, name = key.split("__")
        cfg[section][name] = value
    return cfg


def test_config_rejects_mixture_longer_than_a_crop(root):
    cfg = _cfg(root, model__mixture_prob=0.5)  # smoke crops are 0.5 s = 11,840 samples
    with pytest.raises(C.ConfigError, match="model.mixture_samples"):
        C.validate(cfg, "smoke.yaml")
    C.validate(_cfg(root, model__mixture_prob=0.5, model__mixture_samples=[1000, 3000]), "smoke.yaml")


def test_config_rejects_groups_split_between_processes(root):
    cfg = _cfg(root, train__mask_group=2, train__batch_size=6, train__processes=2)  # 3 groups on 2 processes
    with pytest.raises(C.ConfigError, match="train.mask_group"):
        C.validate(cfg, "smoke.yaml")
    C.validate(_cfg(root, train__mask_group=3, train__batch_size=6, train__processes=2), "smoke.yaml")


def test_config_rejects_cqt_above_nyquist(root):
    cfg = _cfg(root, model__cqt_loss_weight=1.0, model__cqt_bins=600)
    with pytest.raises(C.ConfigError, match="model.cqt_bins"):
        C.validate(cfg, "smoke.yaml")


def test_presets_set_merts_dropouts_feature_grad_mult_and_mixture(root):
    paper = C.load(root / "config" / "paper.yaml")
    small = C.load(root / "config" / "gpu-small.yaml")
    m330, m95 = paper.model, small.model  # the `model:` sections (the same for every arm)
    # MERT_RVQ-VAE_CQT_330M.yaml
    assert (
        m330.dropout,
        m330.attention_dropout,
        m330.activation_dropout,
        m330.encoder_layerdrop,
        m330.dropout_input,
        m330.feature_grad_mult,
        m330.final_dim,
    ) == (0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 128)
    assert (m330.mixture_prob, m330.mixture_segments, m330.mixture_samples, m330.mixture_volume) == (
        0.5,
        (1, 3),
        (12000, 36000),
        1.0,
    )
    # MERT_RVQ-VAE_CQT_95M.yaml
    assert (
        m95.dropout,
        m95.attention_dropout,
        m95.activation_dropout,
        m95.encoder_layerdrop,
        m95.dropout_input,
        m95.feature_grad_mult,
        m95.final_dim,
    ) == (0.1, 0.1, 0.0, 0.05, 0.1, 0.1, 64)
    assert (m95.mixture_prob, m95.mixture_segments, m95.mixture_samples) == (0.5, (1, 3), (12000, 24000))
    for m in (m330, m95):  # audio_cqt_loss_m, audio_cqt_bins 336, loss_weights [10, 1]; 4 dictionary specials
        assert (
            m.cqt_loss_weight,
            m.cqt_bins,
            m.cqt_bins_per_octave,
            m.cqt_fmin,
            m.feature_penalty,
            m.special_symbols,
        ) == (1.0, 336, 48, 32.7, 10.0, 4)
    assert (paper.train.crop_unit, paper.train.mask_group) == ("sample", 7)
    assert (small.train.crop_unit, small.train.mask_group) == ("sample", 16)
    for name in ("config", "smoke"):  # the CPU presets keep their meaning: every switch off
        cpu = C.load(root / "config" / f"{name}.yaml")
        m = cpu.model
        assert (
            m.activation_dropout,
            m.encoder_layerdrop,
            m.dropout_input,
            m.feature_grad_mult,
            m.special_symbols,
            m.cqt_loss_weight,
            m.mixture_prob,
        ) == (m.dropout, 0.0, 0.0, 1.0, 0, 0.0, 0.0)
        assert (cpu.train.crop_unit, cpu.train.mask_group) == ("frame", 0)
