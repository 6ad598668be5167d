"""`amlm validate`: a line naming the runs, and with --out a marker of the same bytes for every valid file."""

from helpers import run_command

from acoustic_mlm.config.config_commands import validate_command


def test_validate_names_the_runs_and_writes_no_marker_unless_asked(smoke_config, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_command(validate_command, smoke_config, "--config", "x.yaml") is None
    assert capsys.readouterr().out == f"x.yaml: valid ({len(smoke_config.runs)} runs: {', '.join(smoke_config.runs)})\n"
    assert list(tmp_path.iterdir()) == []


def test_the_marker_holds_the_same_bytes_for_every_valid_file(smoke_config, tmp_path):
    marker = tmp_path / "results" / "config_check.txt"
    run_command(validate_command, smoke_config, "--out", str(marker))
    assert marker.read_bytes() == b"the configuration is valid\n"
    assert sorted(p.name for p in marker.parent.iterdir()) == ["config_check.txt"]  # no temporary left
    assert validate_command.files == ("out",)
