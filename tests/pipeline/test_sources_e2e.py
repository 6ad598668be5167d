"""Issue 4, end to end: real audio sources through the whole Snakemake pipeline.

- a `url` source (a zip served on 127.0.0.1, sha256-checked) runs the whole pipeline, in shards;
- a wrong hash and an archive with a `../` member are refused, and nothing lands outside data/;
- a `folder` of good and bad files trains on the good ones and lists every bad one in rejects.csv;
- a folder of only bad files fails with one line (the CLI, and Snakemake's merge job).

Each test builds its audio at run time (acoustic_mlm.data.synth, written with soundfile at several rates,
channel counts and formats) in a fresh copy of the repository; nothing reaches the network.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
import yaml
from helpers import RUN_NAMES, copy_repo, make_tar, make_zip, sha256, tool_env

from acoustic_mlm.data import synth

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SR = 24000
CLIP_S = 5.0
FRAMES = int(CLIP_S * SR) // 320  # 375 EnCodec frames per 5 s clip, whatever its original rate
STEPS = 50  # training steps (the smoke preset has 150; every other smoke value is kept)
FIGURE = "results/figures/acoustic_mlm_loss_codebook0.png"


# ------------------------------------------------------------------------------------------
# Audio, archives, a local HTTP server


def music(seed: int, sr: int, channels: int, seconds: float = CLIP_S) -> np.ndarray:
    """Procedural music (the synthetic source's generator), shaped (samples, channels), deterministic."""
    mono = synth.generate_clip(synth.clip_rng(seed, 0), seconds, sr).mean(axis=1)
    gains = np.linspace(1.0, 0.6, channels, dtype=np.float32)  # distinct channels that never cancel
    return (mono[:, None] * gains[None, :]).astype(np.float32)


def audio_bytes(x: np.ndarray, sr: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, format=fmt, subtype=subtype)
    return buf.getvalue()


# archive member -> (original rate, channels, format, subtype): every file of the corpus differs
URL_CORPUS = {
    "corpus/a/clip00.wav": (24000, 1, "WAV", "PCM_16"),
    "corpus/a/clip01.flac": (48000, 2, "FLAC", "PCM_16"),
    "corpus/a/clip02.wav": (44100, 2, "WAV", "FLOAT"),
    "corpus/b/clip03.flac": (16000, 1, "FLAC", "PCM_24"),
    "corpus/b/clip04.wav": (32000, 1, "WAV", "PCM_24"),
    "corpus/b/clip05.flac": (22050, 2, "FLAC", "PCM_16"),
    "corpus/c/clip06.ogg": (24000, 1, "OGG", "VORBIS"),
    "corpus/c/clip07.wav": (8000, 1, "WAV", "PCM_16"),
    "corpus/c/clip08.flac": (96000, 1, "FLAC", "PCM_16"),
    "corpus/c/clip09.wav": (24000, 3, "WAV", "PCM_16"),
}


def url_members() -> dict[str, bytes]:
    members = {
        name: audio_bytes(music(i, sr, ch), sr, fmt, sub)
        for i, (name, (sr, ch, fmt, sub)) in enumerate(URL_CORPUS.items())
    }
    members["corpus/README.txt"] = b"ten clips of procedural music\n"  # not audio: fetch skips it
    return members


# ------------------------------------------------------------------------------------------
# The pipeline in a fresh copy of the repository


def _env() -> dict:
    env = tool_env(pythonpath=None)  # python with the package's deps
    return env


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def snakemake(repo: Path, *targets: str, configfile: str = "config/test.yaml") -> subprocess.CompletedProcess:
    # targets first: --configfile takes several values
    return run([sys.executable, "-m", "snakemake", *targets, "--cores", "2", "--configfile", configfile], repo)


def write_config(path: Path, root: Path, **data) -> Path:
    """config/smoke.yaml with `data` overrides and STEPS training steps; every other smoke value kept."""
    cfg = yaml.safe_load((root / "config" / "smoke.yaml").read_text())
    unknown = set(data) - set(cfg["data"])
    assert not unknown, unknown
    cfg["data"].update(data)
    cfg["train"]["steps"] = STEPS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def tree(folder: Path) -> set[str]:
    """Every file, link and folder under `folder`, relative, with a trailing / on folders."""
    return {
        p.relative_to(folder).as_posix() + ("/" if p.is_dir() and not p.is_symlink() else "") for p in folder.rglob("*")
    }


def read_csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False)


