"""The sizing procedure (experiments.sizing) through `amlm experiment run`'s runner, nothing trained: each
run's outcome comes from a hand-made oracle, so the tests see which runs the procedure picks from the
runs before them, in which order, where it stops (the best rate, (a), (b), the budget, --limit), and
that the published sizing rounds train nothing again."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import judge as J
from acoustic_mlm.experiments import record as R
from acoustic_mlm.experiments import runner

ROOT = Path(__file__).resolve().parents[2]
DECL = ROOT / "config" / "experiments"
PLATEAU = 3.984
CLIP10, CLIP1, NOCLIP = "prenorm_clip10", "prenorm_clip1", "prenorm_noclip"


def _declare(tmp_path: Path, rules_: int = 2, budget_s: float = 9000.0, **params) -> Path:
    """A sizing round at S1 over three arms and four rates, its tables under tmp_path."""
    doc = {
        "round": 2,
        "rules": "sizing",
        "base": str(ROOT / "config" / "proxy.yaml"),
        "size": {"model.dim": 32, "model.layers": 2, "train.steps": 600},
        "tables": str(tmp_path / "tables"),
        "verdict": "verdict.json",
        "arms": {
            CLIP10: {"norm": "pre", "attention": "softmax", "clip": 10.0},
            CLIP1: {"norm": "pre", "attention": "softmax", "clip": 1.0},
            NOCLIP: {"norm": "pre", "attention": "softmax", "clip": 0.0},
        },
        "cells": {"S1": {}},
        "seeds": {"procedure": "1..3"},
        "params": {
            "size": "S1",
            "rules": rules_,
            "baseline": CLIP10,
            "rates": [0.01, 0.03, 0.1, 0.3],
            "pairs": [[NOCLIP, CLIP1], [NOCLIP, CLIP10]],
            "budget_s": budget_s,
            "c_limit_s": 300,
        }
        | params,
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "sizing.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _row(run, final: float, late: float = 0.0, left: bool | None = None, wall: float = 100.0) -> dict:
    """A run's record as record_of writes it (the columns of the record, its words consistent)."""
    size, arm, lr, seed = run
    trained = final <= PLATEAU - 1
    left = trained if left is None else left
    lowest = min(final, 2.5) if left else final
    clip = {CLIP10: 10.0, CLIP1: 1.0, NOCLIP: 0.0}[arm]
    return {
        "round": 2,
        **{"size": size, "arm": arm, "lr": lr, "seed": seed, "dim": 32, "layers": 2, "ffn_dim": 128, "steps": 600},
        **{"batch_size": 8, "norm": "pre", "attention": "softmax", "clip": clip, "warmup_steps": 50},
        **{"status": "completed", "plateau": PLATEAU, "first_loss": 10.3, "final_loss": final, "lowest_loss": lowest},
        **{"lowest_step": 600.0, "cross_step": 100.0 if left else np.nan, "left_plateau": left, "trained": trained},
        **{"collapsed": left and not trained, "spikes": int(late > 0), "largest_spike_bits": late},
        **{"late_spikes": int(late > 0), "largest_late_spike_bits": late, "nonfinite_steps": 0},
        **{"max_grad_norm": 5.0},
        **{"attn_logit_max": 5.0, "attn_logit_final": 5.0, "wall_time_s": wall},
    }


def _oracle() -> dict:
    """Every run the procedure could ask for at S1, (arm, lr, seed) -> its outcome: the baseline learns up
    to 3e-2 (best 3e-2) and sits on the plateau above; at 1e-1 clipping off leaves the plateau and falls
    back with a late spike on seeds 1 and 2 (unstable) and sits on it on seed 3 (stable), while clip 1
    trains on every seed; at 3e-1 every arm sits on the plateau."""
    outcome = {}
    for arm in (CLIP10, CLIP1, NOCLIP):
        for lr in (0.01, 0.03, 0.1, 0.3):
            for seed in (1, 2, 3):
                final = {0.01: 1.2, 0.03: 1.0, 0.1: 3.99, 0.3: 3.99}[lr]
                outcome[(arm, lr, seed)] = {"final": final}
    for seed in (1, 2, 3):
        outcome[(CLIP1, 0.1, seed)] = {"final": 1.1}
        outcome[(NOCLIP, 0.1, seed)] = {"final": 3.99, "late": 1.4, "left": True} if seed < 3 else {"final": 3.99}
    return outcome


