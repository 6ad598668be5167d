"""Hostile inputs and faults: each case is used correctly or refused in one line (exit 2, no
traceback) naming the file and the key or member; nothing is lost and nothing half-written kept.

One test per case of docs/refusals.md: huge samples and implausible rates, values validation let
through, YAML alias bombs, a damaged newest training state, a config error under Snakemake,
resource faults and archive bombs, then own arms and the files stages read. Every input is built
at test time.
"""

import dataclasses
import io
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
import torch
import yaml
from helpers import SMOKE_GROUP, copy_repo, copy_run, make_config, make_tar, sha256, tool_env, train_argv

from acoustic_mlm import cli, encodec
from acoustic_mlm import config as C
from acoustic_mlm.artifacts.prepared import load_prepared
from acoustic_mlm.data import archive, download, prepare
from acoustic_mlm.train import loop as train
from acoustic_mlm.train.state import completed_summary

ROOT = Path(__file__).resolve().parents[2]
SMOKE = (ROOT / "config" / "smoke.yaml").read_text()
LR_LINE = 1 + [line.startswith("  lr:") for line in SMOKE.splitlines()].index(True)


def _env() -> dict:
    return tool_env(pythonpath=ROOT / "src")


def _amlm(args, limit_bytes: int | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m acoustic_mlm ARGS`, optionally under a file-size limit with SIGXFSZ ignored
    (so that a write past the limit fails with EFBIG instead of killing the process)."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", *map(str, args)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit if limit_bytes else None,
    )


def _one_line_refusal(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The process refused with exit 2 and one error line (log lines aside) holding every needle."""
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _noise(seconds: float, sr: int = 24000, seed: int = 0) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * sr))).astype(np.float32)


def _wav_header_rate(data: bytes, rate: int) -> bytes:
    """A WAV file's bytes with the sample rate its header declares (and the byte rate) replaced."""
    fmt = data.index(b"fmt ") + 8
    channels, bits = struct.unpack_from("<H", data, fmt + 2)[0], struct.unpack_from("<H", data, fmt + 14)[0]
    patched = bytearray(data)
    struct.pack_into("<II", patched, fmt + 4, rate, rate * channels * bits // 8)
    return bytes(patched)


# ----------------------------------------------------------------- huge samples, implausible rates


def test_huge_samples_and_implausible_rates_are_rejected_with_a_reason(tmp_path):
    """A float WAV of +-3e38 passed the NaN/infinity check; an 8 KB WAV declaring 1 Hz became a
    4,000 s clip. Both are rejected with their reason in rejects.csv; good files are kept."""
    raw = tmp_path / "raw"
    raw.mkdir()
    sf.write(raw / "good1.wav", _noise(2.0, seed=1), 24000)
    sf.write(raw / "good2.flac", _noise(2.0, seed=2), 24000)
    huge = np.where(np.arange(48000) % 2 == 0, 3e38, -3e38).astype(np.float32)
    sf.write(raw / "huge.wav", huge, 24000, subtype="FLOAT")
    loud = _noise(2.0, seed=3) * 50  # 34 dB over full scale: float headroom, kept as it is
    sf.write(raw / "loud.wav", loud, 24000, subtype="FLOAT")
    buf = io.BytesIO()
    sf.write(buf, _noise(4000 / 24000, seed=4), 24000, format="WAV", subtype="PCM_16")
    one_hz = _wav_header_rate(buf.getvalue(), 1)
    assert len(one_hz) < 8200 and sf.info(io.BytesIO(one_hz)).samplerate == 1
    (raw / "one_hz.wav").write_bytes(one_hz)
    fast = _wav_header_rate(buf.getvalue(), 768_000)
    (raw / "fast.wav").write_bytes(fast)

    cfg = yaml.safe_load(SMOKE)
    cfg["tokenizer"]["mode"] = "pretrained"  # a few seconds of audio: too little to calibrate codebooks on
    prepare.run(make_config(cfg), raw, tmp_path / "prepared")
    manifest = pd.read_csv(tmp_path / "prepared" / "manifest.csv")
    rejects = dict(pd.read_csv(tmp_path / "prepared" / "rejects.csv").itertuples(index=False))
    assert sorted(manifest["path"]) == ["good1.wav", "good2.flac", "loud.wav"]
    assert rejects["huge.wav"].startswith("samples out of range: peak 3e+38, beyond +-1000")
    assert rejects["one_hz.wav"].startswith("implausible sample rate: 1 Hz, outside 4000-384000 Hz")
    assert rejects["fast.wav"].startswith("implausible sample rate: 768000 Hz")
    summary = json.loads((tmp_path / "prepared" / "prepare.json").read_text())
    assert summary["rejected_by_reason"] == {"implausible sample rate": 2, "samples out of range": 1}
    # the kept clips are exactly the decoded audio: 2 s each, no clipping of the loud one
    audio = load_prepared(tmp_path / "prepared")
    loud_row = int(np.flatnonzero(manifest["path"] == "loud.wav")[0])
    np.testing.assert_allclose(audio.clip(loud_row), loud[: 48000 // 320 * 320], rtol=1e-6)


# ------------------------------------------------------------------- values validation let through


def _yaml_case(case: str) -> bytes:
    text = SMOKE
    edits = {
        "clip_nan": ("clip: 1.0\n", "clip: .nan\n"),  # the first Clip=1 arm
        "lr_nan": ("lr: 0.006 ", "lr: .nan "),
        "crop_nan": ("crop_seconds: 0.5 ", "crop_seconds: .nan "),
        "steps_float": ("steps: 150 ", "steps: 150.0 "),
        "layers_float": ("layers: 2 ", "layers: 2.0 "),
        "seeds_float": ("seeds: [1] ", "seeds: [1.0] "),
        "lr_twice": ("  lr: 0.006 ", "  lr: 0.001\n  lr: 0.006 "),
        "codebooks_16": ("codebooks: 8 ", "codebooks: 16 "),
        # single quotes: YAML reads the backslash as is
        "bad_label": ('"Pre-Norm | Gradient Clip=1 | Run 2"', r"'$\badcmd{x}$'"),
        "latin1": ("# Smoke preset", "# Smoke preset (r\u00e9sum\u00e9)"),
    }
    old, new = edits[case]
    assert old in text, old
    text = text.replace(old, new, 1)
    return text.encode("latin-1" if case == "latin1" else "utf-8")


@pytest.mark.parametrize(
    "case, needles",
    [
        ("clip_nan", ["'runs.prenorm_clip1.clip' is nan"]),
        ("lr_nan", ["'train.lr' is nan"]),
        ("crop_nan", ["'train.crop_seconds' is nan"]),
        ("steps_float", ["'train.steps' is 150.0", "whole number"]),
        ("layers_float", ["'model.layers' is 2.0"]),
        ("seeds_float", ["'runs.prenorm_clip10.seeds.0' is 1.0"]),
        ("lr_twice", ["duplicate key 'lr'", f"line {LR_LINE + 1}:", f"first at line {LR_LINE}"]),
        ("codebooks_16", ["'model.codebooks' is 16", "6 kbps gives 8 codebooks"]),
        ("bad_label", ["'runs.prenorm_clip1.label'", r"\badcmd", "cannot be drawn by matplotlib"]),
        ("latin1", ["not UTF-8", "0xe9", "line 1"]),
    ],
)
def test_values_validation_let_through_are_refused_naming_the_key(tmp_path, capsys, case, needles):
    """Each was accepted (or failed late without its key); now `amlm validate` refuses it in one line."""
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(_yaml_case(case))
    assert cli.main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"amlm validate: error: {path}: "), err
    for needle in needles:
        assert needle in err, err
    assert len(err) < 400


def test_refusals_come_before_any_stage_and_through_the_cli(tmp_path):
    """The same refusals through the installed entry point: exit 2, one line, no traceback, and
    training never starts (a NaN clip once silently turned clipping off)."""
    path = tmp_path / "nan.yaml"
    path.write_bytes(_yaml_case("clip_nan"))
    proc = _amlm(["train", "prenorm_clip1", "--config", path, "--out", tmp_path / "run"])
    _one_line_refusal(proc, str(path), "'runs.prenorm_clip1.clip' is nan")
    assert not (tmp_path / "run").exists()
    cfg = yaml.safe_load(SMOKE)
    cfg["runs"]["prenorm_clip1"]["label"] = r"Pre-Norm $\alpha$ | Clip=1"  # math that renders is kept
    assert C.validate(cfg)["runs"]["prenorm_clip1"]["label"].endswith("Clip=1")
    assert encodec.codebooks(1.5) == 2 and encodec.codebooks(24.0) == 32
    cfg["tokenizer"]["bandwidth"], cfg["model"]["codebooks"] = 12.0, 16  # 16 codebooks exist at 12 kbps
    C.validate(cfg)


# -------------------------------------------------------------------------------- YAML alias bombs


def _billion_laughs(levels: int, width: int = 10) -> str:
    """The smoke preset with data.url set to a `levels`-deep chain of aliases, `width` per level."""
    anchors = ['x-lol-0: &l0 "lol"']
    for k in range(1, levels + 1):
        anchors.append(f"x-lol-{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * width) + "]")
    return "\n".join(anchors) + "\n" + SMOKE.replace("  url: null ", f"  url: *l{levels} ", 1)


@pytest.mark.parametrize("levels", [9, 12])
def test_yaml_alias_bombs_fail_at_once_in_one_line(tmp_path, levels):
    """A 6-8 KB file of nested aliases (10^9 to 10^12 strings once expanded) produced an 8 MB
    error, or ran 93 s into a MemoryError. Refused at the first alias, under a 1 GB memory cap."""
    text = _billion_laughs(levels)
    assert len(text.encode()) < 16_000 and 10**levels >= 10**9  # a few KB; a billion strings or more expanded
    path = tmp_path / "lol.yaml"
    path.write_text(text)

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    proc = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "validate", "--config", str(path)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap_memory,
    )
    line = _one_line_refusal(proc, str(path), "line 2: YAML alias '*l0' is not supported")
    assert len(line) < 300


# ----------------------------------------------------------------- a damaged newest training state


def _flip_inside_largest_tensor(state_file: Path, n: int = 256) -> None:
    """Change n bytes in the middle of the largest tensor stored in a torch.save zip; size unchanged."""
    blob = bytearray(state_file.read_bytes())
    with zipfile.ZipFile(state_file) as zf:
        info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    name_len, extra_len = struct.unpack_from("<HH", blob, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    assert info.compress_type == zipfile.ZIP_STORED and info.file_size > 4 * n
    blob[start : start + n] = bytes((b + 1) % 256 for b in blob[start : start + n])
    size = state_file.stat().st_size
    state_file.write_bytes(bytes(blob))
    assert state_file.stat().st_size == size


def test_damaged_newest_state_is_skipped_and_resume_matches(data_dirs, smoke_cfg, tmp_path, monkeypatch, caplog):
    """256 bytes changed inside one tensor of the newest state loaded silently and the resumed
    metrics differed. Now the state's sha256 fails, the previous state is used with a warning,
    and the resumed metrics equal an uninterrupted run's."""
    cfg = smoke_cfg
    cfg["train"].update(
        steps=50, warmup_steps=5, log_interval=10, batch_size=2, valid_crops=3, crop_seconds=0.4, checkpoint_interval=10
    )
    prepared, codes = data_dirs
    reference = train.run(make_config(cfg), "prenorm_clip1", prepared, codes, tmp_path / "ref", threads=1)
    ref_metrics = pd.read_csv(tmp_path / "ref" / "metrics.csv").drop(columns=["wall_time"])

    class Stop(Exception):
        pass

    real_save = train.save_state

    def save_then_stop(state_dir, step, state):
        real_save(state_dir, step, state)
        if step == 40:
            raise Stop  # as if killed right after the state of step 40 was written

    monkeypatch.setattr(train, "save_state", save_then_stop)
    out = tmp_path / "run"
    with pytest.raises(Stop):
        train.run(make_config(cfg), "prenorm_clip1", prepared, codes, out, threads=1)
    monkeypatch.setattr(train, "save_state", real_save)
    state_dir = out / "state" / "seed1"
    assert sorted(p.name for p in state_dir.iterdir()) == [
        "step-000000030.pt",
        "step-000000030.pt.sha256",
        "step-000000040.pt",
        "step-000000040.pt.sha256",
    ]
    newest = state_dir / "step-000000040.pt"
    _flip_inside_largest_tensor(newest)
    torch.load(newest, weights_only=True)  # still loads: only the checksum can tell

    caplog.set_level("INFO", logger="acoustic_mlm")
    resumed = train.run(make_config(cfg), "prenorm_clip1", prepared, codes, out, threads=1)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("step-000000040.pt does not match its checksum" in w for w in warnings), warnings
    assert any("resuming after step 30" in r.getMessage() for r in caplog.records)
    pd.testing.assert_frame_equal(
        pd.read_csv(out / "metrics.csv").drop(columns=["wall_time"]), ref_metrics, check_exact=True
    )
    assert resumed["final_valid_loss_cb0"] == reference["final_valid_loss_cb0"]


# ------------------------------------------------------------------ a config error under Snakemake


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.xdist_group(SMOKE_GROUP)
def test_config_error_under_snakemake_deletes_nothing(smoke_run, tmp_path):
    """DeepNorm on a Pre-Norm arm made Snakemake delete that arm's metrics.csv and summary.json
    before the error; under a new config file name it deleted data/raw. Now the config is
    validated when the workflow is parsed: exit 2, one line, every output still there. The finished
    run: the session's smoke run under config/smoke.yaml (conftest.py: `smoke_run`), copied."""
    repo = copy_run(smoke_run, tmp_path / "repo")
    cfg = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "2"]
    env = _env()
    env.pop("PYTHONPATH")
    run = repo / "results" / "runs" / "prenorm_clip10"
    kept = {p: p.read_bytes() for p in (run / "metrics.csv", run / "summary.json")}
    raw = sorted(p.relative_to(repo) for p in (repo / "data" / "raw").rglob("*"))
    assert raw

    cfg["runs"]["prenorm_clip10"]["norm"] = "deepnorm"  # a changed arm, and a rule broken across sections:
    cfg["model"]["heads"] = 3  # the width is not divisible by it
    for name in ("smoke.yaml", "renamed.yaml"):  # the same file edited, then under a new name
        (repo / "config" / name).write_text(yaml.safe_dump(cfg, sort_keys=False))
        proc = subprocess.run(
            snakemake + ["--configfile", f"config/{name}"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "invalid configuration" in line]
        assert len(errors) == 1 and "must be divisible by 'model.heads' (3)" in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr and f"config/{name}" in errors[0]
        assert {p: p.read_bytes() for p in kept} == kept
        assert sorted(p.relative_to(repo) for p in (repo / "data" / "raw").rglob("*")) == raw


# ------------------------------------------------------------------ resource faults, archive bombs


def _train_args(cfg: dict, tmp_path: Path, prepared: Path, codes: Path, **train) -> list:
    """`amlm train prenorm_clip1`'s arguments on the tiny corpus, a small smoke model, out to tmp_path/run."""
    cfg["train"].update(warmup_steps=2, batch_size=2, valid_crops=3, crop_seconds=0.4, **train)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return train_argv("prenorm_clip1", path, (prepared, codes), tmp_path / "run", launcher=())


def _train_under_limit(cfg: dict, data_dirs, tmp_path: Path, limit_bytes: int, **train) -> tuple:
    """`amlm train` as `_train_args` says, under a file-size limit."""
    proc = _amlm(_train_args(cfg, tmp_path, *data_dirs, **train), limit_bytes=limit_bytes)
    return proc, tmp_path / "run"


@pytest.mark.slow
def test_file_size_limit_in_training_is_one_line_and_leaves_nothing_partial(data_dirs, smoke_cfg, tmp_path):
    """A file-size limit at the first state save ended in "[enforce fail at inline_container.cc]
    unexpected pos". Now: exit 2, one line naming the state file and the bytes it needs."""
    proc, out = _train_under_limit(
        smoke_cfg, data_dirs, tmp_path, 200_000, steps=30, log_interval=10, checkpoint_interval=10
    )
    line = _one_line_refusal(
        proc,
        str(out / "state" / "seed1" / "step-000000010.pt"),
        "file-size limit (ulimit -f) of 200000 bytes",
        "it needs ",
    )
    needed = int(line.split("it needs ")[1].split()[0])
    assert needed > 200_000
    state = out / "state" / "seed1"
    assert not state.exists() or list(state.iterdir()) == []  # no partial state, no temporary file
    assert not (out / "metrics.csv").exists() and not (out / "summary.json").exists()


@pytest.mark.slow
def test_file_size_limit_on_the_progress_rows_is_one_line_and_keeps_the_last_complete_rows(
    data_dirs, smoke_cfg, tmp_path
):
    """metrics.partial.csv (rewritten at every metrics row) under a file-size limit ended in a
    traceback from pandas. Now: exit 2, one line naming it; the file left is the last complete one."""
    proc, out = _train_under_limit(
        smoke_cfg,
        data_dirs,
        tmp_path,
        6_000,
        steps=40,
        log_interval=1,
        log_powers_of_two=False,
        checkpoint_interval=0,
        diagnostics=True,
    )
    seed = out / "seeds" / "seed1"
    _one_line_refusal(proc, str(seed / "metrics.partial.csv"), "file-size limit (ulimit -f) of 6000 bytes")
    rows = pd.read_csv(seed / "metrics.partial.csv")  # complete rows only: the last write that fitted
    assert 1 <= len(rows) < 40 and rows["step"].tolist() == list(range(1, len(rows) + 1))
    assert not [p.name for p in seed.iterdir() if ".tmp-" in p.name]
    assert not (seed / "metrics.csv").exists() and not (seed / "summary.json").exists()
    assert not (out / "metrics.csv").exists()


def test_file_size_limit_in_prepare_is_one_line_and_leaves_nothing_partial(tmp_path):
    """A file-size limit in prepare ended in "OSError: 144000 requested and 111968 written"."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for k in range(3):
        sf.write(raw / f"c{k}.wav", _noise(2.0, seed=k), 24000)  # 192,000 bytes each once prepared
    path = tmp_path / "cfg.yaml"
    path.write_text(SMOKE)
    out = tmp_path / "prepared"
    proc = _amlm(["prepare", "--config", path, "--raw", raw, "--out", out], limit_bytes=300_000)
    line = _one_line_refusal(proc, str(out / "shard-00000" / "audio.npy"), "file-size limit", "it needs 384128 bytes")
    assert "nothing partial was kept" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml", "raw"]  # no output, no temporary folder


def _zip_of_zero_wav(path: Path, nbytes: int) -> None:
    """A zip holding one PCM WAV of `nbytes` of silence, written in blocks (nothing that size in memory)."""
    header = io.BytesIO()
    with sf.SoundFile(header, "w", 24000, 1, "PCM_16", format="WAV") as f:
        f.write(np.zeros(1, np.int16))
    head = bytearray(header.getvalue()[:-2])  # header only, data chunk emptied below
    struct.pack_into("<I", head, 4, len(head) - 8 + nbytes)
    struct.pack_into("<I", head, len(head) - 4, nbytes)
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf,
        zf.open("corpus/zeros.wav", "w", force_zip64=True) as member,
    ):
        member.write(bytes(head))
        block = bytes(1 << 22)
        for _ in range(nbytes // len(block)):
            member.write(block)


@pytest.mark.slow
def test_archive_bombs_conflicts_and_long_names_are_refused_by_name(server, tmp_path, monkeypatch):
    """A 975 KB zip of a 1 GB WAV of zeros was extracted in full; a.wav then a.wav/b.wav gave
    FileExistsError; a 300-character folder name OSError 36. Each is now refused, naming the
    member, before anything is written."""
    monkeypatch.setattr(download.time, "sleep", lambda s: None)
    bomb = tmp_path / "bomb.zip"
    _zip_of_zero_wav(bomb, 1 << 30)
    assert bomb.stat().st_size < 1_100_000
    good = io.BytesIO()
    sf.write(good, _noise(1.0), 24000, format="WAV")
    wav = good.getvalue()
    cases = {
        "bomb.zip": (bomb.read_bytes(), "member 'corpus/zeros.wav' expands"),
        "conflict.tar.gz": (
            make_tar({"c/a.wav": wav, "c/a.wav/b.wav": wav}),
            "member 'c/a.wav/b.wav' needs 'c/a.wav' to be a folder",
        ),
        "twice.tar.gz": (make_tar({"c/a.wav": wav, "c/./a.wav": wav}), "have the same path"),
        "long.tar.gz": (make_tar({"c/" + "d" * 300 + "/a.wav": wav}), "name component of 300 bytes (at most 255)"),
        "deep.tar.gz": (make_tar({"/".join(["d" * 200] * 21) + "/a.wav": wav}), "path of over 4096 bytes"),
    }
    cfg = yaml.safe_load(SMOKE)
    for name, (blob, needle) in cases.items():
        cfg["data"].update(source="url", url=server.serve(f"/hostile/{name}", blob), known_hash=sha256(blob))
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        project = tmp_path / name.replace(".", "_")
        proc = _amlm(
            ["fetch", "--config", path, "--out", project / "raw", "--downloads", project / "downloads"], timeout=120
        )
        _one_line_refusal(proc, f"refusing {name}", needle, "nothing was extracted")
        assert not (project / "raw").exists()
        assert [p.name for p in project.rglob("*") if p.is_file()] == [name]  # only the download itself

    # The limits are the config's: a ratio limit above the bomb's lets the header check pass,
    # the total-size limit stops it.
    data = dataclasses.replace(
        C.load(ROOT / "config" / "smoke.yaml").data, max_extract_gb=0.5, max_compression_ratio=5000
    )
    limits = archive.ExtractLimits.from_config(data)
    with pytest.raises(archive.UnsafeArchiveError, match="expand to 1073741868 bytes, over the limit of 500000000"):
        archive.extract(bomb, tmp_path / "x", limits=limits)
    assert not (tmp_path / "x").exists()


def test_extraction_counts_the_bytes_really_decompressed(tmp_path):
    """A header that understates a member's size cannot get past the limits while streaming."""
    src = io.BytesIO(bytes(3 << 20))
    member = archive.Member("a.wav", None, "file", size=1 << 20, compressed=None)
    (tmp_path / "x.tar").write_bytes(bytes(1 << 20))  # the archive the ratio is measured against
    budget = archive._Budget(tmp_path / "x.tar", archive.ExtractLimits())
    out = io.BytesIO()
    with pytest.raises(archive.UnsafeArchiveError, match="decompresses to more than the 1048576 bytes"):
        budget.copy(src, out, member)
    assert out.tell() <= 1 << 20
    small = archive._Budget(tmp_path / "x.tar", archive.ExtractLimits(max_bytes=2 << 20))
    honest = archive.Member("b.wav", None, "file", size=3 << 20, compressed=None)
    with pytest.raises(archive.UnsafeArchiveError, match="past the limit of 2097152 bytes"):
        small.copy(io.BytesIO(bytes(3 << 20)), io.BytesIO(), honest)


# ================================================================= own arms, files stages read
#
# Each case: used correctly, or refused with exit 2 in one line naming the file
# or key (and the stage to rerun), no traceback, and nothing changed or deleted.


def _snapshot(folder: Path) -> dict:
    """Every file under folder with its bytes (hidden names too): 'nothing changed or deleted'."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def _own_arms(n: int) -> dict:
    """The smoke preset with n arms under new names (one per role, then extra arms without one)."""
    cfg = yaml.safe_load(SMOKE)
    base = list(cfg["runs"].values())
    runs = {}
    for i in range(n):
        arm = dict(json.loads(json.dumps(base[i % len(base)])), label=f"My arm {i}")  # no shared lists: no aliases
        if i >= len(base):
            arm.pop("role", None)
            arm["clip"] = 2.0 + i
        runs[f"mine_{i}_arm"] = arm
    cfg["runs"] = runs
    return cfg


def _engine_env() -> dict:
    env = _env()
    env.pop("PYTHONPATH")  # the jobs find the package in the copy's src/ (common.smk)
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return env


@pytest.mark.slow
@pytest.mark.parametrize("arms", [1, 2, 5])
def test_own_arms_run_through_snakemake_and_dvc_as_the_whole_config(root, tmp_path, arms):
    """`--configfile mine.yaml` is the whole configuration: Snakemake plans exactly the file's
    arms (the Snakefile's default config/config.yaml adds none) and DVC, given the same file as
    config/config.yaml, has exactly those train stages."""
    repo = copy_repo(root, tmp_path / "repo")
    cfg = _own_arms(arms)
    (repo / "mine.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--printshellcmds", "--configfile", "mine.yaml"],
        cwd=repo,
        env=_engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert sorted(set(re.findall(r"acoustic_mlm train (\w+) ", out))) == sorted(cfg["runs"])
    assert re.search(rf"train\s+{arms}\n", out), out[-3000:]
    assert "Traceback" not in out and "--config mine.yaml" in out

    (repo / "config" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=repo, env=_engine_env(), check=True, capture_output=True)
    dvc = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"],
        cwd=repo,
        env=_engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dvc.returncode == 0, dvc.stderr[-3000:]
    stages = json.loads(dvc.stdout)
    assert sorted(s for s in stages if s.startswith("train@")) == sorted(f"train@{r}" for r in cfg["runs"])


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--config", "figure={split: sideways}"], "with --config figure: 'figure.split'"),
        (["--configfile", "config/smoke.yaml", "config/config.yaml"], "2 --configfile files given"),
        (["--configfile", "config/smoke.yaml", "--configfile", "config/config.yaml"], "2 --configfile files given"),
        (["--configfile=config/smoke.yaml", "--configfile", "config/smoke.yaml"], "2 --configfile files given"),
    ],
)
def test_snakemake_invalid_overrides_and_several_configfiles_are_refused_in_one_line(root, tmp_path, extra, needle):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", *extra],
        cwd=repo,
        env=_engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if re.search(r"error|invalid", line, re.I)]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(errors) == 1 and needle in errors[0], proc.stderr


@pytest.mark.parametrize(
    "extra, last_line",
    [
        (
            ["--config", "train.steps=10"],
            "ValueError: Invalid config definition: Config entry must start with a valid identifier.",
        ),
        (["--configfile", "missing.yaml"], "FileNotFoundError: [Errno 2] No such file or directory: 'missing.yaml'"),
    ],
)
def test_what_snakemake_refuses_before_the_workflow_is_as_documented(root, tmp_path, extra, last_line):
    """Snakemake parses --config and opens --configfile before it reads the Snakefile: its own answer,
    exit 1, as docs/refusals.md shows it (if a Snakemake release changes it, the doc must follow)."""
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", *extra],
        cwd=repo,
        env=_engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]  # Snakemake 9 logs it to stdout
    assert proc.returncode == 1 and lines[-1] == last_line, proc.stdout[-3000:]
    assert last_line in (root / "docs" / "refusals.md").read_text()
    assert not (repo / "results").exists() or not any((repo / "results").rglob("*.csv"))


# ------------------------------------------------------------------- values valid now, breaking later


@pytest.mark.parametrize(
    "case, needles",
    [
        ("long_name", ["'runs.", "the run name is 300 bytes; at most 251"]),
        ("huge_seed", ["'runs.prenorm_clip1.seeds' has seed 18446744073709551616", "torch.manual_seed"]),
        ("ddp_seed", ["'runs.prenorm_clip1.seeds' has seed 18446744073709551615", "1000003"]),
        ("long_label", ["'runs.prenorm_clip1.label'", "is 10000 characters long", "at most 60"]),
        ("two_line_label", ["'runs.prenorm_clip1.label'", "holds a line break"]),
    ],
)
def test_values_later_stages_cannot_use_are_refused_by_validate(tmp_path, case, needles):
    cfg = yaml.safe_load(SMOKE)
    arm = cfg["runs"]["prenorm_clip1"]
    if case == "long_name":
        cfg["runs"] = {("a" * 300 if name == "prenorm_clip1" else name): r for name, r in cfg["runs"].items()}
    elif case == "huge_seed":
        arm["seeds"] = [2**64]
    elif case == "ddp_seed":  # accepted by torch in process 0, not in process 1 (seed + 1,000,003)
        arm["seeds"] = [2**64 - 1]
        cfg["train"].update(processes=2, batch_size=2 * cfg["train"]["batch_size"])
    elif case == "long_label":
        arm["label"] = "x" * 10_000
    else:
        arm["label"] = "Pre-Norm\nclip 1"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    _one_line_refusal(_amlm(["validate", "--config", path]), str(path), *needles)


def test_limits_hold_at_their_edges_and_for_derived_names():
    cfg = yaml.safe_load(SMOKE)
    cfg["runs"] = {("a" * 251 if name == "prenorm_clip1" else name): r for name, r in cfg["runs"].items()}
    arm = cfg["runs"]["a" * 251]
    arm.update(seeds=[0, 2**64 - 1], label="y" * C.MAX_LABEL_CHARS)
    C.validate(cfg)  # the longest name, the largest seed, the longest label: accepted
    with pytest.raises(C.ConfigError, match=r"sweep: 'sweep.lr': the run name is 252 bytes"):
        C.check_run_name("b" * 252, "sweep", "sweep.lr")  # a derived name is checked by the same rule
    with pytest.raises(C.ConfigError, match="cannot be a folder name"):
        C.check_run_name("arm__lr-1/2", "sweep", "sweep.lr")
    # the limit is the file system's: a name of MAX_RUN_NAME_BYTES makes every results path
    run = Path("/tmp") / ("a" * C.MAX_RUN_NAME_BYTES + ".log")
    run.write_text("x")
    run.unlink()
    torch.manual_seed(2**64 - 1)
    with pytest.raises((RuntimeError, ValueError)):
        torch.manual_seed(2**64)


# --------------------------------------------------------------------------- paths and config files


def test_output_paths_that_cannot_be_written_are_refused_in_one_line(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(SMOKE)
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    cases = [
        (["figure", "--curves", tmp_path / "c.csv", "--out", a_file], "--out names an existing file, not a folder"),
        (["train", "prenorm_clip1", "--out", a_file / "run"], f"lies under {a_file}, which is a file"),
        (["prepare", "--raw", tmp_path, "--out", a_file / "x" / "prepared"], f"lies under {a_file}, which is a file"),
        (["aggregate", "--runs-dir", tmp_path, "--out", folder], "--out names an existing folder, not a file"),
        (["claims", "--curves", tmp_path / "c.csv", "--out-md", a_file / "claims.md"], "which is a file"),
    ]
    before = _snapshot(tmp_path)
    for args, needle in cases:
        _one_line_refusal(_amlm([*args[:1], "--config", cfg, *args[1:]]), needle)
    assert _snapshot(tmp_path) == before and sorted(p.name for p in folder.iterdir()) == []


def test_config_paths_that_are_folders_fifos_empty_or_absent_are_refused_in_one_line(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    cases = [
        (tmp_path, "a folder, not a configuration file"),
        ("/dev/null", "not a regular file"),
        (fifo, "not a regular file"),
        (empty, "the file is empty (no settings)"),
        (tmp_path / "absent.yaml", "configuration file not found"),
    ]
    for path, needle in cases:
        _one_line_refusal(_amlm(["validate", "--config", path], timeout=60), str(path), needle)


# ----------------------------------------------------------------------------------------------- audio


@pytest.mark.parametrize(
    "fmt, subtype", [("WAV", "PCM_16"), ("WAV", "FLOAT"), ("AIFF", "PCM_24"), ("AU", "PCM_16"), ("W64", "PCM_16")]
)
def test_audio_holding_less_than_its_header_declares_is_rejected_as_truncated(tmp_path, fmt, subtype):
    """A WAV declaring 4 s that holds 1.24 s was kept as a 1.24 s clip (libsndfile reports what is
    there); now it is rejected as truncated, like MP3 and FLAC. Complete files are kept."""
    whole = tmp_path / f"whole.{fmt.lower()}"
    sf.write(whole, np.stack([_noise(4.0, seed=5)] * 2, axis=1), 24000, format=fmt, subtype=subtype)
    cut = tmp_path / f"cut.{fmt.lower()}"
    data = whole.read_bytes()
    cut.write_bytes(data[: int(len(data) * 0.31)])
    assert sf.info(str(cut)).frames < 0.35 * 96000  # what libsndfile alone says: a shorter, clean file
    with pytest.raises(prepare.Unusable, match=r"truncated or corrupt: decoded \d+ of the 96000 frames"):
        prepare.decode(cut, 24000, 24000)
    audio, _, channels = prepare.decode(whole, 24000, 24000)
    assert len(audio) == 96000 and channels == 2


def test_truncated_wav_lands_in_rejects_csv(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(3):
        sf.write(raw / f"good{i}.wav", _noise(2.0, seed=i), 24000)
    sf.write(raw / "long.wav", _noise(4.0, seed=9), 24000)
    data = (raw / "long.wav").read_bytes()
    (raw / "long.wav").write_bytes(data[: 44 + 2 * int(1.24 * 24000)])  # declares 4 s, holds 1.24 s
    cfg = yaml.safe_load(SMOKE)
    cfg["tokenizer"]["mode"] = "pretrained"
    prepare.run(make_config(cfg), raw, tmp_path / "prepared")
    rejects = dict(pd.read_csv(tmp_path / "prepared" / "rejects.csv").itertuples(index=False))
    assert rejects == {"long.wav": "truncated or corrupt: decoded 29760 of the 96000 frames its header declares"}


# ------------------------------------------------------------------------------------ fetch snapshots


def test_a_source_file_edited_after_fetch_is_refused_by_prepare(tmp_path):
    """A `folder` source is hard-linked into data/raw: an edit in place reaches the fetched copy.
    fetch records every file's sha256; prepare refuses a changed file in one line, writing nothing."""
    src = tmp_path / "music"
    src.mkdir()
    for i in range(2):
        sf.write(src / f"t{i}.wav", _noise(2.0, seed=i), 24000)
    cfg = yaml.safe_load(SMOKE)
    cfg["data"].update(source="folder", folder=str(src))
    cfg["tokenizer"]["mode"] = "pretrained"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    raw, prepared = tmp_path / "data" / "raw", tmp_path / "data" / "prepared"
    assert _amlm(["fetch", "--config", path, "--out", raw]).returncode == 0
    record = json.loads((raw / "SOURCE.json").read_text())
    assert record["sha256"] == {f"t{i}.wav": sha256((src / f"t{i}.wav").read_bytes())[7:] for i in range(2)}
    with open(src / "t1.wav", "r+b") as fh:  # an edit in place: the same inode, so data/raw/t1.wav too
        fh.seek(2000)
        fh.write(bytes(4000))
    before = _snapshot(tmp_path / "data")
    proc = _amlm(["prepare", "--config", path, "--raw", raw, "--out", prepared])
    _one_line_refusal(proc, f"{raw / 't1.wav'}: changed since it was fetched", "rerun the fetch stage")
    assert _snapshot(tmp_path / "data") == before and not prepared.exists()
    assert _amlm(["fetch", "--config", path, "--out", raw]).returncode == 0  # fetched again: a new snapshot
    assert _amlm(["prepare", "--config", path, "--raw", raw, "--out", prepared]).returncode == 0


# ------------------------------------------------------------------------- interrupted stages, debris


@pytest.mark.slow
def test_sigterm_keeps_finished_parts_only_and_debris_of_a_killed_run_is_removed(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(60):
        sf.write(raw / f"c{i:02d}.wav", _noise(3.0, sr=44100, seed=i), 44100)
    cfg = yaml.safe_load(SMOKE)
    cfg["tokenizer"]["mode"] = "pretrained"
    cfg["data"]["shard_files"] = 100
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "prepared"
    proc = subprocess.Popen(
        [sys.executable, "-m", "acoustic_mlm", "prepare", "--config", str(path), "--raw", str(raw), "--out", str(out)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120  # the stage's temporary folder, with a shard being written in it
    while (
        not list(tmp_path.glob(".prepared.tmp-*/.shard-00000.tmp-*"))
        and time.monotonic() < deadline
        and proc.poll() is None
    ):
        time.sleep(0.005)
    assert proc.poll() is None, "prepare ended before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err[-2000:]
    # a resumable stage stopped by SIGTERM (a scheduler's preemption) keeps its temporary folder for the
    # next run to take its finished parts from; the part being written is removed, nothing is under `out`
    (kept,) = [p for p in tmp_path.iterdir() if p.name not in ("cfg.yaml", "raw")]
    assert kept.name.startswith(".prepared.tmp-") and not out.exists()
    assert (kept / "resume.json").is_file() and not list(kept.glob(".shard-*.tmp-*"))

    # a run killed harder (SIGKILL) leaves its temporary names; the next run of the same output removes them
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    debris, other = tmp_path / f".prepared.tmp-{pid}-abc", tmp_path / f".raw.tmp-{pid}-def"
    for d in (debris, other):
        (d / "shard-00000").mkdir(parents=True)
        (d / "shard-00000" / "audio.npy").write_bytes(b"x" * 100)
    live = tmp_path / f".prepared.tmp-{os.getpid()}-ghi"  # a live process's (a run in progress): left alone
    live.mkdir()
    assert _amlm(["prepare", "--config", path, "--raw", raw, "--out", out]).returncode == 0
    assert not debris.exists() and live.exists() and other.exists()  # another output's name: not touched
    assert not kept.exists()  # claimed by the next run (its parts checked and taken, or redone), then removed
    assert (out / "manifest.csv").is_file()


def test_messages_name_final_paths_not_temporary_ones(tmp_path):
    """tokenize (one process, DVC) writes files.csv inside data/.codes.tmp-*/ and warned with that
    path; messages and errors now name data/codes/files.csv."""
    script = (
        "import logging, sys\n"
        "from acoustic_mlm.utils import atomic_dir, setup_logging, log, final_names\n"
        "setup_logging()\n"
        f"with atomic_dir({str(tmp_path / 'data' / 'codes')!r}) as tmp:\n"
        "    log.warning('tokenize: see %s for each file', tmp / 'files.csv')\n"
        "    print(final_names(f'error: {tmp}/shard-00000/codes.npy: broken'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"see {tmp_path / 'data' / 'codes' / 'files.csv'} for each file" in proc.stderr, proc.stderr
    assert proc.stdout.strip() == f"error: {tmp_path / 'data' / 'codes'}/shard-00000/codes.npy: broken"
    assert ".tmp-" not in proc.stderr + proc.stdout


# ------------------------------------------------------------- files the pipeline wrote, damaged or edited


def _cut(path: Path, keep: float = 0.6) -> None:
    """The file cut short, as an interrupted copy leaves it (inside a row, inside a number)."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)].rstrip(b"\n")[:-1])


def _edit_csv(path: Path, row: int, column: str, value: str) -> None:
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame.loc[row, column] = value
    frame.to_csv(path, index=False)


@pytest.fixture()
def summaries(tmp_path, smoke_cfg):
    """An aggregate stage's real outputs, from made-up metrics of every arm (two seeds each)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(smoke_cfg))
    for i, name in enumerate(smoke_cfg["runs"]):
        steps = np.array([1, 2, 4, 8, 16, 20, 32, 40])
        rows = []
        for seed in (1, 2):
            curve = 6.0 - 0.1 * i + 4.0 * np.exp(-steps / 20) + 0.01 * seed
            rows.append(
                pd.DataFrame(
                    {
                        "seed": seed,
                        "step": steps,
                        "train_loss_cb0": curve,
                        "valid_loss_cb0": curve + 0.1,
                        "grad_norm": 1.0 + steps,
                        "lr": 1e-3,
                        "nonfinite": 0,
                    }
                )
            )
        (tmp_path / "runs" / name).mkdir(parents=True)
        pd.concat(rows).to_csv(tmp_path / "runs" / name / "metrics.csv", index=False)
    proc = _amlm(["aggregate", "--config", cfg, "--runs-dir", tmp_path / "runs", "--out", tmp_path / "loss_curves.csv"])
    assert proc.returncode == 0, proc.stderr
    shutil.copy(ROOT / "data" / "reference" / "paper_curves.csv", tmp_path / "paper_curves.csv")
    return tmp_path, cfg


def _summary_case(case: str, d: Path) -> tuple[list, list[str]]:
    """(the stage's arguments, needles of its one-line refusal) after damaging one file in d."""
    metrics, curves, diags, ref = (
        d / "runs" / "prenorm_clip1" / "metrics.csv",
        d / "loss_curves.csv",
        d / "diagnostics.csv",
        d / "paper_curves.csv",
    )
    aggregate = ["aggregate", "--runs-dir", d / "runs", "--out", d / "loss_curves.csv"]
    figure = ["figure", "--curves", curves, "--reference", ref, "--out", d / "figures"]
    claims = [
        "claims",
        "--curves",
        curves,
        "--diagnostics",
        diags,
        "--reference",
        ref,
        "--out-json",
        d / "c.json",
        "--out-md",
        d / "c.md",
    ]
    stability = ["stability", "--curves", curves, "--diagnostics", diags, "--out", d / "figures"]
    compare = ["compare", "--curves", curves, "--reference", ref, "--out", d / "figures" / "cmp.png"]
    if case == "metrics_cut":
        _cut(metrics)
        return aggregate, [f"{metrics}: cut short", "rerun the train stage"]
    if case == "metrics_text":
        _edit_csv(metrics, 3, "train_loss_cb0", "7.1O")
        return aggregate, [f"{metrics}: column 'train_loss_cb0', row 5: '7.1O' is not a number"]
    if case == "metrics_steps":
        _edit_csv(metrics, 3, "step", "2")
        return aggregate, [f"{metrics}: 'step' must increase"]
    if case == "curves_cut":
        _cut(curves)
        return figure, [f"{curves}: cut short", "rerun the aggregate stage"]
    if case == "curves_fields":  # an edited row that lost a field, still ending with a line break
        lines = curves.read_text().splitlines(keepends=True)
        lines[3] = lines[3].rsplit(",", 1)[0] + "\n"
        curves.write_text("".join(lines))
        return claims, [f"{curves}: row 4 has 7 fields, the header 8"]
    if case == "curves_split":
        _edit_csv(curves, 0, "split", "test")
        return stability, [f"{curves}: column 'split', row 2: 'test' is not one of train, valid"]
    if case == "diagnostics_cut":
        _cut(diags, 0.5)
        return stability, [f"{diags}: cut short", "rerun the aggregate stage"]
    if case == "diagnostics_text":
        _edit_csv(diags, 1, "value", "high")
        return claims, [f"{diags}: column 'value', row 3: 'high' is not a number"]
    if case == "reference_nan":
        _edit_csv(ref, 0, "loss_bits", "nan")
        return claims, [f"{ref}: column 'loss_bits', row 2 is nan; it must be a finite number"]
    if case == "reference_step0":
        _edit_csv(ref, 0, "step", "0")
        return compare, [f"{ref}: column 'step', row 2 is 0; steps are positive"]
    if case == "reference_role":
        _edit_csv(ref, 5, "role", "clip2")
        return figure, [f"{ref}: column 'role', row 7: 'clip2' is not one of"]
    if case == "metrics_header_edited":  # the figure's loss column renamed: it was kept as a "diagnostic"
        metrics.write_text(metrics.read_text().replace("train_loss_cb0", "train_loss_cbO", 1))
        return aggregate, [f"{metrics}: missing column train_loss_cb0"]
    if case == "curves_arm_deleted":  # one arm's rows gone: its claims turned inconclusive without a word
        curves.write_text(
            "".join(line for line in curves.read_text().splitlines(True) if not line.startswith("prenorm_clip1,"))
        )
        return claims, [f"{curves}: no train codebook-0 rows for run(s) prenorm_clip1"]
    if case == "reference_role_deleted":
        ref.write_text("".join(line for line in ref.read_text().splitlines(True) if ",clip1," not in line))
        return claims, [f"{ref}: role clip1 has 0 point(s)"]
    if case == "reference_missing_column":
        pd.read_csv(ref).drop(columns=["loss_bits"]).to_csv(ref, index=False)
        return compare, [f"{ref}: missing column(s) loss_bits"]
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "metrics_cut",
        "metrics_text",
        "metrics_steps",
        "curves_cut",
        "curves_fields",
        "curves_split",
        "diagnostics_cut",
        "diagnostics_text",
        "reference_nan",
        "reference_step0",
        "reference_role",
        "reference_missing_column",
        "metrics_header_edited",
        "curves_arm_deleted",
        "reference_role_deleted",
    ],
)
def test_damaged_summaries_are_refused_by_every_stage_that_reads_them(summaries, smoke_cfg, case):
    """A metrics.csv cut inside its last row was aggregated with the cut number; NaN in the paper's
    curves flipped verdicts silently. Each damaged file is now refused in one line naming it."""
    d, cfg = summaries
    smoke_cfg["figure"]["overlay_paper"] = True  # the figure reads the reference too
    cfg.write_text(yaml.safe_dump(smoke_cfg))
    args, needles = _summary_case(case, d)
    before = _snapshot(d)
    _one_line_refusal(_amlm([args[0], "--config", cfg, *args[1:]]), *needles)
    assert _snapshot(d) == before


@pytest.mark.parametrize(
    "case",
    [
        "tokenizer_json_cut",
        "tokenizer_json_edited",
        "codes_out_of_range",
        "codes_float",
        "manifest_cut",
        "manifest_text",
    ],
)
def test_damaged_data_is_refused_by_train_before_any_step(data_dirs, smoke_cfg, tmp_path, case):
    """A tokenizer.json that is not JSON, codes outside the codebook (only tokenizer.json's
    max_code was read): tracebacks in train. Now one line naming the file and the stage to rerun."""
    prepared, codes = tmp_path / "prepared", tmp_path / "codes"
    shutil.copytree(data_dirs[0], prepared)
    shutil.copytree(data_dirs[1], codes)
    shard = codes / "shard-00001" / "codes.npy"
    if case == "tokenizer_json_cut":
        _cut(codes / "tokenizer.json")
        needles = [f"{codes / 'tokenizer.json'}: not valid JSON", "rerun the tokenize stage"]
    elif case == "tokenizer_json_edited":
        meta = json.loads((codes / "tokenizer.json").read_text())
        meta["max_code"] = "1023"
        (codes / "tokenizer.json").write_text(json.dumps(meta))
        needles = [f"{codes / 'tokenizer.json'}: 'max_code' is '1023', not list"]
    elif case == "codes_out_of_range":  # tokenizer.json still says every code is below 16
        values = np.load(shard)
        values[0, 7] = 5000
        np.save(shard, values)
        needles = [
            f"{shard}: code 5000 at codebook 0, frame 7 lies outside the codebook (0-1023)",
            "rerun the tokenize stage",
        ]
    elif case == "codes_float":
        np.save(shard, np.load(shard).astype(np.float32))
        needles = [f"{shard}: float32 values; codes are whole numbers"]
    elif case == "manifest_cut":
        _cut(prepared / "manifest.csv", 0.8)
        needles = [f"{prepared / 'manifest.csv'}: cut short", "rerun the prepare stage"]
    else:
        _edit_csv(prepared / "manifest.csv", 2, "offset", "9600.5")
        needles = [f"{prepared / 'manifest.csv'}: column 'offset', row 4: '9600.5' is not a whole number"]
    args = _train_args(smoke_cfg, tmp_path, prepared, codes)
    before = _snapshot(tmp_path)
    _one_line_refusal(_amlm(args), *needles)
    after = _snapshot(tmp_path)
    assert after == before and not (tmp_path / "run" / "metrics.csv").exists()


def test_a_damaged_seed_summary_trains_that_seed_again(tmp_path, caplog):
    """A completed seed's summary.json cut short ended in a traceback; the stage's own record
    is now read through its reader and, damaged, makes the seed train again (with a warning)."""
    out = tmp_path / "seed1"
    out.mkdir()
    fp = {"settings": {"train.lr": 0.001}, "processes": 1}
    summary = {
        "status": "completed",
        "final_train_loss_cb0": 7.5,
        "final_valid_loss_cb0": 7.4,
        "nonfinite_steps": 0,
        "fingerprint": fp,
    }
    (out / "summary.json").write_text(json.dumps(summary))
    pd.DataFrame({"step": [1, 2], "train_loss_cb0": [10.0, 9.0]}).to_csv(out / "metrics.csv", index=False)
    (out / "checkpoint.pt").write_bytes(b"x")
    assert completed_summary(out, fp) == summary
    caplog.set_level("WARNING", logger="acoustic_mlm")
    for damage in ("cut", "edited"):
        if damage == "cut":
            _cut(out / "summary.json")
        else:
            (out / "summary.json").write_text(json.dumps({**summary, "final_train_loss_cb0": "NaN"}))
        assert completed_summary(out, fp) is None
        assert f"{out / 'summary.json'}: " in caplog.text and "training this seed again" in caplog.text
        caplog.clear()
    (out / "summary.json").write_text(json.dumps(summary))
    _cut(out / "metrics.csv", 0.9)
    assert completed_summary(out, fp) is None and "metrics.csv: cut short" in caplog.text


# ----------------------------------------------------------------------------- the newest surfaces (issue 54)


@pytest.mark.parametrize("kind", ["symlink", "folder", "fifo"])
def test_train_through_a_lock_path_that_is_not_the_run_folders_file_writes_nothing_outside(
    data_dirs, root, tmp_path, capsys, kind
):
    """`.amlm.lock` as a symbolic link: train truncated the linked file outside the run folder and wrote its
    holder line into it; a folder or FIFO there ended in a traceback. Now one line, exit 2, nothing written."""
    out, outside = tmp_path / "runs" / "prenorm_clip1", tmp_path / "precious.txt"
    out.mkdir(parents=True)
    outside.write_text("keep me")
    lock = out / ".amlm.lock"
    {"symlink": lambda: lock.symlink_to(outside), "folder": lock.mkdir, "fifo": lambda: os.mkfifo(lock)}[kind]()
    argv = train_argv("prenorm_clip1", root / "config" / "smoke.yaml", data_dirs, out, launcher=())
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"amlm train: error: {lock}: ") and "not the lock file amlm writes there" in err
    assert err.count("\n") == 1 and outside.read_text() == "keep me"
    assert sorted(p.name for p in out.iterdir()) == [".amlm.lock"]  # no run file written beside it


def _exit_code(argv) -> int:
    try:
        return cli.main(argv)
    except SystemExit as stopped:  # argparse's own refusals (an empty path)
        return stopped.code


@pytest.mark.parametrize("argv", [["--out", ""], ["--threads", "1025"], ["--threads", "0"]])
def test_train_with_an_empty_or_bad_option_writes_nothing(data_dirs, root, tmp_path, capsys, monkeypatch, argv):
    """An empty --out (an unset shell variable) was the working folder: train wrote a run's files there."""
    monkeypatch.chdir(tmp_path)
    prepared, codes = data_dirs
    base = ["train", "prenorm_clip1", "--config", str(root / "config" / "smoke.yaml")]
    assert _exit_code([*base, "--prepared", str(prepared), "--codes", str(codes), *argv]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
