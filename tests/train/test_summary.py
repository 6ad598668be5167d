"""What a run reports: the metrics rows' training means, an arm's status from its seeds', and the
summaries of a seed and of an arm."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_config

from acoustic_mlm import curves
from acoustic_mlm.train.summary import COMPLETED_WITH_NONFINITE, Accumulator, run_status, summarize, summarize_arm


def test_a_row_holds_the_means_since_the_last_row_and_the_largest_finite_norm():
    acc = Accumulator(codebooks=2)
    acc.add(torch.tensor([1.0, 2.0, 3.0, 0.5]), grad_norm=4.0, clipped=True)
    acc.add(torch.tensor([3.0, 4.0, 5.0, 1.5]), grad_norm=float("inf"), clipped=False)
    acc.add(torch.tensor([2.0, 3.0, 4.0, 1.0]), grad_norm=2.0, clipped=False)
    assert acc.flush() == {
        "train_loss_cb0": 2.0,
        "train_loss_cb1": 3.0,
        "train_loss": 4.0,
        "feature_penalty": 1.0,
        "grad_norm_max": 4.0,
        "clip_frac": pytest.approx(1 / 3),
    }
    empty = acc.flush()  # flush starts the next row afresh: no step since, no numbers
    assert all(math.isnan(v) for v in empty.values()) and len(empty) == 6


def test_the_means_so_far_travel_in_a_resumable_state():
    acc = Accumulator(codebooks=1)
    acc.add(torch.tensor([1.0, 2.0, 0.0]), grad_norm=3.0, clipped=True)
    again = Accumulator(codebooks=1)
    again.load(acc.state(), torch.device("cpu"))
    for a in (acc, again):
        a.add(torch.tensor([3.0, 4.0, 2.0]), grad_norm=1.0, clipped=False)
    assert (
        again.flush()
        == acc.flush()
        == {"train_loss_cb0": 2.0, "train_loss": 3.0, "feature_penalty": 1.0, "grad_norm_max": 3.0, "clip_frac": 0.5}
    )


def test_an_arm_is_as_bad_as_its_worst_seed():
    assert run_status(["completed", "completed"]) == "completed"
    assert run_status(["completed", COMPLETED_WITH_NONFINITE]) == COMPLETED_WITH_NONFINITE
    assert run_status([COMPLETED_WITH_NONFINITE, "diverged", "completed"]) == "diverged"


def _metrics(nonfinite: list[int], diverged_last: bool = False) -> pd.DataFrame:
    steps = [1, 2, 4, 8]
    return pd.DataFrame(
        {
            "step": steps,
            "train_loss_cb0": [9.0, 8.0, 7.0, 6.0],
            "valid_loss_cb0": [9.5, 8.5, 7.5, 6.5],
            "grad_norm_max": [3.0, 5.0, 2.0, 1.0],
            "clipped_steps": [1, 2, 2, 3],
            "nonfinite": nonfinite,
            "overflow_skips": [0, 0, 1, 1],
            "wall_time": [0.1, 0.2, 0.4, 0.8],
            "diverged": [0, 0, 0, int(diverged_last)],
        }
    )


def test_a_seed_summary_counts_updates_taken_and_names_its_status(smoke_cfg):
    rc, t = make_config(smoke_cfg).run("prenorm_clip1"), make_config(smoke_cfg).train_for("prenorm_clip1")
    clean = summarize(_metrics([0, 0, 0, 0]), rc, t)
    assert (clean["run"], clean["seed"], clean["steps"], clean["status"]) == ("prenorm_clip1", t.seed, 8, "completed")
    assert clean["diverged_at_step"] is None and clean["max_grad_norm"] == 5.0 and clean["first_train_loss_cb0"] == 9.0
    assert clean["clipped_frac"] == 3 / 8 and clean["wall_time_s"] == 0.8 and clean["overflow_skips"] == 1
    assert clean["final_train_loss_cb0"] == curves.final_loss([1, 2, 4, 8], [9.0, 8.0, 7.0, 6.0])
    skipped = summarize(_metrics([0, 0, 1, 2]), rc, t)
    assert skipped["status"] == COMPLETED_WITH_NONFINITE and skipped["nonfinite_steps"] == 2
    assert skipped["clipped_frac"] == 3 / 6  # 8 steps, 2 of them not updates
    diverged = summarize(_metrics([0, 0, 0, 5], diverged_last=True), rc, t)
    assert diverged["status"] == "diverged" and diverged["diverged_at_step"] == 8


def test_an_arm_summary_averages_its_seeds_and_keeps_each_without_its_fingerprint(smoke_cfg):
    rc = make_config(smoke_cfg).run("prenorm_clip1")
    seeds = [
        {
            "seed": s,
            "status": st,
            "nonfinite_steps": n,
            "final_train_loss_cb0": tr,
            "final_valid_loss_cb0": va,
            "fingerprint": {"x": 1},
        }
        for s, st, n, tr, va in [(1, "completed", 0, 2.0, 3.0), (2, COMPLETED_WITH_NONFINITE, 3, 2.5, 4.0)]
    ]
    arm = summarize_arm(rc, seeds)
    assert arm["status"] == COMPLETED_WITH_NONFINITE and arm["nonfinite_steps"] == 3
    assert arm["final_train_loss_cb0"] == 2.25 and arm["final_valid_loss_cb0"] == 3.5
    assert arm["final_train_loss_cb0_spread"] == 0.5 and arm["seeds"] == list(rc.seeds)
    assert set(arm["per_seed"]) == {"1", "2"} and "fingerprint" not in arm["per_seed"]["2"]
    assert np.isclose(arm["per_seed"]["2"]["final_train_loss_cb0"], 2.5)
