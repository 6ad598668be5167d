"""`amlm verify`: a fresh run against a recorded reference, the shipped references' contents."""

import copy
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from helpers import make_config

from acoustic_mlm import cli
from acoustic_mlm import config as C
from acoustic_mlm.artifacts.metrics import LOSS_COLUMN
from acoustic_mlm.artifacts.reference_run import META, METRICS
from acoustic_mlm.errors import UserError
from acoustic_mlm.report import tolerance, verify
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
        train.run(make_config(cfg), run, prepared, codes, runs_dir / run, threads=1)


@pytest.mark.slow
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
    result = verify.compare(make_config(cfg), tmp_path / "fresh", ref)
    assert result["passed"] and all(a["bits"] == 0.0 for a in result["arms"].values())  # deterministic on CPU
    assert all(re.search(rf"^{run} +largest difference 0 bits .* ok$", printed, re.M) for run in ARMS), printed

    # one valid loss of one arm off by 0.2 bits: that arm, that column and step, exit 1
    metrics_path = tmp_path / "fresh" / "postnorm_deepnorm_clip1" / "metrics.csv"
    metrics = pd.read_csv(metrics_path)
    metrics.loc[2, "valid_loss_cb3"] += 0.2
    metrics.to_csv(metrics_path, index=False)
    result = verify.compare(make_config(cfg), tmp_path / "fresh", ref)
    arm = result["arms"]["postnorm_deepnorm_clip1"]
    assert not result["passed"] and result["arms"]["prenorm_clip10"]["within"]
    assert (arm["column"], arm["step"], arm["within"]) == ("valid_loss_cb3", int(metrics.loc[2, "step"]), False)
    assert arm["bits"] == pytest.approx(0.2)
    assert _verify(path, str(tmp_path / "fresh"), "--reference", str(ref), "--out", str(out), "--data", str(data)) == 1
    # a row missing inside the run is an infinite difference; the last rows missing, a run cut short, is named
    metrics.drop(index=1).to_csv(metrics_path, index=False)
    assert verify.compare(make_config(cfg), tmp_path / "fresh", ref)["arms"]["postnorm_deepnorm_clip1"][
        "bits"
    ] == float("inf")
    metrics.iloc[:-1].to_csv(metrics_path, index=False)
    with pytest.raises(verify.UserError, match="the run is unfinished or its file lost rows"):
        verify.compare(make_config(cfg), tmp_path / "fresh", ref)


@pytest.mark.slow
def test_a_run_of_other_settings_is_refused_by_name(data_dirs, tiny, tmp_path, capsys):
    cfg, path = tiny
    _train(cfg, data_dirs, tmp_path / "first")
    verify.record(make_config(cfg), path, tmp_path / "first", tmp_path / "ref", "test")
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
    ref = shutil.copytree(root / "data" / "reference" / "smoke_run" / "GenuineIntel", tmp_path / "ref")
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


def test_record_refuses_a_window_without_its_tolerance(tmp_path, smoke_cfg):
    with pytest.raises(verify.UserError, match="--until-step and --late-tolerance go together"):
        verify.record(make_config(smoke_cfg), tmp_path / "c.yaml", tmp_path, tmp_path / "ref", "cmd", until_step=300)


SHIPPED = [
    (preset, folder, vendor)
    for preset, folder in (("config/smoke.yaml", "smoke_run"), ("config/config.yaml", "default_run"))
    for vendor in ("GenuineIntel", "AuthenticAMD")
]


