"""`amlm decide` trusts no folder it finds: one seed per arm gives no verdict and no seed estimate; a
folder still training, a copy of a folder, runs of one cell trained differently and damaged fields of a
summary are one line each (exit 2); its four files change as a whole; --out naming a file is refused."""

import json
import math
import shutil

import pandas as pd
import pytest
from test_decisive import U, write_run

from acoustic_mlm.cli import main
from acoustic_mlm.report import decisive as D


@pytest.fixture()
def dirs(tmp_path):
    runs, codes = tmp_path / "runs", tmp_path / "codes"
    codes.mkdir()
    (codes / "tokenizer.json").write_text(
        json.dumps({"n_codebooks": 1, "max_code": [1023], "codebook_size": 1024, "unigram_entropy_bits": [U]})
    )
    return runs, codes


def _decide(runs, codes, out):
    return main(["decide", "--runs-dir", str(runs), "--codes", str(codes), "--out", str(out)])


def _refused(capsys, *needles) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("amlm decide: error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and all(n in err for n in needles), err
    return err


def _two_budgets(runs, a_seeds, b_seeds):
    for steps in (500, 1000):
        write_run(runs, f"a{steps}", "deepnorm", "softmax", 1.0, a_seeds, steps=steps)
        write_run(runs, f"b{steps}", "post", "softmax", 1.0, b_seeds, steps=steps)


@pytest.mark.parametrize(
    "a_seeds, b_seeds", [({1: 6.8}, {1: 9.44}), ({1: 6.8}, {1: 9.44, 2: 9.45}), ({1: 9.4}, {1: 9.44})]
)
def test_one_seed_in_an_arm_gives_no_spread_no_verdict_and_no_seed_estimate(dirs, tmp_path, a_seeds, b_seeds):
    runs, codes = dirs
    _two_budgets(runs, a_seeds, b_seeds)
    assert _decide(runs, codes, tmp_path / "out") == 0
    promise = next(
        p for p in json.loads((tmp_path / "out" / "decisive.json").read_text())["promises"] if p["id"] == "deepnorm"
    )
    assert promise["verdict"] == D.INCONCLUSIVE
    for row in promise["rows"]:
        assert row["too_few_seeds"] and row["se"] is None and row["resolution"] is None
        assert (
            row["loss_outcome"] == "unresolved" and row["seeds_for_loss"] is None and row["seeds_for_survival"] is None
        )
    md = (tmp_path / "out" / "decisive.md").read_text()
    assert "one seed in an arm, so no spread" in md and "would be decided" not in md


def test_two_seeds_per_arm_are_judged_as_before():
    a = pd.DataFrame({"capped_loss": [6.8, 6.9], "trained": [True, True], "late_fall": [0.0, 0.0], "wall_time_s": 1.0})
    b = pd.DataFrame(
        {"capped_loss": [9.4, 9.5], "trained": [False, False], "late_fall": [0.0, 0.0], "wall_time_s": 1.0}
    )
    r = D.without_spread(D.compare(a, b, math.nan))
    assert not r["too_few_seeds"] and r["se"] > 0 and r["loss_outcome"] == "A lower"


@pytest.mark.parametrize("made", ["seeds", "state", "both"])
def test_a_folder_still_training_is_refused_not_left_out(dirs, tmp_path, capsys, made):
    runs, codes = dirs
    _two_budgets(runs, {1: 6.8, 2: 6.9}, {1: 9.44, 2: 9.45})
    for part in {"seeds": ["seeds/seed1"], "state": ["state/seed1"], "both": ["seeds/seed1", "state/seed1"]}[made]:
        (runs / "c_training" / part).mkdir(parents=True)
    (runs / ".a500.tmp-1-x").mkdir()  # a temporary name of an atomic output: not a run
    assert _decide(runs, codes, tmp_path / "out") == 2
    _refused(capsys, str(runs / "c_training"), "no summary.json yet", "move it out of")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("copy_name", ["a500.bak", "a500 (copy)", "old_a500"])
def test_a_copy_of_a_run_folder_is_refused_not_counted_as_more_seeds(dirs, tmp_path, capsys, copy_name):
    runs, codes = dirs
    _two_budgets(runs, {1: 6.8, 2: 6.9}, {1: 9.44, 2: 9.45})
    shutil.copytree(runs / "a500", runs / copy_name)
    assert _decide(runs, codes, tmp_path / "out") == 2
    _refused(capsys, "seed 1", "a copy of a run folder", "a500")


@pytest.mark.parametrize(
    "key, value", [("train.batch_size", 16), ("model.dim", 256), ("runs.*.norm_eps", 1e-6), ("data.sample_rate", 16000)]
)
def test_runs_of_one_cell_trained_differently_are_not_pooled(dirs, tmp_path, capsys, key, value):
    runs, codes = dirs
    _two_budgets(runs, {1: 6.8, 2: 6.9}, {1: 9.44, 2: 9.45})
    write_run(runs, "a500_more", "deepnorm", "softmax", 1.0, {3: 6.7, 4: 6.8}, steps=500)  # more seeds, other settings
    path = runs / "a500_more" / "summary.json"
    summary = json.loads(path.read_text())
    summary["settings"][key.replace("*", "a500_more")] = value
    path.write_text(json.dumps(summary))
    assert _decide(runs, codes, tmp_path / "out") == 2
    _refused(capsys, "a500_more", "pooled with a500", key, "move one of them out")


def test_more_seeds_in_another_folder_of_the_same_settings_are_pooled(dirs, tmp_path):
    runs, codes = dirs
    _two_budgets(runs, {1: 6.8, 2: 6.9}, {1: 9.44, 2: 9.45})
    write_run(runs, "a500_more", "deepnorm", "softmax", 1.0, {3: 6.7, 4: 6.8}, steps=500)
    assert _decide(runs, codes, tmp_path / "out") == 0
    table = pd.read_csv(tmp_path / "out" / "runs.csv")
    assert sorted(table[(table["arm"] == "deepnorm") & (table["steps"] == 500)]["seed"]) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "damage, needles",
    [
        (lambda s: s["per_seed"]["1"].update(max_grad_norm="big"), ["'max_grad_norm' is 'big'"]),
        (lambda s: s["per_seed"]["1"].update(nonfinite_steps=-3), ["'nonfinite_steps' is -3"]),
        (lambda s: s["per_seed"]["1"].update(overflow_skips=1.5), ["'overflow_skips' is 1.5"]),
        (lambda s: s["per_seed"]["1"].update(status="exploded"), ["'per_seed.1.status' is 'exploded'"]),
        (lambda s: s["per_seed"].update(one=s["per_seed"].pop("1")), ["'per_seed.one'"]),
        (lambda s: s["per_seed"].update({"1": [6.8]}), ["'per_seed.1'"]),
        (lambda s: s["settings"].update({"train.lr": "fast"}), ["'settings.train.lr' is 'fast'"]),
        (lambda s: s["settings"].update({"model.layers": None}), ["'settings.model.layers' is null"]),
        (lambda s: s["settings"].pop("runs.a500.clip"), ["'settings.runs.*.clip'"]),
        (lambda s: s.update(per_seed={}), ["'per_seed' is empty"]),
    ],
)
def test_a_damaged_field_of_a_summary_is_one_line(dirs, tmp_path, capsys, damage, needles):
    runs, codes = dirs
    _two_budgets(runs, {1: 6.8, 2: 6.9}, {1: 9.44, 2: 9.45})
    path = runs / "a500" / "summary.json"
    summary = json.loads(path.read_text())
    damage(summary)
    path.write_text(json.dumps(summary))
    assert _decide(runs, codes, tmp_path / "out") == 2
    _refused(capsys, str(path), *needles)


