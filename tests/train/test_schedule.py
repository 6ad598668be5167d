"""The schedules of a run: fairseq's polynomial decay learning rate, MERT's numbers, and the steps
that get a metrics row."""

import copy

import pytest
from helpers import make_config

from acoustic_mlm import config as C
from acoustic_mlm.train.schedule import log_steps, lr_at


def test_lr_schedule_warmup_then_polynomial_decay(smoke_cfg):
    t = make_config(smoke_cfg).train_for("prenorm_clip1")
    t = type(t)(**{**t.__dict__, "steps": 100, "warmup_steps": 10, "lr": 1e-3, "end_lr": 1e-4, "lr_power": 2.0})
    assert lr_at(1, t) == pytest.approx(1e-4)
    assert lr_at(5, t) == pytest.approx(5e-4)
    assert lr_at(10, t) == pytest.approx(1e-3)
    assert lr_at(55, t) == pytest.approx(1e-4 + 9e-4 * 0.5**2)
    assert lr_at(100, t) == pytest.approx(1e-4)


def test_log_steps_are_powers_of_two_every_interval_and_the_last():
    assert log_steps(20, 5) == [1, 2, 4, 5, 8, 10, 15, 16, 20]
    assert log_steps(7, 100) == [1, 2, 4, 7]


def _t(cfg, **train_keys):
    cfg = copy.deepcopy(cfg)
    cfg["train"].update(train_keys)
    return make_config(cfg).train_for("prenorm_clip1")


def test_mert_330m_schedule_numbers(root):
    # MERT_RVQ-VAE_CQT_330M.yaml: lr 0.0015, warmup_updates 32,000, max_update 400,000, polynomial_decay
    # (power 1, end_learning_rate 0); the figure runs 100K of the 400K updates.
    t = C.load(root / "config" / "paper.yaml").train_for("prenorm_clip1")
    assert (t.steps, t.schedule_updates) == (100_000, 400_000)
    assert lr_at(16_000, t) == pytest.approx(7.5e-4)
    assert lr_at(32_000, t) == pytest.approx(1.5e-3)
    assert lr_at(50_000, t) == pytest.approx(1.5e-3 * (1 - 18_000 / 368_000))  # 1.4266e-3
    assert round(lr_at(50_000, t), 5) == 1.43e-3
    assert lr_at(100_000, t) == pytest.approx(1.5e-3 * (1 - 68_000 / 368_000))  # 1.2228e-3 at the figure's end
    assert lr_at(400_000, t) == 0.0


def test_schedule_ends_at_steps_without_total_updates(smoke_cfg):
    t = _t(smoke_cfg, steps=100, warmup_steps=10, lr=1e-3, total_updates=None)
    assert t.schedule_updates == 100 and lr_at(100, t) == 0.0
    longer = _t(smoke_cfg, steps=100, warmup_steps=10, lr=1e-3, total_updates=190)
    assert lr_at(100, longer) == pytest.approx(1e-3 * 0.5)  # halfway through the decay


def test_rows_without_powers_of_two_are_whole_intervals():
    assert log_steps(20, 5, powers_of_two=False) == [5, 10, 15, 20]
    assert log_steps(22, 5, powers_of_two=False) == [5, 10, 15, 20, 22]
    assert log_steps(20, 5) == [1, 2, 4, 5, 8, 10, 15, 16, 20]  # the CPU presets' default
