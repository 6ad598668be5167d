"""The training loop as fairseq runs it: schedule and world mistakes refused, interval-mean rows,
fairseq-style fp16 (an overflowing step is not an update), and the data a skip draws."""

import copy
import math

import pandas as pd
import pytest
import torch
from helpers import make_config

from acoustic_mlm import config as C
from acoustic_mlm.model.objective import AcousticMLM
from acoustic_mlm.train import loop as train
from acoustic_mlm.train.schedule import lr_at


@pytest.fixture()
def tiny_cfg(smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(
        steps=12, warmup_steps=2, log_interval=4, batch_size=2, valid_crops=3, crop_seconds=0.4, checkpoint_interval=0
    )
    return cfg


@pytest.mark.parametrize(
    "keys, message",
    [
        (
            dict(steps=100, total_updates=50, warmup_steps=10),
            "'train.steps' (100) must not exceed 'train.total_updates' (50)",
        ),
        (
            dict(steps=100, total_updates=400, warmup_steps=400),
            "'train.warmup_steps' (400) must be below 'train.total_updates'",
        ),
        (dict(nodes=2, processes=3, batch_size=8), "'train.batch_size' (8) must be divisible by the 6 processes"),
    ],
)
def test_schedule_and_world_mistakes_are_one_line(smoke_cfg, keys, message):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(keys)
    with pytest.raises(C.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        C.validate(cfg, "x.yaml")


def test_interval_rows_are_the_mean_of_the_steps_in_the_interval(data_dirs, tiny_cfg, tmp_path):
    prepared, codes = data_dirs
    every = copy.deepcopy(tiny_cfg)
    every["train"].update(log_interval=1)
    per_step = train.run(make_config(every), "prenorm_clip1", prepared, codes, tmp_path / "every", threads=1)
    tiny_cfg["train"].update(log_powers_of_two=False)
    train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "interval", threads=1)
    steps = pd.read_csv(tmp_path / "every" / "metrics.csv").set_index("step")
    rows = pd.read_csv(tmp_path / "interval" / "metrics.csv").set_index("step")
    assert per_step["status"] == "completed" and rows.index.tolist() == [4, 8, 12]
    for end in (4, 8, 12):  # each row: the mean over the 4 updates it closes, as fairseq's train_inner
        window = steps.loc[end - 3 : end]
        for col in ("train_loss_cb0", "train_loss", "feature_penalty"):
            assert rows.loc[end, col] == pytest.approx(window[col].mean(), rel=1e-9, abs=1e-12)
        assert rows.loc[end, "grad_norm_max"] == pytest.approx(window["grad_norm"].max())
        assert rows.loc[end, "clip_frac"] == pytest.approx(window["clipped"].mean())


def _overflow_on(calls_to_blow):
    """AcousticMLM.forward whose loss is infinite on the given training calls (1-based)."""
    real_forward = AcousticMLM.forward
    seen = {"n": 0}

    def forward(self, wav, codes, mask):
        out = real_forward(self, wav, codes, mask)
        if self.training:
            seen["n"] += 1
            if seen["n"] in calls_to_blow:
                return out._replace(loss=out.loss * float("inf"))
        return out

    return forward, seen


def test_fp16_fairseq_trains_with_master_weights_and_a_loss_scale(data_dirs, tiny_cfg, tmp_path):
    prepared, codes = data_dirs
    tiny_cfg["train"].update(precision="fp16_fairseq", steps=8, accum_steps=2)
    summary = train.run(make_config(tiny_cfg), "prenorm_attnrelax_clip1", prepared, codes, tmp_path / "r", threads=1)
    m = pd.read_csv(tmp_path / "r" / "metrics.csv")
    assert summary["status"] == "completed" and math.isfinite(summary["final_train_loss_cb0"])
    assert m["step"].tolist() == [1, 2, 4, 8]
    assert (m["loss_scale"] == 128.0).all()  # 2**7; window 2**14 / 1 / 2 = 8192 never reached
    assert m["valid_loss_cb0"].notna().all() and (m["overflow_skips"] == 0).all()
    ckpt = torch.load(tmp_path / "r" / "seeds" / "seed1" / "checkpoint.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for v in ckpt["model"].values() if v.is_floating_point())  # fp32 masters


def test_fp16_fairseq_gradient_is_the_mean_over_masked_frames(data_dirs, tiny_cfg, tmp_path):
    """The backward runs on the loss summed over masked frames (fairseq's criterion) and the update
    divides by their count: the first update's gradient norm is the fp32 run's, up to fp16 rounding."""
    prepared, codes = data_dirs
    tiny_cfg["train"].update(steps=2, warmup_steps=1, log_interval=1)  # a valid schedule: warm-up below the steps
    norms = {}
    for precision in ("fp32", "fp16_fairseq"):
        cfg = copy.deepcopy(tiny_cfg)
        cfg["train"]["precision"] = precision
        train.run(make_config(cfg), "prenorm_clip10", prepared, codes, tmp_path / precision, threads=1)
        norms[precision] = pd.read_csv(tmp_path / precision / "metrics.csv")["grad_norm"].iloc[0]
    assert norms["fp16_fairseq"] == pytest.approx(norms["fp32"], rel=0.02)


def test_fp16_fairseq_overflow_is_not_an_update(data_dirs, tiny_cfg, tmp_path, monkeypatch):
    """Overflowing steps (training calls 3 and 4: the second update, twice) are skipped without counting:
    the run still makes 8 updates, the lr schedule does not move, the scale halves twice, and the
    next update draws the next micro-batches."""
    prepared, codes = data_dirs
    tiny_cfg["train"].update(precision="fp16_fairseq", steps=8, log_interval=1)
    forward, seen = _overflow_on({3, 4})
    monkeypatch.setattr(AcousticMLM, "forward", forward)
    summary = train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "skip", threads=1)
    m = pd.read_csv(tmp_path / "skip" / "metrics.csv")
    assert summary["status"] == "completed" and seen["n"] == 10  # 8 updates + 2 overflows
    assert m["step"].tolist() == list(range(1, 9))
    assert m["overflow_skips"].tolist() == [0, 0, 2, 2, 2, 2, 2, 2]
    assert m["loss_scale"].tolist() == [128.0, 128.0, 32.0, 32.0, 32.0, 32.0, 32.0, 32.0]
    t = make_config(tiny_cfg).train_for("prenorm_clip1")
    assert m["lr"].tolist() == pytest.approx([lr_at(s, t) for s in range(1, 9)])
    assert m["train_loss_cb0"].notna().all()  # no row holds an overflowed step

    # the same run where micro-batches 3 and 4 are simply absent: identical updates 3.. (data n+2)
    monkeypatch.undo()
    ref_cfg = copy.deepcopy(tiny_cfg)
    ref_cfg["train"].update(steps=8)
    data = train.CropData  # skip micro-batches 2 and 3 (0-based) of the batch stream

    class Shifted(data):
        def __getitem__(self, i):
            return super().__getitem__(i + 2 if self.seed == 1 and self.batch == 2 and i >= 2 else i)

    monkeypatch.setattr(train, "CropData", Shifted)
    train.run(make_config(ref_cfg), "prenorm_clip1", prepared, codes, tmp_path / "ref", threads=1)
    ref = pd.read_csv(tmp_path / "ref" / "metrics.csv")
    # the loss scale does not enter an fp32 update once unscaled, up to fp16 rounding of scaled gradients
    assert m["train_loss_cb0"].tolist() == pytest.approx(ref["train_loss_cb0"].tolist(), abs=2e-3)


def test_fp16_fairseq_stops_at_min_loss_scale(data_dirs, tiny_cfg, tmp_path, monkeypatch):
    prepared, codes = data_dirs
    tiny_cfg["train"].update(precision="fp16_fairseq", steps=40, max_nonfinite=5)
    forward, _ = _overflow_on(set(range(6, 10_000)))  # every training call from the 6th
    monkeypatch.setattr(AcousticMLM, "forward", forward)
    summary = train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "r", threads=1)
    per_seed = summary["per_seed"]["1"]
    assert summary["status"] == "diverged" and per_seed["stop_reason"] == "min_loss_scale"
    m = pd.read_csv(tmp_path / "r" / "metrics.csv")
    # 5 updates, then 20 halvings from 2**7 and a 21st that would pass 1e-4 (max_nonfinite does not apply)
    assert m["step"].iloc[-1] == 6 and m["diverged"].iloc[-1] == 1
    assert m["overflow_skips"].iloc[-1] == 21
    assert m["loss_scale"].iloc[-1] == 2.0**7 / 2**20
    assert m["nonfinite"].iloc[-1] == 0


