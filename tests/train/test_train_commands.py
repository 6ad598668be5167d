"""`amlm train`: the run named once, its folder, its threads and its (sweep point's) configuration."""

import argparse
from pathlib import Path

import pytest

from acoustic_mlm import config as C
from acoustic_mlm.errors import UserError
from acoustic_mlm.train import loop
from acoustic_mlm.train.train_commands import train_command


@pytest.fixture(scope="module")
def cfg(root):
    return C.load(root / "config" / "smoke.yaml")


@pytest.fixture()
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(loop, "run", lambda *a, **k: seen.append((a, k)))
    return seen


def _run(cfg, *argv):
    args = train_command.add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(list(argv))
    return train_command.entry(args, cfg)


def test_the_run_by_name_or_option_into_its_default_folder(cfg, calls):
    arm = next(iter(cfg.runs))
    _run(cfg, arm)
    _run(cfg, "--run", arm, "--threads", "1", "--out", "o", "--prepared", "p", "--codes", "c")
    assert calls == [
        (
            (cfg.point(arm), arm, Path("data/prepared"), Path("data/codes"), Path("results/runs") / arm),
            {"threads": cfg.train.threads},
        ),
        ((cfg.point(arm), arm, Path("p"), Path("c"), Path("o")), {"threads": 1}),
    ]


@pytest.mark.parametrize("argv", [[], ["a", "--run", "a"]])
def test_the_run_is_named_exactly_once(cfg, calls, argv):
    with pytest.raises(UserError, match="name the run once"):
        _run(cfg, *argv)
    assert calls == []


def test_an_unknown_run_is_refused_before_training(cfg, tmp_path):
    # the stage resolves the run (a sweep point or an arm) once, in loop.run, before any work
    with pytest.raises(UserError, match="nosuch"):
        _run(cfg, "nosuch", "--out", str(tmp_path / "o"), "--prepared", str(tmp_path / "p"))
    assert not (tmp_path / "o").exists()
