"""aggregate.py: one arm's wide metrics as tidy rows, the diagnostics apart from the losses, and the
final losses `dvc exp show` reads, on tables made up in the test; then the stage on whole run
folders (the `runs_dir` fixture of conftest.py)."""

import math

import numpy as np
import pandas as pd
import pytest
from helpers import fake_metrics, make_config

from acoustic_mlm import config as C
from acoustic_mlm.errors import UserError
from acoustic_mlm.report import aggregate

ARM = C.RunConfig(name="arm", label="The Arm", norm="pre", attention="softmax", clip=1.0, seeds=(7,), role="clip1")


def _metrics() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": [1, 2],
            "train_loss": [9.5, 8.5],
            "train_loss_cb0": [10.0, 9.0],
            "valid_loss_cb1": [11.0, 10.0],
            "grad_norm": [3.0, 2.0],
            "lr": [1e-4, 2e-4],
            "wall_time": [0.5, 1.0],
        }
    )


def test_one_row_per_step_split_and_codebook_with_the_seed_of_a_single_seed_file():
    tidy = aggregate.tidy(_metrics(), ARM)
    assert list(tidy.columns) == aggregate.COLUMNS + ["nonfinite"]
    rows = sorted(tidy[["split", "codebook", "step", "loss_bits"]].itertuples(index=False, name=None))
    assert rows == [("train", 0, 1, 10.0), ("train", 0, 2, 9.0), ("valid", 1, 1, 11.0), ("valid", 1, 2, 10.0)]
    assert set(tidy["run"]) == {"arm"} and set(tidy["label"]) == {"The Arm"}
    assert set(tidy["seed"]) == {7} and set(tidy["nonfinite"]) == {0}  # no seed column: the arm's seed


def test_a_seed_column_and_the_skipped_updates_are_kept():
    metrics = _metrics().assign(seed=[3, 4], nonfinite=[0, 2])
    tidy = aggregate.tidy(metrics, ARM)
    assert tidy.groupby("seed")["nonfinite"].max().to_dict() == {3: 0, 4: 2}


def test_diagnostics_are_every_column_but_the_losses_the_step_and_the_clock():
    diag = aggregate.tidy_diagnostics(_metrics(), ARM)
    assert list(diag.columns) == aggregate.DIAGNOSTIC_COLUMNS
    assert sorted(set(diag["diagnostic"])) == ["grad_norm", "lr"]  # train_loss and wall_time are not diagnostics
    assert diag[(diag["diagnostic"] == "lr") & (diag["step"] == 2)]["value"].item() == 2e-4
    assert len(diag) == 2 * 2 and set(diag["seed"]) == {7}


@pytest.mark.parametrize("drop", [["step"], ["train_loss_cb0", "valid_loss_cb1"]])
def test_metrics_without_steps_or_loss_columns_are_one_line_naming_the_run(drop):
    with pytest.raises(UserError, match="metrics of run 'arm' lack 'step' or per-codebook loss columns"):
        aggregate.tidy(_metrics().drop(columns=drop), ARM)


def _arms(**roles) -> dict[str, C.RunConfig]:
    """Arms of these names with these roles (None: no role), as `Config.runs` holds them."""
    return {
        name: C.RunConfig(name=name, label=name, norm="pre", attention="softmax", clip=1.0, seeds=(1,), role=role)
        for name, role in roles.items()
    }


def _curves(run: str, seed: int, losses) -> pd.DataFrame:
    return pd.DataFrame(
        {"run": run, "seed": seed, "step": range(len(losses)), "split": "train", "codebook": 0, "loss_bits": losses}
    )


def test_final_losses_leave_non_finite_rows_out_and_average_the_seeds():
    runs = _arms(a="clip10", b="clip1")
    curves = pd.concat(
        [
            _curves("a", 1, [10.0, 8.0, 6.0, 7.0, math.nan]),  # the last finite row is 7.0 (step 3 of 0-3)
            _curves("a", 2, [10.0, 9.0, 8.0, 5.0, math.inf]),  # 5.0
            _curves("b", 1, [10.0, 8.0]).assign(codebook=1),  # codebook 1 only: no final codebook-0 loss
        ]
    )
    assert aggregate.final_losses(runs, curves) == {"clip10": 6.0, "clip1": None}


