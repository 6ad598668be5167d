"""The train stage: a tiny run's metrics rows, summary and checkpoint, every arm learning, the precisions,
missing codes, divergence, torch.compile and skipped non-finite updates."""

import json
import math
import shutil

import pandas as pd
import pytest
import torch
from helpers import RUN_NAMES, make_config

from acoustic_mlm import config as C
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.checkpoint import CHECKPOINT, CHECKPOINT_KEYS, read_checkpoint
from acoustic_mlm.errors import UserError
from acoustic_mlm.train import loop as train
from acoustic_mlm.train.summary import COMPLETED_WITH_NONFINITE, run_status


def test_tiny_run_writes_metrics_summary_checkpoint(data_dirs, tiny_cfg, tmp_path):
    prepared, codes = data_dirs
    tiny_cfg["runs"]["postnorm_deepnorm_clip1"]["seeds"] = [1, 2]
    summary = train.run(make_config(tiny_cfg), "postnorm_deepnorm_clip1", prepared, codes, tmp_path / "run", threads=1)
    both = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert both["seed"].tolist() == [1] * 7 + [2] * 7
    second = both[both.seed == 2]["train_loss_cb0"].reset_index(drop=True)
    assert not both[both.seed == 1]["train_loss_cb0"].equals(second)
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    assert summary["seeds"] == [1, 2] and set(summary["per_seed"]) == {"1", "2"}
    seed_dir = tmp_path / "run" / "seeds" / "seed1"
    metrics = pd.read_csv(seed_dir / "metrics.csv")
    assert metrics["step"].tolist() == [1, 2, 4, 5, 8, 10, 12]
    # the header training writes is the one artifacts.metrics declares, column for column
    codebooks, layers = tiny_cfg["model"]["codebooks"], tiny_cfg["model"]["layers"]
    assert tiny_cfg["train"]["diagnostics"]  # the smoke preset measures them: their columns too
    assert list(metrics.columns) == M.columns(codebooks, layers)
    assert list(both.columns) == [M.SEED, *M.columns(codebooks, layers)]
    assert [c for c in metrics.columns if c in M.COLUMNS] == M.COLUMNS
    assert metrics["lr"].iloc[0] == pytest.approx(tiny_cfg["train"]["lr"] / 2)
    assert (metrics["grad_norm"] > 0).all()
    assert not (seed_dir / "metrics.partial.csv").exists() and not (tmp_path / "run" / "state").exists()
    on_disk = json.loads((seed_dir / "summary.json").read_text())
    assert on_disk["status"] == "completed" and on_disk["steps"] == 12 and on_disk["seed"] == 1
    ckpt = read_checkpoint(seed_dir / CHECKPOINT)
    assert set(ckpt) == set(CHECKPOINT_KEYS) and all(isinstance(v, torch.Tensor) for v in ckpt["model"].values())
    assert ckpt["run"]["norm"] == "deepnorm" and ckpt["model_config"]["norm"] == "deepnorm" and ckpt["step"] == 12
    assert ckpt["train_config"]["clip"] == 1.0


@pytest.mark.parametrize("run", list(RUN_NAMES))
def test_each_arm_lowers_the_loss(data_dirs, tiny_cfg, tmp_path, run):
    prepared, codes = data_dirs
    tiny_cfg["train"].update(steps=30, warmup_steps=3, log_interval=10, lr=3e-3)
    train.run(make_config(tiny_cfg), run, prepared, codes, tmp_path / run, threads=1)
    m = pd.read_csv(tmp_path / run / "metrics.csv")
    assert (m["seed"] == 1).all()
    assert m["valid_loss_cb0"].iloc[-1] < m["valid_loss_cb0"].iloc[0] - 1.0, m[["step", "valid_loss_cb0"]]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_bf16_and_fp16_on_cpu_complete_with_finite_losses(data_dirs, tiny_cfg, tmp_path, precision):
    prepared, codes = data_dirs
    tiny_cfg["train"].update(precision=precision, steps=4, accum_steps=2)
    summary = train.run(make_config(tiny_cfg), "prenorm_attnrelax_clip1", prepared, codes, tmp_path / "r", threads=1)
    assert summary["status"] == "completed" and math.isfinite(summary["final_train_loss_cb0"])


def test_missing_codes_are_named_with_the_stage_to_run(data_dirs, tiny_cfg, tmp_path):
    prepared, codes = data_dirs
    with pytest.raises(UserError, match="nocodes/tokenizer.json: not found; run the tokenize stage"):
        train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, tmp_path / "nocodes", tmp_path / "r")
    partial = tmp_path / "partial"
    shutil.copytree(codes, partial)
    (partial / "shard-00001" / "codes.npy").unlink()
    with pytest.raises(UserError, match="partial/shard-00001/codes.npy: codes not found"):
        train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, partial, tmp_path / "r")


