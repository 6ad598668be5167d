"""`amlm verify`: a fresh run against a recorded reference, the shipped references' contents."""

import copy
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from acoustic_mlm import cli
from acoustic_mlm import config as C
from acoustic_mlm.artifacts.metrics import LOSS_COLUMN
from acoustic_mlm.artifacts.reference_run import META, METRICS
from acoustic_mlm.report import verify
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


def _verify(config, runs_dir, *options) -> int:
    """`amlm verify --config CONFIG --runs-dir RUNS_DIR OPTIONS...`: its exit status."""
    return cli.main(["verify", "--config", str(config), "--runs-dir", str(runs_dir), *map(str, options)])


def _train(cfg, data_dirs, runs_dir):
    prepared, codes = data_dirs
    for run in cfg["runs"]:
        train.run(cfg, run, prepared, codes, runs_dir / run, threads=1)


def test_a_fresh_run_matches_its_reference_and_a_changed_one_does_not(data_dirs, tiny, tmp_path, capsys):
    cfg, path = tiny
    _train(cfg, data_dirs, tmp_path / "first")
    ref = tmp_path / "ref"
    data = data_dirs[0].parent
    assert _verify(path, str(tmp_path / "first"), "--record", str(ref), "--tolerance", "0.01", "--data", str(data)) == 0
    meta = json.loads((ref / META).read_text())
    assert meta["version"] and meta["machine"]["torch"] and meta["tolerance_bits"] == 0.01
    assert "--record" in meta["command"] and set(meta["arms"]) == set(ARMS)
    _train(cfg, data_dirs, tmp_path / "fresh")  # a second, independent run on this machine
    out = tmp_path / "check.png"
    capsys.readouterr()
    assert _verify(path, str(tmp_path / "fresh"), "--reference", str(ref), "--out", str(out), "--data", str(data)) == 0
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
    assert _verify(path, str(tmp_path / "fresh"), "--reference", str(ref), "--out", str(out), "--data", str(data)) == 1
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
    assert _verify(path, str(tmp_path / "first"), "--reference", str(tmp_path / "ref")) == 2
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
    meta = json.loads((ref / META).read_text())
    old_name = {new: old for old, new in C.RENAMED_KEYS.items()}
    meta["arms"] = {
        run: {old_name.get(k, k): v for k, v in settings.items()} for run, settings in verify.fingerprints(cfg).items()
    }
    (ref / META).write_text(json.dumps(meta))
    assert all("tokenizer.level" in s and "tokenizer.loudness" not in s for s in meta["arms"].values())
    _, read = verify.load_reference(ref)
    assert read["arms"] == verify.fingerprints(cfg)
    assert read["arms"]["prenorm_clip1"]["tokenizer.loudness"] == cfg.tokenizer.loudness


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
    # recorded under pinned kernels, with every data stage's outputs hashed
    assert meta["cpu_kernels"] == "avx2" and meta["kernels_used"] == "pinned"
    assert all(meta["data_hashes"][stage] for stage in ("fetch", "prepare", "tokenize"))
    assert meta["native_tolerance_bits"] > 0 and meta["late_tolerance_bits"] > 0
    for run in cfg.runs:
        rows = ref[ref["run"] == run]
        assert rows["step"].max() == cfg.train.steps or rows["diverged"].any(), run
        assert {f"train_loss_cb{k}" for k in range(cfg.model.codebooks)} <= set(rows.columns)


# --- pinned and native runs against a pinned reference (hand-made runs, data and reference) ----------

COLUMNS = [f"{split}_loss_cb{k}" for split in ("train", "valid") for k in range(2)]
STEPS = [1, 2, 4, 8, 16, 32, 50, 100, 150, 200, 250, 300, 350, 400]


def _curve(shift=0.0, early=0.0, burst=None):
    rows = []
    for step in STEPS:
        row = {"seed": 1, "step": step}
        for j, c in enumerate(COLUMNS):
            row[c] = 10.0 - 0.01 * step / 4 - 0.1 * j + (early if step <= 200 else shift)
        rows.append(row)
    frame = pd.DataFrame(rows)
    if burst is not None:
        step, column, bits = burst
        frame.loc[frame["step"] == step, column] += bits
    return frame


