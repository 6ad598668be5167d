"""`amlm experiment`: its verbs on the command line (plan, judge; run and status in test_runner and
test_judge), one line and exit 2 for a bad value."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.cli import main

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "data" / "reference"
DECL = ROOT / "config" / "experiments"


def test_amlm_experiment_judge_prints_and_writes(tmp_path, capsys):
    rc = main(["experiment", "judge", str(DECL / "pb_relax_training.yaml"), "--out", str(tmp_path / "o")])
    assert rc in (0, None)
    out = capsys.readouterr().out
    assert '"verdict": "undecided: the cells are not as the rules need"' in out
    assert (tmp_path / "o" / "verdict.json").read_bytes() == (REF / "pb_relax_training" / "verdict.json").read_bytes()


def test_amlm_experiment_plan_counts_the_done_runs(capsys):
    main(["experiment", "plan", str(DECL / "pb_relax_confirm.yaml")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("pb_relax_confirm: 12 runs planned, 12 done, 0 to run")


def test_a_bad_limit_and_a_missing_declaration_are_one_line(tmp_path, capsys):
    assert main(["experiment", "run", str(DECL / "example.yaml"), "--limit", "0", "--work", str(tmp_path)]) == 2
    assert main(["experiment", "plan", str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--limit must be a positive number of runs" in err[0] and "none.yaml" in err[1]