@pytest.mark.parametrize("preset, folder, vendor", SHIPPED)
def test_the_shipped_references_match_their_presets(root, preset, folder, vendor):
    """A setting added to the train step changes the fingerprint: record the reference again (docs/reference_run.md)."""
    cfg = C.load(root / preset)
    ref, meta = verify.load_reference(root / "data" / "reference" / folder / vendor)
    assert meta["arms"] == verify.fingerprints(cfg)  # made with the preset as it is now
    assert meta["config"] == preset and meta["version"] and meta["commit"] and meta["machine"]["cpu"]
    assert meta["machine"]["vendor"] == vendor  # recorded on a CPU of the vendor its folder names
    assert meta["tolerance_measurement"] and meta["tolerance_bits"] > 0
    # recorded under pinned kernels, with every data stage's outputs hashed
    assert meta["cpu_kernels"] == "avx2" and meta["kernels_used"] == "pinned"
    assert all(meta["data_hashes"][stage] for stage in ("fetch", "prepare", "tokenize"))
    assert meta["native_tolerance_bits"] > 0 and meta["late_tolerance_bits"] > 0
    for run in cfg.runs:
        rows = ref[ref["run"] == run]
        assert rows["step"].max() == cfg.train.steps or rows["diverged"].any(), run
        assert {f"train_loss_cb{k}" for k in range(cfg.model.codebooks)} <= set(rows.columns)


@pytest.mark.parametrize("folder", ["smoke_run", "default_run"])
def test_the_vendors_references_share_their_data_and_part_in_their_curves(root, folder):
    """The data stages write the same bytes on both vendors; training is one float32 rounding apart from
    step 1 (MKL's sgemm), hence a reference per vendor for an exact check."""
    (intel, intel_meta), (amd, amd_meta) = (
        verify.load_reference(root / "data" / "reference" / folder / v) for v in ("GenuineIntel", "AuthenticAMD")
    )
    assert intel_meta["data_hashes"] == amd_meta["data_hashes"]
    assert intel_meta["arms"] == amd_meta["arms"]
    plateau = (-float("inf"), float(intel_meta["tolerance_until_step"]))
    apart = [
        tolerance.largest_difference(amd[amd["run"] == run], intel[intel["run"] == run], plateau)["bits"]
        for run in intel_meta["arms"]
    ]
    assert all(0 < bits < 0.05 for bits in apart), apart  # never equal, yet rounding-sized on the plateau


@pytest.mark.parametrize("folder", ["smoke_run", "default_run"])
@pytest.mark.parametrize(
    "vendor, picked, own",
    [
        ("GenuineIntel", "GenuineIntel", True),
        ("AuthenticAMD", "AuthenticAMD", True),
        ("HygonGenuine", "GenuineIntel", False),  # an x86-64 vendor without a reference of its own
        (None, "GenuineIntel", False),  # a machine that reports no vendor (aarch64, macOS)
    ],
)
def test_each_vendor_reference_is_picked_by_the_vendor_string(root, folder, vendor, picked, own):
    ref_dir, is_own = verify.reference_for(root / "data" / "reference" / folder, vendor)
    assert (ref_dir.name, is_own) == (picked, own)
    assert json.loads((ref_dir / META).read_text())["machine"]["vendor"] == picked


def test_the_vendor_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\n")
    assert verify.cpu_vendor(info) == "AuthenticAMD"
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n")  # aarch64: no vendor_id
    assert verify.cpu_vendor(info) is None
    assert verify.cpu_vendor(tmp_path / "absent") is None


def test_a_recorded_reference_is_one_folder_checked_exactly_on_its_own_vendor(root, tmp_path):
    one = shutil.copytree(root / "data" / "reference" / "smoke_run" / "AuthenticAMD", tmp_path / "mine")
    assert verify.reference_for(one, "GenuineIntel") == (one, True)  # one reference: its recorded vendor decides
    meta = json.loads((one / META).read_text())
    assert tolerance.exactness(meta, "pinned", "AuthenticAMD", True)[0]
    exact, why = tolerance.exactness(meta, "pinned", "GenuineIntel", True)
    assert not exact and "recorded on a AuthenticAMD CPU and this is a GenuineIntel one" in why
    assert not tolerance.exactness(meta, "native", "AuthenticAMD", True)[0]
    assert "reports no CPU vendor" in tolerance.exactness(meta, "pinned", None, False)[1]


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
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data)
    assert result["passed"] and result["kernels"] == "pinned"
    assert [s["outcome"] for s in result["data"]["stages"]] == ["same", "same", "same"]
    assert all(p["bits"] == 0.0 for a in result["arms"].values() for p in a["windows"])
    assert result["windows"][0]["statistic"] == tolerance.MAX_STATISTIC


