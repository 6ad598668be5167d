"""Prepare stage: raw audio files -> 24 kHz mono shards (float32 or int16), a manifest and a split.

Three steps, so that a cluster can decode shards in parallel (Snakemake: one job per shard;
`run` does all three in one process for DVC and by hand):

1. `plan`: `shards.csv` lists every path under the raw folder (sorted) with its clip id (unique
   over the corpus) and its shard: consecutive runs of `data.shard_files` paths. Files are decoded
   by content, whatever their name; paths that cannot be (hidden, links that lead nowhere, FIFOs,
   devices, names that are not UTF-8) and the files fetch did not bring (SOURCE.json's `skipped`)
   carry their reason in `skip`.
2. `prepare_shard`: one shard's files decoded, mixed to mono, resampled, trimmed to whole
   EnCodec frames (acoustic_mlm.data.decode), into `shard-<k>/`: `audio.npy` (ONE 1-D array of
   `data.sample_format`, float32 or int16 PCM, the shard's clips concatenated; memory-map it),
   `clips.csv` (the manifest's columns but shard and split), `rejects.csv`, `shard.json`. Memory
   is bounded by the largest file: clips are decoded one at a time and appended to audio.npy.
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

The files' names and columns, their writers and the later stages' reader (`load_prepared`) are
acoustic_mlm.artifacts.prepared's.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.artifacts.checked import ReadError, read_json
from acoustic_mlm.artifacts.prepared import (
    AUDIO,
    MANIFEST_COLUMNS,
    PLAN,
    PLAN_COLUMNS,
    SHARD_RECORD,
    AudioWriter,
    read_plan,
    read_shard_tables,
    shard_name,
    shard_problem,
    write_manifest,
    write_plan,
    write_record,
    write_rejects,
    write_shard_record,
    write_shard_tables,
)
from acoustic_mlm.data.corpus import check_calibration_data
from acoustic_mlm.data.decode import Unusable, decode
from acoustic_mlm.data.sources import SOURCE_RECORD, is_audio_name, not_audio_reason, walk
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import (
    Progress,
    atomic_dir,
    file_sha256,
    log,
    recover_replaced,
    resumable_dir,
)


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
    record = read_json(path, "fetch's record", "fetch")
    if "source" not in record:  # a JSON object of the user's own: not fetch's record
        return None
    hashes = record.get("sha256", {})
    if not (isinstance(hashes, dict) and all(isinstance(v, str) for v in hashes.values())):
        raise ReadError(f"{path}: 'sha256' must map each file to its hash; rerun the fetch stage")
    return record


def check_snapshot(raw_dir: Path, rel_path: str, record: dict | None) -> None:
    """A file fetch recorded a sha256 for (a `folder` source: hard-linked, so an edit of the
    source in place reaches data/raw) still has that content; refused in one line otherwise."""
    expected = (record or {}).get("sha256", {}).get(rel_path)
    if expected is not None and file_sha256(raw_dir / rel_path) != expected:
        raise UserError(
            f"{raw_dir / rel_path}: changed since it was fetched (its sha256 differs from "
            f"{raw_dir / SOURCE_RECORD}); the source folder was edited: rerun the fetch stage "
            "(snakemake --forcerun fetch, or dvc repro -f fetch)"
        )


def reason_kind(reason: str) -> str:
    """'digital silence (peak 0)' -> 'digital silence': the part of a reason that names its kind."""
    return reason.split(":")[0].split(" (")[0]


def _min_samples(cfg: C.Config) -> int:
    return max(1, cfg.crop_frames) * encodec.HOP


def plan(cfg: C.Config, raw_dir: Path, out_dir: Path) -> pd.DataFrame:
    """Write out_dir/shards.csv: every audio-named path under raw_dir with its clip id and shard.

    Paths are sorted and cut into shards of `data.shard_files` paths. Clip ids are decided here,
    over the whole corpus, so that they are unique across shards. Paths `scan` leaves out
    (hidden, not regular files) carry their reason in `skip` and go straight to the rejects.
    """
    raw_dir = Path(raw_dir)
    recover_replaced(raw_dir)  # a fetch killed while it replaced the folder: the previous one back, said in the log
    if not raw_dir.is_dir():
        raise UserError(f"prepare: {raw_dir} is not a folder; run fetch first")
    files, left_out = scan(raw_dir)
    if not files and not left_out:
        raise UserError(f"prepare: no files under {raw_dir}")
    rel = [p.relative_to(raw_dir).as_posix() for p in files]
    rows = [(r, i, "") for r, i in zip(rel, plan_clip_ids(rel))] + [(r, "", why) for r, why in left_out]
    frame = pd.DataFrame(sorted(rows), columns=["path", "clip_id", "skip"])
    frame.insert(2, "shard", np.arange(len(frame)) // int(cfg.data.shard_files))
    frame = frame[list(PLAN_COLUMNS)]
    write_plan(out_dir, frame)
    log.info(
        "prepare: %d files (%d to decode) in %d shard(s) of up to %d files",
        len(frame),
        len(files),
        frame["shard"].nunique(),
        cfg.data.shard_files,
    )
    return frame


def prepare_shard(cfg: C.Config, raw_dir: Path, out_dir: Path, shard: int) -> dict:
    """Decode the files of one shard of out_dir/shards.csv into out_dir/shard-<k>/ (atomically).

    shard-<k>/: audio.npy (the shard's clips concatenated), clips.csv (the manifest's columns
    without split and shard), rejects.csv (path, reason), shard.json (counts). Memory is bounded
    by the largest file: clips are decoded one at a time and appended to audio.npy. A shard whose
    files are all unusable is complete (its clips.csv is empty): only the whole corpus must hold audio.
    """
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    recover_replaced(raw_dir)
    sample_rate, min_samples = int(cfg.data.sample_rate), _min_samples(cfg)
    todo = read_plan(out_dir)
    todo = todo[todo["shard"] == int(shard)]
    if todo.empty:
        raise UserError(
            f"{out_dir / PLAN}: no shard {shard} (the plan has shards 0-{read_plan(out_dir)['shard'].max()})"
        )
    rows, rejects = [], []
    record = _fetch_record(raw_dir)
    for rel_path, skip in zip(todo["path"], todo["skip"]):  # before writing anything
        if not skip and (raw_dir / rel_path).is_file():
            check_snapshot(raw_dir, rel_path, record)
    with atomic_dir(out_dir / shard_name(shard)) as tmp:
        with (
            AudioWriter(tmp / AUDIO, cfg.data.sample_format) as writer,
            Progress(len(todo), f"prepare {shard_name(shard)}", unit="file") as bar,
        ):
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
                    rows.append(
                        dict(
                            clip_id=clip_id,
                            path=rel_path,
                            offset=writer.append(audio),
                            num_samples=n,
                            num_frames=n // encodec.HOP,
                            orig_sample_rate=orig_sr,
                            orig_channels=orig_ch,
                            duration_s=n / sample_rate,
                            gain=writer.last_gain,  # below 1 only for an int16 clip that peaks above full scale
                        )
                    )
                bar.update(1, kept=len(rows), rejected=len(rejects))
        write_shard_tables(tmp, rows, rejects)
        summary = {
            "shard": int(shard),
            "files": len(todo),
            "kept": len(rows),
            "rejected": len(rejects),
            "samples": int(sum(r["num_samples"] for r in rows)),
        }
        write_shard_record(tmp, summary)
    log.info("prepare %s: kept %d files, rejected %d", shard_name(shard), len(rows), len(rejects))
    return summary


def merge(cfg: C.Config, out_dir: Path) -> pd.DataFrame:
    """Join the shards of out_dir into the corpus: manifest.csv, rejects.csv, prepare.json.

    The train/valid split is decided here, over every usable clip of every shard. Every path of
    the plan must be in exactly one shard's clips or rejects. Fails with one line when no file
    of the corpus is usable.
    """
    out_dir = Path(out_dir)
    sample_rate, min_samples = int(cfg.data.sample_rate), _min_samples(cfg)
    todo = read_plan(out_dir)
    kept, rejected = [], []
    for shard in sorted(todo["shard"].unique()):
        clips, shard_rejects = read_shard_tables(out_dir / shard_name(shard), shard)
        clips.insert(2, "shard", int(shard))
        kept.append(clips)
        rejected.append(shard_rejects)
    manifest = pd.concat(kept, ignore_index=True)
    rejects = pd.concat(rejected, ignore_index=True).sort_values("path", kind="stable")
    accounted = sorted(manifest["path"].tolist() + rejects["path"].tolist())
    if accounted != sorted(todo["path"].tolist()):
        lost = sorted(set(todo["path"]) ^ set(accounted))
        raise UserError(
            f"{out_dir}: the shards do not match {PLAN} (e.g. {lost[0] if lost else 'a duplicate'}); rerun prepare"
        )
    by_kind = dict(sorted(Counter(reason_kind(r) for r in rejects["reason"]).items()))
    kinds = ", ".join(f"{v} {k}" for k, v in by_kind.items())
    log.info(
        "prepare: kept %d files, rejected %d%s",
        len(manifest),
        len(rejects),
        f" ({kinds}); see rejects.csv" if len(rejects) else "",
    )
    if manifest.empty:
        raise UserError(f"prepare: no usable audio: all {len(rejects)} files rejected ({kinds})")
    manifest["split"] = assign_splits(manifest["clip_id"].tolist(), cfg.data.valid_fraction, cfg.data.split_seed)
    check_calibration_data(cfg, manifest)
    manifest = manifest[list(MANIFEST_COLUMNS)]
    write_rejects(out_dir, rejects)
    by_split = manifest.groupby("split")
    total = int(manifest["num_samples"].sum())
    write_record(
        out_dir,
        {
            "sample_rate": sample_rate,
            "hop": encodec.HOP,
            "shards": int(todo["shard"].nunique()),
            "shard_files": int(cfg.data.shard_files),
            "clips": {s: int(by_split.size().get(s, 0)) for s in ("train", "valid")},
            "seconds": {s: round(float(by_split["duration_s"].sum().get(s, 0.0)), 3) for s in ("train", "valid")},
            "total_samples": total,
            "valid_fraction": cfg.data.valid_fraction,
            "split_seed": cfg.data.split_seed,
            "min_seconds": min_samples / sample_rate,
            "kept": len(manifest),
            "rejected": len(rejects),
            "rejected_by_reason": by_kind,
        },
    )
    write_manifest(out_dir, manifest)  # last: the manifest marks the corpus complete
    log.info(
        "prepare: %d clips (%d train, %d valid), %.1f s at %d Hz in %d shard(s)",
        len(manifest),
        (manifest["split"] == "train").sum(),
        (manifest["split"] == "valid").sum(),
        total / sample_rate,
        sample_rate,
        todo["shard"].nunique(),
    )
    return manifest


def run(cfg: C.Config, raw_dir: Path, out_dir: Path) -> None:
    """The whole stage in one process: plan, every shard in turn, merge; out_dir appears complete or not at all.

    Snakemake runs the same three steps as separate jobs (one per shard), DVC runs this. `cfg`: a
    `Config` (`config.load`), as for `plan`, `prepare_shard` and `merge`.
    Memory is one file's audio at a time. A run killed mid-corpus (SIGKILL, the OOM killer, a lost node)
    leaves its temporary folder; the next run takes the shards it had finished (each written whole) when
    its plan, settings and fetch record are the same, and prepares only the others.
    """
    raw_dir = Path(raw_dir)
    with resumable_dir(out_dir, "prepare") as parts:
        todo = plan(cfg, raw_dir, parts.tmp)
        parts.match(_resume_key(cfg, raw_dir, parts.tmp / PLAN))  # shards.csv included: same plan, same shards
        for shard in sorted(todo["shard"].unique()):
            if not parts.take(shard_name(shard), SHARD_RECORD, check=shard_problem):
                prepare_shard(cfg, raw_dir, parts.tmp, shard)
        parts.done()
        merge(cfg, parts.tmp)


def _resume_key(cfg: C.Config, raw_dir: Path, plan_path: Path) -> dict:
    """What a shard's content depends on: the plan (shards.csv), the settings of the steps up to it and
    fetch's record of the raw folder (the files' sha256 for a folder source)."""
    record = raw_dir / SOURCE_RECORD
    return {
        "raw_dir": str(raw_dir.resolve()),
        "fetch_record_sha256": file_sha256(record) if record.is_file() else None,
        "settings": C.settings(cfg, C.result_keys("prepare_shard", cfg, upstream=True)),
        "plan_sha256": file_sha256(plan_path),
    }
