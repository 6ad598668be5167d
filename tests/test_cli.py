"""The command line: errors meant for the user are one line with exit status 2; a bug keeps its traceback."""

import argparse
import re

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


def _subcommands() -> list[str]:
    """The subcommands as the parser defines them, in its order."""
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


@pytest.mark.parametrize("stage", _subcommands())
def test_every_subcommand_has_help_with_the_config_option(capsys, stage):
    with pytest.raises(SystemExit) as exit_:
        cli.main([stage, "--help"])
    assert exit_.value.code == 0 and "--config" in capsys.readouterr().out


def test_the_help_lists_every_subcommand_in_the_parsers_order():
    """`amlm --help` ends with the module docstring's table: one line per subcommand, none missing."""
    assert re.findall(r"^    amlm (\S+)", cli.__doc__, re.M) == _subcommands()
