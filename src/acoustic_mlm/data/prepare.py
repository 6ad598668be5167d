"""Prepare stage: raw audio files -> 24 kHz mono float32 shards, a manifest and a split.

Three steps, so that a cluster can decode shards in parallel (Snakemake: one job per shard;
`run` does all three in one process for DVC and by hand):

1. `plan`: `shards.csv` lists every path under the raw folder (sorted) with its clip id (unique
   over the corpus) and its shard: consecutive runs of `data.shard_files` paths. Files are decoded
   by content, whatever their name; paths that cannot be (hidden, links that lead nowhere, FIFOs,
   devices, names that are not UTF-8) and the files fetch did not bring (SOURCE.json's `skipped`)
   carry their reason in `skip`.
2. `prepare_shard`: one shard's files decoded, mixed to mono, resampled, trimmed to whole
   EnCodec frames, into `shard-<k>/`: `audio.npy` (ONE 1-D float32 array, the shard's clips
   concatenated; memory-map it), `clips.csv` (the manifest's columns but shard and split),
   `rejects.csv`, `shard.json`. Memory is bounded by the largest file: clips are decoded one at a
   time and appended to audio.npy.
3. `merge`: the corpus-level files, written last:
   - `manifest.csv`: one row per clip: clip_id, path (relative to the raw folder), shard,
     split (train | valid), offset (first sample in its shard's audio.npy), num_samples (a multiple
     of 320), num_frames (num_samples // 320, EnCodec frames), orig_sample_rate, orig_channels,
     duration_s.
   - `rejects.csv`: path, reason for every file that is not in the manifest (not audio, an
     unsupported format, empty, not decodable, truncated or corrupt, NaN or infinite samples,
     digital silence, shorter than one training crop, hidden, a broken link, ...). Every path of
     the plan is in exactly one of the two.
   - `prepare.json`: clips and seconds per split, sample rate, shards, kept and rejected counts by reason.

With the calibrated tokenizer, `merge` refuses a corpus whose train split is shorter than one
frame per code (1024 EnCodec frames, 13.7 s), saying how many minutes of audio are missing.

The split is a pure function of (split_seed, clip_id): adding, removing or reordering other
files never moves a clip between train and valid (except the guarantee that neither split
is empty, which moves the clip nearest the threshold). It does not depend on the shard size.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import soundfile as sf

from acoustic_mlm import encodec
from acoustic_mlm.config import crop_frames
from acoustic_mlm import readers
from acoustic_mlm.errors import UserError, one_line
from acoustic_mlm.data.sources import SOURCE_RECORD, find_audio, is_audio_name, not_audio_reason, walk  # noqa: F401
from acoustic_mlm.utils import (OutOfSpaceError, Progress, atomic_dir, atomic_path, file_sha256, is_out_of_space, log,
                                write_json)

MANIFEST_COLUMNS = ("clip_id", "path", "shard", "split", "offset", "num_samples", "num_frames",
                    "orig_sample_rate", "orig_channels", "duration_s")
REJECTS_COLUMNS = ("path", "reason")  # rejects.csv: audio-named files left out, and why
REQUIRED_COLUMNS = ("clip_id", "shard", "split", "offset", "num_samples", "num_frames")  # what readers need
SHARD_COLUMNS = tuple(c for c in MANIFEST_COLUMNS if c not in ("shard", "split"))  # shard-<k>/clips.csv
PLAN = "shards.csv"  # the plan: every audio-named path, its clip id, its shard, why it is skipped (if it is)
PLAN_COLUMNS = ("path", "clip_id", "shard", "skip")
_MANIFEST_DTYPES = {"clip_id": str, "path": str, "shard": np.int64, "split": str, "offset": np.int64, "num_samples": np.int64,
                    "num_frames": np.int64, "orig_sample_rate": np.int64, "orig_channels": np.int64,
                    "duration_s": np.float64}


def clip_ids(rel_paths: list[str]) -> list[str]:
    """File stems; where stems collide, the relative path without suffix (then with it)."""
    stems = [Path(r).stem for r in rel_paths]
    stem_count = Counter(stems)
    ids = [s if stem_count[s] == 1 else str(Path(r).with_suffix("").as_posix()) for s, r in zip(stems, rel_paths)]
    id_count = Counter(ids)
    return [i if id_count[i] == 1 else r for i, r in zip(ids, rel_paths)]  # a/x.wav and a/x.flac


def plan_clip_ids(rel_paths: list[str]) -> list[str]:
    """Clip ids for the files of a plan: `clip_ids` over the audio-named files, so that a file of
    another kind beside them (cover.jpg beside cover.flac) never changes them; any other file's id
    is its relative path ("./" + path if an audio-named file already holds that id)."""
    audio = [r for r in rel_paths if is_audio_name(r)]
    ids = dict(zip(audio, clip_ids(audio)))
    taken = set(ids.values())
    return [ids[r] if r in ids else (f"./{r}" if r in taken else r) for r in rel_paths]


def split_hash(split_seed: int, clip_id: str) -> float:
    """A stable uniform number in [0, 1) for (seed, clip): sha256, not Python's salted hash()."""
    digest = hashlib.sha256(f"{split_seed}\x00{clip_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_splits(ids: list[str], valid_fraction: float, split_seed: int) -> list[str]:
    """'valid' where the clip's hash < valid_fraction, else 'train'; neither split left empty."""
    if len(ids) < 2:
        raise UserError(f"prepare: {len(ids)} usable clip(s); a train and a valid split need at least 2")
    u = [split_hash(split_seed, i) for i in ids]
    split = ["valid" if x < valid_fraction else "train" for x in u]
    if "valid" not in split:  # the clip closest to the threshold from above
        split[min(range(len(ids)), key=lambda k: (u[k], ids[k]))] = "valid"
    if "train" not in split:
        split[max(range(len(ids)), key=lambda k: (u[k], ids[k]))] = "train"
    return split


class Unusable(Exception):
    """A file prepare cannot use; the message is the reason written to rejects.csv."""


def scan(raw_dir: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """(files to decode; [(relative path, reason)] for every other path under raw_dir).

    Every regular file (or link to one) is decoded by content, whatever its name, except fetch's
    SOURCE.json record and Snakemake's `.snakemake_timestamp` (written into folder outputs) at the
    top. Left out, each with its reason (sources.walk): hidden files and folders, names that are
    not UTF-8, broken links, link loops, links to folders, FIFOs, devices; and the files of the
    source that fetch did not bring (the record's `skipped` list).
    """
    raw_dir = Path(raw_dir)
    record = _fetch_record(raw_dir)
    listing = walk(raw_dir, skip_top=(SNAKEMAKE_MARKER, *((SOURCE_RECORD,) if record is not None else ())))
    skipped = [(str(s["path"]), str(s["reason"])) for s in (record or {}).get("skipped", [])]
    return [p for _, p in listing.files], sorted(listing.left_out + skipped)


SNAKEMAKE_MARKER = ".snakemake_timestamp"  # Snakemake's mark in a directory() output such as data/raw


def _fetch_record(raw_dir: Path) -> dict | None:
    """fetch's SOURCE.json at the top of raw_dir (a JSON object naming its source), or None."""
    path = raw_dir / SOURCE_RECORD
    if not path.is_file():
        return None
    record = readers.read_json(path, "fetch's record", "fetch")
    if "source" not in record:  # a JSON object of the user's own: not fetch's record
        return None
    hashes = record.get("sha256", {})
    if not (isinstance(hashes, dict) and all(isinstance(v, str) for v in hashes.values())):
        raise readers.ReadError(f"{path}: 'sha256' must map each file to its hash; rerun the fetch stage")
    return record


def check_snapshot(raw_dir: Path, rel_path: str, record: dict | None) -> None:
    """A file fetch recorded a sha256 for (a `folder` source: hard-linked, so an edit of the
    source in place reaches data/raw) still has that content; refused in one line otherwise."""
    expected = (record or {}).get("sha256", {}).get(rel_path)
    if expected is not None and file_sha256(raw_dir / rel_path) != expected:
        raise UserError(f"{raw_dir / rel_path}: changed since it was fetched (its sha256 differs from "
                        f"{raw_dir / SOURCE_RECORD}); the source folder was edited: rerun the fetch stage "
                        "(snakemake --forcerun fetch, or dvc repro -f fetch)")


def _mono_blocks(path: Path, block: int = 1 << 20) -> tuple[np.ndarray, int, int, int]:
    """Decode in blocks (memory follows what decodes, not what a header claims), mixed to mono.

    Returns (mono float32, sample rate, channels, frames the header declares).
    """
    parts = []
    with sf.SoundFile(str(path)) as f, np.errstate(invalid="ignore"):  # inf - inf: NaN, caught by the caller
        sr, channels, declared = int(f.samplerate), int(f.channels), int(f.frames)
        # f.read, not f.blocks: blocks() yields its whole buffer even when the decoder stops
        # early, so a truncated file would come back padded with uninitialised memory.
        while len(b := f.read(block, dtype="float32", always_2d=True)):
            parts.append(b.mean(axis=1, dtype=np.float32))
    mono = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return mono, sr, channels, declared


_W64_FMT = bytes.fromhex("666d7420f3acd3118cd100c04f8edb8a")  # Sony Wave64 chunk GUIDs ("fmt ", "data")
_W64_DATA = bytes.fromhex("64617461f3acd3118cd100c04f8edb8a")


def header_frames(path: Path) -> int:
    """The frames a WAV, AIFF, AU or Wave64 header declares (0: unknown or another format).

    libsndfile reports the frames a file holds, not what its header declares: a WAV whose header
    says 4 s but whose data stops at 1.24 s decodes as a clean 1.24 s clip. The header's own count
    tells the two apart, as MP3 and FLAC decoders do themselves.
    """
    import struct

    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return 0
    try:
        if head[:4] in (b"RIFF", b"RIFX") and head[8:12] == b"WAVE":
            end = "<" if head[:4] == b"RIFF" else ">"
            pos, align = 12, 0
            while pos + 8 <= len(head):
                cid, size = head[pos : pos + 4], struct.unpack_from(end + "I", head, pos + 4)[0]
                if cid == b"fmt ":
                    align = struct.unpack_from(end + "H", head, pos + 8 + 12)[0]
                elif cid == b"data":
                    return size // align if align and size not in (0, 0xFFFFFFFF) else 0
                pos += 8 + size + (size & 1)
        elif head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
            pos = 12
            while pos + 8 <= len(head):
                cid, size = head[pos : pos + 4], struct.unpack_from(">I", head, pos + 4)[0]
                if cid == b"COMM":
                    return struct.unpack_from(">I", head, pos + 10)[0]
                pos += 8 + size + (size & 1)
        elif head[:4] == b".snd":
            offset, size, _, _, channels = struct.unpack_from(">IIIII", head, 4)
            width = {1: 1, 2: 1, 3: 2, 4: 3, 5: 4, 6: 4, 7: 8, 27: 1}.get(struct.unpack_from(">I", head, 12)[0], 0)
            return size // (width * channels) if width and channels and size != 0xFFFFFFFF else 0
        elif head[:4] == b"riff" and head[24:32] == bytes.fromhex("77617665f3acd311"):
            pos, align = 40, 0
            while pos + 24 <= len(head):
                guid, size = head[pos : pos + 16], struct.unpack_from("<Q", head, pos + 16)[0]
                if guid == _W64_FMT:
                    align = struct.unpack_from("<H", head, pos + 24 + 12)[0]
                elif guid == _W64_DATA:
                    return (size - 24) // align if align and size > 24 else 0
                pos += (size + 7) // 8 * 8
    except struct.error:  # a header cut inside a chunk: libsndfile decides
        return 0
    return 0


def _resample(mono: np.ndarray, sr: int, sample_rate: int) -> np.ndarray:
    """torchaudio's windowed-sinc resampler.

    Its kernel grows with the reduced ratio (sr / gcd by target / gcd): 44101 -> 24000 Hz takes
    minutes and gigabytes. Such odd rates are resampled as if they were the nearest multiple of
    50 Hz, a pitch and tempo error of at most 25 Hz / sr (0.06% at 44.1 kHz).
    """
    if sr == sample_rate:
        return mono
    import torch
    import torchaudio.functional as AF

    g = math.gcd(sr, sample_rate)
    if (sr // g) * (sample_rate // g) > _MAX_RESAMPLE_RATIO_PRODUCT:
        sr = max(50, round(sr / 50) * 50)
    return AF.resample(torch.from_numpy(np.ascontiguousarray(mono)), sr, sample_rate).numpy()


_MAX_RESAMPLE_RATIO_PRODUCT = 4_000_000  # 5507 x 3000 (44056 Hz) resamples in ~1 s; 44101 x 24000 takes 2 min
TRUNCATION_TOLERANCE = 0.05  # reject when more than this share of the frames a header declares fails to decode
SILENCE_PEAK = 2.0**-15  # a peak at or below one 16-bit step is digital silence
# Integer formats decode to [-1, 1]; float formats may carry headroom above full scale, but a peak
# 60 dB over it is no recording at any sane gain: +-3e38 passed the finite check and made k-means
# and training non-finite. Such files are rejected, never rescaled (their content is unknown).
MAX_ABS_SAMPLE = 1000.0
# Plausible sample rates: 4 kHz (below telephone speech) to 384 kHz (the highest studio rate). A
# header declaring 1 Hz would otherwise be resampled into a clip 24,000 times longer.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 4_000, 384_000


def decode(path: Path, sample_rate: int, min_samples: int) -> tuple[np.ndarray, int, int]:
    """One file -> (mono float32 at sample_rate in whole EnCodec frames, orig rate, orig channels).

    Raises Unusable(reason) for: an empty file, one soundfile cannot open or decode (not audio,
    corrupt, truncated FLAC), a sample rate outside MIN_SAMPLE_RATE..MAX_SAMPLE_RATE, a truncated
    or corrupt MP3 (decodes to fewer frames than its header declares), NaN or infinite samples,
    a peak beyond MAX_ABS_SAMPLE, digital silence, or fewer than `min_samples` samples (one
    training crop) once resampled and trimmed to whole frames.
    """
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise Unusable(f"cannot read: {one_line(exc)}") from None
    if size == 0:
        raise Unusable("empty file (0 bytes)")
    try:
        mono, sr, channels, declared = _mono_blocks(path)
    except Exception as exc:  # libsndfile: not audio, malformed, lost sync, ...
        raise Unusable(f"not decodable: {_libsndfile_reason(exc)}") from None
    if not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
        raise Unusable(f"implausible sample rate: {sr} Hz, outside {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz "
                       "(a damaged header or not audio)")
    declared = max(declared, header_frames(path))  # WAV, AIFF, AU: libsndfile reports what is there
    if declared > 0 and len(mono) < (1 - TRUNCATION_TOLERANCE) * declared:
        raise Unusable(f"truncated or corrupt: decoded {len(mono)} of the {declared} frames its header declares")
    if len(mono) == 0:
        raise Unusable("no audio samples")
    if not np.isfinite(mono).all():
        raise Unusable("non-finite samples (NaN or infinity)")
    peak = float(np.abs(mono).max())
    if peak > MAX_ABS_SAMPLE:
        raise Unusable(f"samples out of range: peak {peak:.3g}, beyond +-{MAX_ABS_SAMPLE:g} "
                       f"({20 * math.log10(MAX_ABS_SAMPLE):.0f} dB over full scale)")
    if peak <= SILENCE_PEAK:
        raise Unusable(f"digital silence (peak {peak:.2g})")
    audio = _resample(mono, sr, sample_rate)
    n = len(audio) // encodec.HOP * encodec.HOP  # whole EnCodec frames only
    if n < min_samples:
        raise Unusable(f"shorter than one training crop ({len(audio) / sample_rate:.3f} s < {min_samples / sample_rate:.3f} s)")
    return np.ascontiguousarray(audio[:n], dtype=np.float32), sr, channels




def _libsndfile_reason(exc: BaseException) -> str:
    """libsndfile's message without the absolute path, and without its misleading MP3 wording."""
    msg = re.sub(r"^Error opening .*?: ", "", one_line(exc)).removeprefix("Error : ")
    if msg.startswith("File does not exist or is not a regular file"):  # what it says of an unrecognised .mp3
        return "format not recognised"
    msg = msg.rstrip(".")
    return msg[:1].lower() + msg[1:]


def reason_kind(reason: str) -> str:
    """'digital silence (peak 0)' -> 'digital silence': the part of a reason that names its kind."""
    return reason.split(":")[0].split(" (")[0]


class NpyWriter:
    """A 1-D float32 .npy file written clip by clip, so the corpus never sits in memory.

    numpy pads a 1-D header with room for any length (GROWTH_AXIS_MAX_DIGITS), so the header is
    written for length 0 first and rewritten in place with the final length: the file is then
    byte for byte what np.save would write.
    """

    def __init__(self, path: Path):
        self.path, self.n = Path(path), 0
        self.f = open(self.path, "wb")
        self.header_bytes = self._header()

    def _header(self) -> int:
        self.f.seek(0)
        np.lib.format.write_array_header_1_0(self.f, {"descr": "<f4", "fortran_order": False, "shape": (self.n,)})
        return self.f.tell()

    def append(self, x: np.ndarray) -> int:
        """Write x; return its offset (in samples)."""
        offset = self.n
        try:
            np.ascontiguousarray(x, dtype="<f4").tofile(self.f)
        except OSError as exc:  # a full disk or the file-size limit: one line with the bytes it needs
            if not is_out_of_space(exc):
                raise
            raise OutOfSpaceError(self.path, os.fstat(self.f.fileno()).st_size,
                                  self.header_bytes + 4 * (self.n + len(x))) from None
        self.n += len(x)
        return offset

    def close(self) -> None:
        """Write the final length into the header."""
        with self.f:
            if self._header() != self.header_bytes:  # cannot happen with numpy's padded headers
                raise RuntimeError(f"{self.path}: the .npy header changed length")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            self.f.close()


def shard_name(shard: int) -> str:
    """The folder of shard k: shard-00000, shard-00001, ..."""
    return f"shard-{int(shard):05d}"


def _min_samples(cfg: dict) -> int:
    return max(1, crop_frames(cfg)) * encodec.HOP


def plan(cfg: dict, raw_dir: Path, out_dir: Path) -> pd.DataFrame:
    """Write out_dir/shards.csv: every audio-named path under raw_dir with its clip id and shard.

    Paths are sorted and cut into shards of `data.shard_files` paths. Clip ids are decided here,
    over the whole corpus, so that they are unique across shards. Paths `scan` leaves out
    (hidden, not regular files) carry their reason in `skip` and go straight to the rejects.
    """
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise UserError(f"prepare: {raw_dir} is not a folder; run fetch first")
    files, left_out = scan(raw_dir)
    if not files and not left_out:
        raise UserError(f"prepare: no files under {raw_dir}")
    rel = [p.relative_to(raw_dir).as_posix() for p in files]
    rows = [(r, i, "") for r, i in zip(rel, plan_clip_ids(rel))] + [(r, "", why) for r, why in left_out]
    frame = pd.DataFrame(sorted(rows), columns=["path", "clip_id", "skip"])
    frame.insert(2, "shard", np.arange(len(frame)) // int(cfg["data"]["shard_files"]))
    frame = frame[list(PLAN_COLUMNS)]
    with atomic_path(Path(out_dir) / PLAN) as tmp:
        frame.to_csv(tmp, index=False)
    log.info("prepare: %d files (%d to decode) in %d shard(s) of up to %d files", len(frame), len(files),
             frame["shard"].nunique(), cfg["data"]["shard_files"])
    return frame


def read_plan(out_dir: Path) -> pd.DataFrame:
    path = Path(out_dir) / PLAN
    if not path.is_file():
        raise UserError(f"{path}: not found (run `amlm prepare --plan` first)")
    frame = readers.read_csv_table(path, "the shard plan", "prepare --plan", PLAN_COLUMNS, ints=["shard"],
                                   empty_ok=True)
    if (frame["shard"] < 0).any():
        raise UserError(f"{path}: a negative shard; rerun the prepare --plan stage")
    return frame


def prepare_shard(cfg: dict, raw_dir: Path, out_dir: Path, shard: int) -> dict:
    """Decode the files of one shard of out_dir/shards.csv into out_dir/shard-<k>/ (atomically).

    shard-<k>/: audio.npy (the shard's clips concatenated), clips.csv (the manifest's columns
    without split and shard), rejects.csv (path, reason), shard.json (counts). Memory is bounded
    by the largest file: clips are decoded one at a time and appended to audio.npy. A shard whose
    files are all unusable is complete (its clips.csv is empty): only the whole corpus must hold audio.
    """
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    sample_rate, min_samples = int(cfg["data"]["sample_rate"]), _min_samples(cfg)
    todo = read_plan(out_dir)
    todo = todo[todo["shard"] == int(shard)]
    if todo.empty:
        raise UserError(f"{out_dir / PLAN}: no shard {shard} (the plan has shards 0-{read_plan(out_dir)['shard'].max()})")
    rows, rejects = [], []
    record = _fetch_record(raw_dir)
    for rel_path, skip in zip(todo["path"], todo["skip"]):  # before writing anything
        if not skip and (raw_dir / rel_path).is_file():
            check_snapshot(raw_dir, rel_path, record)
    with atomic_dir(out_dir / shard_name(shard)) as tmp:
        with NpyWriter(tmp / "audio.npy") as writer, \
                Progress(len(todo), f"prepare {shard_name(shard)}", unit="file") as bar:
            for rel_path, clip_id, skip in zip(todo["path"], todo["clip_id"], todo["skip"]):
                try:
                    if skip:
                        raise Unusable(skip)
                    audio, orig_sr, orig_ch = decode(raw_dir / rel_path, sample_rate, min_samples)
                except Unusable as why:
                    reason = str(why)
                    if not skip and not is_audio_name(rel_path) and reason.startswith("not decodable"):
                        reason = not_audio_reason(rel_path)  # name the format: a .m4a, a .jpg
                    log.warning("prepare: rejected %s: %s", rel_path, reason)
                    rejects.append((rel_path, reason))
                else:
                    n = len(audio)
                    rows.append(dict(clip_id=clip_id, path=rel_path, offset=writer.append(audio), num_samples=n,
                                     num_frames=n // encodec.HOP, orig_sample_rate=orig_sr, orig_channels=orig_ch,
                                     duration_s=n / sample_rate))
                bar.update(1, kept=len(rows), rejected=len(rejects))
        pd.DataFrame(rows, columns=list(SHARD_COLUMNS)).to_csv(tmp / "clips.csv", index=False)
        pd.DataFrame(rejects, columns=list(REJECTS_COLUMNS)).to_csv(tmp / "rejects.csv", index=False)
        summary = {"shard": int(shard), "files": len(todo), "kept": len(rows), "rejected": len(rejects),
                   "samples": int(sum(r["num_samples"] for r in rows))}
        write_json(tmp / "shard.json", summary)
    log.info("prepare %s: kept %d files, rejected %d", shard_name(shard), len(rows), len(rejects))
    return summary


def merge(cfg: dict, out_dir: Path) -> pd.DataFrame:
    """Join the shards of out_dir into the corpus: manifest.csv, rejects.csv, prepare.json.

    The train/valid split is decided here, over every usable clip of every shard. Every path of
    the plan must be in exactly one shard's clips or rejects. Fails with one line when no file
    of the corpus is usable.
    """
    out_dir = Path(out_dir)
    sample_rate, min_samples = int(cfg["data"]["sample_rate"]), _min_samples(cfg)
    todo = read_plan(out_dir)
    kept, rejected = [], []
    for shard in sorted(todo["shard"].unique()):
        folder = out_dir / shard_name(shard)
        for name in ("clips.csv", "rejects.csv", "audio.npy"):
            if not (folder / name).is_file():
                raise UserError(f"{folder / name}: not found (run `amlm prepare --shard {shard}` first)")
        rerun = f"prepare --shard {shard}"
        clips = readers.read_csv_table(folder / "clips.csv", "a shard's clips", rerun, SHARD_COLUMNS, empty_ok=True,
                                       ints=[c for c in SHARD_COLUMNS if _MANIFEST_DTYPES[c] is np.int64],
                                       numbers=["duration_s"])
        clips.insert(2, "shard", int(shard))
        kept.append(clips)
        rejected.append(readers.read_csv_table(folder / "rejects.csv", "a shard's rejects", rerun, REJECTS_COLUMNS,
                                               empty_ok=True))
    manifest = pd.concat(kept, ignore_index=True)
    rejects = pd.concat(rejected, ignore_index=True).sort_values("path", kind="stable")
    accounted = sorted(manifest["path"].tolist() + rejects["path"].tolist())
    if accounted != sorted(todo["path"].tolist()):
        lost = sorted(set(todo["path"]) ^ set(accounted))
        raise UserError(f"{out_dir}: the shards do not match {PLAN} (e.g. {lost[0] if lost else 'a duplicate'}); "
                         "rerun prepare")
    by_kind = dict(sorted(Counter(reason_kind(r) for r in rejects["reason"]).items()))
    kinds = ", ".join(f"{v} {k}" for k, v in by_kind.items())
    log.info("prepare: kept %d files, rejected %d%s", len(manifest), len(rejects),
             f" ({kinds}); see rejects.csv" if len(rejects) else "")
    if manifest.empty:
        raise UserError(f"prepare: no usable audio: all {len(rejects)} files rejected ({kinds})")
    manifest["split"] = assign_splits(manifest["clip_id"].tolist(), cfg["data"]["valid_fraction"],
                                      cfg["data"]["split_seed"])
    check_calibration_data(cfg, manifest)
    manifest = manifest[list(MANIFEST_COLUMNS)]
    with atomic_path(out_dir / "rejects.csv") as tmp:
        rejects.to_csv(tmp, index=False)
    by_split = manifest.groupby("split")
    total = int(manifest["num_samples"].sum())
    write_json(out_dir / "prepare.json", {
        "sample_rate": sample_rate,
        "hop": encodec.HOP,
        "shards": int(todo["shard"].nunique()),
        "shard_files": int(cfg["data"]["shard_files"]),
        "clips": {s: int(by_split.size().get(s, 0)) for s in ("train", "valid")},
        "seconds": {s: round(float(by_split["duration_s"].sum().get(s, 0.0)), 3) for s in ("train", "valid")},
        "total_samples": total,
        "valid_fraction": cfg["data"]["valid_fraction"],
        "split_seed": cfg["data"]["split_seed"],
        "min_seconds": min_samples / sample_rate,
        "kept": len(manifest),
        "rejected": len(rejects),
        "rejected_by_reason": by_kind,
    })
    with atomic_path(out_dir / "manifest.csv") as tmp:  # last: the manifest marks the corpus complete
        manifest.to_csv(tmp, index=False)
    log.info("prepare: %d clips (%d train, %d valid), %.1f s at %d Hz in %d shard(s)", len(manifest),
             (manifest["split"] == "train").sum(), (manifest["split"] == "valid").sum(),
             total / sample_rate, sample_rate, todo["shard"].nunique())
    return manifest


def check_calibration_data(cfg: dict, manifest: pd.DataFrame, where: str = "prepare") -> None:
    """Refuse, before tokenize, a corpus whose train split cannot fit the calibrated tokenizer.

    k-means needs at least one frame per code (1024 per level); `tokenizer.calibration_frames`
    (a multiple of 1024) is what the fit uses when the train split has it, else all of it (the
    fit warns). Below the minimum: a UserError saying how many minutes of audio are needed.
    Prepare's merge calls it; so does the tokenizer's fit (`where`), for a corpus prepared while
    tokenizer.mode was pretrained (prepare does not rerun when only the mode changes).
    """
    tc = cfg.get("tokenizer") or {}
    if tc.get("mode") != "calibrated":
        return
    CODEBOOK_SIZE, FRAME_RATE = encodec.CODEBOOK_SIZE, encodec.FRAME_RATE  # noqa: N806
    have = int(manifest.loc[manifest["split"] == "train", "num_frames"].sum())
    if have < CODEBOOK_SIZE:
        share = 1 - float(cfg["data"]["valid_fraction"])
        raise UserError(
            f"{where}: the train split holds {have} EnCodec frames ({have / FRAME_RATE / 60:.2f} min); the calibrated "
            f"tokenizer needs at least {CODEBOOK_SIZE} ({CODEBOOK_SIZE / FRAME_RATE / 60:.2f} min of train audio, about "
            f"{CODEBOOK_SIZE / FRAME_RATE / 60 / share:.2f} min in all with data.valid_fraction "
            f"{cfg['data']['valid_fraction']}): add at least {(CODEBOOK_SIZE - have) / FRAME_RATE / 60 / share:.2f} min "
            "of audio, or set tokenizer.mode: pretrained")


def run(cfg: dict, raw_dir: Path, out_dir: Path) -> None:
    """The whole stage in one process: plan, every shard in turn, merge; out_dir appears complete or not at all.

    Snakemake runs the same three steps as separate jobs (one per shard), DVC runs this.
    """
    with atomic_dir(out_dir) as tmp:
        todo = plan(cfg, raw_dir, tmp)
        for shard in sorted(todo["shard"].unique()):
            prepare_shard(cfg, raw_dir, tmp, shard)
        merge(cfg, tmp)


class Corpus:
    """The prepared corpus: the manifest (one row per clip) and each shard's audio, memory-mapped on demand.

    Clip i is `audio(shard_i)[offset_i : offset_i + num_samples_i]`. Pickles without its memory
    maps (data-loader workers reopen them).
    """

    def __init__(self, root: Path, manifest: pd.DataFrame):
        self.root, self.manifest = Path(root), manifest
        self._audio: dict[int, np.ndarray] = {}

    @property
    def shards(self) -> list[int]:
        return sorted(int(s) for s in self.manifest["shard"].unique())

    def audio_path(self, shard: int) -> Path:
        return self.root / shard_name(shard) / "audio.npy"

    def audio(self, shard: int) -> np.ndarray:
        if shard not in self._audio:
            self._audio[shard] = _open_audio(self.audio_path(shard))
        return self._audio[shard]

    def clip(self, i: int) -> np.ndarray:
        row = self.manifest.iloc[i]
        o = int(row["offset"])
        return self.audio(int(row["shard"]))[o : o + int(row["num_samples"])]

    def __getstate__(self):
        return {"root": self.root, "manifest": self.manifest, "_audio": {}}


def _open_audio(path: Path) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{path}: not found (run the prepare stage first)")
    try:
        audio = np.load(path, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise UserError(f"{path}: not a readable .npy array ({exc})") from None
    if audio.ndim != 1 or audio.dtype != np.float32:
        raise UserError(f"{path}: expected a 1-D float32 array, got {audio.dtype} {audio.shape}")
    return audio


def load_prepared(prepared_dir: Path) -> Corpus:
    """The prepared corpus (manifest with typed columns, shards' audio memory-mapped read-only),
    checked against each other; every problem is one line naming the file (and the clip).

    Tokenization and training both read the corpus through here.
    """
    prepared_dir = Path(prepared_dir)
    manifest_path = prepared_dir / "manifest.csv"
    if not manifest_path.is_file():
        raise UserError(f"{manifest_path}: not found (run the prepare stage first)")
    # every field of every row, whole numbers where they must be; a clip called "NA" stays a string
    ints = [c for c, kind in _MANIFEST_DTYPES.items() if kind is np.int64]
    manifest = readers.read_csv_table(manifest_path, "the manifest", "prepare", REQUIRED_COLUMNS, ints=ints,
                                      numbers=["duration_s"], empty_ok=True)
    if manifest.empty:
        raise UserError(f"{manifest_path}: no clips")
    bad_split = sorted(set(manifest["split"].astype(str)) - {"train", "valid"})
    if bad_split:
        raise UserError(f"{manifest_path}: split must be train or valid, found {bad_split[0]!r}")
    corpus = Corpus(prepared_dir, manifest)
    sh, o, s, nf = (manifest[c].to_numpy(np.int64) for c in ("shard", "offset", "num_samples", "num_frames"))
    length = {k: len(corpus.audio(k)) for k in corpus.shards}  # also checks every shard's audio.npy
    checks = [
        ((s <= 0) | (s % encodec.HOP != 0), f"num_samples is not a positive multiple of {encodec.HOP}"),
        (nf != s // encodec.HOP, f"num_frames != num_samples // {encodec.HOP}"),
        ((o < 0) | (o % encodec.HOP != 0), f"offset is not a non-negative multiple of {encodec.HOP}"),
        (o + s > np.array([length[k] for k in sh]), "offset + num_samples exceeds its shard's audio.npy "
                                                    "(the manifest does not match the audio; rerun prepare)"),
    ]
    for bad, what in checks:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise UserError(f"{manifest_path}: clip {manifest['clip_id'].iloc[i]!r} (row {i + 2}): {what}")
    order = np.lexsort((o, sh))
    overlap = (sh[order][1:] == sh[order][:-1]) & (o[order][1:] < (o + s)[order][:-1])
    if overlap.any():
        i = int(order[1:][overlap][0])
        raise UserError(f"{manifest_path}: clip {manifest['clip_id'].iloc[i]!r} (row {i + 2}) overlaps another clip")
    return corpus
