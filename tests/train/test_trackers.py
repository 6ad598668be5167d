"""train.loggers: TensorBoard events equal the CSV rows, W&B offline run files, a failing tracker."""

import copy
import logging
import math
import os
import sys

import pandas as pd
import pytest
from helpers import make_config

from acoustic_mlm import config as C
from acoustic_mlm.errors import UserError
from acoustic_mlm.train import loop as train
from acoustic_mlm.train import trackers
from acoustic_mlm.train.state import fingerprint


@pytest.fixture()
def tiny_cfg(smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(steps=12, warmup_steps=2, log_interval=5, batch_size=2, valid_crops=3, crop_seconds=0.4)
    return cfg


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_equal_the_csv_rows(data_dirs, tiny_cfg, tmp_path):
    prepared, codes = data_dirs
    tiny_cfg["train"]["loggers"] = ["csv", "tensorboard"]
    train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "run", threads=1)
    seed_dir = tmp_path / "run" / "seeds" / "seed1"
    rows = pd.read_csv(seed_dir / "metrics.csv")
    events = _events(seed_dir / trackers.TENSORBOARD_DIR)
    assert set(events) == set(rows.columns) - {"step"}  # every scalar of a row, nothing else
    for column in events:
        steps, values = zip(*events[column])
        assert list(steps) == rows["step"].tolist(), column
        for got, want in zip(values, rows[column]):  # event values are float32
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-6, abs=1e-30), column


def test_loggers_do_not_change_results_nor_the_fingerprint(tiny_cfg):
    with_tb = copy.deepcopy(tiny_cfg)
    with_tb["train"].update(loggers=["csv", "tensorboard", "wandb"], wandb_project="other")
    for step in C.STEP_KEYS:
        run = "prenorm_clip1" if step == "train" else None
        assert C.settings(tiny_cfg, C.result_keys(step, tiny_cfg, run)) == C.settings(
            with_tb, C.result_keys(step, with_tb, run)
        )
    assert fingerprint(tiny_cfg, "prenorm_clip1", 1) == fingerprint(with_tb, "prenorm_clip1", 1)


def test_loggers_must_name_known_trackers_and_keep_the_csv(tiny_cfg):
    for bad in (["tensorboard"], ["csv", "mlflow"], ["csv", "csv"]):
        tiny_cfg["train"]["loggers"] = bad
        with pytest.raises(C.ConfigError, match="train.loggers"):
            C.validate(tiny_cfg)


