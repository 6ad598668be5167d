"""A seed's checkpoint.pt: written with its declared keys, read back with weights_only, and every
damage (cut, foreign, a missing key, a non-tensor weight, a pickled object) one ReadError line."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers import read_refused

from acoustic_mlm.artifacts.checkpoint import CHECKPOINT, CHECKPOINT_KEYS, read_checkpoint, write_checkpoint


def _checkpoint() -> dict:
    return {
        "model": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)},
        "model_config": {"norm": "deepnorm", "layers": 2},
        "train_config": {"clip": 1.0},
        "run": {"name": "r"},
        "step": 12,
    }


class Foreign:  # a class a weights_only load must refuse to build
    pass


def test_written_checkpoint_reads_back(tmp_path):
    path = write_checkpoint(tmp_path, _checkpoint())
    assert path == tmp_path / CHECKPOINT and not list(tmp_path.glob(".*"))  # no temporary file left
    back = read_checkpoint(path)
    assert list(back) == list(CHECKPOINT_KEYS) and back["step"] == 12
    assert torch.equal(back["model"]["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    with pytest.raises(ValueError, match="checkpoint.pt's keys"):
        write_checkpoint(tmp_path, {k: v for k, v in _checkpoint().items() if k != "step"})


def test_damaged_checkpoints_are_one_line(tmp_path):
    path = tmp_path / CHECKPOINT
    read_refused(lambda: read_checkpoint(path), path, "a seed's checkpoint not found", "train")
    write_checkpoint(tmp_path, _checkpoint())
    path.write_bytes(path.read_bytes()[:100])
    read_refused(lambda: read_checkpoint(path), path, "not a readable checkpoint")
    torch.save({**_checkpoint(), "model": {"w": Foreign()}}, path)
    read_refused(lambda: read_checkpoint(path), path, "not a readable checkpoint")  # weights_only refuses it
    path.write_bytes(pickle.dumps(_checkpoint(), protocol=2))
    read_refused(lambda: read_checkpoint(path), path, "not a readable checkpoint")
    torch.save({k: v for k, v in _checkpoint().items() if k != "run"}, path)
    read_refused(lambda: read_checkpoint(path), path, "lacks 'run'")
    torch.save({**_checkpoint(), "step": 1.5}, path)
    read_refused(lambda: read_checkpoint(path), path, "'step' is a float, not int")
    torch.save({**_checkpoint(), "model": {"w": [1.0]}}, path)
    read_refused(lambda: read_checkpoint(path), path, "model weight 'w' is not a tensor")
    torch.save([1, 2], path)
    read_refused(lambda: read_checkpoint(path), path, "holds a list")
