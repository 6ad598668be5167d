"""What every command shares: --config, --threads and -v first, the shared options, the step options,
the output paths checked before any work, and one line for an access error."""

import argparse
import errno
from pathlib import Path

import pytest

from acoustic_mlm.cli_options import (
    SHARED,
    Command,
    Steps,
    access_refusal,
    check_outputs,
    command,
    opt,
    torch_threads,
)
from acoustic_mlm.errors import UserError
from acoustic_mlm.kernels import DEFAULT_CONFIG


def _command(threads=False, options=(), **paths) -> Command:
    return Command("x", "one line", "A description.", options, lambda args, cfg: None, threads=threads, **paths)


def _parser(command: Command) -> argparse.ArgumentParser:
    return command.add_parser(argparse.ArgumentParser().add_subparsers())


def test_every_command_opens_with_config_then_threads_where_asked_then_verbose():
    flags = [a.option_strings[-1] for a in _parser(_command(threads=True))._actions]
    assert flags == ["--help", "--config", "--threads", "--verbose"]
    assert [a.option_strings[-1] for a in _parser(_command())._actions] == ["--help", "--config", "--verbose"]
    args = _parser(_command(threads=True)).parse_args([])
    assert (args.config, args.threads, args.verbose) == (DEFAULT_CONFIG, None, False)


def test_the_stages_own_options_follow_the_shared_ones():
    p = _parser(_command(options=("runs_dir", "figures")))
    assert [a.option_strings[-1] for a in p._actions][-2:] == ["--runs-dir", "--out"]
    args = p.parse_args(["--runs-dir", "r"])
    assert (str(args.runs_dir), str(args.out)) == ("r", "results/figures")


def test_shared_options_state_their_defaults():
    for key, option in SHARED.items():
        assert option.flags[0].startswith("--") and "(default: " in option.help, key


def test_an_option_is_a_path_unless_its_type_or_action_says_otherwise():
    p = argparse.ArgumentParser()
    for row in (
        opt("--out", default=Path("o"), help="a path"),
        opt("--n", type=int, help="a count"),
        opt("--name", type=None, help="a string"),
        opt("--check", action="store_true", help="a flag"),
    ):
        row.add(p)
    args = p.parse_args(["--out", "x", "--n", "3", "--name", "y"])
    assert (args.out, args.n, args.name, args.check) == (Path("x"), 3, "y", False)
    assert p.parse_args([]).out == Path("o")


def test_a_declared_command_takes_its_help_and_description_from_its_docstring():
    @command("demo", opt("--out", help="where"), files=("out",))
    def demo(args, cfg):
        """do a thing

        Do the thing at length,
        over two lines.
        """
        return 3

    assert (demo.name, demo.help, demo.files) == ("demo", "do a thing", ("out",))
    assert demo.description == "Do the thing at length,\nover two lines."
    assert demo(argparse.Namespace(), None) == 3  # a command runs its entry
    p = _parser(demo)
    assert "Do the thing at length, over two lines." in p.format_help()  # argparse reflows it


def test_a_command_without_a_description_is_refused():
    def bare(args, cfg):
        """only a line"""

    with pytest.raises(ValueError, match="bare: its docstring must give a one-line help, then a description"):
        command("bare")(bare)


def test_torch_threads_is_the_option_else_train_threads():
    class Cfg:
        class train:
            threads = 3

    assert torch_threads(argparse.Namespace(threads=None), Cfg) == 3
    assert torch_threads(argparse.Namespace(threads=1), Cfg) == 1


def test_step_options_are_exclusive(capsys):
    p = argparse.ArgumentParser()
    Steps("--plan", "plan only", "decode", "merge only").add(p)
    assert p.parse_args(["--shard", "2"]).shard == 2 and not p.parse_args([]).merge
    with pytest.raises(SystemExit) as exit_:
        p.parse_args(["--plan", "--merge"])
    assert exit_.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_check_outputs_refuses_a_path_that_cannot_become_what_it_names(tmp_path):
    file, folder = tmp_path / "f.txt", tmp_path / "d"
    file.write_text("x")
    folder.mkdir()
    command = _command(folders=("out",), files=("out_json",))
    with pytest.raises(UserError, match=r"f.txt: --out names an existing file, not a folder"):
        check_outputs(argparse.Namespace(out=file, out_json=None), command)
    with pytest.raises(UserError, match=r"d: --out-json names an existing folder, not a file"):
        check_outputs(argparse.Namespace(out=None, out_json=folder), command)
    with pytest.raises(UserError, match=r"--out lies under .*f.txt, which is a file, not a folder"):
        check_outputs(argparse.Namespace(out=file / "sub" / "x", out_json=None), command)
    check_outputs(argparse.Namespace(out=folder / "new", out_json=tmp_path / "new.json"), command)
    # an option the command does not declare as an output is not checked
    check_outputs(argparse.Namespace(out=None, out_json=None, runs_dir=file), command)


def test_check_outputs_checks_folders_first_in_name_order(tmp_path):
    file = tmp_path / "f.txt"
    file.write_text("x")
    command = _command(folders=("out", "downloads"), files=("marker",))
    args = argparse.Namespace(out=file, downloads=file, marker=tmp_path)
    with pytest.raises(UserError, match=r"--downloads names"):
        check_outputs(args, command)


def test_access_refusal_names_the_final_path_and_leaves_other_errors_alone():
    denied = PermissionError(errno.EACCES, "Permission denied", "/r/.claims.md.tmp-1-ab")
    assert access_refusal(denied) == (
        "/r/claims.md: permission denied; give this user access to it (or its folder), or name another path"
    )
    assert access_refusal(OSError(errno.EROFS, "ro", "/mnt/x")).startswith("/mnt/x: a read-only file system")
    assert access_refusal(FileNotFoundError(errno.ENOENT, "missing", "x")) is None
