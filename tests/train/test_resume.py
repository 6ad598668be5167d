"""Runs survive SIGKILL: rerunning resumes from the last good state and ends with identical metrics."""

import copy
import os
import signal
import subprocess
import time

import pandas as pd
import pytest
import torch
import yaml
from helpers import make_config, train_argv

from acoustic_mlm.errors import UserError
from acoustic_mlm.train import loop as train
from acoustic_mlm.train.state import KEEP_STATES, save_state

TIMING = ["wall_time"]


@pytest.fixture()
def resume_cfg(smoke_cfg, tmp_path):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(
        steps=300,
        warmup_steps=10,
        log_interval=20,
        batch_size=2,
        valid_crops=3,
        crop_seconds=0.4,
        checkpoint_interval=10,
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return cfg, path


def _kill_after_state(cmd, out, min_step: int) -> None:
    """Start the CLI, SIGKILL it as soon as a state past `min_step` exists."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            states = sorted((out / "state" / "seed1").glob("step-*.pt"))
            if states and int(states[-1].stem.split("-")[1]) >= min_step:
                break
            assert proc.poll() is None, "training finished before it could be killed"
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_sigkill_then_rerun_gives_identical_metrics(data_dirs, resume_cfg, tmp_path):
    cfg, cfg_path = resume_cfg
    subprocess.run(train_argv("prenorm_clip1", cfg_path, data_dirs, tmp_path / "ref"), check=True, capture_output=True)
    reference = pd.read_csv(tmp_path / "ref" / "metrics.csv").drop(columns=TIMING)
    assert not (tmp_path / "ref" / "state").exists()  # removed once the run is complete

    out = tmp_path / "killed"
    _kill_after_state(train_argv("prenorm_clip1", cfg_path, data_dirs, out), out, min_step=40)
    assert not (out / "metrics.csv").exists()  # nothing half-written looks complete
    states = sorted((out / "state" / "seed1").glob("step-*.pt"))
    assert 1 <= len(states) <= KEEP_STATES

    # the newest state is damaged (e.g. a bad copy): the previous one must be used
    if len(states) == 2:
        states[-1].write_bytes(states[-1].read_bytes()[:1000])
    proc = subprocess.run(train_argv("prenorm_clip1", cfg_path, data_dirs, out), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "resuming after step" in proc.stderr
    resumed = pd.read_csv(out / "metrics.csv").drop(columns=TIMING)
    pd.testing.assert_frame_equal(resumed, reference, check_exact=True)
    ref_ckpt = torch.load(tmp_path / "ref" / "seeds" / "seed1" / "checkpoint.pt", weights_only=True)["model"]
    new_ckpt = torch.load(out / "seeds" / "seed1" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(ref_ckpt[k], new_ckpt[k]) for k in ref_ckpt)


def test_state_of_other_settings_is_refused(data_dirs, resume_cfg, tmp_path):
    cfg, _ = resume_cfg
    out = tmp_path / "run"
    save_state(out / "state" / "seed1", 10, {"fingerprint": {"other": 1}, "step": 10})
    with pytest.raises(UserError, match="resumable state of a run with other settings"):
        train.run(make_config(cfg), "prenorm_clip1", *data_dirs, out, threads=1)


def test_a_completed_seed_is_not_trained_again(data_dirs, resume_cfg, tmp_path):
    cfg, _ = resume_cfg
    cfg["train"].update(steps=8, warmup_steps=2, log_interval=4)
    first = train.run(make_config(cfg), "prenorm_clip1", *data_dirs, tmp_path / "run", threads=1)
    ckpt = tmp_path / "run" / "seeds" / "seed1" / "checkpoint.pt"
    mtime = ckpt.stat().st_mtime_ns
    cfg["runs"]["prenorm_clip1"]["seeds"] = [1, 2]  # add a seed: only seed 2 trains
    second = train.run(make_config(cfg), "prenorm_clip1", *data_dirs, tmp_path / "run", threads=1)
    assert ckpt.stat().st_mtime_ns == mtime
    assert second["per_seed"]["1"] == first["per_seed"]["1"] and "2" in second["per_seed"]
    cfg["runs"]["prenorm_clip1"]["clip"] = 5.0  # other settings: seed 1 is trained again
    train.run(make_config(cfg), "prenorm_clip1", *data_dirs, tmp_path / "run", threads=1)
    assert ckpt.stat().st_mtime_ns != mtime
