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


def test_a_config_path_dvc_cannot_parse_is_refused_before_dvc_yaml_is_replaced(tmp_path, monkeypatch, capsys):
    """`amlm dvc-yaml --config` with a file named a:b.yaml wrote a dvc.yaml DVC could not parse, over a working one."""
    import shutil

    from acoustic_mlm import cli

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    for name in ("a:b.yaml", "x${y}.yaml", "good.yaml"):
        shutil.copy(root / "config" / "smoke.yaml", tmp_path / "config" / name)
    assert cli.main(["dvc-yaml", "--config", "config/good.yaml"]) == 0
    working = (tmp_path / "dvc.yaml").read_bytes()
    capsys.readouterr()
    for name, mark in (("a:b.yaml", "':'"), ("x${y}.yaml", "'${'")):
        for extra in ([], ["--check"]):
            assert cli.main(["dvc-yaml", "--config", f"config/{name}", *extra]) == 2
            err = capsys.readouterr().err
            said = f"amlm dvc-yaml: error: config/{name}: its path in dvc.yaml (config/{name}) holds {mark}"
            assert err.startswith(said)
            assert err.count("\n") == 1
            assert (tmp_path / "dvc.yaml").read_bytes() == working
