"""Fixtures of the data tests: downloads retry without sleeping."""

import pytest

from acoustic_mlm.data import download


@pytest.fixture(autouse=True)
def no_retry_sleep(monkeypatch):
    """download.download sleeps 1 s, 2 s, ... between attempts; the local server needs no pause."""
    monkeypatch.setattr(download.time, "sleep", lambda s: None)
