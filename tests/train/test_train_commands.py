"""`amlm train`: the run named once, its folder, its threads and its (sweep point's) configuration."""

from pathlib import Path

import pytest
from helpers import run_command

from acoustic_mlm.errors import UserError
from acoustic_mlm.train import loop
from acoustic_mlm.train.train_commands import train_command


@pytest.fixture()
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(loop, "run", lambda *a, **k: seen.append((a, k)))
    return seen


def test_the_run_by_name_or_option_into_its_default_folder(smoke_config, calls):
    arm = next(iter(smoke_config.runs))
    run_command(train_command, smoke_config, arm)
    run_command(
        train_command, smoke_config, "--run", arm, "--threads", "1", "--out", "o", "--prepared", "p", "--codes", "c"
    )
    assert calls == [
        (
            (smoke_config.point(arm), arm, Path("data/prepared"), Path("data/codes"), Path("results/runs") / arm),
            {"threads": smoke_config.train.threads},
        ),
        ((smoke_config.point(arm), arm, Path("p"), Path("c"), Path("o")), {"threads": 1}),
    ]


@pytest.mark.parametrize("argv", [[], ["a", "--run", "a"]])
def test_the_run_is_named_exactly_once(smoke_config, calls, argv):
    with pytest.raises(UserError, match="name the run once"):
        run_command(train_command, smoke_config, *argv)
    assert calls == []


def test_an_unknown_run_is_refused_before_training(smoke_config, tmp_path):
    # the stage resolves the run (a sweep point or an arm) once, in loop.run, before any work
    with pytest.raises(UserError, match="nosuch"):
        run_command(
            train_command, smoke_config, "nosuch", "--out", str(tmp_path / "o"), "--prepared", str(tmp_path / "p")
        )
    assert not (tmp_path / "o").exists()
