"""`amlm fetch` and `amlm prepare`: each option reaches the stage function it names."""

from pathlib import Path

import pytest
from helpers import run_command

from acoustic_mlm.data import fetch, prepare
from acoustic_mlm.data.data_commands import fetch_command, prepare_command


def test_fetch_writes_into_out_with_its_downloads(monkeypatch, smoke_config):
    calls = []
    monkeypatch.setattr(fetch, "run", lambda *a: calls.append(a))
    run_command(fetch_command, smoke_config)
    run_command(fetch_command, smoke_config, "--out", "o", "--downloads", "d")
    assert calls == [(smoke_config, Path("data/raw"), Path("data/downloads")), (smoke_config, Path("o"), Path("d"))]
    assert fetch_command.folders == ("out", "downloads") and not fetch_command.threads


@pytest.mark.parametrize(
    "argv, called",
    [
        ([], ("run", Path("r"), Path("p"))),
        (["--plan"], ("plan", Path("r"), Path("p"))),
        (["--shard", "3"], ("prepare_shard", Path("r"), Path("p"), 3)),
        (["--merge"], ("merge", Path("p"))),
    ],
)
def test_prepare_runs_the_step_its_option_names(monkeypatch, smoke_config, argv, called):
    calls = []
    for name in ("run", "plan", "prepare_shard", "merge", "remove_archive"):
        monkeypatch.setattr(prepare, name, lambda c, *a, name=name: calls.append((name, *a)) or c)
    run_command(prepare_command, smoke_config, "--raw", "r", "--out", "p", *argv)
    # the merge step, once it has written the manifest, removes the archive (data.remove_archive)
    assert calls == [called] + ([("remove_archive", Path("r"), Path("p"))] if argv == ["--merge"] else [])
