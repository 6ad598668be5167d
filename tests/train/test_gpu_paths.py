"""Code paths that only GPU presets use, exercised on CPU at the smallest sizes that still run them.

The paper-size model does one whole training update; every precision mode trains; the compiled
model trains and the training step has no graph break; the masked loss has static shapes and no
host sync (every frame is scored, the unmasked ones weighted 0).
"""

from __future__ import annotations

import copy
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers import make_config, tiny_config
from torch.utils._python_dispatch import TorchDispatchMode

from acoustic_mlm import config as C
from acoustic_mlm.model.objective import LN2, AcousticMLM, compute_mask_indices, nats_to_bits
from acoustic_mlm.train import loop as train
from acoustic_mlm.train.precision import autocast, make_precision
from acoustic_mlm.train.update import evaluate

ARMS = {
    "pre": dict(norm="pre"),
    "pre_attn_relax": dict(norm="pre", attention="pb_relax"),
    "post_deepnorm": dict(norm="deepnorm"),
}


@pytest.fixture()
def tiny_cfg(smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(steps=4, warmup_steps=1, log_interval=2, batch_size=2, valid_crops=3, crop_seconds=0.4)
    return cfg


def batch(m, B: int = 3, T: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    wav = torch.randn(B, 320 * T, generator=g)
    codes = torch.randint(0, m.codebook_size, (B, m.codebooks, T), generator=g)
    mask = compute_mask_indices((B, T), m.mask_prob, m.mask_length, m.mask_min_masks, np.random.default_rng(seed))
    return wav, codes, torch.from_numpy(mask)


# ----------------------------------------------------------------------------- the paper-size model


@pytest.mark.slow
def test_paper_size_model_does_one_training_update_on_cpu(root):
    """MERT-330M's shape (MERT's conv stack, width 1024, 24 layers) at micro-batch 1 and 5.12 s.

    Measured on 2 shared cores: about 30 s (first forward 18 s, backward 9 s, AdamW 5 s) and 8 GB peak RSS.
    """
    cfg = C.load(root / "config" / "paper.yaml")
    m, t = cfg.model_for("prenorm_clip1"), cfg.train_for("prenorm_clip1")
    assert (m.dim, m.layers, m.heads, m.ffn_dim) == (1024, 24, 16, 4096)
    assert m.conv_layers == ((512, 10, 5),) + ((512, 3, 2),) * 4 + ((512, 2, 2),) * 2
    frames = cfg.crop_frames
    assert frames == 384
    torch.manual_seed(0)
    model = AcousticMLM(m)
    assert 300e6 < sum(p.numel() for p in model.parameters()) < 340e6
    precision = make_precision("fp32", torch.device("cpu"))
    opt = precision.build_optimizer(
        model, lambda ps: torch.optim.AdamW(ps, lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay)
    )
    wav, codes, mask = batch(m, B=1, T=frames)
    before = model.encoder.transformer.blocks[23].ffn.fc2.weight.detach().clone()
    with precision.autocast():
        out = model(wav, codes, mask)
    assert math.isfinite(out.loss.item()) and out.bits.shape == (8,)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing  # every parameter takes part in the update
    grad_norm, _, overflow = precision.unscale_and_clip(t.clip, float(out.n_masked), 1)
    assert math.isfinite(grad_norm) and not overflow and not precision.step()
    assert not torch.equal(before, model.encoder.transformer.blocks[23].ffn.fc2.weight)
    assert len(opt.state) == len(list(model.parameters()))  # Adam state for every parameter


# ----------------------------------------------------------------------------- precisions


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_precision_trains_with_finite_losses(data_dirs, tiny_cfg, tmp_path, precision):
    prepared, codes = data_dirs
    tiny_cfg["train"]["precision"] = precision
    summary = train.run(make_config(tiny_cfg), "prenorm_attnrelax_clip1", prepared, codes, tmp_path / "r", threads=1)
    metrics = pd.read_csv(tmp_path / "r" / "metrics.csv")
    assert summary["status"] == "completed" and metrics["step"].iloc[-1] == 4
    assert np.isfinite(metrics[[c for c in metrics.columns if c.startswith(("train_loss", "valid_loss"))]]).all().all()
    assert metrics["nonfinite"].iloc[-1] == 0
    # fp16's loss scaler starts at 2^16 and halves on overflow: at most a few skips, never all steps
    assert metrics["overflow_skips"].iloc[-1] < 4


@pytest.mark.parametrize(
    "precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_autocast_runs_the_blocks_in_the_precision(precision, dtype):
    m = tiny_config()
    model = AcousticMLM(m)
    seen = []
    model.encoder.transformer.blocks[0].ffn.fc1.register_forward_hook(lambda mod, i, o: seen.append(o.dtype))
    with autocast(torch.device("cpu"), precision):
        out = model(*batch(m))
    assert seen == [dtype] and out.loss.dtype == torch.float32  # the loss is reduced in float32


# ----------------------------------------------------------------------------- torch.compile


def _compiler_or_skip():
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH: torch.compile's CPU backend (inductor) cannot build kernels")


@pytest.mark.parametrize("arm", list(ARMS))
def test_training_step_has_no_graph_break(arm):
    m = tiny_config(**ARMS[arm])
    model = AcousticMLM(m)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(*batch(m))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_new_masks_do_not_recompile():
    """Masks with other masked counts reuse the one compiled graph: no shape depends on the mask."""
    from torch._dynamo.testing import CompileCounter

    m = tiny_config()
    model = AcousticMLM(m)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=False)
    torch._dynamo.reset()
    counts = set()
    for seed in range(4):
        wav, codes, mask = batch(m, seed=seed)
        counts.add(int(mask.sum()))
        compiled(wav, codes, mask).loss.backward()
    assert len(counts) > 1 and counter.frame_count == 1


@pytest.mark.slow
def test_compiled_training_trains():
    """train.compile's path: torch.compile (inductor, C++ kernels on CPU) of the model, then updates
    through the precision's autocast, clip and step; the losses follow eager mode to rounding."""
    _compiler_or_skip()
    m = tiny_config()
    losses = {}
    for mode in ("eager", "compiled"):
        torch.manual_seed(0)
        model = AcousticMLM(m)
        step_model = torch.compile(model) if mode == "compiled" else model
        precision = make_precision("fp32", torch.device("cpu"))
        precision.build_optimizer(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3))
        wav, codes, mask = batch(m)
        losses[mode] = []
        for _ in range(3):
            precision.zero_grad()
            with precision.autocast():
                out = step_model(wav, codes, mask)
            precision.backward(out.loss, out.n_masked, 1)
            precision.unscale_and_clip(1.0, float(out.n_masked), 1)
            precision.step()
            losses[mode].append(out.loss.item())
    assert all(math.isfinite(x) for x in losses["compiled"])
    assert losses["compiled"][-1] < losses["compiled"][0]
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-3)