def test_a_broken_tokenizer_is_named_by_its_stage(pinned, tmp_path, capsys):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve())
    (data / "codes" / "shard-00000" / "codes.npy").write_bytes(b"other codes")
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data)
    assert not result["passed"] and result["data"]["first_differing_stage"] == "tokenize"
    assert result["data"]["fails"]
    print(verify.report(result))
    assert "the tokenize stage computed other bytes" in capsys.readouterr().out
    (data / "raw" / "a.flac").write_bytes(b"other audio")  # an earlier stage differs: it is the one named
    assert (
        verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data)["data"]["first_differing_stage"]
        == "fetch"
    )


def test_a_changed_model_fails_in_the_early_rows_when_pinned(pinned, tmp_path):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve(early=1e-3))  # every early row moved by 0.001 bits
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data)
    assert not result["passed"] and result["arms"]["prenorm_clip1"]["window"] == "steps <= 200"
    # a pinned run on another vendor's CPU: rounding of the order measured (2e-5 bits) passes
    _write_run(tmp_path / "runs", cfg, _curve(early=2e-5))
    assert verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data)["passed"]


def test_a_burst_in_one_row_of_one_codebook_cannot_trip_the_late_check(pinned, tmp_path):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve(shift=0.4, burst=(300, "valid_loss_cb1", 5.0)))
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data)
    assert result["passed"], verify.report(result)
    late = result["arms"]["prenorm_clip1"]["windows"][1]
    assert late["statistic"] == tolerance.MEDIAN_STATISTIC and late["bits"] == pytest.approx(0.4)


def test_a_wrong_target_moves_every_late_row_and_fails(pinned, tmp_path):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve(shift=1.5))  # e.g. codes of another tokenizer: another plateau
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data)
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
    result = verify.compare(make_config(cfg_native), tmp_path / "runs", ref, data_dir=data)
    assert result["kernels"] == "native" and result["passed"], verify.report(result)
    assert result["data"]["first_differing_stage"] == "tokenize" and not result["data"]["fails"]
    assert result["windows"][0]["statistic"] == tolerance.MEDIAN_STATISTIC
    print(verify.report(result))
    assert "as expected with native kernels" in capsys.readouterr().out
    # but a changed model moves the early rows by more than CPUs do
    _write_run(tmp_path / "runs", cfg_native, _curve(early=0.5), pinned=False)
    assert not verify.compare(make_config(cfg_native), tmp_path / "runs", ref, data_dir=data)["passed"]
    # a run whose config asks for avx2 but whose process was not pinned counts as native
    _write_run(tmp_path / "runs", cfg, _curve(early=0.1), pinned=False)
    assert verify.run_kernels(C.from_mapping(cfg), tmp_path / "runs") == "native"


