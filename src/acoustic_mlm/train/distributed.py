"""Several processes (DDP): this process's rank and the world size from torchrun's environment, and
the process group. How the processes are started is launch.py's."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from acoustic_mlm.errors import UserError

BACKEND_VARIABLE = "AMLM_DIST_BACKEND"  # nccl | gloo: overrides the backend picked by the device


def backend(cuda: bool) -> str:
    """The process group's backend: NCCL on CUDA, gloo otherwise, unless AMLM_DIST_BACKEND names one.
    gloo on CUDA lets several processes share one GPU (NCCL refuses two ranks on the same device), which
    benchmarks/gpu_check.sh uses to run its two-process step on a machine with a single GPU."""
    chosen = os.environ.get(BACKEND_VARIABLE, "").strip().lower()
    if not chosen:
        return "nccl" if cuda else "gloo"
    if chosen not in ("nccl", "gloo"):
        raise UserError(f"{BACKEND_VARIABLE}={chosen!r}: expected nccl or gloo")
    if chosen == "nccl" and not cuda:
        raise UserError(f"{BACKEND_VARIABLE}=nccl needs CUDA, and this run trains on the CPU (use gloo)")
    return chosen


def world_info() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) for a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def init_distributed(device_name: str) -> tuple[int, int]:
    """(rank, world size), this process joined to the process group when there are several (NCCL on
    CUDA, gloo otherwise; `backend`)."""
    rank, world = world_info()
    if world > 1 and not dist.is_initialized():
        cuda = device_name in ("cuda", "auto") and torch.cuda.is_available()
        dist.init_process_group(backend(cuda))
    return rank, world
