"""What lets a seed resume: its fingerprint, the checksummed states (the newest KEEP_STATES kept,
damaged ones skipped) and the RNG state they hold."""

import copy

import pytest
import torch

from acoustic_mlm.errors import UserError
from acoustic_mlm.train.state import (
    KEEP_STATES,
    STATE_KEYS,
    fingerprint,
    load_latest_state,
    rng_state,
    save_state,
    set_rng_state,
    state_problem,
)


def test_only_unreadable_states_start_afresh(tmp_path):
    (tmp_path / "step-000000010.pt").write_bytes(b"not a checkpoint")
    assert load_latest_state(tmp_path, {"a": 1}) is None


def test_only_the_newest_states_are_kept_and_the_newest_intact_one_is_loaded(tmp_path):
    for step in (10, 20, 30):
        save_state(tmp_path, step, {"fingerprint": {"a": 1}, "step": step, "w": torch.full((3,), float(step))})
    kept = sorted(p.name for p in tmp_path.glob("step-*.pt"))
    assert len(kept) == KEEP_STATES and kept[-1] == "step-000000030.pt"
    assert (tmp_path / "step-000000030.pt.sha256").read_text().split()[1] == "step-000000030.pt"  # sha256sum's format
    assert load_latest_state(tmp_path, {"a": 1})["step"] == 30
    (tmp_path / "step-000000030.pt").write_bytes(b"flipped")  # damaged: the one before it is used
    state = load_latest_state(tmp_path, {"a": 1})
    assert state["step"] == 20 and torch.equal(state["w"], torch.full((3,), 20.0))


def test_a_state_of_other_settings_is_refused_naming_the_folder(tmp_path):
    save_state(tmp_path, 5, {"fingerprint": {"a": 1}, "step": 5})
    with pytest.raises(UserError, match=f"resumable state of a run with other settings; delete {tmp_path}"):
        load_latest_state(tmp_path, {"a": 2})


def test_the_fingerprint_follows_the_settings_and_the_processes_but_not_the_other_seeds(smoke_cfg):
    fp = fingerprint(smoke_cfg, "prenorm_clip1", 1)
    assert fp == fingerprint(copy.deepcopy(smoke_cfg), "prenorm_clip1", 1) and fp["processes"] == 1
    assert fingerprint(smoke_cfg, "prenorm_clip1", 2) != fp
    seeds = copy.deepcopy(smoke_cfg)
    seeds["runs"]["prenorm_clip1"]["seeds"] = [1, 2, 3]
    assert fingerprint(seeds, "prenorm_clip1", 1) == fp
    lr = copy.deepcopy(smoke_cfg)
    lr["train"]["lr"] *= 2
    assert fingerprint(lr, "prenorm_clip1", 1) != fp


def test_the_rng_state_puts_the_cpu_generator_back():
    torch.manual_seed(0)
    st = rng_state(torch.device("cpu"))
    first = torch.rand(4)
    set_rng_state(st, torch.device("cpu"))
    assert torch.equal(torch.rand(4), first) and set(st) == {"cpu"}


GOOD = {"fingerprint": {"a": 1}, "step": 10, "w": torch.zeros(2)}


@pytest.mark.parametrize(
    "content, why",
    [
        ([1, 2, 3], "holds a list, not a resumable state"),
        (torch.ones(3), "holds a Tensor, not a resumable state"),
        ({"step": 20, "w": torch.zeros(2)}, "lacks 'fingerprint'"),
        ({"fingerprint": [1], "step": 20}, "'fingerprint' holds a list, not dict"),
        ({"fingerprint": {"a": 1}, "w": torch.zeros(2)}, "lacks 'step'"),
        ({"fingerprint": {"a": 1}, "step": 20.0, "w": torch.zeros(2)}, "'step' holds a float, not int"),
        ({"fingerprint": {"a": 1}, "step": True, "w": torch.zeros(2)}, "'step' holds a bool, not int"),
    ],
)
def test_a_checksummed_file_that_is_not_a_state_is_skipped_with_a_warning(tmp_path, caplog, content, why):
    save_state(tmp_path, 10, GOOD)
    save_state(tmp_path, 20, content)  # its checksum matches: the content itself is wrong
    with caplog.at_level("WARNING", logger="acoustic_mlm"):
        state = load_latest_state(tmp_path, {"a": 1}, required={"step": int})
    assert state["step"] == 10  # the previous state
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert f"{tmp_path / 'step-000000020.pt'} {why}" in warning and "trying the previous state" in warning, warning


def test_only_a_damaged_state_is_no_state_at_all(tmp_path, caplog):
    save_state(tmp_path, 20, {"fingerprint": {"a": 1}})  # lacks a key: skipped, nothing before it
    with caplog.at_level("WARNING", logger="acoustic_mlm"):
        assert load_latest_state(tmp_path, {"a": 1}, required={"rows": list}) is None
    assert "lacks 'rows'" in caplog.text


def test_the_check_of_a_states_content_skips_a_state_it_finds_wrong(tmp_path, caplog):
    save_state(tmp_path, 10, GOOD)
    save_state(tmp_path, 20, {**GOOD, "step": 20, "w": torch.zeros(5)})

    def check(st):
        return None if st["w"].shape == (2,) else f"holds 'w' of {tuple(st['w'].shape)}"

    with caplog.at_level("WARNING", logger="acoustic_mlm"):
        assert load_latest_state(tmp_path, {"a": 1}, check=check)["step"] == 10
    assert "step-000000020.pt holds 'w' of (5,)" in caplog.text


def test_state_problem_names_what_a_state_lacks():
    assert state_problem(GOOD, {"step": int}) is None
    assert state_problem("text") == "holds a str, not a resumable state"
    assert state_problem({"fingerprint": {}}, STATE_KEYS) == "lacks 'step'"
    assert set(STATE_KEYS) >= {"model", "optimizer", "rng", "accumulator", "rows"}
