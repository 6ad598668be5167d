"""`amlm status`: completed, running, diverged, stopped and waiting seeds read from results/runs/."""

import copy
import json
import os
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import make_config

from acoustic_mlm import cli
from acoustic_mlm import config as C
from acoustic_mlm.artifacts.metrics import PARTIAL
from acoustic_mlm.artifacts.run_summary import COMPLETED_WITH_NONFINITE
from acoustic_mlm.report import status
from acoustic_mlm.train import loop as train
from acoustic_mlm.train.state import STATE_DIR
from acoustic_mlm.train.summary import summarize


def _rows(steps, wall, cb0, diverged_at=None, fp16=False):
    rows = pd.DataFrame(
        {
            "step": steps,
            "train_loss_cb0": cb0,
            "valid_loss_cb0": cb0,
            "wall_time": wall,
            "grad_norm_max": 1.0,
            "clipped_steps": 0,
            "nonfinite": 0,
            "overflow_skips": 0,
            "loss_scale": 128.0 if fp16 else np.nan,
            "diverged": 0,
        }
    )
    if fp16:
        rows["overflow_skips"] = np.arange(len(rows))
    if diverged_at is not None:
        rows.loc[len(rows)] = {
            **rows.iloc[-1].to_dict(),
            "step": diverged_at,
            "train_loss_cb0": np.nan,
            "nonfinite": 50,
            "diverged": 1,
            "wall_time": wall[-1] + 1.0,
        }
    return rows


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(path, index=False)