def last_error(log: str) -> str:
    errors = [line for line in log.splitlines() if ": error: " in line]
    assert len(errors) == 1, log
    return errors[0]


# ------------------------------------------------------------------------------------------
# 1. A url source runs the whole pipeline


def test_url_source_runs_the_whole_pipeline_in_shards(server, root, tmp_path):
    members = url_members()
    blob = make_zip(members)
    url = server.serve("/issue4/corpus.zip", blob)
    repo = copy_repo(root, tmp_path / "repo")
    # 11 paths: 10 clips and the README, which stays in the archive but is listed in the rejects;
    # two shards, of 6 and 5 paths
    write_config(repo / "config" / "test.yaml", root, source="url", url=url, known_hash=sha256(blob), shard_files=6)

    proc = snakemake(repo)
    assert proc.returncode == 0, show(proc)

    assert (repo / FIGURE).stat().st_size > 1000
    curves = pd.read_csv(repo / "results" / "loss_curves.csv")
    assert sorted(curves["run"].unique()) == sorted(RUN_NAMES)
    cb0 = curves[(curves["split"] == "train") & (curves["codebook"] == 0)]
    for run_name, g in cb0.groupby("run"):
        assert g["step"].max() == STEPS and np.isfinite(g["loss_bits"]).all(), run_name
        assert 9.0 < g.sort_values("step")["loss_bits"].iloc[0] < 11.5, run_name  # starts near 10 bits

    # Every audio file of the archive is in the manifest, at its own rate and channel count; the README
    # (not extracted) is the one reject.
    manifest = read_csv(repo / "data" / "prepared" / "manifest.csv")
    assert sorted(manifest["path"]) == sorted(URL_CORPUS), manifest["path"].tolist()
    for row in manifest.itertuples():
        sr, ch, _, _ = URL_CORPUS[row.path]
        assert (row.orig_sample_rate, row.orig_channels, row.num_frames) == (sr, ch, FRAMES), row
    assert set(manifest["split"]) == {"train", "valid"}
    assert (repo / "data" / "prepared" / "rejects.csv").read_text() == (
        "path,reason\ncorpus/README.txt,not an audio file name (not extracted)\n"
    )
    source = json.loads((repo / "data" / "raw" / "SOURCE.json").read_text())
    assert (source["source"], source["url"], source["known_hash"]) == ("url", url, sha256(blob))
    assert (source["files"], source["other_files_skipped"], source["archive"]) == (10, 1, "corpus.zip")

    # The archive is kept under data/downloads/ (and was downloaded once).
    assert (repo / "data" / "downloads" / "corpus.zip").read_bytes() == blob
    assert sorted(p.name for p in (repo / "data" / "downloads").iterdir()) == ["corpus.zip"]
    assert [p for p, _ in server.requests].count("/issue4/corpus.zip") == 1

    # Two shards, each prepared and tokenized by its own job.
    plan = read_csv(repo / "data" / "prepared" / "shards.csv")
    assert plan.groupby("shard")["path"].count().to_dict() == {0: 6, 1: 5}
    assert sorted(manifest["shard"].unique()) == [0, 1]
    for stage, folder in (("prepare", "prepared"), ("tokenize", "codes")):
        shards = sorted(p.name for p in (repo / "data" / folder).glob("shard-*"))
        assert shards == ["shard-00000", "shard-00001"], (folder, shards)
        logs = sorted(p.name for p in (repo / "results" / "logs" / stage).glob("shard-*.log"))
        assert logs == [f"{s}.log" for s in shards], (stage, logs)
    summary = json.loads((repo / "data" / "prepared" / "prepare.json").read_text())
    assert (summary["shards"], summary["shard_files"], summary["kept"], summary["rejected"]) == (2, 6, 10, 1)
    tok = json.loads((repo / "data" / "codes" / "tokenizer.json").read_text())
    assert (tok["shards"], tok["clips"]) == (2, 10)
    assert tok["audio_seconds"] == pytest.approx(10 * FRAMES * 320 / SR)


