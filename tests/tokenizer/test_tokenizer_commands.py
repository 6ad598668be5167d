"""`amlm tokenize`: each step option reaches its function, always with tokenizer.threads."""

import logging
from pathlib import Path

import pytest
from helpers import run_command

from acoustic_mlm.tokenizer import stage
from acoustic_mlm.tokenizer.tokenizer_commands import tokenize_command


@pytest.fixture()
def calls(monkeypatch):
    seen = []
    for name in ("run", "fit", "encode_shard", "merge"):
        monkeypatch.setattr(stage, name, lambda c, *a, name=name, **k: seen.append((name, *a, k)))
    return seen


@pytest.mark.parametrize(
    "argv, called",
    [
        ([], ("run", Path("p"), Path("c"))),
        (["--fit"], ("fit", Path("p"), Path("c"))),
        (["--shard", "1"], ("encode_shard", Path("p"), Path("c"), 1)),
    ],
)
def test_each_step_computes_with_tokenizer_threads(smoke_config, calls, argv, called):
    run_command(tokenize_command, smoke_config, "--prepared", "p", "--out", "c", *argv)
    assert calls == [(*called, {"threads": smoke_config.tokenizer.threads})]


def test_merge_takes_no_threads(smoke_config, calls):
    run_command(tokenize_command, smoke_config, "--prepared", "p", "--out", "c", "--merge")
    assert calls == [("merge", Path("p"), Path("c"), {})]


def test_another_thread_count_is_ignored_with_a_warning(smoke_config, calls, caplog):
    other = smoke_config.tokenizer.threads + 1
    with caplog.at_level(logging.WARNING):
        run_command(tokenize_command, smoke_config, "--threads", str(other))
    assert calls == [("run", Path("data/prepared"), Path("data/codes"), {"threads": smoke_config.tokenizer.threads})]
    assert f"--threads {other} ignored" in caplog.text
    caplog.clear()
    run_command(tokenize_command, smoke_config, "--threads", str(smoke_config.tokenizer.threads))
    assert "ignored" not in caplog.text
