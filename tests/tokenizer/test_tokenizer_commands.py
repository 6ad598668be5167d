"""`amlm tokenize`: each step option reaches its function, always with tokenizer.threads."""

import argparse
import logging
from pathlib import Path

import pytest

from acoustic_mlm import config as C
from acoustic_mlm.tokenizer import stage
from acoustic_mlm.tokenizer.tokenizer_commands import tokenize_command


@pytest.fixture(scope="module")
def cfg(root):
    return C.load(root / "config" / "smoke.yaml")


@pytest.fixture()
def calls(monkeypatch):
    seen = []
    for name in ("run", "fit", "encode_shard", "merge"):
        monkeypatch.setattr(stage, name, lambda c, *a, name=name, **k: seen.append((name, *a, k)))
    return seen


def _run(cfg, *argv):
    args = tokenize_command.add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(list(argv))
    return tokenize_command.entry(args, cfg)


@pytest.mark.parametrize(
    "argv, called",
    [
        ([], ("run", Path("p"), Path("c"))),
        (["--fit"], ("fit", Path("p"), Path("c"))),
        (["--shard", "1"], ("encode_shard", Path("p"), Path("c"), 1)),
    ],
)
def test_each_step_computes_with_tokenizer_threads(cfg, calls, argv, called):
    _run(cfg, "--prepared", "p", "--out", "c", *argv)
    assert calls == [(*called, {"threads": cfg.tokenizer.threads})]


def test_merge_takes_no_threads(cfg, calls):
    _run(cfg, "--prepared", "p", "--out", "c", "--merge")
    assert calls == [("merge", Path("p"), Path("c"), {})]


def test_another_thread_count_is_ignored_with_a_warning(cfg, calls, caplog):
    other = cfg.tokenizer.threads + 1
    with caplog.at_level(logging.WARNING):
        _run(cfg, "--threads", str(other))
    assert calls == [("run", Path("data/prepared"), Path("data/codes"), {"threads": cfg.tokenizer.threads})]
    assert f"--threads {other} ignored" in caplog.text
    caplog.clear()
    _run(cfg, "--threads", str(cfg.tokenizer.threads))
    assert "ignored" not in caplog.text