def test_a_skipped_step_draws_its_micro_batches_so_data_does_not_shift(data_dirs, tiny_cfg, tmp_path, monkeypatch):
    """A non-finite loss on the first of 2 micro-batches skips the update; its second micro-batch is
    drawn all the same, so that update n always uses micro-batches 2n-2 and 2n-1 (as after a resume)."""
    prepared, codes = data_dirs
    tiny_cfg["train"].update(steps=4, accum_steps=2, log_interval=1)
    drawn = []
    real_getitem = train.CropData.__getitem__

    def getitem(self, i):
        if self.batch == 2:
            drawn.append(int(i))
        return real_getitem(self, i)

    forward, _ = _overflow_on({3})  # first micro-batch of update 2
    monkeypatch.setattr(AcousticMLM, "forward", forward)
    monkeypatch.setattr(train.CropData, "__getitem__", getitem)
    summary = train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "r", threads=1)
    assert summary["per_seed"]["1"]["nonfinite_steps"] == 1
    assert drawn == list(range(8))  # 4 steps x 2 micro-batches, none carried into the next step


def test_fp16_fairseq_resumes_with_its_scale_masters_and_micro_batch_count(data_dirs, tiny_cfg, tmp_path, monkeypatch):
    """A run stopped after its state at update 4 (taken after an overflow, so micro-batch 5 is next,
    not 4) resumes to the same metrics as a run never stopped."""
    prepared, codes = data_dirs
    tiny_cfg["train"].update(precision="fp16_fairseq", steps=8, log_interval=2, checkpoint_interval=4)
    forward, _ = _overflow_on({3})
    monkeypatch.setattr(AcousticMLM, "forward", forward)
    train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "whole", threads=1)

    class Stop(Exception):
        pass

    real_step = train.train_step

    def stop_at_6(s, loop, loader, step):
        if step == 6:
            raise Stop
        return real_step(s, loop, loader, step)

    forward, _ = _overflow_on({3})
    monkeypatch.setattr(AcousticMLM, "forward", forward)
    monkeypatch.setattr(train, "train_step", stop_at_6)
    with pytest.raises(Stop):
        train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "cut", threads=1)
    state = torch.load(next((tmp_path / "cut" / "state" / "seed1").glob("step-*.pt")), weights_only=True)
    assert (state["step"], state["batches"], state["overflow"]) == (4, 5, 1)
    assert state["fp16"]["scaler"]["scale"] == 64.0
    monkeypatch.undo()  # no overflow after the resume: micro-batch 3 is behind it
    train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "cut", threads=1)
    whole = pd.read_csv(tmp_path / "whole" / "metrics.csv").drop(columns=["wall_time"])
    resumed = pd.read_csv(tmp_path / "cut" / "metrics.csv").drop(columns=["wall_time"])
    pd.testing.assert_frame_equal(whole, resumed)
