"""Fixtures of the tokenizer tests: two torch threads for every test, and one prepared corpus and its
calibrated codes shared by the files that read them (made once: calibration is the slow part)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizer_helpers import make_prepared, tok_cfg

from acoustic_mlm.tokenizer import stage


@pytest.fixture(autouse=True)
def two_torch_threads():
    """Codes depend on the thread count at float near-ties: compare them at the fixture's 2 threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("prepared"))


@pytest.fixture(scope="session")
def calibrated(prepared, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenized"
    stage.run(tok_cfg(), prepared, out, threads=2)
    return out