@pytest.mark.parametrize("machine", ["amd_epyc_avx512", "intel_xeon_avx512"])
def test_native_runs_of_other_cpus_pass_against_the_pinned_default_reference(root, machine, tmp_path):
    """The default preset trained on two CPUs' own kernels (tests/fixtures/native_runs/): other codes,
    curves apart by tenths of a bit after bursts, yet a correct installation."""
    cfg = C.load(root / "config" / "config.yaml")
    runs = root / "tests" / "fixtures" / "native_runs" / machine
    result = verify.compare(make_config(cfg), runs, root / "data" / "reference" / "default_run", data_dir=None)
    assert result["kernels"] == "native" and result["passed"], verify.report(result)
    assert all(w["statistic"] == tolerance.MEDIAN_STATISTIC for w in result["windows"])
    # the same runs with one arm's late rows moved by 1.5 bits (a wrong target) fail
    broken = {run: pd.read_csv(runs / run / "metrics.csv") for run in cfg.runs}
    late = broken["prenorm_clip10"]["step"] > 300
    for column in [c for c in broken["prenorm_clip10"].columns if LOSS_COLUMN.match(c)]:
        broken["prenorm_clip10"].loc[late, column] += 1.5
    assert not verify.compare(
        make_config(cfg), _as_runs(broken, runs, tmp_path), root / "data" / "reference" / "default_run", data_dir=None
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
        for vendor in ("GenuineIntel", "AuthenticAMD"):
            assert (root / "data" / "reference" / name / vendor / "reference.json").is_file()


# --- the exact check: a pinned run on a CPU of the reference's vendor ---------------------------------


def _vendor_reference(ref, vendor="TestVendor"):
    meta = json.loads((ref / META).read_text())
    meta["machine"]["vendor"] = vendor
    (ref / META).write_text(json.dumps(meta))
    return ref


def test_a_pinned_run_on_the_references_vendor_is_held_to_zero_bits_on_every_row(pinned, tmp_path, capsys):
    cfg, data, ref = pinned
    _vendor_reference(ref)
    _write_run(tmp_path / "runs", cfg, _curve())
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data, vendor="TestVendor")
    assert result["exact"] and result["passed"] and result["windows"] == tolerance.exact_windows()
    print(verify.report(result))
    out = capsys.readouterr().out
    assert "exact: pinned kernels on this CPU (vendor TestVendor)" in out and "bit for bit" in out
    # one float32 ulp in one late row of one codebook: the exact check fails it, where the tolerance passes it
    frame = _curve()
    late = frame.index[frame["step"] == 400][0]
    frame.loc[late, "train_loss_cb1"] = float(
        np.nextafter(np.float32(frame.loc[late, "train_loss_cb1"]), np.float32(0))
    )
    _write_run(tmp_path / "runs", cfg, frame)
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data, vendor="TestVendor")
    arm = result["arms"]["prenorm_clip1"]
    assert not result["passed"] and (arm["column"], arm["step"]) == ("train_loss_cb1", 400) and 0 < arm["bits"] < 1e-5
    other = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data, vendor="OtherVendor")
    assert not other["exact"] and other["passed"]  # what an inexact check cannot see
    print(verify.report(other))
    out = capsys.readouterr().out
    assert "not exact: the reference was recorded on a TestVendor CPU and this is a OtherVendor one" in out
    assert "it sees a defect that moves any row by more than 0.0001 bits at steps <= 200" in out


@pytest.mark.parametrize(
    "defect",
    ["model: every early row 1e-3 bits off", "tokenizer: other codes", "target: every late row 1.5 bits off"],
)
def test_a_changed_model_tokenizer_or_target_fails_the_exact_check(pinned, tmp_path, defect):
    cfg, data, ref = pinned
    _vendor_reference(ref)
    frame = _curve(early=1e-3) if defect.startswith("model") else _curve(shift=1.5) if "target" in defect else _curve()
    if defect.startswith("tokenizer"):
        (data / "codes" / "shard-00000" / "codes.npy").write_bytes(b"other codes")
    _write_run(tmp_path / "runs", cfg, frame)
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data, vendor="TestVendor")
    assert result["exact"] and not result["passed"]
    if defect.startswith("tokenizer"):
        assert result["data"]["first_differing_stage"] == "tokenize"


def test_one_ulp_in_the_data_fails_the_exact_check_at_its_stage(pinned, tmp_path):
    cfg, data, ref = pinned
    _vendor_reference(ref)
    _write_run(tmp_path / "runs", cfg, _curve())
    audio = np.arange(8, dtype=np.float32) / 8
    path = data / "prepared" / "shard-00000" / "audio.npy"
    np.save(path, audio)
    # the reference's hashes are of the data as recorded: hash this audio into it
    meta = json.loads((ref / META).read_text())
    meta["data_hashes"] = verify.data_hashes(data)
    (ref / META).write_text(json.dumps(meta))
    assert verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data, vendor="TestVendor")["passed"]
    audio[3] = np.nextafter(audio[3], np.float32(1))  # one ulp in one sample
    np.save(path, audio)
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data, vendor="TestVendor")
    assert not result["passed"] and result["data"]["first_differing_stage"] == "prepare" and result["data"]["fails"]


