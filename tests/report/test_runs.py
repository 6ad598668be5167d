"""report/runs.py: the one reader of run folders (the map, decide, status and verify read through it);
and no module of those four names a metrics column by a string literal."""

import ast
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from acoustic_mlm import config as C
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.checked import ReadError
from acoustic_mlm.errors import UserError
from acoustic_mlm.report import runs as R

ROOT = Path(__file__).resolve().parents[2]


def _folder(runs_dir: Path, name="arm", per_seed=None, logits=(3.0, 7.5), seed_column=True) -> Path:
    run = runs_dir / name
    run.mkdir(parents=True)
    rows = [
        {M.SEED: seed, M.STEP: step, M.FIGURE_LOSS: 9.0 - step / 10, M.ATTN_LOGIT_MAX: logits[i]}
        for seed in (2, 1)
        for i, step in enumerate((1, 2))
    ]
    frame = pd.DataFrame(rows)
    (frame if seed_column else frame[frame[M.SEED] == 1].drop(columns=[M.SEED])).to_csv(run / M.METRICS, index=False)
    if per_seed is None:
        per_seed = {str(s): {"status": "completed", "max_grad_norm": 2.5, "overflow_skips": 3} for s in (2, 1)}
    summary = {"run": name, "per_seed": per_seed, "settings": {"train.lr": 0.01}}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_a_run_folder_gives_its_settings_and_each_seed_with_its_rows(tmp_path):
    folder = R.read_run_folder(_folder(tmp_path))
    assert folder.name == "arm" and folder.settings == {"train.lr": 0.01}
    seeds = folder.seed_runs()
    assert [s.seed for s in seeds] == [1, 2]  # by seed, whatever the summary's order
    one = folder.seed_run(2)
    assert one.status == "completed" and one.rows[M.STEP].tolist() == [1, 2]
    assert one.number("max_grad_norm") == 2.5 and one.whole("overflow_skips") == 3 and one.whole("nonfinite_steps") == 0
    assert one.attn_logit_max() == 7.5
    assert math.isnan(R.read_run_folder(_folder(tmp_path / "b", logits=(math.nan,) * 2)).seed_run(1).attn_logit_max())


@pytest.mark.parametrize(
    "per_seed, needle",
    [
        ({"1": {"status": "exploded"}}, "'per_seed.1.status' is 'exploded'"),
        ({"1": [6.8]}, "'per_seed.1' is not a seed's summary"),
        ({"one": {"status": "completed"}}, "'per_seed.one' is not a seed's summary"),
        ({}, "'per_seed' is empty"),
    ],
)
def test_a_damaged_seed_entry_is_one_line_naming_the_summary(tmp_path, per_seed, needle):
    folder = R.read_run_folder(_folder(tmp_path, per_seed=per_seed))
    with pytest.raises(ReadError) as err:
        folder.seed_runs()
    assert str(err.value).startswith(f"{folder.summary_path}: ") and needle in str(err.value)
    assert str(err.value).endswith("rerun the train stage for arm")


def test_a_seed_the_summary_lacks_and_metrics_without_seeds_are_refused(tmp_path):
    folder = R.read_run_folder(_folder(tmp_path))
    with pytest.raises(UserError, match="summary.json: no seed 7; rerun the train stage for arm"):
        folder.seed_run(7)
    with pytest.raises(UserError, match="metrics.csv: no column 'seed'"):
        R.read_run_folder(_folder(tmp_path / "b", seed_column=False))


def test_finished_folders_are_listed_and_an_unfinished_one_refused(tmp_path):
    _folder(tmp_path, "b")
    _folder(tmp_path, "a")
    (tmp_path / ".tmp-c").mkdir()  # an atomic output's temporary name
    assert [p.name for p in R.finished_run_folders(tmp_path, "decide")] == ["a", "b"]
    R.seed_dir(tmp_path / "c", 1).mkdir(parents=True)
    with pytest.raises(UserError, match="c: no summary.json yet.*decide judges finished runs only"):
        R.finished_run_folders(tmp_path, "decide")
    with pytest.raises(UserError, match="does not exist"):
        R.finished_run_folders(tmp_path / "none", "decide")


def test_recorded_settings_and_metrics_of_a_run(tmp_path):
    run = _folder(tmp_path)
    assert R.recorded_settings(run) == {"train.lr": 0.01} and R.recorded_settings(tmp_path / "none") is None
    assert len(R.arm_metrics(run, "train it")) == 4
    with pytest.raises(UserError, match=r"none/metrics.csv: not found; train it$"):
        R.arm_metrics(tmp_path / "none", "train it")


def test_config_runs_are_the_arms_with_their_seeds_and_steps():
    cfg = C.load(ROOT / "config" / "smoke.yaml")
    got = R.config_runs(cfg)
    assert [r for r, _, _ in got] == list(cfg.runs)
    assert all(seeds == tuple(cfg.runs[r].seeds) and steps == cfg.train.steps for r, seeds, steps in got)


READERS = ("decisive", "stability_map", "status", "verify", "runs")
# names that are metrics columns and also another record's: the train.lr setting of the runs tables and
# the map ("lr"), their run-name column ("run"), a seed summary's overflow_skips, verify's result key and
# status's printed header ("step")
OTHER_RECORDS = {"lr", "run", "overflow_skips", "step"}


def _literals(module: str) -> set[str]:
    """The module's string literals, less the text of f-strings (f"seed{seed}" names a folder)."""
    tree = ast.parse((ROOT / "src" / "acoustic_mlm" / "report" / f"{module}.py").read_text())
    in_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in in_fstrings
    }


@pytest.mark.parametrize("module", READERS)
def test_the_run_readers_name_metrics_columns_by_their_constants(module):
    metrics_columns = {*M.COLUMNS, *M.DIAGNOSTIC_COLUMNS, M.FIGURE_LOSS, M.SEED, M.RUN}
    metrics_columns |= {M.loss_column(split, k) for split in ("train", "valid") for k in range(8)}
    assert _literals(module) & metrics_columns <= OTHER_RECORDS