@pytest.mark.parametrize("make", ["missing", "file"])
def test_a_runs_dir_that_is_missing_or_a_file_is_named_as_such(dirs, tmp_path, capsys, make):
    runs, codes = dirs
    if make == "file":
        runs.write_text("x")
    assert _decide(runs, codes, tmp_path / "out") == 2
    err = _refused(capsys, str(runs), "does not exist" if make == "missing" else "is not a folder")
    assert "train" not in err.split(";")[0]


def test_an_empty_runs_dir_still_says_train_first(dirs, tmp_path, capsys):
    runs, codes = dirs
    runs.mkdir()
    assert _decide(runs, codes, tmp_path / "out") == 2
    _refused(capsys, "no run folder with a summary.json", "train the experiment's points first")


def test_out_naming_a_file_is_one_line(dirs, tmp_path, capsys):
    runs, codes = dirs
    _two_budgets(runs, {1: 6.8, 2: 6.9}, {1: 9.44, 2: 9.45})
    out = tmp_path / "decisive.md"
    out.write_text("notes")
    assert _decide(runs, codes, out) == 2
    _refused(capsys, str(out), "--out names an existing file")
    assert out.read_text() == "notes"


def test_the_four_files_change_together_or_not_at_all(dirs, tmp_path, monkeypatch):
    runs, codes = dirs
    _two_budgets(runs, {1: 6.8, 2: 6.9}, {1: 9.44, 2: 9.45})
    out = tmp_path / "out"
    assert _decide(runs, codes, out) == 0
    (out / "notes.txt").write_text("mine")  # another file in the folder is carried over
    before = {n: (out / n).read_bytes() for n in D.DECIDE_FILES}
    write_run(runs, "a500_more", "deepnorm", "softmax", 1.0, {3: 6.7, 4: 6.8}, steps=500)  # another judgement

    def stopped(result):  # the last of the four files fails (a stop, a full disk) after the others were written
        raise KeyboardInterrupt

    monkeypatch.setattr(D, "to_markdown", stopped)
    with pytest.raises(KeyboardInterrupt):
        D.run(runs, codes, out)
    assert {n: (out / n).read_bytes() for n in D.DECIDE_FILES} == before  # the old judgement, whole
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary folder left
    monkeypatch.undo()
    D.run(runs, codes, out)
    assert len(pd.read_csv(out / "runs.csv")) == len(pd.read_csv(runs.parent / "out" / "runs.csv"))
    assert (out / "notes.txt").read_text() == "mine" and (out / "decisive.json").read_bytes() != before["decisive.json"]