def _data_folder(tmp_path):
    """A data folder with one output of each data stage."""
    data = tmp_path / "data"
    for rel, payload in (
        ("raw/a.flac", b"raw"),
        ("prepared/shard-00000/audio.npy", b"pcm"),
        ("codes/shard-00000/codes.npy", b"codes"),
    ):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_bytes(payload)
    return data


def _write_run(runs, cfg, frame, pinned=True):
    for run in cfg["runs"]:
        (runs / run).mkdir(parents=True, exist_ok=True)
        frame.to_csv(runs / run / "metrics.csv", index=False)
        (runs / run / "summary.json").write_text(json.dumps({"run": run, "cpu_kernels": {"pinned": pinned}}))


def _reference(tmp_path, cfg, data):
    """A reference recorded from `data` under pinned kernels, with the package's tolerances."""
    ref = tmp_path / "ref"
    ref.mkdir()
    pd.concat([_curve().assign(run=run) for run in cfg["runs"]]).to_csv(ref / METRICS, index=False)
    meta = {
        "package": "acoustic-mlm",
        "version": "0",
        "config": "config/smoke.yaml",
        "cpu_kernels": "avx2",
        "tolerance_bits": 1e-4,
        "tolerance_until_step": 200,
        "late_tolerance_bits": 1.0,
        "native_tolerance_bits": 0.2,
        "data_hashes": verify.data_hashes(data),
        "arms": verify.fingerprints(C.from_mapping(cfg)),
        "machine": {"cpu": "test"},
    }
    (ref / META).write_text(json.dumps(meta))
    return ref


@pytest.fixture()
def pinned(smoke_cfg, tmp_path):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["runs"] = {"prenorm_clip1": cfg["runs"]["prenorm_clip1"]}
    cfg["train"]["steps"] = 400
    data = _data_folder(tmp_path)
    return cfg, data, _reference(tmp_path, cfg, data)


def test_a_pinned_run_equal_to_the_reference_passes_at_zero_bits(pinned, tmp_path):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve())
    result = verify.compare(cfg, tmp_path / "runs", ref, data_dir=data)
    assert result["passed"] and result["kernels"] == "pinned"
    assert [s["outcome"] for s in result["data"]["stages"]] == ["same", "same", "same"]
    assert all(p["bits"] == 0.0 for a in result["arms"].values() for p in a["windows"])
    assert result["windows"][0]["statistic"] == verify.MAX_STATISTIC


def test_a_broken_tokenizer_is_named_by_its_stage(pinned, tmp_path, capsys):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve())
    (data / "codes" / "shard-00000" / "codes.npy").write_bytes(b"other codes")
    result = verify.compare(cfg, tmp_path / "runs", ref, data_dir=data)
    assert not result["passed"] and result["data"]["first_differing_stage"] == "tokenize"
    assert result["data"]["fails"]
    print(verify.report(result))
    assert "the tokenize stage computed other bytes" in capsys.readouterr().out
    (data / "raw" / "a.flac").write_bytes(b"other audio")  # an earlier stage differs: it is the one named
    assert verify.compare(cfg, tmp_path / "runs", ref, data_dir=data)["data"]["first_differing_stage"] == "fetch"


def test_a_changed_model_fails_in_the_early_rows_when_pinned(pinned, tmp_path):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve(early=1e-3))  # every early row moved by 0.001 bits
    result = verify.compare(cfg, tmp_path / "runs", ref, data_dir=data)
    assert not result["passed"] and result["arms"]["prenorm_clip1"]["window"] == "steps <= 200"
    # a pinned run on another vendor's CPU: rounding of the order measured (2e-5 bits) passes
    _write_run(tmp_path / "runs", cfg, _curve(early=2e-5))
    assert verify.compare(cfg, tmp_path / "runs", ref, data_dir=data)["passed"]


def test_a_burst_in_one_row_of_one_codebook_cannot_trip_the_late_check(pinned, tmp_path):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve(shift=0.4, burst=(300, "valid_loss_cb1", 5.0)))
    result = verify.compare(cfg, tmp_path / "runs", ref, data_dir=data)
    assert result["passed"], verify.report(result)
    late = result["arms"]["prenorm_clip1"]["windows"][1]
    assert late["statistic"] == verify.MEDIAN_STATISTIC and late["bits"] == pytest.approx(0.4)


