"""GPU assignment on a multi-GPU host, with a simulated device count (no GPU needed)."""

import subprocess
import sys
import threading
import time

import pytest
import torch

from acoustic_mlm import devices
from acoustic_mlm.devices import claim_gpu
from acoustic_mlm.errors import UserError


def test_four_jobs_get_four_distinct_gpus_and_a_fifth_waits(tmp_path):
    claims = [claim_gpu(4, tmp_path) for _ in range(4)]
    assert sorted(c.index for c in claims) == [0, 1, 2, 3]
    with pytest.raises(TimeoutError):
        claim_gpu(4, tmp_path, poll_s=0.05, timeout_s=0.2)

    got = []
    waiter = threading.Thread(target=lambda: got.append(claim_gpu(4, tmp_path, poll_s=0.05, timeout_s=10)))
    waiter.start()
    time.sleep(0.2)
    assert not got  # still waiting
    claims[2].release()
    waiter.join(5)
    assert got and got[0].index == 2


@pytest.mark.slow
def test_a_killed_job_frees_its_gpu(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from acoustic_mlm.devices import claim_gpu; "
            f"c = claim_gpu(2, {str(tmp_path)!r}); print(c.index, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "0"
    assert claim_gpu(2, tmp_path).index == 1  # 0 is held by the other process
    holder.kill()
    holder.wait()
    assert claim_gpu(2, tmp_path).index == 0  # the kernel released the dead job's lock


def test_pick_device_assigns_distinct_gpus_with_a_simulated_count(monkeypatch, tmp_path):
    monkeypatch.setenv("AMLM_GPU_LOCK_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    held = claim_gpu(4, tmp_path)  # another job already runs on GPU 0
    monkeypatch.setattr(devices, "_GPU_CLAIM", None)
    assert devices.pick_device("cuda") == torch.device("cuda", 1)
    assert devices.pick_device("cuda") == torch.device("cuda", 1)  # the same claim for the whole run
    held.release()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(devices, "_GPU_CLAIM", None)
    assert devices.pick_device("cuda") == torch.device("cuda", 0)  # a scheduler gave us one GPU


def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="torch sees no CUDA device"):
        devices.pick_device("cuda")
    with pytest.raises(UserError, match="^'tokenizer.device' is cuda but torch sees no CUDA device"):
        devices.pick_device("cuda", "tokenizer.device")
    assert devices.pick_device("auto").type == "cpu"
