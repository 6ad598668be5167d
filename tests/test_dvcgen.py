"""dvcgen.py: `amlm dvc-yaml --check` refuses a stale file; the file names the configuration relative
to its own folder and is never written outside the repository."""

from helpers import write_sweep_config


def test_dvc_yaml_check_refuses_a_stale_file(root, tmp_path, capsys):
    """After a change of the sweep the file must be generated again: its first stage checks it."""
    from acoustic_mlm import cli

    config, out = tmp_path / "config" / "c.yaml", tmp_path / "dvc.yaml"
    config.parent.mkdir()
    config.write_text((root / "config" / "smoke.yaml").read_text())
    check = ["dvc-yaml", "--config", str(config), "--out", str(out), "--check"]
    assert cli.main(check) == 2  # no file yet
    assert cli.main(check[:-1]) == 0 and cli.main(check) == 0
    assert out.read_text().count("config/c.yaml") > 10  # named relative to the folder of dvc.yaml
    write_sweep_config(root, config)
    capsys.readouterr()
    assert cli.main(check) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not the file generated for it" in err and "amlm dvc-yaml --config" in err
    outside = tmp_path / "elsewhere" / "dvc.yaml"
    outside.parent.mkdir()
    assert cli.main(["dvc-yaml", "--config", str(config), "--out", str(outside)]) == 2
    assert "outside" in capsys.readouterr().err and not outside.exists()