def test_a_stage_missing_from_the_data_folder_or_the_reference_is_not_skipped(pinned, tmp_path, capsys):
    cfg, data, ref = pinned
    _write_run(tmp_path / "runs", cfg, _curve())
    shutil.rmtree(data / "codes")  # the tokenize stage's outputs are not here: not checked, so not passed
    result = verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data)
    assert not result["passed"] and result["data"]["not_here"] == "tokenize"
    print(verify.report(result))
    assert (
        "the tokenize stage's outputs are not in the data folder, so they were not checked" in capsys.readouterr().out
    )
    with pytest.raises(verify.UserError, match=r"^--data .*nowhere: no such folder"):
        verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=tmp_path / "nowhere")
    meta = json.loads((ref / META).read_text())
    del meta["data_hashes"]["prepare"]
    (ref / META).write_text(json.dumps(meta))
    with pytest.raises(verify.ReferenceDamaged, match="'data_hashes' has no entry for the prepare stage"):
        verify.compare(make_config(cfg), tmp_path / "runs", ref, data_dir=data)


def test_a_run_trained_with_other_settings_or_cut_short_is_named_not_blamed_on_the_installation(pinned, tmp_path):
    cfg, data, ref = pinned
    runs = tmp_path / "runs"
    _write_run(runs, cfg, _curve())
    summary = runs / "prenorm_clip1" / "summary.json"
    settings = verify.fingerprints(C.from_mapping(cfg))["prenorm_clip1"]
    summary.write_text(json.dumps({"run": "prenorm_clip1", "settings": {**settings, "train.lr": 0.5}}))
    with pytest.raises(
        verify.UserError, match=r"summary.json: this run was trained with other settings .*train.lr: 0.5"
    ):
        verify.compare(make_config(cfg), runs, ref, data_dir=data)
    summary.write_text(json.dumps({"run": "prenorm_clip1", "settings": settings}))
    assert verify.compare(make_config(cfg), runs, ref, data_dir=data)["passed"]
    _write_run(runs, cfg, _curve().iloc[:-2])  # the last two rows lost
    with pytest.raises(verify.UserError, match=r"metrics.csv: ends, seed 1, at step 300, not at train.steps \(400\)"):
        verify.compare(make_config(cfg), runs, ref, data_dir=data)


