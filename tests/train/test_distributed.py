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
