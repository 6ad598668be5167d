"""A seed's final model, the train stage's checkpoint.pt: its name, its keys, its writer and its
checked reader. Training writes it (acoustic_mlm.train.loop) beside the seed's metrics.csv and
summary.json; a completed seed is one that has all three (acoustic_mlm.train.state).

    <run>/seeds/seed<S>/checkpoint.pt   a torch.save'd dict, CHECKPOINT_KEYS: `model` (the weights in
                                        fp32: fp16_fairseq's fp32 master weights), `model_config`,
                                        `train_config` and `run` (the sections it was trained with, as
                                        plain mappings) and `step` (the last step: train.steps, or the
                                        step at which the seed diverged)

Read with torch.load(weights_only=True): tensors and plain containers only, never arbitrary
objects (a checkpoint is a file anyone may hand over).
"""

from __future__ import annotations

from pathlib import Path

import torch

from acoustic_mlm.artifacts.checked import ReadError, check_file, rerun_advice
from acoustic_mlm.errors import one_line
from acoustic_mlm.utils import atomic_path

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_KEYS = {"model": dict, "model_config": dict, "train_config": dict, "run": dict, "step": int}


def write_checkpoint(seed_dir: Path, checkpoint: dict) -> Path:
    """A seed's checkpoint.pt, atomically; `checkpoint` holds exactly CHECKPOINT_KEYS (in the order given)."""
    if set(checkpoint) != set(CHECKPOINT_KEYS):
        raise ValueError(f"{CHECKPOINT}'s keys are {', '.join(CHECKPOINT_KEYS)}, not {', '.join(checkpoint)}")
    path = Path(seed_dir) / CHECKPOINT
    with atomic_path(path) as tmp:
        torch.save(checkpoint, tmp)
    return path


def read_checkpoint(path: str | Path) -> dict:
    """A seed's checkpoint.pt on the CPU (weights_only): every CHECKPOINT_KEYS key of its type, the
    model's values tensors; one line naming the file otherwise."""
    path = Path(path)
    check_file(path, "a seed's checkpoint", "train")
    advice = rerun_advice("train")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a cut, edited or foreign file: one line, whatever torch raises
        raise ReadError(f"{path}: not a readable checkpoint ({one_line(exc).splitlines()[0]}); {advice}") from None
    if not isinstance(checkpoint, dict):
        raise ReadError(f"{path}: holds a {type(checkpoint).__name__}, not a checkpoint's mapping; {advice}")
    for key, kind in CHECKPOINT_KEYS.items():
        if key not in checkpoint:
            raise ReadError(f"{path}: lacks '{key}'; {advice}")
        if not isinstance(checkpoint[key], kind) or isinstance(checkpoint[key], bool):
            raise ReadError(f"{path}: '{key}' is a {type(checkpoint[key]).__name__}, not {kind.__name__}; {advice}")
    bad = next((k for k, v in checkpoint["model"].items() if not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise ReadError(f"{path}: model weight {bad!r} is not a tensor; {advice}")
    return checkpoint
