"""`amlm fetch` and `amlm prepare`: each option reaches the stage function it names."""

import argparse
from pathlib import Path

import pytest

from acoustic_mlm import config as C
from acoustic_mlm.data import fetch, prepare
from acoustic_mlm.data.data_commands import fetch_command, prepare_command


@pytest.fixture(scope="module")
def cfg(root):
    return C.load(root / "config" / "smoke.yaml")


def _run(command, cfg, *argv):
    args = command.add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(list(argv))
    return command.entry(args, cfg)


def test_fetch_writes_into_out_with_its_downloads(monkeypatch, cfg):
    calls = []
    monkeypatch.setattr(fetch, "run", lambda *a: calls.append(a))
    _run(fetch_command, cfg)
    _run(fetch_command, cfg, "--out", "o", "--downloads", "d")
    assert calls == [(cfg, Path("data/raw"), Path("data/downloads")), (cfg, Path("o"), Path("d"))]
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
def test_prepare_runs_the_step_its_option_names(monkeypatch, cfg, argv, called):
    calls = []
    for name in ("run", "plan", "prepare_shard", "merge"):
        monkeypatch.setattr(prepare, name, lambda c, *a, name=name: calls.append((name, *a)) or c)
    _run(prepare_command, cfg, "--raw", "r", "--out", "p", *argv)
    assert calls == [called]
