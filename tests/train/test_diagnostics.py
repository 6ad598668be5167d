"""diagnostics.py: each diagnostic against a direct computation, and training unchanged by measuring."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers import make_config

from acoustic_mlm import encodec
from acoustic_mlm.model.objective import AcousticMLM
from acoustic_mlm.report import aggregate
from acoustic_mlm.train import diagnostics as D
from acoustic_mlm.train import loop as train


@pytest.fixture()
def tiny_cfg(smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(steps=12, warmup_steps=2, log_interval=5, batch_size=2, valid_crops=3, crop_seconds=0.4)
    return cfg


def _model_and_batch(cfg, run="prenorm_clip1", T=15, B=2, seed=0):
    torch.manual_seed(seed)
    m = make_config(cfg).model_for(run)
    model = AcousticMLM(m)
    wav = torch.randn(B, T * encodec.HOP)
    codes = torch.randint(0, 16, (B, m.codebooks, T))
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, 3:9] = True
    return model, wav, codes, mask


def test_blocks_partition_the_parameters(smoke_cfg):
    model, *_ = _model_and_batch(smoke_cfg)
    blocks = D.param_blocks(model)
    layers = smoke_cfg["model"]["layers"]
    assert list(blocks) == ["conv", "embed"] + [f"block{i}" for i in range(layers)] + ["heads"]
    ids = [id(p) for ps in blocks.values() for p in ps]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())  # each parameter in exactly one block
    assert D.block_of("encoder.transformer.blocks.1.attn.q_proj.weight") == "block1"
    assert D.block_of("encoder.transformer.pos_conv.conv.bias") == "embed"
    assert D.block_of("encoder.mask_emb") == "embed"


def test_block_gradient_norms_make_the_total_and_undo_the_loss_scale(smoke_cfg):
    model, wav, codes, mask = _model_and_batch(smoke_cfg)
    model(wav, codes, mask).loss.backward()
    blocks = D.param_blocks(model)
    per_block = D.grad_norms(blocks)
    total = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
    assert math.sqrt(sum(v**2 for v in per_block.values())) == pytest.approx(total, rel=1e-5)
    for p in model.parameters():  # as the fp16 loss scaler leaves them before unscale_
        p.grad *= 1024.0
    assert D.grad_norms(blocks, scale=1024.0) == pytest.approx(per_block, rel=1e-5)


def test_update_ratio_is_the_relative_size_of_the_step(smoke_cfg):
    model, wav, codes, mask = _model_and_batch(smoke_cfg)
    model(wav, codes, mask).loss.backward()
    probe = D.UpdateProbe(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    row = probe.finish()
    heads = [n for n in before if n.startswith("heads.")]
    num = math.sqrt(sum(float((model.get_parameter(n).detach() - before[n]).pow(2).sum()) for n in heads))
    den = math.sqrt(sum(float(before[n].pow(2).sum()) for n in heads))
    assert row["update_ratio_heads"] == pytest.approx(num / den, rel=1e-5)
    assert row["grad_norm_heads"] > 0


def test_attention_logits_are_what_softmax_attention_exponentiates(smoke_cfg):
    model, wav, codes, mask = _model_and_batch(smoke_cfg)
    attn = model.encoder.transformer.blocks[0].attn
    x = torch.randn(2, 15, smoke_cfg["model"]["dim"])
    logits = D.attention_logits(x, attn.q_proj, attn.k_proj, attn.heads)  # (B, H, T, T)
    B, T, Dm = x.shape
    v = attn.v_proj(x).view(B, T, attn.heads, Dm // attn.heads).transpose(1, 2)
    q = attn.q_proj(x).view(B, T, attn.heads, Dm // attn.heads).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, attn.heads, Dm // attn.heads).transpose(1, 2)
    torch.testing.assert_close(logits.softmax(-1) @ v, F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-5)
    assert D.fp16_fraction(D.FP16_MAX) == 1.0 and D.FP16_MAX == 65504.0


@pytest.mark.parametrize(
    "run, static",
    [
        ("prenorm_clip1", False),
        ("postnorm_deepnorm_clip1", False),
        ("prenorm_attnrelax_clip1", False),
        ("prenorm_clip1", True),
    ],
)
def test_valid_probe_measures_every_layer_and_the_accuracy(smoke_cfg, run, static):
    model, wav, codes, mask = _model_and_batch(smoke_cfg, run)
    model.eval()
    model.static_shapes = static  # True: the heads score every frame, as on a GPU
    inputs = []
    hooks = [
        b.attn.register_forward_pre_hook(lambda mod, args: inputs.append((mod, args[0])))
        for b in model.encoder.transformer.blocks
    ]
    with torch.no_grad(), D.ValidProbe(model) as probe:
        out = model(wav, codes, mask)
        h, _ = model.encoder(wav, mask)
    for hk in hooks:
        hk.remove()
    row = probe.values()
    layers = smoke_cfg["model"]["layers"]
    with torch.no_grad():
        expect = [
            float(D.attention_logits(x, mod.q_proj, mod.k_proj, mod.heads).abs().amax()) for mod, x in inputs[:layers]
        ]
    assert [row[f"attn_logit_max_l{i}"] for i in range(layers)] == pytest.approx(expect, rel=1e-6)
    assert row["attn_logit_max"] == pytest.approx(max(expect))
    assert row["attn_logit_fp16_frac"] == pytest.approx(max(expect) / 65504)
    logits = model.heads(h[mask], model.cfg.logit_temp)
    right = (logits[:, 0].argmax(-1) == model.heads.target_ids(codes).transpose(1, 2)[mask][:, 0]).float().mean()
    assert row["valid_acc_cb0"] == pytest.approx(float(right)) and int(out.n_masked) == int(mask.sum())
    # hooks are gone after the block: a second pass adds nothing
    model(wav, codes, mask)
    assert int(probe.total) == int(mask.sum())


def test_diagnostics_do_not_change_training_and_fill_every_row(data_dirs, tiny_cfg, tmp_path):
    prepared, codes = data_dirs
    on = train.run(make_config(tiny_cfg), "prenorm_attnrelax_clip1", prepared, codes, tmp_path / "on", threads=1)
    off_cfg = copy.deepcopy(tiny_cfg)
    off_cfg["train"]["diagnostics"] = False
    train.run(make_config(off_cfg), "prenorm_attnrelax_clip1", prepared, codes, tmp_path / "off", threads=1)
    with_d, without = pd.read_csv(tmp_path / "on" / "metrics.csv"), pd.read_csv(tmp_path / "off" / "metrics.csv")
    shared = [c for c in without.columns if c != "wall_time"]
    pd.testing.assert_frame_equal(with_d[shared], without[shared])  # measuring changes no number
    added = set(with_d.columns) - set(without.columns)
    layers = tiny_cfg["model"]["layers"]
    blocks = ["conv", "embed"] + [f"block{i}" for i in range(layers)] + ["heads"]
    assert added == (
        {f"grad_norm_{b}" for b in blocks}
        | {f"update_ratio_{b}" for b in blocks}
        | {f"attn_logit_max_l{i}" for i in range(layers)}
        | {"attn_logit_max", "attn_logit_fp16_frac", "valid_acc_cb0", "masked_frac"}
    )
    assert with_d[sorted(added)].notna().all().all()  # measured at every row
    per_block = with_d[[f"grad_norm_{b}" for b in blocks]].pow(2).sum(axis=1).pow(0.5)
    assert per_block.to_numpy() == pytest.approx(with_d["grad_norm"].to_numpy(), rel=1e-4)  # before clipping (clip 1)
    assert (with_d["masked_frac"].between(0.1, 0.9)).all() and on["status"] == "completed"


def test_fp16_rows_carry_the_loss_scale(data_dirs, tiny_cfg, tmp_path):
    prepared, codes = data_dirs
    tiny_cfg["train"]["precision"] = "fp16"
    train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "run", threads=1)
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert (m["loss_scale"] > 0).all() and "overflow_skips" in m.columns


def test_fp16_fairseq_rows_carry_per_block_gradients_and_master_weight_updates(data_dirs, tiny_cfg, tmp_path):
    """Under fp16_fairseq the per-block norms are the gradients the update sees (unscaled, per masked
    frame): together they make the row's grad_norm; the update ratios are the fp32 masters' (fp16
    weights would round updates under 2^-11 of a weight to zero); training is unchanged."""
    prepared, codes = data_dirs
    tiny_cfg["train"].update(precision="fp16_fairseq", log_interval=2, log_powers_of_two=False)
    train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "on", threads=1)
    off_cfg = copy.deepcopy(tiny_cfg)
    off_cfg["train"]["diagnostics"] = False
    train.run(make_config(off_cfg), "prenorm_clip1", prepared, codes, tmp_path / "off", threads=1)
    with_d, without = pd.read_csv(tmp_path / "on" / "metrics.csv"), pd.read_csv(tmp_path / "off" / "metrics.csv")
    shared = [c for c in without.columns if c != "wall_time"]
    pd.testing.assert_frame_equal(with_d[shared], without[shared])
    layers = tiny_cfg["model"]["layers"]
    blocks = ["conv", "embed"] + [f"block{i}" for i in range(layers)] + ["heads"]
    grads = with_d[[f"grad_norm_{b}" for b in blocks]]
    ratios = with_d[[f"update_ratio_{b}" for b in blocks]]
    assert grads.notna().all().all() and ratios.notna().all().all() and with_d["masked_frac"].notna().all()
    per_block = grads.pow(2).sum(axis=1).pow(0.5)
    assert per_block.to_numpy() == pytest.approx(with_d["grad_norm"].to_numpy(), rel=1e-3)
    moved = with_d["lr"] > 0  # the schedule ends at lr 0: that update moves nothing
    assert 0 < moved.sum() < len(with_d)
    assert (ratios[moved] > 0).all().all() and (ratios[moved] < 0.5).all().all() and (ratios[~moved] == 0).all().all()


def test_aggregate_writes_tidy_diagnostics_beside_the_curves(tmp_path, smoke_cfg):
    runs_dir = tmp_path / "runs"
    for i, name in enumerate(smoke_cfg["runs"]):
        (runs_dir / name).mkdir(parents=True)
        pd.DataFrame(
            {
                "seed": [1, 1],
                "step": [1, 2],
                "train_loss_cb0": [10.0, 9.0],
                "valid_loss_cb0": [10.0, 9.5],
                "train_loss": [80.0, 70.0],
                "grad_norm_max": [3.0 + i, 2.0],
                "attn_logit_max": [1.0, 2.0],
                "wall_time": [0.1, 0.2],
            }
        ).to_csv(runs_dir / name / "metrics.csv", index=False)
    aggregate.run(make_config(smoke_cfg), runs_dir, tmp_path / "loss_curves.csv")
    d = pd.read_csv(tmp_path / aggregate.DIAGNOSTICS)
    assert list(d.columns) == aggregate.DIAGNOSTIC_COLUMNS
    assert set(d["diagnostic"]) == {"grad_norm_max", "attn_logit_max"}  # losses and wall time stay out
    assert list(d["run"].unique()) == list(smoke_cfg["runs"])  # config order
    row = d[(d.run == "prenorm_clip1") & (d.diagnostic == "grad_norm_max") & (d.step == 1)]
    assert row["value"].tolist() == [4.0] and row["label"].iloc[0] == smoke_cfg["runs"]["prenorm_clip1"]["label"]
