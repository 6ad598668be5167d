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


def test_checkpoint_only_checks_and_records_the_pretrained_checkpoint(smoke_config, calls, tmp_path):
    import json

    from tokenizer_helpers import saved_checkpoint

    from acoustic_mlm import config as C
    from acoustic_mlm.errors import UserError
    from acoustic_mlm.tokenizer import codec
    from acoustic_mlm.utils import file_sha256

    good = saved_checkpoint(codec.build_encodec(6.0, 4).state_dict(), tmp_path)
    m = smoke_config.mapping
    m["tokenizer"].update(mode="pretrained", checkpoint=str(good))
    run_command(tokenize_command, C.from_mapping(m), "--out", str(tmp_path / "codes"), "--checkpoint-only")
    record = json.loads((tmp_path / "codes" / "checkpoint.json").read_text())
    assert record == {"path": str(good), "sha256": file_sha256(good)} and calls == []  # no stage step ran
    with pytest.raises(UserError, match="only pretrained mode has a checkpoint"):
        run_command(tokenize_command, smoke_config, "--out", str(tmp_path / "c2"), "--checkpoint-only")
