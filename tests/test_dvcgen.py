"""dvcgen.py: `amlm dvc-yaml --check` refuses a stale file; the file names the configuration relative
to its own folder and is never written outside the repository."""

import pytest
from helpers import write_sweep_config

from acoustic_mlm import config as C
from acoustic_mlm import dvcgen
from acoustic_mlm.cli import main
from acoustic_mlm.errors import UserError


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


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.mkdir(), "--out names an existing folder, not a file; name a file"),
        (lambda p: (p / "dvc.yaml").mkdir(parents=True), "--out names an existing folder"),
    ],
)
@pytest.mark.parametrize("check", [False, True])
def test_dvc_yaml_out_naming_a_folder_is_one_line(root, tmp_path, capsys, make, words, check):
    out = tmp_path / "out"
    make(out)
    target = out if out.is_dir() and not (out / "dvc.yaml").exists() else out / "dvc.yaml"
    capsys.readouterr()
    code = main(
        [
            "dvc-yaml",
            "--config",
            str(root / "config" / "smoke.yaml"),
            "--out",
            str(target),
            *(["--check"] if check else []),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"amlm dvc-yaml: error: {target}: ") and words in err, err
    with pytest.raises(UserError, match="--out names an existing folder"):  # the functions refuse it as well
        (dvcgen.check if check else dvcgen.write)(
            C.load(root / "config" / "smoke.yaml"), root / "config" / "smoke.yaml", target
        )


def test_dvc_yaml_out_under_a_file_is_one_line(root, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    code = main(
        ["dvc-yaml", "--config", str(root / "config" / "smoke.yaml"), "--out", str(tmp_path / "a_file" / "dvc.yaml")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "lies under" in err and "which is a file, not a folder" in err and "\n" not in err
