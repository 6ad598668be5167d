"""A run's summary.json: a seed's (its keys and statuses, as resuming and `amlm status` read it) and an
arm's (its per-seed summaries and the settings it was trained with), written and read back; damage
is one ReadError line naming the file and the stage to rerun."""

from __future__ import annotations

import json

from helpers import read_refused

from acoustic_mlm.artifacts.run_summary import (
    SEED_STATUSES,
    SUMMARY,
    arm_settings,
    read_arm_summary,
    read_seed_status,
    read_seed_summary,
    write_summary,
)
from acoustic_mlm.train.summary import run_status


def test_the_statuses_go_from_best_to_worst():
    assert SEED_STATUSES == ("completed", "completed_with_nonfinite", "diverged")
    assert run_status(["completed", "diverged", "completed_with_nonfinite"]) == "diverged"


def test_a_seeds_summary(tmp_path):
    summary = tmp_path / SUMMARY
    good = {
        "status": "completed",
        "final_train_loss_cb0": 7.5,
        "final_valid_loss_cb0": 8,
        "nonfinite_steps": 0,
        "fingerprint": {},
    }
    write_summary(summary, good)
    assert read_seed_summary(summary) == good
    summary.write_text(json.dumps({**good, "nonfinite_steps": 0.5}))
    read_refused(
        lambda: read_seed_summary(summary), summary, "'nonfinite_steps' is 0.5, not int", "rerun the train stage"
    )


def test_read_seed_status_refuses_a_cut_file_a_control_character_and_an_unknown_status(tmp_path):
    path = tmp_path / "summary.json"
    good = {"status": "completed", "steps": 100, "wall_time_s": 12.5, "label": "x"}
    path.write_text(json.dumps(good))
    assert read_seed_status(path) == good
    text = json.dumps(good)
    for damaged, needles in [
        (text[:-7], ("not valid JSON", "cut short or edited", "rerun the train stage")),
        (text.replace('"x"', '"a\x07b"'), ("not valid JSON", "Invalid control character")),
        (text.replace("completed", "compl\\u0007eted"), ("'status' is 'compl\\x07eted', not one of completed",)),
        (json.dumps({**good, "steps": "100"}), ("'steps' is '100', not int",)),
        (json.dumps({**good, "steps": -1}), ("'steps' is -1, below 0",)),
        (json.dumps({**good, "wall_time_s": "1 s"}), ("'wall_time_s' is '1 s', not a finite number",)),
        (json.dumps({"status": "completed"}), ("lacks 'steps'",)),
    ]:
        path.write_text(damaged)
        read_refused(lambda: read_seed_status(path), path, *needles)
    path.write_text(
        json.dumps(
            {
                **good,
                "status": "finished",
                "final_train_loss_cb0": 1,
                "final_valid_loss_cb0": 1,
                "nonfinite_steps": 0,
                "fingerprint": {},
            }
        )
    )
    read_refused(lambda: read_seed_summary(path), path, "'status' is 'finished', not one of completed")


def test_an_arms_summary_and_the_settings_it_was_trained_with(tmp_path):
    path = tmp_path / "prenorm_clip1" / SUMMARY
    arm = {"run": "prenorm_clip1", "per_seed": {"1": {"status": "completed"}}, "settings": {"train.lr": 0.001}}
    write_summary(path, arm)
    assert read_arm_summary(path) == arm and arm_settings(arm, path) == {"train.lr": 0.001}
    write_summary(path, {"run": "prenorm_clip1", "per_seed": []})
    read_refused(lambda: read_arm_summary(path), path, "'per_seed' is [], not dict", "rerun the train stage")
    assert read_arm_summary(path, required={}) == {"run": "prenorm_clip1", "per_seed": []}
    old = {"run": "prenorm_clip1", "per_seed": {}}
    read_refused(
        lambda: arm_settings(old, path),
        path,
        "no 'settings' (written by an older version); rerun the train stage for prenorm_clip1",
    )
    read_refused(
        lambda: read_arm_summary(tmp_path / "none" / SUMMARY),
        tmp_path / "none" / SUMMARY,
        "the summary of none not found; run the train stage first",
    )