def test_a_wrong_target_moves_every_late_row_and_fails(pinned, tmp_path):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve(shift=1.5))  # e.g. codes of another tokenizer: another plateau
    result = verify.compare(cfg, tmp_path / "runs", ref, data_dir=data)
    assert not result["passed"] and result["arms"]["prenorm_clip1"]["windows"][1]["bits"] == pytest.approx(1.5)


def test_a_native_run_is_held_by_medians_and_its_other_codes_are_expected(pinned, tmp_path, capsys):
    cfg, data, ref = pinned
    cfg_native = copy.deepcopy(cfg)
    cfg_native["cpu_kernels"] = "native"
    (data / "codes" / "shard-00000" / "codes.npy").write_bytes(b"native codes")
    _write_run(
        tmp_path / "runs", cfg_native, _curve(early=0.1, shift=0.5, burst=(16, "train_loss_cb1", 0.9)), pinned=False
    )
    # cpu_kernels differs, and is allowed to
    assert verify.fingerprints(C.from_mapping(cfg_native)) != verify.fingerprints(C.from_mapping(cfg))
    result = verify.compare(cfg_native, tmp_path / "runs", ref, data_dir=data)
    assert result["kernels"] == "native" and result["passed"], verify.report(result)
    assert result["data"]["first_differing_stage"] == "tokenize" and not result["data"]["fails"]
    assert result["windows"][0]["statistic"] == verify.MEDIAN_STATISTIC
    print(verify.report(result))
    assert "as expected with native kernels" in capsys.readouterr().out
    # but a changed model moves the early rows by more than CPUs do
    _write_run(tmp_path / "runs", cfg_native, _curve(early=0.5), pinned=False)
    assert not verify.compare(cfg_native, tmp_path / "runs", ref, data_dir=data)["passed"]
    # a run whose config asks for avx2 but whose process was not pinned counts as native
    _write_run(tmp_path / "runs", cfg, _curve(early=0.1), pinned=False)
    assert verify.run_kernels(C.from_mapping(cfg), tmp_path / "runs") == "native"


@pytest.mark.parametrize("machine", ["amd_epyc_avx512", "intel_xeon_avx512"])
def test_native_runs_of_other_cpus_pass_against_the_pinned_default_reference(root, machine, tmp_path):
    """The default preset trained on two CPUs' own kernels (tests/fixtures/native_runs/): other codes,
    curves apart by tenths of a bit after bursts, yet a correct installation."""
    cfg = C.load(root / "config" / "config.yaml")
    runs = root / "tests" / "fixtures" / "native_runs" / machine
    result = verify.compare(cfg, runs, root / "data" / "reference" / "default_run", data_dir=None)
    assert result["kernels"] == "native" and result["passed"], verify.report(result)
    assert all(w["statistic"] == verify.MEDIAN_STATISTIC for w in result["windows"])
    # the same runs with one arm's late rows moved by 1.5 bits (a wrong target) fail
    broken = {run: pd.read_csv(runs / run / "metrics.csv") for run in cfg.runs}
    late = broken["prenorm_clip10"]["step"] > 300
    for column in [c for c in broken["prenorm_clip10"].columns if LOSS_COLUMN.match(c)]:
        broken["prenorm_clip10"].loc[late, column] += 1.5
    assert not verify.compare(
        cfg, _as_runs(broken, runs, tmp_path), root / "data" / "reference" / "default_run", data_dir=None
    )["passed"]


def _as_runs(frames: dict, source, out):
    for run, frame in frames.items():
        (out / run).mkdir()
        frame.to_csv(out / run / "metrics.csv", index=False)
        shutil.copy(source / run / "summary.json", out / run / "summary.json")
    return out


def test_a_preset_is_checked_against_its_own_shipped_reference(root):
    assert verify.default_reference("config/smoke.yaml") == Path("data/reference/smoke_run")
    assert verify.default_reference(root / "config" / "config.yaml") == Path("data/reference/default_run")
    assert verify.default_reference("my_ablation.yaml") == Path("data/reference/default_run")
    for name in ("smoke_run", "default_run"):
        assert (root / "data" / "reference" / name / "reference.json").is_file()