def test_the_hint_to_train_keeps_the_preset(tmp_path, capsys):
    assert cli.main(["verify", "--config", "config/smoke.yaml", "--runs-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "snakemake --cores all --configfile config/smoke.yaml" in err and "--config config/smoke.yaml)" in err


def test_one_ulp_in_one_weight_moves_the_trained_rows_and_only_the_exact_check_sees_it(
    data_dirs, tiny, tmp_path, monkeypatch
):
    """Real training: a model whose first weight is one float32 ulp off at initialisation ends in other
    metrics rows; 0 bits catches it, the cross-vendor tolerance does not."""
    from acoustic_mlm.train import update

    cfg, _ = tiny
    cfg = copy.deepcopy(cfg)
    cfg["runs"] = {"prenorm_clip10": cfg["runs"]["prenorm_clip10"]}
    _train(cfg, data_dirs, tmp_path / "clean")

    class OneUlpOff(update.AcousticMLM):
        def __init__(self, m):
            super().__init__(m)
            with torch.no_grad():
                w = next(self.parameters()).view(-1)
                w[0] = torch.nextafter(w[0], torch.tensor(float("inf")))

    monkeypatch.setattr(update, "AcousticMLM", OneUlpOff)
    _train(cfg, data_dirs, tmp_path / "nudged")
    clean = pd.read_csv(tmp_path / "clean" / "prenorm_clip10" / "metrics.csv")
    nudged = pd.read_csv(tmp_path / "nudged" / "prenorm_clip10" / "metrics.csv")
    found = tolerance.largest_difference(nudged, clean)
    assert found["bits"] > 0, "one ulp in a weight must show in the rows"
    assert not found["bits"] <= tolerance.exact_windows()[0]["tolerance_bits"]
    assert found["bits"] < 1e-4  # below the smoke reference's cross-vendor tolerance: invisible to it


@pytest.mark.parametrize("lacking", [META, METRICS, "both"])
def test_this_vendors_incomplete_reference_is_refused_by_the_file_it_lacks_not_passed_over(root, tmp_path, lacking):
    refs = shutil.copytree(root / "data" / "reference" / "smoke_run", tmp_path / "smoke_run")
    for name in [META, METRICS] if lacking == "both" else [lacking]:
        (refs / "AuthenticAMD" / name).unlink()
    ref_dir, own = verify.reference_for(refs, "AuthenticAMD")
    assert (ref_dir, own) == (refs / "AuthenticAMD", True)  # never GenuineIntel's by tolerance
    with pytest.raises(UserError) as refused:
        verify.load_reference(ref_dir)
    missing = META if lacking in (META, "both") else METRICS
    assert str(refused.value).startswith(f"{refs / 'AuthenticAMD' / missing}: ")
    assert "\n" not in str(refused.value)
    assert verify.reference_for(refs, "HygonGenuine") == (refs / "GenuineIntel", False)  # no folder: the primary's


def test_record_writes_both_files_or_neither(pinned, tmp_path, monkeypatch):
    from acoustic_mlm.artifacts import reference_run

    cfg, data, ref = pinned
    runs = tmp_path / "runs"
    _write_run(runs, cfg, _curve())
    out = tmp_path / "mine"
    (tmp_path / "c.yaml").write_text("x")
    verify.record(make_config(cfg), tmp_path / "c.yaml", runs, out, "cmd", data_dir=data)
    before = {n: (out / n).read_bytes() for n in (META, METRICS)}
    (out / "notes.txt").write_text("mine")

    def stop(*args, **kwargs):
        raise KeyboardInterrupt  # a stop after metrics.csv was written, before reference.json

    monkeypatch.setattr(reference_run, "write_json", stop)
    _write_run(runs, cfg, _curve(shift=0.5))
    with pytest.raises(KeyboardInterrupt):
        verify.record(make_config(cfg), tmp_path / "c.yaml", runs, out, "cmd", data_dir=data)
    assert {n: (out / n).read_bytes() for n in (META, METRICS)} == before  # the old reference, whole
    assert (out / "notes.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.glob(".mine*")) == []


def test_record_into_a_folder_of_per_vendor_references_is_refused(root, tmp_path, smoke_cfg):
    refs = shutil.copytree(root / "data" / "reference" / "smoke_run", tmp_path / "smoke_run")
    before = sorted(p.relative_to(refs) for p in refs.rglob("*"))
    with pytest.raises(UserError) as refused:
        verify.record(make_config(smoke_cfg), tmp_path / "c.yaml", tmp_path / "runs", refs, "cmd")
    message = str(refused.value)
    assert message.startswith(f"{refs}: a folder of per-vendor references (AuthenticAMD, GenuineIntel)")
    assert "would shadow them all" in message and "\n" not in message
    assert sorted(p.relative_to(refs) for p in refs.rglob("*")) == before


def test_a_run_trained_with_another_thread_count_is_named_not_blamed_on_the_installation(pinned, tmp_path):
    cfg, data, ref = pinned
    meta = json.loads((ref / META).read_text())
    meta["machine"]["torch_threads"] = 2
    (ref / META).write_text(json.dumps(meta))
    runs = tmp_path / "runs"
    _write_run(runs, cfg, _curve())
    summary = runs / "prenorm_clip1" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "torch_threads": 4}))
    with pytest.raises(UserError) as refused:
        verify.compare(make_config(cfg), runs, ref, data_dir=data)
    message = str(refused.value)
    assert message.startswith(f"{summary}: this run trained with 4 torch threads, the reference with 2")
    assert "train it again with --threads 2" in message
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "torch_threads": 2}))
    assert verify.compare(make_config(cfg), runs, ref, data_dir=data)["passed"]
    assert verify._recorded_threads(make_config(cfg), runs) == 2  # what a reference recorded from them holds
