"""The clip-and-step of an update (precision.py's `AutocastPrecision`, as `train.update` calls it): the gradient
norm logged before clipping, clipping bounds the update, and an overflowing fp16 step is skipped."""

import math

import pytest
import torch

from acoustic_mlm.train.precision import AutocastPrecision


def _model_with_grads(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    for p in model.parameters():
        p.grad = torch.full_like(p, 2.0)  # total norm = 2 * sqrt(15)
    return model


def _sgd(model, name="fp32"):
    precision = AutocastPrecision(name, torch.device("cpu"))
    precision.build_optimizer(model, lambda ps: torch.optim.SGD(ps, lr=1.0))  # update = -grad
    return precision


def _clip_and_step(precision, clip):
    norm, clipped, overflow = precision.unscale_and_clip(clip, 1.0, 1)
    return norm, clipped, overflow or precision.step()


@pytest.mark.parametrize("clip, expect_clipped", [(1.0, True), (100.0, False), (0.0, False)])
def test_clipping_logs_the_norm_before_clipping_and_bounds_the_update(clip, expect_clipped):
    model = _model_with_grads()
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    norm, clipped, skipped = _clip_and_step(_sgd(model), clip)  # SGD lr 1: the update's norm is the clipped norm
    full = 2.0 * math.sqrt(15)
    assert norm == pytest.approx(full)  # logged before clipping
    assert clipped is expect_clipped and skipped is False
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    expected = min(full, clip) if clip > 0 else full  # clip 0 disables clipping
    assert float((after - before).norm()) == pytest.approx(expected, rel=1e-5)


def test_fp16_scaler_skips_overflowing_steps():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    precision = _sgd(model, "fp16")
    precision.scaler = torch.amp.GradScaler("cpu", enabled=True, init_scale=1.0)
    precision.backward(model(torch.ones(2, 4)).sum(), torch.tensor(2.0), 1)
    for p in model.parameters():
        p.grad[0] = float("inf")  # as an fp16 overflow leaves them
    before = [p.detach().clone() for p in model.parameters()]
    norm, clipped, skipped = _clip_and_step(precision, 1.0)
    assert skipped and not clipped and not math.isfinite(norm)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no update
    assert precision.loss_scale == 0.5  # halved, and it stays one scaler's


def test_a_finite_loss_with_an_infinite_gradient_norm_is_a_skipped_non_finite_update():
    """fp32 has no loss scaler to skip such a step: taken, it wrote NaN into every weight, and it was
    counted as a finite update (model.logit_temp 1e-30: an infinite norm at every step, 0 non-finite)."""
    from types import SimpleNamespace

    from acoustic_mlm.train.update import Trainer, update

    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.zero_()
    precision = _sgd(model)

    def step_model(x):  # sqrt at 0: a finite loss whose gradient is infinite
        loss = torch.sqrt(model.weight.sum()) + 0 * x.sum()
        return SimpleNamespace(
            loss=loss, n_masked=torch.tensor(1.0), bits=loss.detach().reshape(1), feature_penalty=loss.detach() * 0
        )

    tr = Trainer(model, step_model, None, precision.optimizer, precision, torch.device("cpu"), clip=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    u = update(tr, [[torch.ones(1, 2)]], lr=1.0)
    assert not u.finite and not math.isfinite(u.grad_norm) and not u.clipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no NaN written, no step
