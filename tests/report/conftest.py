"""Fixtures of the report stages' tests."""

import pytest
from helpers import fake_metrics


@pytest.fixture()
def runs_dir(tmp_path, smoke_cfg):
    for i, name in enumerate(smoke_cfg["runs"]):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        fake_metrics([1, 2, 4, 8, 16, 20, 32, 40], end=6.0 - 0.1 * i).to_csv(d / "metrics.csv", index=False)
    return tmp_path / "runs"
