"""Fixtures of the train tests. tiny_cfg: the smoke preset cut to a dozen steps of tiny crops; a file
that trains with other settings defines its own tiny_cfg, which takes precedence over this one."""

import copy

import pytest


@pytest.fixture()
def tiny_cfg(smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(steps=12, warmup_steps=2, log_interval=5, batch_size=2, valid_crops=3, crop_seconds=0.4)
    return cfg
