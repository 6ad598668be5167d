"""Several processes (DDP): this process's rank and the world size from torchrun's environment, and
the process group. How the processes are started is launch.py's."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world_info() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) for a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def init_distributed(device_name: str) -> tuple[int, int]:
    """(rank, world size), this process joined to the process group when there are several (NCCL on
    CUDA, gloo otherwise)."""
    rank, world = world_info()
    if world > 1 and not dist.is_initialized():
        cuda = device_name in ("cuda", "auto") and torch.cuda.is_available()
        dist.init_process_group("nccl" if cuda else "gloo")
    return rank, world
