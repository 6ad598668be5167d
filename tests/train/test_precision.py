"""precision.py: one object per trainer for each train.precision (its kind, scale and resumable state);
fairseq-style fp16: the loss scaler's rule, the master weights, the half model."""

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from acoustic_mlm.train.precision import (
    TRAITS,
    AutocastPrecision,
    FairseqPrecision,
    Fp32GroupNorm,
    LossScaler,
    MinLossScaleError,
    autocast,
    half_model,
    make_precision,
    names_where,
    scale_window,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "name, kind, scale, retries",
    [
        ("fp32", AutocastPrecision, math.nan, False),
        ("bf16", AutocastPrecision, math.nan, False),
        ("fp16", AutocastPrecision, 2.0**16, False),  # torch's GradScaler
        ("fp16_fairseq", FairseqPrecision, 2.0**7, True),  # fairseq's fp16_init_scale
    ],
)
def test_one_precision_object_per_setting_with_one_scale_and_a_state_of_the_same_format(name, kind, scale, retries):
    """The resumable state keeps 'scaler' (torch's GradScaler, {} when disabled) and 'fp16' (the fairseq
    masters and scaler, None otherwise), as states written before the precision was one object."""
    model = _model()
    precision = make_precision(name, CPU, world=2, accum_steps=4)
    assert type(precision) is kind and precision.name == name and precision.retries_overflows is retries
    precision.build_optimizer(precision.prepare(model), _adam)
    assert precision.loss_scale == scale or math.isnan(scale) and math.isnan(precision.loss_scale)
    state = precision.state_dict()
    assert set(state) == {"scaler", "fp16"}
    assert (state["scaler"] != {}) is (name == "fp16")
    assert (state["fp16"] is not None) is (name == "fp16_fairseq")
    if name == "fp16_fairseq":
        assert precision.scaler.window == scale_window(2, 4)
    assert precision.state_problem({"fp16": None}) == (
        None if name != "fp16_fairseq" else "lacks 'fp16' (the fp16_fairseq optimizer's state)"
    )
    again = make_precision(name, CPU, world=2, accum_steps=4)
    again.build_optimizer(again.prepare(_model()), _adam)
    again.load_state_dict(state)
    assert str(again.state_dict()) == str(state)


def test_scale_window_is_fairseqs_default_rule():
    # fairseq/optim/fp16_optimizer.py: int(2**14 / world / update_freq)
    assert scale_window(64, 8) == 32  # MERT-330M: 64 GPUs, update_freq 8
    assert scale_window(64, 1) == 256  # MERT-95M yaml: 64 GPUs, no update_freq
    assert scale_window(8, 64) == 32  # the same global batch on one 8-GPU node: the same window
    assert scale_window(1, 1) == 16384
    assert scale_window(3, 7) == int(16384 / 21) == 780  # truncated, not rounded
    assert scale_window(100000, 1) == 1  # fairseq would divide by zero; here at least 1


def test_scale_starts_at_2_pow_7_and_halves_on_every_overflow():
    s = LossScaler(window=4)
    assert s.scale == 128.0  # fairseq/dataclass/configs.py: fp16_init_scale 2**7
    s.overflow()
    assert s.scale == 64.0
    s.overflow()
    assert s.scale == 32.0


def test_scale_doubles_after_window_clean_steps_and_every_window_after():
    s = LossScaler(window=3, init_scale=8.0)
    scales = []
    for _ in range(7):
        s.clean()
        scales.append(s.scale)
    assert scales == [8, 8, 16, 16, 16, 32, 32]


def test_window_restarts_at_an_overflow():
    s = LossScaler(window=3, init_scale=8.0)
    s.clean()
    s.clean()  # one clean step short of doubling
    s.overflow()
    assert s.scale == 4.0
    seen = []
    for _ in range(3):
        s.clean()
        seen.append(s.scale)
    assert seen == [4, 4, 8]  # three clean steps after the overflow, not one


def test_min_loss_scale_stops_with_the_scale_kept():
    s = LossScaler(window=1000, init_scale=1.0, min_scale=0.2)
    s.overflow()  # 0.5
    s.overflow()  # 0.25
    with pytest.raises(MinLossScaleError, match="min_loss_scale"):
        s.overflow()  # 0.125 <= 0.2: stop, scale back at 0.25 (as fairseq)
    assert s.scale == 0.25


def test_from_2_pow_7_training_stops_after_21_overflows_in_a_row():
    s = LossScaler(window=32)
    n = 0
    with pytest.raises(MinLossScaleError):
        while True:
            s.overflow()
            n += 1
    assert n == 20  # the 21st: 2**7 / 2**21 = 6.1e-5 <= 1e-4
    assert s.scale == 2.0**7 / 2**20


def test_scaler_state_round_trips():
    a = LossScaler(window=3)
    for f in (a.clean, a.overflow, a.clean, a.clean):
        f()
    b = LossScaler(window=99)
    b.load_state_dict(a.state_dict())
    for _ in range(5):
        a.clean()
        b.clean()
        assert a.scale == b.scale


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 1))


def _adam(params):
    return torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)


def _fairseq(half, make_optimizer, window):
    """fp16_fairseq's precision over a model already half, its optimizer built."""
    precision = FairseqPrecision(CPU, LossScaler(window=window))
    precision.build_optimizer(half, make_optimizer)
    return precision