# ------------------------------------------------------------------------------------------
# 2. A wrong hash, an archive with a `../` member: refused, nothing written outside data/


@pytest.mark.parametrize("case", ["wrong-hash", "parent-member"])
def test_bad_download_is_refused_and_nothing_escapes(server, root, tmp_path, case):
    good = {
        name: audio_bytes(music(i, SR, 1, seconds=1.0), SR, "WAV", "PCM_16")
        for i, name in enumerate(["corpus/one.wav", "corpus/two.wav"])
    }
    if case == "wrong-hash":
        blob = make_zip(good)
        name, known = "hashed.zip", sha256(blob + b"tampered")
    else:
        # data/.raw.tmp-*/../../../evil.wav is tmp_path/evil.wav: the very folder this test watches
        blob = make_tar({**good, "../../../evil.wav": good["corpus/one.wav"]})
        name, known = "escape.tar.gz", sha256(blob)
    url = server.serve(f"/issue4/{case}/{name}", blob)
    repo = copy_repo(root, tmp_path / "repo")
    write_config(repo / "config" / "test.yaml", root, source="url", url=url, known_hash=known, shard_files=4)
    before = tree(tmp_path)

    proc = snakemake(repo)
    assert proc.returncode != 0, show(proc)
    assert "Error in rule fetch" in proc.stdout + proc.stderr, show(proc)
    # refused after the download, not before; a complete download that fails its hash is not fetched again
    assert [p for p, _ in server.requests].count(f"/issue4/{case}/{name}") == 1
    error = last_error((repo / "results" / "logs" / "fetch.log").read_text())
    if case == "wrong-hash":
        assert error.startswith(f"amlm fetch: error: fetch: {url}: SHA256 hash of downloaded file"), error
        assert f"expected {known} but got {hashlib.sha256(blob).hexdigest()}" in error
        assert error.endswith("check data.known_hash"), error
    else:
        assert "'../../../evil.wav'" in error and name in error and "nothing was extracted" in error, error

    new = tree(tmp_path) - before
    kept = {"repo/data/downloads/", f"repo/data/downloads/{name}"} if case == "parent-member" else set()
    outside = {p for p in new if not p.startswith(("repo/.snakemake/", "repo/results/logs/"))}
    assert outside == kept, sorted(outside)  # wrong hash: pooch deleted the download
    assert not (repo / "data" / "raw").exists() and not (repo / "data" / "prepared").exists()
    assert not [p for p in tree(tmp_path) if "evil" in p]
    assert (tmp_path / "repo" / "data").is_dir()


