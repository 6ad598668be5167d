"""Hostile inputs and faults: each case is used correctly or refused in one line (exit 2, no
traceback) naming the file and the key or member; nothing is lost and nothing half-written kept.

One test per case of the hostile-input report (item numbers in the test names): 2 huge
samples and implausible rates, 3 values validation let through, 4 YAML alias bombs, 5 a damaged
newest training state, 7 a config error under Snakemake, 8 resource faults and archive bombs.
Every input is built at test time.
"""

import io
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
import torch
import yaml
from helpers import copy_repo, make_tar, sha256

from acoustic_mlm import archive, cli, fetch, prepare, train
from acoustic_mlm import config as C

ROOT = Path(__file__).resolve().parents[1]
SMOKE = (ROOT / "config" / "smoke.yaml").read_text()
LR_LINE = 1 + [line.startswith("  lr:") for line in SMOKE.splitlines()].index(True)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _amlm(args, limit_bytes: int | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m acoustic_mlm ARGS`, optionally under a file-size limit with SIGXFSZ ignored
    (so that a write past the limit fails with EFBIG instead of killing the process)."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "acoustic_mlm", *map(str, args)], env=_env(), capture_output=True,
                          text=True, timeout=timeout, preexec_fn=limit if limit_bytes else None)


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


# ------------------------------------------------------------------------------------------ item 2


def test_item2_huge_samples_and_implausible_rates_are_rejected_with_a_reason(tmp_path):
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
    prepare.run(cfg, raw, tmp_path / "prepared")
    manifest = pd.read_csv(tmp_path / "prepared" / "manifest.csv")
    rejects = dict(pd.read_csv(tmp_path / "prepared" / "rejects.csv").itertuples(index=False))
    assert sorted(manifest["path"]) == ["good1.wav", "good2.flac", "loud.wav"]
    assert rejects["huge.wav"].startswith("samples out of range: peak 3e+38, beyond +-1000")
    assert rejects["one_hz.wav"].startswith("implausible sample rate: 1 Hz, outside 4000-384000 Hz")
    assert rejects["fast.wav"].startswith("implausible sample rate: 768000 Hz")
    summary = json.loads((tmp_path / "prepared" / "prepare.json").read_text())
    assert summary["rejected_by_reason"] == {"implausible sample rate": 2, "samples out of range": 1}
    # the kept clips are exactly the decoded audio: 2 s each, no clipping of the loud one
    audio = prepare.load_prepared(tmp_path / "prepared")
    loud_row = int(np.flatnonzero(manifest["path"] == "loud.wav")[0])
    np.testing.assert_allclose(audio.clip(loud_row), loud[: 48000 // 320 * 320], rtol=1e-6)


# ------------------------------------------------------------------------------------------ item 3


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
        "bad_label": ('"Pre-Norm | Gradient Clip=1 | Run 2"', r"'$\badcmd{x}$'"),  # single quotes: YAML reads the backslash as is
        "latin1": ("# Smoke preset", "# Smoke preset (r\u00e9sum\u00e9)"),
    }
    old, new = edits[case]
    assert old in text, old
    text = text.replace(old, new, 1)
    return text.encode("latin-1" if case == "latin1" else "utf-8")


@pytest.mark.parametrize("case, needles", [
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
])
def test_item3_values_validation_let_through_are_refused_naming_the_key(tmp_path, capsys, case, needles):
    """Each was accepted (or failed late without its key); now `amlm validate` refuses it in one line."""
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(_yaml_case(case))
    assert cli.main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"amlm validate: error: {path}: "), err
    for needle in needles:
        assert needle in err, err
    assert len(err) < 400


def test_item3_refusals_come_before_any_stage_and_through_the_cli(tmp_path):
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
    assert C.encodec_codebooks(1.5) == 2 and C.encodec_codebooks(24.0) == 32
    cfg["tokenizer"]["bandwidth"], cfg["model"]["codebooks"] = 12.0, 16  # 16 codebooks exist at 12 kbps
    C.validate(cfg)


# ------------------------------------------------------------------------------------------ item 4


def _billion_laughs(levels: int, width: int = 10) -> str:
    """The smoke preset with data.url set to a `levels`-deep chain of aliases, `width` per level."""
    anchors = ['x-lol-0: &l0 "lol"']
    for k in range(1, levels + 1):
        anchors.append(f"x-lol-{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * width) + "]")
    return "\n".join(anchors) + "\n" + SMOKE.replace("  url: null ", f"  url: *l{levels} ", 1)


@pytest.mark.parametrize("levels", [9, 12])
def test_item4_yaml_alias_bombs_fail_at_once_in_one_line(tmp_path, levels):
    """A 6-8 KB file of nested aliases (10^9 to 10^12 strings once expanded) produced an 8 MB
    error, or ran 93 s into a MemoryError. Refused at the first alias, under a 1 GB memory cap."""
    text = _billion_laughs(levels)
    assert len(text.encode()) < 16_000 and 10**levels >= 10**9  # a few KB; a billion strings or more expanded
    path = tmp_path / "lol.yaml"
    path.write_text(text)

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    proc = subprocess.run([sys.executable, "-m", "acoustic_mlm", "validate", "--config", str(path)], env=_env(),
                          capture_output=True, text=True, timeout=120, preexec_fn=cap_memory)
    line = _one_line_refusal(proc, str(path), "line 2: YAML alias '*l0' is not supported")
    assert len(line) < 300


# ------------------------------------------------------------------------------------------ item 5


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


def test_item5_damaged_newest_state_is_skipped_and_resume_matches(data_dirs, smoke_cfg, tmp_path, monkeypatch, caplog):
    """256 bytes changed inside one tensor of the newest state loaded silently and the resumed
    metrics differed. Now the state's sha256 fails, the previous state is used with a warning,
    and the resumed metrics equal an uninterrupted run's."""
    cfg = smoke_cfg
    cfg["train"].update(steps=50, warmup_steps=5, log_interval=10, batch_size=2, valid_crops=3, crop_seconds=0.4,
                        checkpoint_interval=10)
    prepared, codes = data_dirs
    reference = train.run(cfg, "prenorm_clip1", prepared, codes, tmp_path / "ref", threads=1)
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
        train.run(cfg, "prenorm_clip1", prepared, codes, out, threads=1)
    monkeypatch.setattr(train, "save_state", real_save)
    state_dir = out / "state" / "seed1"
    assert sorted(p.name for p in state_dir.iterdir()) == [
        "step-000000030.pt", "step-000000030.pt.sha256", "step-000000040.pt", "step-000000040.pt.sha256"]
    newest = state_dir / "step-000000040.pt"
    _flip_inside_largest_tensor(newest)
    torch.load(newest, weights_only=True)  # still loads: only the checksum can tell

    caplog.set_level("INFO", logger="acoustic_mlm")
    resumed = train.run(cfg, "prenorm_clip1", prepared, codes, out, threads=1)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("step-000000040.pt does not match its checksum" in w for w in warnings), warnings
    assert any("resuming after step 30" in r.getMessage() for r in caplog.records)
    pd.testing.assert_frame_equal(pd.read_csv(out / "metrics.csv").drop(columns=["wall_time"]), ref_metrics,
                                  check_exact=True)
    assert resumed["final_valid_loss_cb0"] == reference["final_valid_loss_cb0"]


# ------------------------------------------------------------------------------------------ item 7


@pytest.mark.e2e
def test_item7_config_error_under_snakemake_deletes_nothing(root, tmp_path):
    """DeepNorm on a Pre-Norm arm made Snakemake delete that arm's metrics.csv and summary.json
    before the error; under a new config file name it deleted data/raw. Now the config is
    validated when the workflow is parsed: exit 2, one line, every output still there."""
    repo = copy_repo(root, tmp_path / "repo")
    cfg = yaml.safe_load(SMOKE)
    cfg["train"].update(steps=20, warmup_steps=2, log_interval=10)
    (repo / "config" / "small.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "2"]
    env = _env()
    env.pop("PYTHONPATH")
    done = subprocess.run(snakemake + ["--configfile", "config/small.yaml"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    run = repo / "results" / "runs" / "prenorm_clip10"
    kept = {p: p.read_bytes() for p in (run / "metrics.csv", run / "summary.json")}
    raw = sorted(p.relative_to(repo) for p in (repo / "data" / "raw").rglob("*"))
    assert raw

    cfg["runs"]["prenorm_clip10"]["norm"] = "deepnorm"  # a changed arm, and a rule broken across sections:
    cfg["model"]["heads"] = 3  # the width is not divisible by it
    for name in ("small.yaml", "renamed.yaml"):  # the same file edited, then under a new name
        (repo / "config" / name).write_text(yaml.safe_dump(cfg, sort_keys=False))
        proc = subprocess.run(snakemake + ["--configfile", f"config/{name}"], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "invalid configuration" in line]
        assert len(errors) == 1 and "must be divisible by 'model.heads' (3)" in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr and f"config/{name}" in errors[0]
        assert {p: p.read_bytes() for p in kept} == kept
        assert sorted(p.relative_to(repo) for p in (repo / "data" / "raw").rglob("*")) == raw


# ------------------------------------------------------------------------------------------ item 8


def _train_under_limit(cfg: dict, data_dirs, tmp_path: Path, limit_bytes: int, **train) -> tuple:
    """`amlm train prenorm_clip1` on the tiny corpus, a small smoke model, under a file-size limit."""
    cfg["train"].update(warmup_steps=2, batch_size=2, valid_crops=3, crop_seconds=0.4, **train)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    prepared, codes = data_dirs
    out = tmp_path / "run"
    proc = _amlm(["train", "prenorm_clip1", "--config", path, "--threads", "1", "--prepared", prepared,
                  "--codes", codes, "--out", out], limit_bytes=limit_bytes)
    return proc, out


def test_item8_file_size_limit_in_training_is_one_line_and_leaves_nothing_partial(data_dirs, smoke_cfg, tmp_path):
    """A file-size limit at the first state save ended in "[enforce fail at inline_container.cc]
    unexpected pos". Now: exit 2, one line naming the state file and the bytes it needs."""
    proc, out = _train_under_limit(smoke_cfg, data_dirs, tmp_path, 200_000, steps=30, log_interval=10,
                                   checkpoint_interval=10)
    line = _one_line_refusal(proc, str(out / "state" / "seed1" / "step-000000010.pt"),
                             "file-size limit (ulimit -f) of 200000 bytes", "it needs ")
    needed = int(line.split("it needs ")[1].split()[0])
    assert needed > 200_000
    state = out / "state" / "seed1"
    assert not state.exists() or list(state.iterdir()) == []  # no partial state, no temporary file
    assert not (out / "metrics.csv").exists() and not (out / "summary.json").exists()


def test_item8_file_size_limit_on_the_progress_rows_is_one_line_and_keeps_the_last_complete_rows(
        data_dirs, smoke_cfg, tmp_path):
    """metrics.partial.csv (rewritten at every metrics row) under a file-size limit ended in a
    traceback from pandas. Now: exit 2, one line naming it; the file left is the last complete one."""
    proc, out = _train_under_limit(smoke_cfg, data_dirs, tmp_path, 6_000, steps=40, log_interval=1,
                                   log_powers_of_two=False, checkpoint_interval=0, diagnostics=True)
    seed = out / "seeds" / "seed1"
    _one_line_refusal(proc, str(seed / "metrics.partial.csv"), "file-size limit (ulimit -f) of 6000 bytes")
    rows = pd.read_csv(seed / "metrics.partial.csv")  # complete rows only: the last write that fitted
    assert 1 <= len(rows) < 40 and rows["step"].tolist() == list(range(1, len(rows) + 1))
    assert not [p.name for p in seed.iterdir() if ".tmp-" in p.name]
    assert not (seed / "metrics.csv").exists() and not (seed / "summary.json").exists()
    assert not (out / "metrics.csv").exists()


def test_item8_file_size_limit_in_prepare_is_one_line_and_leaves_nothing_partial(tmp_path):
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
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf, \
            zf.open("corpus/zeros.wav", "w", force_zip64=True) as member:
        member.write(bytes(head))
        block = bytes(1 << 22)
        for _ in range(nbytes // len(block)):
            member.write(block)


def test_item8_archive_bombs_conflicts_and_long_names_are_refused_by_name(server, tmp_path, monkeypatch):
    """A 975 KB zip of a 1 GB WAV of zeros was extracted in full; a.wav then a.wav/b.wav gave
    FileExistsError; a 300-character folder name OSError 36. Each is now refused, naming the
    member, before anything is written."""
    monkeypatch.setattr(fetch.time, "sleep", lambda s: None)
    bomb = tmp_path / "bomb.zip"
    _zip_of_zero_wav(bomb, 1 << 30)
    assert bomb.stat().st_size < 1_100_000
    good = io.BytesIO()
    sf.write(good, _noise(1.0), 24000, format="WAV")
    wav = good.getvalue()
    cases = {
        "bomb.zip": (bomb.read_bytes(), "member 'corpus/zeros.wav' expands"),
        "conflict.tar.gz": (make_tar({"c/a.wav": wav, "c/a.wav/b.wav": wav}),
                            "member 'c/a.wav/b.wav' needs 'c/a.wav' to be a folder"),
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
        proc = _amlm(["fetch", "--config", path, "--out", project / "raw", "--downloads", project / "downloads"],
                     timeout=120)
        _one_line_refusal(proc, f"refusing {name}", needle, "nothing was extracted")
        assert not (project / "raw").exists()
        assert [p.name for p in project.rglob("*") if p.is_file()] == [name]  # only the download itself

    # The limits are the config's: a ratio limit above the bomb's lets the header check pass,
    # the total-size limit stops it.
    limits = archive.ExtractLimits.from_config({"max_extract_gb": 0.5, "max_compression_ratio": 5000})
    with pytest.raises(archive.UnsafeArchiveError, match="expand to 1073741868 bytes, over the limit of 500000000"):
        archive.extract(bomb, tmp_path / "x", limits=limits)
    assert not (tmp_path / "x").exists()


def test_item8_extraction_counts_the_bytes_really_decompressed(tmp_path):
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