STOPPED_DECIDE = r"""
import sys, time
from acoustic_mlm import cli
from acoustic_mlm.report import decisive as D

real = D.to_markdown

def slow(result):  # runs.csv, cells.csv and decisive.json are written by now
    print("writing", flush=True)
    time.sleep(60)
    return real(result)

D.to_markdown = slow
sys.exit(cli.main(["decide", "--runs-dir", sys.argv[1], "--codes", sys.argv[2], "--out", sys.argv[3]]))
"""


@pytest.mark.slow
def test_a_sigterm_while_decide_writes_leaves_the_previous_judgement_whole(dirs, tmp_path):
    import signal
    import subprocess
    import sys

    runs, codes = dirs
    _two_budgets(runs, {1: 6.8, 2: 6.9}, {1: 9.44, 2: 9.45})
    out = tmp_path / "out"
    assert _decide(runs, codes, out) == 0
    before = {n: (out / n).read_bytes() for n in D.DECIDE_FILES}
    write_run(runs, "a500_more", "deepnorm", "softmax", 1.0, {3: 6.7, 4: 6.8}, steps=500)  # another judgement
    proc = subprocess.Popen(
        [sys.executable, "-c", STOPPED_DECIDE, str(runs), str(codes), str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        proc.kill()
    assert {n: (out / n).read_bytes() for n in D.DECIDE_FILES} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["codes", "out", "runs"]  # no temporary folder left


def test_a_folder_a_train_is_writing_is_refused_even_over_an_earlier_summary(dirs, tmp_path, capsys):
    from acoustic_mlm.folder_lock import folder_busy, folder_lock

    runs, codes = dirs
    _two_budgets(runs, {1: 6.8, 2: 6.9}, {1: 9.44, 2: 9.45})
    assert folder_busy(runs / "a500") is None
    with folder_lock(runs / "a500", "train a500"):  # retrained now: its summary.json is the earlier run's
        assert folder_busy(runs / "a500").startswith("amlm train a500 (pid ")
        assert _decide(runs, codes, tmp_path / "out") == 2
    _refused(capsys, str(runs / "a500"), "amlm train a500 (pid", "is writing this run folder now")
    assert folder_busy(runs / "a500") is None and _decide(runs, codes, tmp_path / "out") == 0