class Trainer:
    """runner.train_one in place: the run's record from the oracle, and the order it was asked for."""

    def __init__(self, outcome: dict):
        self.outcome, self.asked = outcome, []

    def __call__(self, rnd, run, work):
        self.asked.append(run)
        size, arm, lr, seed = run
        curve = pd.DataFrame(columns=runner.CURVE_COLUMNS)
        return (_row(run, **self.outcome[(arm, lr, seed)]), curve, []), Path(work) / "runs" / runner.run_name(*run)


@pytest.fixture
def trainer(monkeypatch):
    t = Trainer(_oracle())
    monkeypatch.setattr(runner, "train_one", t)
    return t


def _keys(runs) -> list[tuple]:
    return [(arm, lr, seed) for _, arm, lr, seed in runs]


SCAN = [(CLIP10, lr, 1) for lr in (0.01, 0.03, 0.1, 0.3)]
A_SEEDS = [(CLIP10, 0.03, 2), (CLIP10, 0.03, 3)]
ABOVE = [(CLIP1, 0.1, 1), (NOCLIP, 0.1, 1), (CLIP1, 0.3, 1), (NOCLIP, 0.3, 1)]  # the baseline's are the scan's
PAIR = [(NOCLIP, 0.1, 2), (CLIP1, 0.1, 2), (NOCLIP, 0.1, 3), (CLIP1, 0.1, 3)]


def test_the_procedure_scans_repeats_the_best_rate_runs_every_arm_above_it_then_the_first_pair_that_can_prevent(
    tmp_path, trainer
):
    decl = _declare(tmp_path)
    written = runner.run_round(decl, tmp_path / "work")
    assert _keys(trainer.asked) == SCAN + A_SEEDS + ABOVE + PAIR  # neither 3e-1's pairs nor (noclip, clip10)
    assert [(r["arm"], r["lr"], r["seed"]) for r in written] == _keys(trainer.asked)
    table = pd.read_csv(tmp_path / "tables" / "runs.csv")
    assert len(table) == 14 and list(table.columns) == [c.name for c in R.columns()]
    verdict = J.judge(decl, tmp_path / "out")["verdict"]
    assert verdict["best_rate"] == 0.03 and verdict["a"] and verdict["a_trained"] == "3 of 3"
    assert verdict["b_prevented"] == [{"lr": 0.1, "without": NOCLIP, "with": CLIP1, "unstable_without": 2}]
    assert runner.run_round(decl, tmp_path / "work") == [] and len(trainer.asked) == 14  # finished: nothing again


def test_the_best_rate_is_the_lower_one_within_0_02_bits(tmp_path, monkeypatch):
    t = Trainer(_oracle() | {(CLIP10, 0.01, 1): {"final": 1.015}})
    monkeypatch.setattr(runner, "train_one", t)
    runner.run_round(_declare(tmp_path), tmp_path / "work", limit=6)
    assert _keys(t.asked)[4:] == [(CLIP10, 0.01, 2), (CLIP10, 0.01, 3)]  # 1.015 is within 0.02 of 1.0


def test_a_baseline_that_does_not_learn_on_every_seed_gives_the_size_up_after_a(tmp_path, monkeypatch):
    t = Trainer(_oracle() | {(CLIP10, 0.03, 3): {"final": 3.2, "left": True}})
    monkeypatch.setattr(runner, "train_one", t)
    decl = _declare(tmp_path)
    runner.run_round(decl, tmp_path / "work")
    assert _keys(t.asked) == SCAN + A_SEEDS
    verdict = J.judge(decl, tmp_path / "out")["verdict"]
    assert verdict["a_trained"] == "2 of 3" and verdict["a"] is False and "b" not in verdict


def test_by_rules_2_a_stabilized_arm_that_does_not_learn_is_not_worth_more_seeds_by_rules_1_it_is(
    tmp_path, monkeypatch
):
    # clip 1 never leaves the plateau at 1e-1: stable, not trained
    outcome = _oracle() | {(CLIP1, 0.1, s): {"final": 3.99} for s in (1, 2, 3)}
    two = Trainer(outcome)
    monkeypatch.setattr(runner, "train_one", two)
    runner.run_round(_declare(tmp_path / "r2"), tmp_path / "work")
    # rules 2: (noclip, clip1) is not screened; (noclip, clip10): clip 10 at 1e-1 sits on the plateau too
    assert _keys(two.asked) == SCAN + A_SEEDS + ABOVE
    one = Trainer(outcome)
    monkeypatch.setattr(runner, "train_one", one)
    decl = _declare(tmp_path / "r1", rules_=1)
    runner.run_round(decl, tmp_path / "work")
    assert _keys(one.asked) == SCAN + A_SEEDS + ABOVE + PAIR
    verdict = J.judge(decl, tmp_path / "out")["verdict"]
    assert verdict["b_prevented"] == [{"lr": 0.1, "without": NOCLIP, "with": CLIP1, "unstable_without": 2}]


