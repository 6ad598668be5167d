"""One GPU per job (training, tokenization) on a multi-GPU host: `pick_device`.

Snakemake's `--resources gpu=N` caps how many GPU jobs run at once but assigns no device:
every job would use cuda:0. Each job therefore claims the first free GPU with an exclusive
`flock` on a per-GPU lock file. The kernel drops the lock when the process ends, even on
SIGKILL, so a killed job never leaves a GPU claimed. Under SLURM (or any scheduler that sets
CUDA_VISIBLE_DEVICES to one device) there is one visible device and nothing to claim.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

import torch

from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import log

LOCK_DIR_ENV = "AMLM_GPU_LOCK_DIR"


def lock_dir() -> Path:
    """Per host (the temp folder), overridable with $AMLM_GPU_LOCK_DIR."""
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "acoustic-mlm-gpu-locks")


class GpuClaim:
    """A claimed GPU index; keep the object alive for as long as the GPU is used."""

    def __init__(self, index: int, handle):
        self.index, self._handle = index, handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def claim_gpu(
    n_devices: int, folder: Path | None = None, poll_s: float = 2.0, timeout_s: float | None = None
) -> GpuClaim:
    """Claim the first GPU among `n_devices` that no other process holds; wait while all are held."""
    folder = Path(folder) if folder is not None else lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    start, warned = time.monotonic(), False
    while True:
        for i in range(n_devices):
            handle = open(folder / f"gpu{i}.lock", "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            return GpuClaim(i, handle)
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(f"all {n_devices} GPUs stayed claimed for {timeout_s:.0f} s (locks in {folder})")
        if not warned:
            log.info("all %d GPUs are claimed by other jobs (locks in %s); waiting", n_devices, folder)
            warned = True
        time.sleep(poll_s)


_GPU_CLAIM = None  # held for the life of the process


def pick_device(name: str, key: str = "train.device") -> torch.device:
    """cpu, or one GPU: under torchrun the process's local rank; with several GPUs visible, the
    first one no other job has claimed. `name`: cpu | cuda | auto, the value of config `key`."""
    global _GPU_CLAIM
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"'{key}' is cuda but torch sees no CUDA device")
    n = torch.cuda.device_count()
    if torch.distributed.is_available() and torch.distributed.is_initialized():  # torchrun: one process per GPU
        local = int(os.environ.get("LOCAL_RANK", 0)) % n  # more processes than GPUs share them (gloo)
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    if n == 1:
        return torch.device("cuda", 0)
    if _GPU_CLAIM is None:
        _GPU_CLAIM = claim_gpu(n)
        log.info("claimed GPU %d of %d", _GPU_CLAIM.index, n)
    torch.cuda.set_device(_GPU_CLAIM.index)
    return torch.device("cuda", _GPU_CLAIM.index)