def test_zip_written_by_pythons_zipfile_is_extracted(server, root, tmp_path):
    """`ZipFile.writestr(name, data)` stores mode 0o600 without the regular-file type bits; such members
    are regular files to zipfile and to unzip, and must be extracted like any other."""
    members = {f"songs/s{i}.wav": audio_bytes(music(20 + i, SR, 1, seconds=1.0), SR, "WAV", "PCM_16") for i in range(2)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    blob = buf.getvalue()
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        assert {i.external_attr >> 16 for i in zf.infolist()} == {0o600}
    url = server.serve("/issue4/python.zip", blob)
    cfg = write_config(tmp_path / "cfg.yaml", root, source="url", url=url, known_hash=sha256(blob))
    proc = run([sys.executable, "-m", "acoustic_mlm", "fetch", "--config", str(cfg)], tmp_path, timeout=300)
    assert proc.returncode == 0, show(proc)
    assert sorted(tree(tmp_path / "data" / "raw")) == ["SOURCE.json", "songs/", *sorted(members)]
    for name, data in members.items():
        assert (tmp_path / "data" / "raw" / name).read_bytes() == data


# ------------------------------------------------------------------------------------------
# 3. A folder of good and bad files: trains on the good ones, every bad one in rejects.csv


# good file -> (original rate, channels, format, subtype)
GOOD = {
    "good/g0.wav": (24000, 1, "WAV", "PCM_16"),
    "good/g1.flac": (48000, 2, "FLAC", "PCM_16"),
    "good/g2.wav": (44100, 1, "WAV", "FLOAT"),
    "good/g3.flac": (16000, 2, "FLAC", "PCM_24"),
    "good/g4.ogg": (22050, 1, "OGG", "VORBIS"),
    "good/g5.wav": (32000, 1, "WAV", "PCM_16"),
}
MIN_CROP_S = (int(0.5 * SR) // 320) * 320 / SR  # the smoke crop (0.5 s) in whole frames: 0.493 s
# bad file -> the reason rejects.csv must give (exactly, or its start)
BAD = {
    "bad/empty.wav": "empty file (0 bytes)",
    "bad/nan.wav": "non-finite samples (NaN or infinity)",
    "bad/notes.wav": "not decodable: ",
    "bad/short.wav": f"shorter than one training crop (0.300 s < {MIN_CROP_S:.3f} s)",
    "bad/silence.flac": "digital silence (peak 0)",
    "bad/truncated.flac": "not decodable: ",
}
BAD_KINDS = "1 digital silence, 1 empty file, 1 non-finite samples, 2 not decodable, 1 shorter than one training crop"


def write_bad_files(folder: Path) -> None:
    (folder / "bad").mkdir(parents=True)
    (folder / "bad" / "empty.wav").write_bytes(b"")
    (folder / "bad" / "notes.wav").write_text("these are lecture notes, not audio\n" * 20)
    flac = audio_bytes(music(100, SR, 1, seconds=2.0), SR, "FLAC", "PCM_16")
    (folder / "bad" / "truncated.flac").write_bytes(flac[: len(flac) // 2])
    x = music(101, SR, 1, seconds=1.0)
    x[100, 0] = np.nan
    sf.write(folder / "bad" / "nan.wav", x, SR, subtype="FLOAT")
    sf.write(folder / "bad" / "silence.flac", np.zeros((SR, 2), np.float32), SR)
    sf.write(folder / "bad" / "short.wav", music(102, SR, 1, seconds=0.3), SR)


def assert_rejects(path: Path) -> None:
    rejects = read_csv(path)
    assert list(rejects.columns) == ["path", "reason"]
    got = dict(zip(rejects["path"], rejects["reason"]))
    assert sorted(got) == sorted(BAD), sorted(got)
    for bad, reason in BAD.items():
        assert got[bad] == reason or (
            reason.endswith(": ") and got[bad].startswith(reason) and len(got[bad]) > len(reason)
        ), (bad, got[bad])


def test_folder_with_good_and_bad_files_trains_on_the_good_ones(root, tmp_path):
    folder = tmp_path / "music"
    write_bad_files(folder)
    for i, (name, (sr, ch, fmt, sub)) in enumerate(GOOD.items()):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(audio_bytes(music(10 + i, sr, ch), sr, fmt, sub))
    repo = copy_repo(root, tmp_path / "repo")
    # 12 files sorted by path, shards of 6: shard 0 holds the 6 bad files, shard 1 the 6 good ones. A shard
    # with no usable clip is complete (prepare.prepare_shard): only the corpus as a whole must hold audio.
    write_config(repo / "config" / "test.yaml", root, source="folder", folder=str(folder), shard_files=6)

    proc = snakemake(repo, "results/runs/prenorm_clip1/metrics.csv")
    assert proc.returncode == 0, show(proc)

    manifest = read_csv(repo / "data" / "prepared" / "manifest.csv")
    assert sorted(manifest["path"]) == sorted(GOOD), manifest["path"].tolist()
    for row in manifest.itertuples():
        sr, ch, _, _ = GOOD[row.path]
        assert (row.orig_sample_rate, row.orig_channels, row.num_frames) == (sr, ch, FRAMES), row
    assert sorted(manifest["shard"].unique()) == [1]
    assert read_csv(repo / "data" / "prepared" / "shard-00000" / "clips.csv").empty
    assert_rejects(repo / "data" / "prepared" / "rejects.csv")
    summary = json.loads((repo / "data" / "prepared" / "prepare.json").read_text())
    assert (summary["shards"], summary["kept"], summary["rejected"]) == (2, len(GOOD), len(BAD))
    assert summary["rejected_by_reason"] == {
        "digital silence": 1,
        "empty file": 1,
        "non-finite samples": 1,
        "not decodable": 2,
        "shorter than one training crop": 1,
    }

    metrics = pd.read_csv(repo / "results" / "runs" / "prenorm_clip1" / "metrics.csv")
    assert metrics["step"].max() == STEPS and len(metrics) >= 5
    for column in ("train_loss_cb0", "valid_loss_cb0"):
        assert np.isfinite(metrics[column]).all() and metrics[column].between(0, 16).all(), metrics[column]
    assert not (repo / "results" / "runs" / "prenorm_clip10").exists()  # only the arm asked for
    assert not (repo / "results" / "loss_curves.csv").exists()


# ------------------------------------------------------------------------------------------
# 4. Only bad files: one line, from the CLI and through Snakemake


def test_folder_of_only_bad_files_fails_with_one_line(root, tmp_path):
    folder = tmp_path / "music"
    write_bad_files(folder)
    cfg = write_config(tmp_path / "cfg.yaml", root, source="folder", folder=str(folder), shard_files=4)
    out = tmp_path / "outdir"

    cli = run(
        [
            sys.executable,
            "-m",
            "acoustic_mlm",
            "prepare",
            "--config",
            str(cfg),
            "--raw",
            str(folder),
            "--out",
            str(out),
        ],
        tmp_path,
        timeout=300,
    )
    assert cli.returncode == 2, show(cli)
    assert "Traceback" not in cli.stderr, show(cli)
    error = last_error(cli.stderr)
    assert cli.stderr.rstrip("\n").splitlines()[-1] == error  # the last line, and a line of its own
    assert error.startswith("amlm prepare: error: prepare: no usable audio"), error
    assert ".tmp-" not in error, error  # names no temporary folder (gone by the time it is read)
    assert error.endswith(f": all {len(BAD)} files rejected ({BAD_KINDS})"), error
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml", "music"]  # no temporary folder left

    repo = copy_repo(root, tmp_path / "repo")
    write_config(repo / "config" / "test.yaml", root, source="folder", folder=str(folder), shard_files=4)
    proc = snakemake(repo)
    assert proc.returncode != 0, show(proc)
    assert "Error in rule prepare:" in proc.stdout + proc.stderr, show(proc)
    merge_log = (repo / "results" / "logs" / "prepare" / "merge.log").read_text()
    error = last_error(merge_log)
    assert error.startswith("amlm prepare: error: prepare: no usable audio"), error
    assert error.endswith(f": all {len(BAD)} files rejected ({BAD_KINDS})"), error
    assert sorted(p.name for p in (repo / "data" / "prepared").glob("shard-*")) == ["shard-00000", "shard-00001"]
    assert not (repo / "data" / "prepared" / "manifest.csv").exists()
    assert not (repo / "data" / "codes").exists() and not (repo / "results" / "runs").exists()
