"""A small decisive experiment end to end through Snakemake: two budgets of DeepNorm against plain
Post-Norm with the A/A pair, judged by `amlm decide`. It starts from the data of the session's smoke run
(conftest.py: `smoke_run`; helpers.copy_run_data), which is the smoke preset's."""

import json
import sys

import pandas as pd
import pytest
import yaml
from helpers import SMOKE_GROUP, copy_run_data
from test_e2e import _run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.xdist_group(SMOKE_GROUP)
def test_snakemake_trains_the_points_and_decides(smoke_run, tmp_path):
    # The decisive configuration is written over config/smoke.yaml: Snakemake finds the smoke run's data
    # stages up to date (the same config file and data settings) and trains the points only.
    repo = copy_run_data(smoke_run, tmp_path / "repo")
    cfg = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())
    cfg["runs"]["postnorm_clip1"] = {
        "label": "Post-Norm | Gradient Clip=1 (control)",
        "norm": "post",
        "attention": "softmax",
        "clip": 1.0,
        "seeds": [1],
    }
    cfg["sweep"] = [
        {"grid": {"train.steps": [20, 40], "seeds": [1, 2]}, "arms": ["postnorm_deepnorm_clip1", "postnorm_clip1"]},
        {"grid": {"train.steps": [20], "seeds": [1, 2]}, "arms": ["prenorm_clip1", "prenorm_attnrelax_clip1"]},
    ]
    (repo / "config" / "smoke.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    _run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config/smoke.yaml"], repo)

    out = repo / "results" / "decisive"
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 12 and set(runs["arm"]) == {"deepnorm", "postnorm", "clip1", "pb_relax"}
    assert set(runs["steps"]) == {20, 40} and runs["plateau"].between(5, 10.1).all()
    # every run's settings came from its own summary.json, which records them
    summary = json.loads((repo / "results" / "runs" / "postnorm_clip1__steps-40" / "summary.json").read_text())
    assert summary["settings"]["train.steps"] == 40 and summary["cpu_kernels"]["pinned"]
    result = json.loads((out / "decisive.json").read_text())
    assert [p["id"] for p in result["promises"]] == ["deepnorm", "clipping", "pb_relax_arithmetic", "pb_relax_training"]
    deepnorm = result["promises"][0]
    assert [r["steps"] for r in deepnorm["rows"]] == [20, 40] and all(r["aa"] is not None for r in deepnorm["rows"])
    assert deepnorm["verdict"] in ("supported", "not supported", "inconclusive")
    assert result["promises"][1]["verdict"] == "inconclusive"  # no clip-10 arm: nothing to compare
    assert "## deepnorm" in (out / "decisive.md").read_text()
