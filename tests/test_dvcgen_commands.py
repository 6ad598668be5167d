"""`amlm dvc-yaml`: --check only compares; otherwise the file is written and named."""

import argparse
from pathlib import Path

import pytest

from acoustic_mlm import config as C
from acoustic_mlm import dvcgen
from acoustic_mlm.dvcgen_commands import dvc_yaml_command


@pytest.fixture(scope="module")
def cfg(root):
    return C.load(root / "config" / "smoke.yaml")


def _run(cfg, *argv):
    args = dvc_yaml_command.add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(list(argv))
    return dvc_yaml_command.entry(args, cfg)


def test_check_writes_nothing(monkeypatch, cfg):
    calls = []
    monkeypatch.setattr(dvcgen, "check", lambda *a: calls.append(("check", *a)))
    monkeypatch.setattr(dvcgen, "write", lambda *a: calls.append(("write", *a)))
    _run(cfg, "--config", "c.yaml", "--check")
    assert calls == [("check", cfg, "c.yaml", Path("dvc.yaml"))]


def test_write_names_the_file_written(monkeypatch, cfg, capsys):
    monkeypatch.setattr(dvcgen, "write", lambda c, config, out: Path("w") / out)
    _run(cfg, "--config", "c.yaml", "--out", "d.yaml")
    assert capsys.readouterr().out == "w/d.yaml: the DVC pipeline for c.yaml\n"
    assert dvc_yaml_command.files == ("out",)