def test_wandb_offline_writes_its_run_files(data_dirs, tiny_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    prepared, codes = data_dirs
    tiny_cfg["train"].update(steps=4, loggers=["csv", "wandb"], wandb_project="amlm-test")
    train.run(make_config(tiny_cfg), "prenorm_clip10", prepared, codes, tmp_path / "run", threads=1)
    runs = list((tmp_path / "run" / "seeds" / "seed1" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    files = list(runs[0].glob("run-*.wandb"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    data = files[0].read_bytes()  # protobuf records: names and keys are stored as plain bytes
    assert b"amlm-test" in data and b"prenorm_clip10-seed1" in data  # project and run name from the config
    rows = pd.read_csv(tmp_path / "run" / "seeds" / "seed1" / "metrics.csv")
    for column in set(rows.columns) - {"step"}:  # each history record names every column of its row
        assert data.count(column.encode()) >= len(rows), column


class _Raises:
    name = "broken"
    calls = 0

    def __init__(self, *args):
        pass

    def log(self, row):
        _Raises.calls += 1
        raise OSError(28, "No space left on device")

    def close(self):
        pass


def test_a_tracker_that_raises_warns_once_and_training_goes_on(data_dirs, tiny_cfg, tmp_path, monkeypatch, caplog):
    prepared, codes = data_dirs
    monkeypatch.setitem(trackers._BACKENDS, "tensorboard", _Raises)
    tiny_cfg["train"]["loggers"] = ["csv", "tensorboard"]
    with caplog.at_level(logging.WARNING, logger="acoustic_mlm"):
        summary = train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "run", threads=1)
    assert summary["status"] == "completed"
    assert pd.read_csv(tmp_path / "run" / "metrics.csv")["step"].tolist() == [1, 2, 4, 5, 8, 10, 12]
    assert _Raises.calls == 1  # dropped after its first failure
    warnings = [r.getMessage() for r in caplog.records if "tracker" in r.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0]


def test_a_tracker_that_cannot_start_warns_and_training_goes_on(data_dirs, tiny_cfg, tmp_path, monkeypatch, caplog):
    class CannotStart(_Raises):
        def __init__(self, *args):
            raise ConnectionError("api.wandb.ai unreachable")

    prepared, codes = data_dirs
    monkeypatch.setitem(trackers._BACKENDS, "wandb", CannotStart)
    monkeypatch.setattr(trackers, "check_available", lambda names: None)
    tiny_cfg["train"].update(steps=4, loggers=["csv", "wandb"])
    with caplog.at_level(logging.WARNING, logger="acoustic_mlm"):
        summary = train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "run", threads=1)
    assert summary["status"] == "completed"
    assert any("could not start" in r.getMessage() and "unreachable" in r.getMessage() for r in caplog.records)


def test_a_named_tracker_whose_package_is_missing_stops_before_training(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a module it cannot import
    with pytest.raises(UserError, match=r"'train.loggers' names wandb.*pip install -e \"\.\[wandb\]\"") as err:
        trackers.check_available(["csv", "wandb"])
    assert "whose package 'wandb' is not installed (ModuleNotFoundError: " in str(err.value)


BROKEN = {  # what an installed package can raise while it is imported: (its code, the error's text)
    "AttributeError": (
        "raise AttributeError(\"module 'numpy' has no attribute 'float_'\")",
        "module 'numpy' has no attribute 'float_'",
    ),
    "ImportError": (
        "raise ImportError(\"cannot import name 'builder' from 'google.protobuf.internal'\")",
        "cannot import name 'builder' from 'google.protobuf.internal'",
    ),
    "OSError": (
        'raise OSError("libstdc++.so.6: version GLIBCXX_3.4.30 not found")',
        "libstdc++.so.6: version GLIBCXX_3.4.30 not found",
    ),
    "ModuleNotFoundError": (
        "import a_dependency_it_lacks",  # a missing dependency of an installed package
        "No module named 'a_dependency_it_lacks'",
    ),
}


def _broken_package(tmp_path, monkeypatch, package: str, error: str, forget=()):
    """`package` installed on sys.path, raising `error` when it is imported; the real one forgotten."""
    import importlib

    folder = tmp_path / "site" / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(BROKEN[error][0] + "\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")] + list(forget):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()


@pytest.mark.parametrize("error", list(BROKEN))
@pytest.mark.parametrize(
    "logger, package, forget",
    [
        ("wandb", "wandb", ()),
        ("tensorboard", "tensorboard", ("torch.utils.tensorboard",)),  # torch's writer imports it
    ],
)
def test_a_tracker_installed_but_failing_to_import_stops_like_a_missing_one(
    tmp_path, monkeypatch, logger, package, forget, error
):
    _broken_package(tmp_path, monkeypatch, package, error, forget)
    with pytest.raises(UserError) as err:
        trackers.check_available(["csv", logger])
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        f"'train.loggers' names {logger}, whose package '{package}' is installed but fails to import ({error}: "
    ), msg
    assert f"({error}: {BROKEN[error][1]})" in msg, msg
    assert f"or remove {logger} from train.loggers" in msg


def test_amlm_train_with_a_broken_tracker_stops_before_the_first_step(data_dirs, tiny_cfg, tmp_path):
    import subprocess

    import yaml

    site = tmp_path / "site" / "wandb"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(BROKEN["AttributeError"][0] + "\n")
    tiny_cfg["train"]["loggers"] = ["csv", "wandb"]
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tiny_cfg))
    prepared, codes = data_dirs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "acoustic_mlm",
            "train",
            "prenorm_clip1",
            "--config",
            str(tmp_path / "cfg.yaml"),
            "--prepared",
            str(prepared),
            "--codes",
            str(codes),
            "--out",
            str(tmp_path / "run"),
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()
    assert len(last) == 1 and last[0].startswith(
        "amlm train: error: 'train.loggers' names wandb, whose package "
        "'wandb' is installed but fails to import (AttributeError: "
    ), r.stderr
    assert not (tmp_path / "run" / "seeds").exists()  # nothing trained, no step taken


def test_only_the_first_process_opens_trackers(tiny_cfg, tmp_path):
    tiny_cfg["train"]["loggers"] = ["csv", "tensorboard"]
    with trackers.Trackers(tiny_cfg, "prenorm_clip1", 1, tmp_path, enabled=False) as t:
        t.log({"step": 1, "train_loss_cb0": 9.0})
        assert t.active == []
    assert not (tmp_path / trackers.TENSORBOARD_DIR).exists()
