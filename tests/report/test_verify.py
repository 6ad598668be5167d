"""`amlm verify`: a fresh run against a recorded reference, the shipped references' contents."""

import copy
import json
import re
import shutil

import pandas as pd
import pytest
import yaml

from acoustic_mlm import cli
from acoustic_mlm.report import verify
from acoustic_mlm import config as C
from acoustic_mlm.train import loop as train

ARMS = ("prenorm_clip10", "postnorm_deepnorm_clip1")


@pytest.fixture()
def tiny(smoke_cfg, tmp_path):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(steps=6, warmup_steps=2, log_interval=3, batch_size=2, valid_crops=3, crop_seconds=0.4)
    cfg["runs"] = {run: cfg["runs"][run] for run in ARMS}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg, path


def _train(cfg, data_dirs, runs_dir):
    prepared, codes = data_dirs
    for run in cfg["runs"]:
        train.run(cfg, run, prepared, codes, runs_dir / run, threads=1)


def test_a_fresh_run_matches_its_reference_and_a_changed_one_does_not(data_dirs, tiny, tmp_path, capsys):
    cfg, path = tiny
    _train(cfg, data_dirs, tmp_path / "first")
    ref = tmp_path / "ref"
    assert cli.main(["verify", "--config", str(path), "--runs-dir", str(tmp_path / "first"), "--record", str(ref),
                     "--tolerance", "0.01"]) == 0
    meta = json.loads((ref / verify.META).read_text())
    assert meta["version"] and meta["machine"]["torch"] and meta["tolerance_bits"] == 0.01
    assert "--record" in meta["command"] and set(meta["arms"]) == set(ARMS)
    _train(cfg, data_dirs, tmp_path / "fresh")  # a second, independent run on this machine
    out = tmp_path / "check.png"
    capsys.readouterr()
    assert cli.main(["verify", "--config", str(path), "--runs-dir", str(tmp_path / "fresh"), "--reference", str(ref),
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.stat().st_size > 1000
    result = verify.compare(cfg, tmp_path / "fresh", ref)
    assert result["passed"] and all(a["bits"] == 0.0 for a in result["arms"].values())  # deterministic on CPU
    assert all(re.search(rf"^{run} +largest difference 0 bits .* ok$", printed, re.M) for run in ARMS), printed

    # one valid loss of one arm off by 0.2 bits: that arm, that column and step, exit 1
    metrics_path = tmp_path / "fresh" / "postnorm_deepnorm_clip1" / "metrics.csv"
    metrics = pd.read_csv(metrics_path)
    metrics.loc[2, "valid_loss_cb3"] += 0.2
    metrics.to_csv(metrics_path, index=False)
    result = verify.compare(cfg, tmp_path / "fresh", ref)
    arm = result["arms"]["postnorm_deepnorm_clip1"]
    assert not result["passed"] and result["arms"]["prenorm_clip10"]["within"]
    assert (arm["column"], arm["step"], arm["within"]) == ("valid_loss_cb3", int(metrics.loc[2, "step"]), False)
    assert arm["bits"] == pytest.approx(0.2)
    assert cli.main(["verify", "--config", str(path), "--runs-dir", str(tmp_path / "fresh"), "--reference", str(ref),
                     "--out", str(out)]) == 1
    # a row missing (a run that stopped early) is an infinite difference
    metrics.iloc[:-1].to_csv(metrics_path, index=False)
    assert verify.compare(cfg, tmp_path / "fresh", ref)["arms"]["postnorm_deepnorm_clip1"]["bits"] == float("inf")


def test_a_run_of_other_settings_is_refused_by_name(data_dirs, tiny, tmp_path, capsys):
    cfg, path = tiny
    _train(cfg, data_dirs, tmp_path / "first")
    verify.record(cfg, path, tmp_path / "first", tmp_path / "ref", "test")
    other = copy.deepcopy(cfg)
    other["train"]["lr"] = 0.001
    path.write_text(yaml.safe_dump(other, sort_keys=False))
    capsys.readouterr()  # the training's progress lines
    assert cli.main(["verify", "--config", str(path), "--runs-dir", str(tmp_path / "first"),
                     "--reference", str(tmp_path / "ref")]) == 2
    err = capsys.readouterr().err
    assert "runs.prenorm_clip10: its settings differ" in err
    assert f"train.lr: 0.001 here, {cfg['train']['lr']} in the reference" in err
    assert len(err.strip().splitlines()) == 1
    assert cli.main(["verify", "--config", str(path), "--reference", str(tmp_path / "nothing")]) == 2


def test_a_reference_recorded_under_renamed_keys_is_read_under_the_new_names(root, tmp_path):
    """A reference stores each arm's settings by key; a key renamed since (config.RENAMED_KEYS, values
    unchanged) is read under its new name, so the reference still matches its preset."""
    cfg = C.load(root / "config" / "smoke.yaml")
    ref = shutil.copytree(root / "data" / "reference" / "smoke_run", tmp_path / "ref")
    meta = json.loads((ref / verify.META).read_text())
    old_name = {new: old for old, new in C.RENAMED_KEYS.items()}
    meta["arms"] = {run: {old_name.get(k, k): v for k, v in settings.items()}
                    for run, settings in verify.fingerprints(cfg).items()}
    (ref / verify.META).write_text(json.dumps(meta))
    assert all("tokenizer.level" in s and "tokenizer.loudness" not in s for s in meta["arms"].values())
    _, read = verify.load_reference(ref)
    assert read["arms"] == verify.fingerprints(cfg)
    assert read["arms"]["prenorm_clip1"]["tokenizer.loudness"] == cfg["tokenizer"]["loudness"]


def _rows(losses, steps=(1, 2, 4, 8)):
    return pd.DataFrame({"seed": 1, "step": list(steps), "train_loss_cb0": losses, "valid_loss_cb0": losses})


def test_the_windows_hold_early_rows_tight_and_late_rows_to_their_own_tolerance():
    ref = _rows([10.0, 9.5, 9.0, 8.0])
    meta = {"tolerance_bits": 0.001, "tolerance_until_step": 2, "late_tolerance_bits": 0.5}
    wins = verify.windows(meta)
    assert [w["name"] for w in wins] == ["steps <= 2", "steps > 2"]
    assert [w["tolerance_bits"] for w in wins] == [0.001, 0.5]
    drifted = _rows([10.0, 9.5, 9.3, 8.4])  # 0.4 bits late: within 0.5
    early = verify.largest_difference(drifted, ref, wins[0]["steps"])
    late = verify.largest_difference(drifted, ref, wins[1]["steps"])
    assert early["bits"] == 0.0 and late["bits"] == pytest.approx(0.4) and late["step"] == 8
    broken = _rows([10.01, 9.5, 9.0, 8.0])  # 0.01 bits at step 1: outside 0.001
    assert verify.largest_difference(broken, ref, wins[0]["steps"])["bits"] == pytest.approx(0.01)
    assert verify.largest_difference(broken, ref, wins[1]["steps"])["bits"] == 0.0
    # without tolerance_until_step every row is held to tolerance_bits; --tolerance sets the first window
    assert [w["steps"] for w in verify.windows({"tolerance_bits": 0.01})] == [(-float("inf"), float("inf"))]
    assert verify.windows(meta, tolerance_bits=0.2)[0]["tolerance_bits"] == 0.2


def test_record_refuses_a_window_without_its_tolerance(tmp_path, smoke_cfg):
    with pytest.raises(verify.UserError, match="--until-step and --late-tolerance go together"):
        verify.record(smoke_cfg, tmp_path / "c.yaml", tmp_path, tmp_path / "ref", "cmd", until_step=300)


@pytest.mark.parametrize("preset, folder", [("config/smoke.yaml", "smoke_run"), ("config/config.yaml", "default_run")])
def test_the_shipped_references_match_their_presets(root, preset, folder):
    """A setting added to the train step changes the fingerprint: record the reference again (docs/reference_run.md)."""
    cfg = C.load(root / preset)
    ref, meta = verify.load_reference(root / "data" / "reference" / folder)
    assert meta["arms"] == verify.fingerprints(cfg)  # made with the preset as it is now
    assert meta["config"] == preset and meta["version"] and meta["commit"] and meta["machine"]["cpu"]
    assert meta["tolerance_measurement"] and meta["tolerance_bits"] > 0
    for run in cfg["runs"]:
        rows = ref[ref["run"] == run]
        assert rows["step"].max() == cfg["train"]["steps"] or rows["diverged"].any(), run
        assert {f"train_loss_cb{k}" for k in range(cfg["model"]["codebooks"])} <= set(rows.columns)
