import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture()
def smoke_cfg() -> dict:
    """The smoke preset as a fresh, mutable dict."""
    return copy.deepcopy(yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text()))