@pytest.mark.slow
def test_divergence_is_a_result_not_a_crash(data_dirs, tiny_cfg, tmp_path, monkeypatch):
    """A loss that stays non-finite ends the seed as diverged; metrics, summary and figure still complete."""
    from acoustic_mlm.model.objective import AcousticMLM
    from acoustic_mlm.report import aggregate, figure

    real_forward = AcousticMLM.forward
    calls = {"n": 0}

    def exploding(self, wav, codes, mask):
        out = real_forward(self, wav, codes, mask)
        calls["n"] += self.training  # count training steps, not validation passes
        if self.training and calls["n"] > 6:  # from the 7th training step on
            return out._replace(loss=out.loss * float("inf"))
        return out

    monkeypatch.setattr(AcousticMLM, "forward", exploding)
    tiny_cfg["train"].update(steps=40, max_nonfinite=5)
    prepared, codes = data_dirs
    summary = train.run(
        make_config(tiny_cfg), "postnorm_deepnorm_clip1", prepared, codes, tmp_path / "runs" / "postnorm_deepnorm_clip1"
    )
    per_seed = summary["per_seed"]["1"]
    assert summary["status"] == "diverged" and per_seed["diverged_at_step"] == 11  # steps 7..11: 5 in a row
    m = pd.read_csv(tmp_path / "runs" / "postnorm_deepnorm_clip1" / "metrics.csv")
    assert m["diverged"].tolist()[-1] == 1 and m["step"].iloc[-1] == 11 and m["nonfinite"].iloc[-1] == 5
    assert math.isnan(m["train_loss_cb0"].iloc[-1])  # no finite step since the previous row
    monkeypatch.setattr(AcousticMLM, "forward", real_forward)
    for other in ["prenorm_clip10", "prenorm_clip1", "prenorm_attnrelax_clip1"]:
        train.run(make_config(tiny_cfg), other, prepared, codes, tmp_path / "runs" / other, threads=1)
    curves = aggregate.run(make_config(tiny_cfg), tmp_path / "runs", tmp_path / "curves.csv")
    typed = C.from_mapping(tiny_cfg)
    fig, ax = figure.draw(curves, typed.runs, typed.figure)
    assert any(t.get_text() == "diverged (seed 1)" for t in ax.texts)
    assert any(line.get_marker() == "X" for line in ax.get_lines())


@pytest.mark.slow
def test_torch_compile_option_trains(data_dirs, tiny_cfg, tmp_path):
    """train.compile wraps the model in torch.compile (inductor on CPU): same metrics columns, a falling loss."""
    prepared, codes = data_dirs
    tiny_cfg["train"].update(compile=True, steps=6, log_interval=3)
    summary = train.run(make_config(tiny_cfg), "prenorm_attnrelax_clip1", prepared, codes, tmp_path / "r", threads=1)
    assert summary["status"] == "completed"
    eager = train.run(
        make_config({**tiny_cfg, "train": {**tiny_cfg["train"], "compile": False}}),
        "prenorm_attnrelax_clip1",
        prepared,
        codes,
        tmp_path / "e",
        threads=1,
    )
    # compiled kernels round differently, nothing more
    assert summary["final_train_loss_cb0"] == pytest.approx(eager["final_train_loss_cb0"], abs=0.05)


def test_skipped_nonfinite_updates_are_not_a_clean_completion(data_dirs, tiny_cfg, tmp_path, monkeypatch):
    """A run that skipped non-finite updates without diverging says so: its status is
    completed_with_nonfinite (per seed and for the arm) and it counts them."""
    from acoustic_mlm.model.objective import AcousticMLM

    real_forward = AcousticMLM.forward
    calls = {"n": 0}

    def two_bad_steps(self, wav, codes, mask):
        out = real_forward(self, wav, codes, mask)
        calls["n"] += self.training
        if self.training and calls["n"] in (4, 9):  # training steps 4 and 9 only
            return out._replace(loss=out.loss * float("nan"))
        return out

    monkeypatch.setattr(AcousticMLM, "forward", two_bad_steps)
    tiny_cfg["train"].update(steps=12, max_nonfinite=5)
    prepared, codes = data_dirs
    summary = train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "run", threads=1)
    assert summary["status"] == COMPLETED_WITH_NONFINITE and summary["nonfinite_steps"] == 2
    assert summary["per_seed"]["1"]["status"] == COMPLETED_WITH_NONFINITE
    assert summary["per_seed"]["1"]["steps"] == 12 and summary["per_seed"]["1"]["diverged_at_step"] is None
    assert run_status(["completed", "completed_with_nonfinite"]) == "completed_with_nonfinite"
    assert run_status(["completed_with_nonfinite", "diverged"]) == "diverged"
    assert run_status(["completed", "completed"]) == "completed"