# ----------------------------------------------------------------------------- the static masked loss


def selected_loss(model: AcousticMLM, wav, codes, mask):
    """The loss as computed before it had static shapes: heads on the masked frames only (h[mask])."""
    h, penalty = model.encoder(wav, mask)
    logits = model.heads(h[mask], model.cfg.logit_temp)  # (N_masked, K, V)
    ce = F.cross_entropy(logits.transpose(1, 2), codes.transpose(1, 2)[mask], reduction="none").mean(0)  # (K,)
    return ce.sum() + model.cfg.feature_penalty * penalty, nats_to_bits(ce)


@pytest.mark.parametrize("arm", list(ARMS))
def test_static_masked_loss_equals_the_selection(arm):
    """Loss, bits and every gradient equal the masked-frames-only computation to float32 rounding
    (the cosine logits run in float32 whatever the model's dtype)."""
    torch.manual_seed(0)
    m = tiny_config(**ARMS[arm])
    model = AcousticMLM(m)
    wav, codes, mask = batch(m)
    model.static_shapes = True
    out = model(wav, codes, mask)
    loss, bits = selected_loss(model, wav, codes, mask)
    model.static_shapes = False  # the model's own selection path is the helper's computation exactly
    selected = model(wav, codes, mask)
    assert torch.equal(selected.loss, loss) and torch.equal(selected.bits, bits.detach())
    assert torch.equal(selected.n_masked, out.n_masked)
    assert torch.allclose(out.bits, bits.detach(), rtol=1e-6, atol=0)
    assert out.loss.item() == pytest.approx(loss.item(), rel=1e-6)
    assert out.loss.item() == pytest.approx(
        out.bits.sum().item() * LN2 + m.feature_penalty * out.feature_penalty.item(), rel=1e-6
    )
    assert int(out.n_masked) == int(mask.sum())
    grads = torch.autograd.grad(out.loss, list(model.parameters()))
    ref = torch.autograd.grad(loss, list(model.parameters()))
    for (name, _), g, r in zip(model.named_parameters(), grads, ref):
        assert torch.allclose(g, r, rtol=1e-4, atol=1e-6 * r.abs().max().item()), name


