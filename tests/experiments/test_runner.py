"""`amlm experiment run`: trains a round's planned runs that its tables lack, never one twice, and the
example round runs end to end through Snakemake (slow: six runs of S1, 300 updates each)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import tool_env

from acoustic_mlm.cli import main
from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import declaration as D
from acoustic_mlm.experiments import runner

ROOT = Path(__file__).resolve().parents[2]
DECL = ROOT / "config" / "experiments"


def _copy(tmp_path: Path, name: str, tables: str) -> Path:
    """A round's declaration over a copy of its published tables."""
    shutil.copytree(ROOT / "data" / "reference" / tables, tmp_path / "tables")
    doc = yaml.safe_load((DECL / f"{name}.yaml").read_text())
    doc["tables"] = str(tmp_path / "tables")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_published_round_trains_nothing_again(tmp_path):
    decl = _copy(tmp_path, "pb_relax_training", "pb_relax_training")
    before = (tmp_path / "tables" / "runs.csv").read_bytes()
    assert runner.run_round(decl, tmp_path / "work") == []
    assert (tmp_path / "tables" / "runs.csv").read_bytes() == before and not (tmp_path / "work").exists()


def test_a_lost_run_is_what_remains_in_plan_order(tmp_path):
    decl = _copy(tmp_path, "confirm_round", "confirm_round")
    runs = pd.read_csv(tmp_path / "tables" / "runs.csv")
    lost = runs[(runs["arm"] == "prenorm_clip10") & (runs["seed"] == 107)].index
    runs.drop(lost).to_csv(tmp_path / "tables" / "runs.csv", index=False)
    assert runner.remaining(D.load(decl)) == [("S1", "prenorm_clip10", 0.05, 107)]


def test_a_round_trained_elsewhere_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match=r"pb_relax_range\.yaml: 'rules' is range: its runs are trained elsewhere"):
        runner.run_round(DECL / "pb_relax_range.yaml", tmp_path / "work")


def test_late_spikes_skip_single_update_rows_and_the_warm_up():
    """Rules 2's spikes: on the rows at multiples of the log interval only, onset after the warm-up."""
    steps = [1, 2, 4, 8, 16, 25, 50, 75, 100, 125, 150]
    loss = [9.0, 9.9, 9.0, 9.0, 9.0, 4.0, 3.0, 3.8, 3.0, 2.0, 2.0]  # a 0.9 rise at step 2 and a 0.8 one at 75
    [spike] = runner.late_spikes(steps, loss, log_interval=25, warmup=50)
    assert spike["onset_step"] == 75 and spike["height_bits"] == pytest.approx(0.8)
    assert runner.late_spikes(steps, loss, log_interval=25, warmup=75) == []  # its onset is not after the warm-up
    assert [s["onset_step"] for s in runner.late_spikes(steps, loss, log_interval=1, warmup=0)] == [2, 75]


@pytest.mark.slow
def test_the_example_round_runs_through_snakemake_resumes_and_judges(tmp_path, capsys, monkeypatch):
    """The example round as a user runs it: `snakemake --configfile <round>.yaml`, after a run stopped
    midway (`amlm experiment run --limit 1`): Snakemake trains the other five, one job a run, and writes
    the verdicts; run again, it has nothing to do and trains nothing."""
    doc = yaml.safe_load((DECL / "example.yaml").read_text())
    doc |= {"tables": str(tmp_path / "tables"), "base": str(ROOT / doc["base"])}
    doc["reference"]["tables"] = str(ROOT / doc["reference"]["tables"])
    decl = tmp_path / "example.yaml"
    decl.write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.chdir(tmp_path)  # the default work folder, results/experiments/work, as a user's: relative
    assert main(["experiment", "run", str(decl), "--limit", "1"]) == 0  # stopped after one run
    work = str(tmp_path / "results" / "experiments" / "work")  # where the Snakemake route's jobs train too
    first = pd.read_csv(tmp_path / "tables" / "runs.csv")
    snakemake = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "workflow" / "Snakefile"), "-d", str(tmp_path)]
    snakemake += ["--cores", "2", "--configfile", str(decl)]
    env = tool_env()  # the jobs' `python` is this environment's, activated or not
    done = subprocess.run(snakemake, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = pd.read_csv(tmp_path / "tables" / "runs.csv")
    assert len(runs) == 6 and runs.iloc[:1][["arm", "seed", "final_loss"]].equals(first[["arm", "seed", "final_loss"]])
    assert sorted(zip(runs["arm"], runs["seed"])) == sorted(
        (a, s) for a in ("prenorm_clip1", "prenorm_noclip") for s in (901, 902, 903)
    )
    out = tmp_path / "results" / "experiments" / "example"
    assert len(list((out / "done").iterdir())) == 6  # one job a run, the resumed one included
    verdicts = json.loads((out / "verdicts.json").read_text())
    (e1,) = verdicts["verdicts"]
    assert (
        e1["finished"] and e1["n_a"] == e1["n_b"] == 3 and e1["verdict"] in ("supported", "undecided", "contradicted")
    )
    again = subprocess.run(snakemake, capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    assert main(["experiment", "run", str(decl), "--work", work]) == 0  # nothing left: nothing trained
    assert len(pd.read_csv(tmp_path / "tables" / "runs.csv")) == 6
    capsys.readouterr()
    assert main(["experiment", "judge", str(decl), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "verdicts.json").read_text()) == verdicts
    assert '"id": "E1"' in capsys.readouterr().out


def test_one_planned_run_by_its_key_and_an_unplanned_key_refused(tmp_path):
    decl = _copy(tmp_path, "confirm_round", "confirm_round")
    rnd = D.load(decl)
    assert runner.planned_run(rnd, "S1/prenorm_clip10/0.05/107") == ("S1", "prenorm_clip10", 0.05, 107)
    with pytest.raises(UserError, match="--only 'S1/prenorm_clip10/0.05/999' is not a run of the round's plan"):
        runner.planned_run(rnd, "S1/prenorm_clip10/0.05/999")
    marker = tmp_path / "done" / "marker"
    marker.parent.mkdir()
    # a published run: nothing trained, the job's marker written
    only = ["--only", "S1/prenorm_clip10/0.05/107", "--done", str(marker), "--work", str(tmp_path / "work")]
    assert main(["experiment", "run", str(decl), *only]) == 0
    assert marker.exists() and not (tmp_path / "work").exists()
    assert main(["experiment", "run", str(decl), "--done", str(marker)]) == 2  # --done needs --only
