"""Fixtures of the data tests: downloads retry without sleeping; a small synthetic corpus fetched and
prepared once per module (`prepared`)."""

import pytest
from data_helpers import make_cfg
from helpers import make_config

from acoustic_mlm.data import download, fetch, prepare


@pytest.fixture(autouse=True)
def no_retry_sleep(monkeypatch):
    """download.download sleeps 1 s, 2 s, ... between attempts; the local server needs no pause."""
    monkeypatch.setattr(download.time, "sleep", lambda s: None)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    cfg = make_cfg()
    fetch.run(make_config(cfg), root / "raw")
    prepare.run(make_config(cfg), root / "raw", root / "prepared")
    return cfg, root
