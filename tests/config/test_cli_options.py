"""What every command shares: --config, --threads and -v first, the shared options, the step options,
the output paths checked before any work, and one line for an access error."""

import argparse
import errno
from pathlib import Path

import pytest

from acoustic_mlm.config.cli_options import (
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


def test_every_command_opens_with_config_then_threads_where_asked_then_verbose_and_quiet():
    flags = [a.option_strings[-1] for a in _parser(_command(threads=True))._actions]
    assert flags == ["--help", "--config", "--threads", "--verbose", "--quiet"]
    shared = ["--help", "--config", "--verbose", "--quiet"]
    assert [a.option_strings[-1] for a in _parser(_command())._actions] == shared
    args = _parser(_command(threads=True)).parse_args([])
    assert (args.config, args.threads, args.verbose, args.quiet) == (DEFAULT_CONFIG, None, False, False)
    assert _parser(_command()).parse_args(["-q"]).quiet is True


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


# ----------------------------------------------------------------------------- values: the same rule as the file's


def _run(argv, root, capsys) -> tuple[int, str]:
    from acoustic_mlm import cli

    try:
        code = cli.main([*argv, "--config", str(root / "config" / "smoke.yaml")])
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["train", "--threads", "1025", "prenorm_clip1"],
            "--threads 1025 (it stands for 'train.threads'): 1025 is more",
        ),
        (["train", "--threads", "0", "prenorm_clip1"], "--threads 0 (it stands for 'train.threads'): 0 is less than"),
        (["train", "--threads", "-2", "prenorm_clip1"], "-2 is less than the minimum of 1"),
        (["tokenize", "--threads", "0"], "(it stands for 'tokenizer.threads')"),
        (["preflight", "--nodes", "0"], "(it stands for 'train.nodes')"),
        (["preflight", "--corpus-hours", "-1"], "--corpus-hours -1.0: -1.0 is less than or equal to the minimum of 0"),
        (["preflight", "--utilisation", "1.5"], "--utilisation 1.5: 1.5 is greater than the maximum of 1"),
        (["preflight", "--peak-tflops", "nan"], "--peak-tflops nan: nan is not a finite number"),
        (["verify", "--tolerance", "-1"], "--tolerance -1.0: -1.0 is less than the minimum of 0"),
        (["verify", "--record", "r", "--until-step", "5", "--late-tolerance", "nan"], "nan is not a finite number"),
        (["verify", "--record", "r", "--until-step", "0"], "--until-step 0: 0 is less than the minimum of 1"),
        (["status", "--stale-after", "0"], "--stale-after 0.0: 0.0 is less than or equal to the minimum of 0"),
        (["verify", "--until-step", "5"], "--until-step means something only with --record; add --record"),
        (
            ["verify", "--record", "r", "--late-tolerance", "0.1"],
            "--late-tolerance means something only with --until-step",
        ),
        (["verify", "--record", "r", "--native-tolerance", "0.1"], "--native-tolerance means something only with"),
        (["train", "--out", "", "prenorm_clip1"], "argument --out: an empty path (an unset shell variable?)"),
        (["train", "--run", ""], "argument --run: an empty value (an unset shell variable?)"),
        (["train", ""], "argument RUN: an empty value"),
        (["aggregate", "--runs-dir", ""], "argument --runs-dir: an empty path"),
        (["status", "--run", "x"], "unrecognized arguments: --run x"),  # never completed to --runs-dir
        (["train", "--thr", "2", "prenorm_clip1"], "unrecognized arguments: --thr"),
        (["preflight", "--corpus", "1"], "unrecognized arguments: --corpus"),
    ],
)
def test_a_bad_command_line_value_is_one_line_exit_2_before_any_work(root, capsys, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    code, err = _run(argv, root, capsys)
    assert code == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written, least of all a run's files in the working folder


@pytest.mark.parametrize("value, taken", [(-2, False), (0, False), (1, True), (1024, True), (1025, False)])
def test_threads_on_the_command_line_meet_the_files_rule(smoke_cfg, value, taken):
    from acoustic_mlm import config as C
    from acoustic_mlm.config.cli_options import THREADS, value_problem

    smoke_cfg["train"]["threads"] = value
    try:
        C.validate(smoke_cfg, "c.yaml")
        file_taken = True
    except C.ConfigError:
        file_taken = False
    assert file_taken is taken
    assert (value_problem(THREADS.rule, value) is None) is taken


def test_every_parser_refuses_abbreviations():
    from acoustic_mlm import cli

    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert not parser.allow_abbrev
    assert sub.choices and all(not p.allow_abbrev for p in sub.choices.values())


def test_a_value_within_its_rule_is_taken(root, tmp_path):
    from acoustic_mlm import cli

    args = cli.build_parser().parse_args(["preflight", "--corpus-hours", "0.5", "--utilisation", "1", "--nodes", "2"])
    from acoustic_mlm.config.cli_options import check_values

    check_values(args, cli.COMMANDS["preflight"])  # no refusal
    args = cli.build_parser().parse_args(["verify", "--record", "r", "--until-step", "3", "--late-tolerance", "0"])
    check_values(args, cli.COMMANDS["verify"])
