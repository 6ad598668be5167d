"""`amlm validate`: a line naming the runs, and with --out a marker of the same bytes for every valid file."""

import argparse

import pytest

from acoustic_mlm import config as C
from acoustic_mlm.config.config_commands import validate_command


@pytest.fixture(scope="module")
def cfg(root):
    return C.load(root / "config" / "smoke.yaml")


def _run(cfg, *argv):
    args = validate_command.add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(list(argv))
    return validate_command.entry(args, cfg)


def test_validate_names_the_runs_and_writes_no_marker_unless_asked(cfg, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _run(cfg, "--config", "x.yaml") is None
    assert capsys.readouterr().out == f"x.yaml: valid ({len(cfg.runs)} runs: {', '.join(cfg.runs)})\n"
    assert list(tmp_path.iterdir()) == []


def test_the_marker_holds_the_same_bytes_for_every_valid_file(cfg, tmp_path):
    marker = tmp_path / "results" / "config_check.txt"
    _run(cfg, "--out", str(marker))
    assert marker.read_bytes() == b"the configuration is valid\n"
    assert sorted(p.name for p in marker.parent.iterdir()) == ["config_check.txt"]  # no temporary left
    assert validate_command.files == ("out",)