def test_final_losses_are_keyed_by_run_name_where_a_role_is_shared_or_missing():
    runs = _arms(a="clip1", b="clip1", c=None)
    curves = pd.concat([_curves(name, 1, [9.0, 4.123456]) for name in ("a", "b", "c")])
    assert aggregate.final_losses(runs, curves) == {"a": 4.1235, "b": 4.1235, "c": 4.1235}  # 4 decimals


def test_aggregate_writes_one_row_per_run_step_split_and_codebook(runs_dir, tmp_path, smoke_cfg):
    out = tmp_path / "curves.csv"
    curves = aggregate.run(make_config(smoke_cfg), runs_dir, out)
    on_disk = pd.read_csv(out)
    assert list(on_disk.columns) == ["run", "label", "seed", "step", "split", "codebook", "loss_bits", "nonfinite"]
    assert len(on_disk) == 4 * 8 * 2 * 2  # runs x steps x splits x codebooks
    assert list(dict.fromkeys(on_disk["run"])) == list(smoke_cfg["runs"])  # config order
    row = on_disk[
        (on_disk.run == "prenorm_clip1") & (on_disk.step == 1) & (on_disk.split == "valid") & (on_disk.codebook == 1)
    ]
    expected = 6.0 - 0.1 + (10.0 - 5.9) * np.exp(-1 / 20) + 1 + 0.1
    assert row["loss_bits"].item() == pytest.approx(expected)
    assert row["label"].item() == "Pre-Norm | Gradient Clip=1 | Run 2"
    assert len(curves) == len(on_disk)


def test_final_losses_by_role_for_dvc_exp_show(runs_dir, tmp_path, smoke_cfg):
    import json

    from acoustic_mlm import curves

    smoke_cfg["runs"]["prenorm_attnrelax_clip1"].pop("role")  # no role: keyed by its run name
    aggregate.run(make_config(smoke_cfg), runs_dir, tmp_path / "c.csv", finals_path=tmp_path / "finals.json")
    finals = json.loads((tmp_path / "finals.json").read_text())
    assert set(finals) == {"clip10", "clip1", "deepnorm", "prenorm_attnrelax_clip1"}
    steps = [1, 2, 4, 8, 16, 20, 32, 40]
    want = curves.final_loss(steps, fake_metrics(steps, end=6.0 - 0.1)["train_loss_cb0"])  # prenorm_clip1
    assert finals["clip1"] == pytest.approx(want, abs=1e-4)
    assert finals["clip10"] > finals["clip1"] > finals["deepnorm"]


def test_aggregate_missing_run_names_the_file(runs_dir, tmp_path, smoke_cfg):
    (runs_dir / "prenorm_clip1" / "metrics.csv").unlink()
    with pytest.raises(UserError, match=r"prenorm_clip1/metrics.csv"):
        aggregate.run(make_config(smoke_cfg), runs_dir, tmp_path / "c.csv")
    assert not (tmp_path / "c.csv").exists()


@pytest.mark.parametrize("make", ["missing", "file", "broken link"])
@pytest.mark.parametrize("stage", ["aggregate", "map"])
def test_a_runs_folder_that_is_missing_is_named_as_such_not_told_to_train(root, tmp_path, capsys, make, stage):
    from acoustic_mlm import cli

    runs = tmp_path / "runz"
    if make == "file":
        runs.write_text("x")
    elif make == "broken link":
        runs.symlink_to(tmp_path / "gone")
    config = root / "config" / ("smoke.yaml" if stage == "aggregate" else "decisive.yaml")
    out = tmp_path / "out.csv"
    assert cli.main([stage, "--config", str(config), "--runs-dir", str(runs), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    what = {"missing": "does not exist", "file": "is not a folder", "broken link": "is a broken link"}[make]
    assert err == (
        f"amlm {stage}: error: {runs}: the runs folder (--runs-dir) {what}; name the folder training wrote its "
        "runs into (default results/runs)"
    )