@pytest.fixture()
def cfg(smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"]["steps"] = 100
    cfg["runs"]["prenorm_clip1"]["seeds"] = [1, 2]
    return cfg


@pytest.fixture()
def runs_dir(tmp_path, cfg):
    """One completed arm (as train.finish writes it), one running, one diverged and one stopped seed,
    one waiting seed and one arm not started."""
    runs = tmp_path / "runs"
    done = _rows([1, 2, 4, 50, 100], [1.0, 2.0, 4.0, 50.0, 100.0], [10.0, 9.5, 9.0, 7.0, 6.25])
    seed_dir = runs / "prenorm_clip10" / "seeds" / "seed1"
    _write(seed_dir / "metrics.csv", done)
    typed = C.from_mapping(cfg)
    summary = summarize(done, typed.run("prenorm_clip10"), typed.train_for("prenorm_clip10"))
    (seed_dir / "summary.json").write_text(json.dumps(summary))
    # running: rows so far and a resumable state, both fresh; fp16 loss scale and skips
    running = _rows(
        [1, 2, 4, 8, 16, 32, 40], [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 40.0], [10, 9.8, 9.6, 9.0, 8.5, 8.0, 7.5], fp16=True
    )
    _write(runs / "prenorm_clip1" / "seeds" / "seed1" / PARTIAL, running)
    (runs / "prenorm_clip1" / STATE_DIR / "seed1").mkdir(parents=True)
    (runs / "prenorm_clip1" / STATE_DIR / "seed1" / "step-000000040.pt").write_bytes(b"x")
    # diverged: its last row says so; the job is writing its summary
    _write(
        runs / "postnorm_deepnorm_clip1" / "seeds" / "seed1" / PARTIAL,
        _rows([1, 2, 4], [1.0, 2.0, 4.0], [10.0, 9.9, 9.8], diverged_at=57),
    )
    # stopped: rows, but nothing new for two hours
    stale = runs / "prenorm_attnrelax_clip1" / "seeds" / "seed1" / PARTIAL
    _write(stale, _rows([1, 2, 4, 8], [1.0, 2.0, 4.0, 8.0], [10.0, 9.9, 9.8, 9.7]))
    old = time.time() - 7200
    os.utime(stale, (old, old))
    return runs


def test_status_of_completed_running_diverged_stopped_and_waiting_seeds(cfg, runs_dir):
    got = {(s.run, s.seed): s for s in status.collect(make_config(cfg), runs_dir)}
    assert {k: s.status for k, s in got.items()} == {
        ("prenorm_clip10", 1): "completed",
        ("prenorm_clip1", 1): "running",
        ("prenorm_clip1", 2): "waiting",
        ("postnorm_deepnorm_clip1", 1): "diverged",
        ("prenorm_attnrelax_clip1", 1): "stopped",
    }
    done, running = got[("prenorm_clip10", 1)], got[("prenorm_clip1", 1)]
    assert (done.step, done.total, done.cb0, done.rate) == (100, 100, 6.25, 1.0) and np.isnan(done.left_s)
    assert done.overflow_skips is None and np.isnan(done.loss_scale)  # fp32: no scaler
    assert (running.step, running.cb0) == (40, 7.5)
    assert running.rate == pytest.approx((40 - 8) / (40.0 - 8.0))  # over the last four rows
    assert running.left_s == pytest.approx(60.0)
    assert (running.loss_scale, running.overflow_skips) == (128.0, 6)
    assert got[("postnorm_deepnorm_clip1", 1)].step == 57
    assert got[("prenorm_attnrelax_clip1", 1)].idle_s == pytest.approx(7200, abs=60)


def test_stale_after_decides_running_or_stopped(cfg, runs_dir):
    stale = {s.run: s.status for s in status.collect(make_config(cfg), runs_dir, stale_after=3 * 3600)}
    assert stale["prenorm_attnrelax_clip1"] == "running"
    soon = {
        (s.run, s.seed): s.status
        for s in status.collect(make_config(cfg), runs_dir, now=time.time() + 3600, stale_after=1800)
    }
    assert soon[("prenorm_clip1", 1)] == "stopped"  # the state file counts as progress, but it is an hour old too


def test_completed_with_nonfinite_comes_from_the_summary(cfg, runs_dir):
    path = runs_dir / "prenorm_clip10" / "seeds" / "seed1" / "summary.json"
    summary = json.loads(path.read_text())
    path.write_text(json.dumps({**summary, "status": COMPLETED_WITH_NONFINITE}))
    assert status.collect(make_config(cfg), runs_dir)[0].status == "completed_with_nonfinite"


def test_amlm_status_prints_one_line_per_arm_and_seed(cfg, runs_dir, tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert cli.main(["status", "--config", str(path), "--runs-dir", str(runs_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "30m00s" in lines[0] and lines[1].split()[-1] == "status"
    body = lines[2:]
    assert len(body) == 5 and all(len(line) <= 96 for line in body)
    assert body[0].split()[:4] == ["prenorm_clip10", "1", "100/100", "6.250"] and body[0].endswith("completed")
    assert body[1].split()[-5:] == ["1", "1m00s", "128", "6", "running"]  # upd/s, left, loss scale, skips
    assert body[4].endswith("stopped 2h00m")
    assert cli.main(["status", "--config", str(path), "--runs-dir", str(runs_dir), "--stale-after", "-1"]) == 2


def test_status_of_a_real_tiny_run(data_dirs, cfg, tmp_path):
    prepared, codes = data_dirs
    cfg["train"].update(steps=4, warmup_steps=1, log_interval=2, batch_size=2, valid_crops=3, crop_seconds=0.4)
    train.run(make_config(cfg), "prenorm_clip10", prepared, codes, tmp_path / "prenorm_clip10", threads=1)
    s = status.collect(make_config(cfg), tmp_path)[0]
    assert (s.status, s.step, s.total) == ("completed", 4, 4) and np.isfinite(s.cb0) and s.rate > 0


@pytest.mark.parametrize(
    "name, damage, needles",
    [
        ("summary.json", lambda t: t[: len(t) // 2], ("not valid JSON", "cut short or edited")),
        (
            "summary.json",
            lambda t: t.replace('"prenorm_clip10"', '"prenorm\x1bclip10"'),
            ("Invalid control character",),
        ),
        ("summary.json", lambda t: t.replace('"completed"', '"done"'), ("'status' is 'done', not one of completed",)),
        ("summary.json", lambda t: "[]", ("a JSON list, not an object",)),
        ("metrics.csv", lambda t: t[:-3], ("cut short",)),
    ],
)
def test_a_damaged_summary_or_metrics_of_a_completed_seed_is_one_line(
    cfg, runs_dir, tmp_path, capsys, name, damage, needles
):
    path = runs_dir / "prenorm_clip10" / "seeds" / "seed1" / name
    path.write_text(damage(path.read_text()))
    _status_refuses(cfg, runs_dir, tmp_path, capsys, path, *needles, "rerun the train stage")


@pytest.mark.parametrize(
    "text, needles",
    [
        ("epoch,loss,time\n1,9.5,3.0\n", ("missing column(s) step",)),
        ("step,train_loss_cb0,elapsed\n1,9.5,3.0\n", ("missing column(s) wall_time",)),
        ("step,train_loss_cb0,wall_time\n1,9.5,3.0\n2,9.4,", ("cut short",)),
        ("step,train_loss_cb0,wall_time\n1,9.5,3.0\n1,9.4,4.0\n", ("'step' must increase",)),
    ],
)
def test_a_partial_metrics_file_with_other_columns_is_one_line(cfg, runs_dir, tmp_path, capsys, text, needles):
    path = runs_dir / "prenorm_clip1" / "seeds" / "seed1" / PARTIAL
    path.write_text(text)
    _status_refuses(cfg, runs_dir, tmp_path, capsys, path, *needles)


def _status_refuses(cfg, runs_dir, tmp_path, capsys, path, *needles):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    capsys.readouterr()
    assert cli.main(["status", "--config", str(cfg_path), "--runs-dir", str(runs_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"amlm status: error: {path}: "), err
    for needle in needles:
        assert needle in err, (needle, err)


def test_status_of_a_sweep_shows_its_points_with_their_seeds_and_steps(cfg, tmp_path, capsys):
    cfg["sweep"] = [
        {"grid": {"train.lr": [0.001, 0.003], "train.steps": [50, 100]}, "arms": ["prenorm_clip1"]},
        {"grid": {"model.layers": [2], "seeds": [7, 8, 9]}, "arms": ["prenorm_clip10"]},
    ]
    points = C.from_mapping(cfg).points
    runs = tmp_path / "runs"
    one = "prenorm_clip1__lr-3e-3__steps-50"
    _write(runs / one / "seeds" / "seed1" / PARTIAL, _rows([1, 2, 4], [1.0, 2.0, 4.0], [10.0, 9.0, 8.0]))
    statuses = status.collect(make_config(cfg), runs)
    assert [(s.run, s.seed) for s in statuses] == [(name, seed) for name in points for seed in points[name].seeds]
    assert len(statuses) == 4 * 2 + 3 and {s.run for s in statuses}.isdisjoint(cfg["runs"])  # points, not arms
    by = {(s.run, s.seed): s for s in statuses}
    assert by[(one, 1)].status == "running" and by[(one, 1)].total == 50 and by[(one, 1)].step == 4
    assert by[("prenorm_clip1__lr-1e-3__steps-100", 1)].total == 100
    assert [s.seed for s in statuses if s.run == "prenorm_clip10__layers-2"] == [7, 8, 9]
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert cli.main(["status", "--config", str(path), "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{runs}: 11 seeds of 5 runs") and len(out) == 2 + 11
    assert any(line.startswith(one) and line.endswith("running") for line in out)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.write_text("x"), "--runs-dir names a file, not a folder"),
        (lambda p: p.symlink_to(p.parent / "gone"), "--runs-dir names a broken link, a device or a FIFO, not a folder"),
    ],
)
def test_a_runs_dir_that_is_not_a_folder_is_refused_in_one_line(cfg, tmp_path, capsys, make, words):
    runs = tmp_path / "runs"
    make(runs)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    capsys.readouterr()
    assert cli.main(["status", "--config", str(path), "--runs-dir", str(runs)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"amlm status: error: {runs}: ") and words in err and "\n" not in err, err
    assert "waiting" not in captured.out


def test_before_any_run_every_seed_is_waiting_and_status_exits_0(cfg, tmp_path, capsys):
    """No runs folder yet (a fresh checkout): not a refusal; every arm's every seed waits, and the first
    line says the folder does not exist yet."""
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    runs = tmp_path / "results" / "runs"
    capsys.readouterr()
    assert cli.main(["status", "--config", str(path), "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out.splitlines()
    arms = make_config(cfg).runs
    seeds = sum(len(r.seeds) for r in arms.values())
    assert out[0].startswith(
        f"{runs} (no such folder yet: nothing has started there): {seeds} seeds of {len(arms)} runs"
    )
    assert len(out) == 2 + seeds and all(line.endswith("  waiting") for line in out[2:])
    assert {line.split()[0] for line in out[2:]} == set(arms)
    assert not runs.exists()  # status writes nothing
