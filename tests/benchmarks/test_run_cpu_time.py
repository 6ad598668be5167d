"""benchmarks/run_cpu_time.py: a published run trained again is compared with its published curve and its
row appended (the training itself replaced: nothing is trained or timed here)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from helpers import load_benchmark

from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import corpora, runner

ROOT = Path(__file__).resolve().parents[2]
DECL = ROOT / "config" / "experiments" / "proxy_sizing.yaml"
bench = load_benchmark("run_cpu_time")


def _published_curve(size, arm, lr, seed) -> pd.DataFrame:
    c = pd.read_csv(ROOT / "data" / "reference" / "proxy_sizing" / "curves.csv")
    return c[(c["size"] == size) & (c["arm"] == arm) & (c["lr"] == lr) & (c["seed"] == seed)].reset_index(drop=True)


@pytest.fixture
def trained(monkeypatch):
    """train_one in place: the published curve, changed by `shift` bits at its last row."""
    state = {"shift": 0.0, "asked": []}

    def fake(rnd, run, work):
        state["asked"].append(run)
        curve = _published_curve(*run)
        curve.loc[len(curve) - 1, "train_loss_cb0"] += state["shift"]
        return ({"final_loss": 1.1164439042409262}, curve, []), Path(work)

    monkeypatch.setattr(runner, "train_one", fake)
    monkeypatch.setattr(corpora, "data_for", lambda name, work: None)
    monkeypatch.chdir(ROOT)
    return state


def test_a_rerun_with_the_published_curve_is_the_same_curve_and_its_row_is_appended(trained, tmp_path):
    out = tmp_path / "retime.csv"
    [row] = bench.main([str(DECL), "S1/prenorm_clip1/0.05/1", "--work", str(tmp_path / "w"), "--out", str(out)])
    assert trained["asked"] == [("S1", "prenorm_clip1", 0.05, 1)]
    assert row["same_curve"] is True and row["final_loss"] == 1.1164439042409262 and row["cpu_s"] >= 0
    trained["shift"] = 1e-6  # one row off by a millionth of a bit: not the same curve
    bench.main([str(DECL), "S1/prenorm_clip1/0.05/1", "--work", str(tmp_path / "w"), "--out", str(out)])
    table = pd.read_csv(out)
    assert list(table.columns) == ["size", "arm", "lr", "seed", "cpu_s", "wall_s", "same_curve", "final_loss"]
    assert table["same_curve"].tolist() == [True, False]


def test_a_run_outside_the_plan_or_without_a_published_curve_is_one_line(trained, tmp_path):
    out = ["--out", str(tmp_path / "retime.csv")]
    with pytest.raises(UserError, match="--only 'S1/prenorm_clip1/0.5/1' is not a run of the round's plan"):
        bench.main([str(DECL), "S1/prenorm_clip1/0.5/1", *out])
    with pytest.raises(UserError, match=r"curves\.csv: no published curve of D6/prenorm_clip1/0\.3/2"):
        bench.main([str(DECL), "D6/prenorm_clip1/0.3/2", *out])
    assert trained["asked"] == [] and not (tmp_path / "retime.csv").exists()
