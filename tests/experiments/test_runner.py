"""`amlm experiment run`: trains a round's planned runs that its tables lack, never one twice, and the
example round runs end to end (slow: six runs of S1, about 6 minutes on 2 cores)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

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


def test_a_round_whose_procedure_picks_its_runs_is_not_run_here(tmp_path):
    with pytest.raises(UserError, match="'rules' is sizing"):
        runner.run_round(DECL / "proxy_sizing.yaml", tmp_path / "work")


@pytest.mark.slow
def test_the_example_round_runs_resumes_and_judges(tmp_path, capsys):
    doc = yaml.safe_load((DECL / "example.yaml").read_text())
    doc["tables"] = str(tmp_path / "tables")
    decl = tmp_path / "example.yaml"
    decl.write_text(yaml.safe_dump(doc, sort_keys=False))
    work = str(tmp_path / "work")
    assert main(["experiment", "run", str(decl), "--work", work, "--limit", "1"]) == 0  # stopped after one run
    first = pd.read_csv(tmp_path / "tables" / "runs.csv")
    assert main(["experiment", "run", str(decl), "--work", work]) == 0  # resumes: the other five
    runs = pd.read_csv(tmp_path / "tables" / "runs.csv")
    assert len(runs) == 6 and runs.iloc[:1][["arm", "seed", "final_loss"]].equals(first[["arm", "seed", "final_loss"]])
    assert sorted(zip(runs["arm"], runs["seed"])) == sorted(
        (a, s) for a in ("prenorm_clip1", "prenorm_noclip") for s in (901, 902, 903)
    )
    assert main(["experiment", "run", str(decl), "--work", work]) == 0  # nothing left: nothing trained
    assert len(pd.read_csv(tmp_path / "tables" / "runs.csv")) == 6
    capsys.readouterr()
    assert main(["experiment", "judge", str(decl), "--out", str(tmp_path / "out")]) == 0
    verdicts = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    (e1,) = verdicts["verdicts"]
    assert (
        e1["finished"] and e1["n_a"] == e1["n_b"] == 3 and e1["verdict"] in ("supported", "undecided", "contradicted")
    )
    assert '"id": "E1"' in capsys.readouterr().out
