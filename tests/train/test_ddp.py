"""One run on several processes (DDP through torchrun, gloo on CPU) matches one process, with one
gradient all-reduce per update."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import train_argv

TOLERANCE_BITS = 2e-3  # float reduction order differs between 1 and 2 processes; nothing else may


@pytest.fixture()
def ddp_cfg(smoke_cfg, tmp_path):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(
        steps=12, warmup_steps=2, log_interval=4, batch_size=4, valid_crops=3, crop_seconds=0.4, checkpoint_interval=0
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(launcher, cfg_path, data_dirs, out):
    cmd = train_argv("postnorm_deepnorm_clip1", cfg_path, data_dirs, out, launcher=launcher)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_csv(out / "metrics.csv")


@pytest.mark.slow
@pytest.mark.parametrize("accum_steps", [1, 4])
def test_two_gloo_processes_match_one_process_with_the_same_global_batch(data_dirs, ddp_cfg, tmp_path, accum_steps):
    cfg = yaml.safe_load(ddp_cfg.read_text())
    cfg["train"]["accum_steps"] = accum_steps  # 4: three backwards under no_sync, the fourth all-reduces
    ddp_cfg.write_text(yaml.safe_dump(cfg))
    one = _train([sys.executable, "-m", "acoustic_mlm"], ddp_cfg, data_dirs, tmp_path / "one")
    two = _train(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "acoustic_mlm"],
        ddp_cfg,
        data_dirs,
        tmp_path / "two",
    )
    assert one["step"].tolist() == two["step"].tolist() == [1, 2, 4, 8, 12]
    for col in ["train_loss_cb0", "train_loss_cb7", "valid_loss_cb0", "grad_norm"]:
        diff = (one[col] - two[col]).abs().max()
        assert diff < TOLERANCE_BITS, (col, diff)
    assert one["clip_frac"].tolist() == two["clip_frac"].tolist()


@pytest.mark.slow
def test_one_gradient_all_reduce_and_one_scalar_all_reduce_per_update(ddp_cfg, tmp_path):
    """2 gloo processes, accum_steps 4: per update the gradients are all-reduced once (the hook's
    buckets add up to the gradients' bytes exactly once: DDP's no_sync on the first three
    micro-batches) and one scalar collective (non-finite count, masked frames, the metrics' means:
    K + 4 values) carries the once-per-update check."""
    cfg = yaml.safe_load(ddp_cfg.read_text())
    cfg["train"]["accum_steps"] = 4
    ddp_cfg.write_text(yaml.safe_dump(cfg))
    script = Path(__file__).parents[1] / "ddp_collectives.py"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(ddp_cfg),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    k = cfg["model"]["codebooks"]
    for rank in (0, 1):
        log = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert log["world"] == 2 and log["accum_steps"] == 4 and len(log["grad"]) == 3
        for grads, scalars in zip(log["grad"], log["scalar"]):
            assert sum(grads) == log["grad_bytes"]  # every gradient byte once per update, not 4 times
            assert scalars == [k + 4]
