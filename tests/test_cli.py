"""The command line: errors meant for the user are one line with exit status 2; a bug keeps its traceback."""

import argparse
import re

import pytest
import yaml
from helpers import ROOT

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
def test_every_subcommand_has_help_with_the_config_option_where_it_reads_one(capsys, stage):
    """Every stage reads --config but `experiment`, whose round names its own base preset."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([stage, "--help"])
    assert exit_.value.code == 0 and ("--config" in capsys.readouterr().out) == (stage != "experiment")


def test_an_experiment_runs_from_a_folder_with_no_config_folder(tmp_path, monkeypatch, capsys):
    """`amlm experiment` reads no configuration of its own: from any folder, it plans the round it is given
    (its base preset named by the declaration, here by its full path)."""
    doc = yaml.safe_load((ROOT / "config" / "experiments" / "example.yaml").read_text())
    doc |= {"base": str(ROOT / doc["base"]), "tables": str(tmp_path / "tables")}
    doc["reference"]["tables"] = str(ROOT / doc["reference"]["tables"])
    (tmp_path / "example.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["experiment", "plan", "example.yaml"]) == 0
    assert "6 runs planned" in capsys.readouterr().out


def test_the_module_table_lists_every_subcommand_in_the_parsers_order():
    """The module docstring's table: one line per subcommand, none missing."""
    assert re.findall(r"^    amlm (\S+)", cli.__doc__, re.M) == _subcommands()


def test_amlm_help_lists_each_subcommand_once(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    listed = re.findall(r"^    (\S+)", out, re.M)  # argparse's list of the STAGE choices
    assert listed == _subcommands()
    assert "amlm fetch" not in out  # the docstring's table is not repeated as the epilog
    assert out.rstrip().endswith("before doing any work.")


def _stages() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_help_text_states_its_default():
    """An option with a default (a path, a number, a choice) says it in its help, as printed."""
    missing = []
    for name, parser in _stages().items():
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if action.help in (None, argparse.SUPPRESS) or action.default in (None, False, argparse.SUPPRESS):
                continue
            d = action.default
            shown = {str(d)} | ({str(int(d))} if isinstance(d, float) and d.is_integer() else set())
            if not any(f"(default: {v})" in text or f"default {v}" in text for v in shown):
                missing.append(f"{name} {'/'.join(action.option_strings)}: {action.default}")
    assert not missing, missing


def test_threads_is_offered_only_where_it_sets_torchs_threads(capsys):
    offered = {name for name, p in _stages().items() if "--threads" in p.format_help()}
    assert offered == {"train", "preflight"}
    # tokenize computes with tokenizer.threads: the rules' --threads (that same value) is accepted, not offered
    assert cli.build_parser().parse_args(["tokenize", "--threads", "2"]).threads == 2


def test_help_texts_print_percent_signs_once(capsys):
    for name, parser in _stages().items():
        assert "%%" not in parser.format_help(), name
    assert "stable by 40% of the x-range" in " ".join(_stages()["claims"].format_help().split())


@pytest.mark.parametrize(
    "exc, shown",
    [
        (
            PermissionError(13, "Permission denied", "results/runs/x/metrics.csv"),
            "results/runs/x/metrics.csv: permission denied",
        ),
        (
            PermissionError(13, "Permission denied", "/r/results/.loss_curves.csv.tmp-77-ab12cd"),
            "/r/results/loss_curves.csv: permission denied",
        ),
        (PermissionError(1, "Operation not permitted", "/r/results/figures"), "/r/results/figures: permission denied"),
        (OSError(30, "Read-only file system", "/mnt/ro/results/.decisive.tmp-5-x/runs.csv"), "a read-only file system"),
        (PermissionError(13, "Permission denied"), "a file or folder: permission denied"),
    ],
)
def test_an_access_error_of_any_stage_is_one_line_exit_2(monkeypatch, capsys, root, exc, shown):
    def denied(args):
        raise exc

    monkeypatch.setattr(cli, "dispatch", denied)
    assert cli.main(["aggregate", "--config", str(root / "config" / "smoke.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("amlm aggregate: error: ") and shown in err and err.count("\n") == 1, err
    assert ".tmp-" not in err


def test_the_cli_refuses_a_config_that_differs_from_the_one_the_kernels_were_pinned_for(monkeypatch, capsys, root):
    from acoustic_mlm import kernels

    monkeypatch.setattr(kernels, "READ_CONFIG", "config/other.yaml")
    assert cli.main(["validate", "--config", str(root / "config" / "smoke.yaml")]) == 2
    err = capsys.readouterr().err
    assert "the CPU kernels were chosen for config/other.yaml" in err and err.count("\n") == 1
    monkeypatch.setattr(kernels, "READ_CONFIG", str(root / "config" / "smoke.yaml"))
    assert cli.main(["validate", "--config", str(root / "config" / "smoke.yaml")]) == 0
