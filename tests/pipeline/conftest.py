"""Fixtures of the pipeline tests: the smoke pipeline, run once per session for every test that reads
it or continues from it.

`smoke_run` is the smoke preset through Snakemake in a fresh copy of the repository, as the default
tier's pipeline test runs it (`snakemake --cores 2 --configfile config/smoke.yaml`). No test changes it:
one that continues from it (kills and reruns a job, edits the config, runs DVC on the finished run)
works on its own copy, `helpers.copy_run(smoke_run, dest)`. The tests that use it are marked
`pytest.mark.xdist_group(helpers.SMOKE_GROUP)`: under `pytest -n 2 --dist loadgroup` they run on one
worker, and the pipeline runs once (docs/testing.md).
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import copy_repo, tool_env


@pytest.fixture(scope="session")
def smoke_run(root, tmp_path_factory) -> Path:
    """The smoke pipeline through Snakemake in a fresh copy of the repository, run once per session (per
    xdist worker): read it, or copy it with `helpers.copy_run` to change it."""
    repo = copy_repo(root, tmp_path_factory.mktemp("smoke_run") / "repo")
    env = tool_env(pythonpath=None)  # the jobs find the package in the copy's src/ (common.smk)
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config/smoke.yaml"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    print(f"snakemake smoke preset: {time.monotonic() - t0:.0f} s")
    return repo