def test_a_pair_whose_repeats_do_not_prevent_goes_on_to_the_next_pair_and_rate(tmp_path, monkeypatch):
    # clipping off spikes only on seed 1 at 1e-1: 1 of 3 unstable, not prevented; 3e-1 has nothing to screen
    t = Trainer(_oracle() | {(NOCLIP, 0.1, 2): {"final": 3.99}})
    monkeypatch.setattr(runner, "train_one", t)
    decl = _declare(tmp_path)
    runner.run_round(decl, tmp_path / "work")
    assert _keys(t.asked) == SCAN + A_SEEDS + ABOVE + PAIR
    verdict = J.judge(decl, tmp_path / "out")["verdict"]
    assert verdict["b"] is False and verdict["stopped_at_budget"] is False


def test_the_procedure_starts_no_rate_or_pair_once_the_rounds_run_time_passes_its_budget(tmp_path, trainer):
    decl = _declare(tmp_path, budget_s=550.0)  # 100 s a run: over after the sixth
    runner.run_round(decl, tmp_path / "work")
    assert _keys(trainer.asked) == SCAN + A_SEEDS
    verdict = J.judge(decl, tmp_path / "out")["verdict"]
    assert verdict["stopped_at_budget"] is True and verdict["b"] is False
    trainer.asked.clear()
    more = _declare(tmp_path, budget_s=750.0)  # over after the first rate above the best
    runner.run_round(more, tmp_path / "work")
    assert _keys(trainer.asked) == ABOVE[:2]


def test_limit_stops_the_procedure_and_a_rerun_resumes_it_in_the_same_order(tmp_path, trainer):
    decl = _declare(tmp_path)
    assert len(runner.run_round(decl, tmp_path / "work", limit=5)) == 5
    assert len(pd.read_csv(tmp_path / "tables" / "runs.csv")) == 5
    assert len(runner.run_round(decl, tmp_path / "work", limit=4)) == 4
    runner.run_round(decl, tmp_path / "work")
    assert _keys(trainer.asked) == SCAN + A_SEEDS + ABOVE + PAIR


@pytest.mark.parametrize("name", ["proxy_sizing", "proxy_sizing_r1"])
def test_a_published_sizing_round_trains_nothing_again(name, tmp_path, monkeypatch):
    def refuse(rnd, run, work):
        raise AssertionError(f"the procedure asked to train {run}, which the published round holds")

    monkeypatch.setattr(runner, "train_one", refuse)
    shutil.copytree(ROOT / "data" / "reference" / "proxy_sizing", tmp_path / "tables")
    doc = yaml.safe_load((DECL / f"{name}.yaml").read_text()) | {"tables": str(tmp_path / "tables")}
    decl = tmp_path / f"{name}.yaml"
    decl.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = (tmp_path / "tables" / "runs.csv").read_bytes()
    assert runner.run_round(decl, tmp_path / "work") == []
    assert (tmp_path / "tables" / "runs.csv").read_bytes() == before


def test_shard_and_only_are_refused_for_a_procedure_that_picks_its_runs(tmp_path):
    decl = _declare(tmp_path)
    with pytest.raises(UserError, match=r"sizing\.yaml: 'rules' is sizing: .* --shard and --only do not apply"):
        runner.run_round(decl, tmp_path / "work", shard=(0, 2))
    with pytest.raises(UserError, match="--shard and --only do not apply"):
        runner.run_round(decl, tmp_path / "work", only="S1/prenorm_clip10/0.01/1")


@pytest.mark.parametrize(
    "params, message",
    [
        ({"size": "S9"}, "'params.size' is 'S9': not a cell of the round"),
        ({"baseline": "postnorm"}, "'params.baseline' is 'postnorm': not an arm of the round"),
        ({"pairs": [[NOCLIP, "deepnorm"]]}, "'params.pairs' is .*: not a list of \\[unstabilized arm"),
        ({"rules": 3}, "'params.rules' is 3: not 1 or 2"),
        ({"budget_s": -1}, "'params.budget_s' is -1: not a positive number of seconds"),
    ],
)
def test_a_sizing_declaration_with_a_bad_param_is_one_line_naming_the_key(params, message, tmp_path, trainer):
    with pytest.raises(UserError, match=message):
        runner.run_round(_declare(tmp_path, **params), tmp_path / "work")
    assert trainer.asked == []