class _HostSyncs(TorchDispatchMode):
    """Counts the ops that read a tensor's value on the host or give a shape that depends on values."""

    SYNCS = {
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten.masked_select.default",
        "aten.is_nonzero.default",
    }

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in self.SYNCS:
            self.seen.append(str(func))
        elif str(func).startswith(("aten.index.", "aten.index_put")) and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()) or ()
        ):
            self.seen.append(f"{func} with a boolean index")  # its output shape depends on the mask's values
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_forward_and_backward_have_no_host_sync(precision):
    m = tiny_config(attention="pb_relax")
    model = AcousticMLM(m)
    model.static_shapes = True  # what a GPU runs (CPU eager selects the masked frames: a free host read there)
    wav, codes, mask = batch(m)
    with _HostSyncs() as syncs:
        with autocast(torch.device("cpu"), precision):
            out = model(wav, codes, mask)
        out.loss.backward()
    assert syncs.seen == []
    # what the training step does read on the host: the finite-loss check (and later the gradient norm)
    with _HostSyncs() as syncs:
        bool(torch.isfinite(out.loss.detach()))
    assert syncs.seen == ["aten._local_scalar_dense.default"]
    model.static_shapes = False
    with _HostSyncs() as syncs:
        model(wav, codes, mask)
    assert syncs.seen  # the selection's boolean indexing: the check above can see a host sync


def test_static_shapes_on_gpus_and_under_compile():
    """Eager on CPU the model selects the masked frames; a GPU tensor or torch.compile takes the static path."""
    m = tiny_config()
    model = AcousticMLM(m)
    wav, codes, mask = batch(m)
    with _HostSyncs() as syncs:
        model(wav, codes, mask)
    assert "aten.index.Tensor with a boolean index" in syncs.seen  # h[mask]
    explanation = torch._dynamo.explain(model)(wav, codes, mask)  # traced: static, so no graph break
    assert explanation.graph_break_count == 0


def test_evaluate_weights_by_masked_frames():
    """train.evaluate: the per-codebook loss over chunks, weighted by each chunk's masked frames."""
    torch.manual_seed(0)
    m = tiny_config()
    model = AcousticMLM(m)
    wav, codes, mask = batch(m, B=5)
    got = evaluate(model, wav, codes, mask, make_precision("fp32", torch.device("cpu")), chunk=2)
    assert model.training  # evaluate restores training mode
    with torch.no_grad():
        _, bits = selected_loss(model.eval(), wav, codes, mask)  # every masked frame of the 5 crops at once
    assert np.allclose(got, bits.numpy(), rtol=1e-5)