def test_master_weights_follow_an_fp32_optimizer_and_are_copied_back():
    ref, half = _model(), _model()
    ref_opt = _adam(ref.parameters())
    half.half()
    opt = _fairseq(half, _adam, window=1000)
    x = torch.randn(16, 4)
    for _ in range(3):
        ref_opt.zero_grad()
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        opt.zero_grad()
        opt.backward(half(x.half()).float().pow(2).mean(), 1, 1)
        outcome = opt.unscale_and_clip(0.0, 1.0, 1)
        assert not outcome.overflow and not outcome.clipped and not opt.step()
    for p_ref, m, p in zip(ref.parameters(), opt.master, half.parameters()):
        assert m.dtype == torch.float32 and p.dtype == torch.float16
        assert torch.allclose(m, p_ref, atol=2e-3)  # fp16 forward/backward, fp32 update
        assert torch.equal(p, m.half())  # the model holds the rounded master weights
    state = opt.fp32_state_dict()
    assert all(v.dtype == torch.float32 for v in state.values())
    assert torch.equal(state["0.weight"], opt.master[0].detach())


def test_gradients_are_unscaled_and_clipped_to_the_norm():
    model = _model().half()
    opt = _fairseq(model, lambda ps: torch.optim.SGD(ps, lr=1.0), window=1000)
    before = [m.detach().clone() for m in opt.master]
    opt.zero_grad()
    opt.backward(model(torch.randn(8, 4).half()).float().sum(), 10, 1)  # summed over 10 masked frames
    grads = [p.grad.float() / opt.loss_scale for p in model.parameters()]
    expected = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
    outcome = opt.unscale_and_clip(0.5, 8.0, 2)  # fairseq's multiply_grads(world / sample_size): 2 / 8
    assert outcome.clipped and not outcome.overflow and not opt.step()
    assert outcome.grad_norm == pytest.approx(0.25 * expected, rel=1e-5)
    step = torch.cat([(b - m.detach()).flatten() for b, m in zip(before, opt.master)])  # SGD lr 1: the gradient
    assert float(step.norm()) == pytest.approx(0.5, rel=1e-4)


def test_an_overflow_takes_no_step_and_halves_the_scale():
    model = _model().half()
    opt = _fairseq(model, _adam, window=1000)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    out = model(torch.randn(4, 4).half()).float().sum()
    opt.backward(out * float("inf"), 1, 1)
    outcome = opt.unscale_and_clip(1.0, 1.0, 1)
    assert outcome.overflow and not math.isfinite(outcome.grad_norm)
    assert opt.loss_scale == 64.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert not opt.optimizer.state  # Adam's moments untouched: the step never happened


def test_master_state_restores_weights_and_scale():
    model = _model().half()
    opt = _fairseq(model, _adam, window=7)
    opt.zero_grad()
    opt.backward(model(torch.randn(4, 4).half()).float().sum(), 1, 1)
    opt.unscale_and_clip(0.0, 1.0, 1)
    opt.step()
    state = opt.state_dict()
    other = _model().half()
    restored = _fairseq(other, _adam, window=7)
    restored.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(opt.master, restored.master))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    assert restored.scaler.state_dict() == opt.scaler.state_dict()


def test_half_model_is_fp16_but_group_norm_computes_in_fp32():
    model = nn.Sequential(nn.Conv1d(1, 4, 3), nn.GroupNorm(4, 4), nn.Linear(6, 2))
    half_model(model)
    assert isinstance(model[1], Fp32GroupNorm)
    assert all(p.dtype == torch.float16 for p in model.parameters())
    out = model(torch.randn(2, 1, 8))  # fp32 input is cast to half, as fairseq's _prepare_sample
    assert out.dtype == torch.float16
    # the fp32 group norm equals group norm of the fp16 input computed in fp32, then rounded
    x = torch.randn(2, 4, 6).half() * 300
    gn = model[1]
    ref = torch.nn.functional.group_norm(x.float(), 4, gn.weight.float(), gn.bias.float(), gn.eps).half()
    assert torch.equal(gn(x), ref)


def test_every_configured_precision_has_traits_and_autocasts_as_they_say():
    from acoustic_mlm import config as C

    assert set(TRAITS) == set(C.PRECISIONS)
    x = torch.ones(2, 2)
    for name, tr in TRAITS.items():
        with make_precision(name, CPU).autocast(), autocast(CPU, name):
            got = (x @ x).dtype
        assert got == (tr.autocast_dtype or torch.float32), name
        assert make_precision(name, CPU).retries_overflows == tr.half_model
    assert [n for n, t in TRAITS.items() if not t.tensor_cores] == ["fp32"]
    assert [n for n, t in TRAITS.items() if t.weight_bytes == 2] == ["fp16_fairseq"]
    assert names_where(lambda t: t.float16_range) == ("fp16", "fp16_fairseq")
    assert names_where(lambda t: not t.float16_range) == ("fp32", "bf16")


NAME_BRANCH = re.compile(r"""(==|!=|\bin|isin\()\s*[(\[]?\s*["'](fp32|bf16|fp16|fp16_fairseq)["']""")


def test_no_training_preflight_or_report_module_branches_on_a_precision_s_name():
    """Precision asked, never named: train/, preflight/ and report/ ask precision.py (its object, `traits`,
    `names_where`)."""
    src = Path(__file__).resolve().parents[2] / "src" / "acoustic_mlm"
    named = [
        f"{path.relative_to(src)}:{i}"
        for sub in ("train", "preflight", "report")
        for path in sorted((src / sub).glob("*.py"))
        if path.name != "precision.py"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if NAME_BRANCH.search(line)
    ]
    assert named == []