def _not_resumable(fp):
    """States whose checksum matches but whose content this run cannot resume from."""
    whole = {
        "fingerprint": fp,
        "step": 4,
        "rows": [],
        "elapsed": 0.0,
        "nonfinite": 0,
        "streak": 0,
        "overflow": 0,
        "clipped": 0,
        "accumulator": {"n": 0, "sums": None, "clipped": 0, "gmax": 0.0},
        "model": {"w": torch.zeros(3)},
        "optimizer": {"state": {}, "param_groups": [{}]},
        "scaler": {},
        "fp16": None,
        "rng": {"cpu": torch.get_rng_state()},
    }
    return [
        ({"fingerprint": fp, "step": 4}, "lacks 'rows'"),
        ({**whole, "accumulator": [0]}, "'accumulator' holds a list, not dict"),
        (whole, "holds another model (parameter"),
    ]


def test_a_state_that_is_not_this_runs_state_is_skipped_and_the_seed_trains_afresh(
    data_dirs, tiny_cfg, tmp_path, caplog
):
    from acoustic_mlm.train.state import fingerprint, save_state

    tiny_cfg["train"].update(steps=6, log_interval=3, checkpoint_interval=3)
    train.run(make_config(tiny_cfg), "prenorm_clip1", *data_dirs, tmp_path / "ref", threads=1)
    reference = pd.read_csv(tmp_path / "ref" / "metrics.csv").drop(columns=["wall_time"])
    for i, (state, why) in enumerate(_not_resumable(fingerprint(tiny_cfg, "prenorm_clip1", 1))):
        out = tmp_path / f"r{i}"
        save_state(out / "state" / "seed1", 4, state)
        caplog.clear()
        with caplog.at_level("WARNING", logger="acoustic_mlm"):
            train.run(make_config(tiny_cfg), "prenorm_clip1", *data_dirs, out, threads=1)
        assert why in caplog.text and "step-000000004.pt" in caplog.text, caplog.text
        pd.testing.assert_frame_equal(pd.read_csv(out / "metrics.csv").drop(columns=["wall_time"]), reference)


def test_a_real_state_passes_the_content_check_and_resumes(data_dirs, tiny_cfg, tmp_path, monkeypatch, caplog):
    tiny_cfg["train"].update(steps=6, log_interval=3, checkpoint_interval=3)
    real_step = train.train_step

    def stop_at_5(s, loop, loader, step):
        if step == 5:
            raise KeyboardInterrupt
        return real_step(s, loop, loader, step)

    monkeypatch.setattr(train, "train_step", stop_at_5)
    with pytest.raises(KeyboardInterrupt):
        train.run(make_config(tiny_cfg), "prenorm_clip1", *data_dirs, tmp_path / "cut", threads=1)
    monkeypatch.undo()
    with caplog.at_level("INFO", logger="acoustic_mlm"):
        train.run(make_config(tiny_cfg), "prenorm_clip1", *data_dirs, tmp_path / "cut", threads=1)
    assert "resuming after step 3" in caplog.text and "not a state this run can resume from" not in caplog.text


@pytest.mark.parametrize("other", [{}, {"lr": 1e-3}, {"steps": 3}])
def test_a_second_train_of_a_run_folder_is_refused_while_the_first_runs(data_dirs, tiny_cfg, tmp_path, other):
    """While one train holds results/runs/<run> (here: its lock, as a running train does), another train of
    the folder, with the same or other settings, is refused before it writes anything."""
    from acoustic_mlm.folder_lock import folder_lock

    out = tmp_path / "prenorm_clip1"
    tiny_cfg["train"].update(other)
    with folder_lock(out, "train prenorm_clip1"):
        with pytest.raises(UserError, match=r"is writing this folder now; a second train prenorm_clip1 would mix"):
            train.run(make_config(tiny_cfg), "prenorm_clip1", *data_dirs, out, threads=1)
    assert not out.exists()  # nothing written (the holder made the folder and removed it, empty)
    assert train.run(make_config(tiny_cfg), "prenorm_clip1", *data_dirs, out, threads=1)["status"] == "completed"
