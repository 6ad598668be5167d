"""`amlm dvc-yaml`: --check only compares; otherwise the file is written and named."""

from pathlib import Path

from helpers import run_command

from acoustic_mlm import dvcgen
from acoustic_mlm.dvcgen_commands import dvc_yaml_command


def test_check_writes_nothing(monkeypatch, smoke_config):
    calls = []
    monkeypatch.setattr(dvcgen, "check", lambda *a: calls.append(("check", *a)))
    monkeypatch.setattr(dvcgen, "write", lambda *a: calls.append(("write", *a)))
    run_command(dvc_yaml_command, smoke_config, "--config", "c.yaml", "--check")
    assert calls == [("check", smoke_config, "c.yaml", Path("dvc.yaml"))]


def test_write_names_the_file_written(monkeypatch, smoke_config, capsys):
    monkeypatch.setattr(dvcgen, "write", lambda c, config, out: Path("w") / out)
    run_command(dvc_yaml_command, smoke_config, "--config", "c.yaml", "--out", "d.yaml")
    assert capsys.readouterr().out == "w/d.yaml: the DVC pipeline for c.yaml\n"
    assert dvc_yaml_command.files == ("out",)
