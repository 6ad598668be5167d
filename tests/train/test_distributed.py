"""This process's place among several: rank and world size from torchrun's environment, and no
process group for a single process."""

import pytest
import torch.distributed as dist

from acoustic_mlm.train.distributed import init_distributed, world_info


@pytest.fixture()
def torchrun_env(monkeypatch):
    """No variable of torchrun's set, whatever the shell running the tests has."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_plain_process_is_rank_0_of_1(torchrun_env):
    assert world_info() == (0, 1)


def test_rank_and_world_size_come_from_torchruns_variables(torchrun_env):
    torchrun_env.setenv("RANK", "3")
    torchrun_env.setenv("WORLD_SIZE", "8")
    assert world_info() == (3, 8)


def test_a_single_process_joins_no_process_group(torchrun_env):
    for device in ("cpu", "auto", "cuda"):
        assert init_distributed(device) == (0, 1)
    assert not dist.is_initialized()


def test_one_process_of_a_world_of_one_needs_no_rendezvous(torchrun_env):
    """torchrun with --nproc-per-node 1 sets the variables: still one process, no MASTER_ADDR needed."""
    torchrun_env.setenv("RANK", "0")
    torchrun_env.setenv("WORLD_SIZE", "1")
    assert init_distributed("cpu") == (0, 1) and not dist.is_initialized()


def test_the_backend_follows_the_device_unless_amlm_dist_backend_names_one(torchrun_env):
    from acoustic_mlm.errors import UserError
    from acoustic_mlm.train.distributed import backend

    torchrun_env.delenv("AMLM_DIST_BACKEND", raising=False)
    assert (backend(cuda=True), backend(cuda=False)) == ("nccl", "gloo")
    torchrun_env.setenv("AMLM_DIST_BACKEND", "gloo")  # several processes on one GPU (benchmarks/gpu_check.sh)
    assert (backend(cuda=True), backend(cuda=False)) == ("gloo", "gloo")
    torchrun_env.setenv("AMLM_DIST_BACKEND", " NCCL ")
    assert backend(cuda=True) == "nccl"
    with pytest.raises(UserError, match="AMLM_DIST_BACKEND=nccl needs CUDA"):
        backend(cuda=False)
    torchrun_env.setenv("AMLM_DIST_BACKEND", "mpi")
    with pytest.raises(UserError, match="AMLM_DIST_BACKEND='mpi': expected nccl or gloo"):
        backend(cuda=True)
