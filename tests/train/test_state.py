"""What lets a seed resume: its fingerprint, the checksummed states (the newest KEEP_STATES kept,
damaged ones skipped) and the RNG state they hold."""

import copy

import pytest
import torch

from acoustic_mlm.errors import UserError
from acoustic_mlm.train.state import KEEP_STATES, fingerprint, load_latest_state, rng_state, save_state, set_rng_state


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
