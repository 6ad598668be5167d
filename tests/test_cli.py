"""The command line: errors meant for the user are one line with exit status 2; a bug keeps its traceback."""

import pytest

from acoustic_mlm import cli
from acoustic_mlm.errors import UserError


def test_user_error_is_one_line_exit_2(monkeypatch, capsys, root):
    def refuse(args):
        raise UserError("data/raw/x.wav: not audio; remove it")

    monkeypatch.setattr(cli, "dispatch", refuse)
    assert cli.main(["validate", "--config", str(root / "config" / "smoke.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == "amlm validate: error: data/raw/x.wav: not audio; remove it\n"


@pytest.mark.parametrize("bug", [ValueError("shape mismatch"), FileNotFoundError("internal"), RuntimeError("x")])
def test_anything_else_is_a_bug_with_its_traceback(monkeypatch, root, bug):
    def broken(args):
        raise bug

    monkeypatch.setattr(cli, "dispatch", broken)
    with pytest.raises(type(bug)):
        cli.main(["validate", "--config", str(root / "config" / "smoke.yaml")])


def test_every_stage_has_help(capsys):
    for stage in ("fetch", "prepare", "tokenize", "train", "aggregate", "figure", "claims", "compare",
                  "validate", "preflight", "map", "map-figure", "map-claims", "dvc-yaml"):
        with pytest.raises(SystemExit) as exit_:
            cli.main([stage, "--help"])
        assert exit_.value.code == 0 and "--config" in capsys.readouterr().out
