"""Prepare stage: raw audio files -> 24 kHz mono shards (float32 or int16), a manifest and a split.

Three steps, so that a cluster can decode shards in parallel (Snakemake: one job per shard;
`run` does all three in one process for DVC and by hand):

1. `plan`: `shards.csv` lists every path under the raw folder (sorted) with its clip id (unique
   over the corpus) and its shard: consecutive runs of `data.shard_files` paths. Files are decoded
   by content, whatever their name; paths that cannot be (hidden, links that lead nowhere, FIFOs,
   devices, names that are not UTF-8) and the files fetch did not bring (SOURCE.json's `skipped`)
   carry their reason in `skip`. Where fetch's record says so (`read_in_place`: FMA's zips), the
   paths are also the audio members of the archive it names, which `prepare_shard` reads straight
   from the zip (archive.ZipMembers: every member checked first) into memory and decodes: nothing
   is extracted, so the disk holds the archive and the prepared audio, never a third copy.
   Before it writes the plan, `plan` refuses in one line a corpus whose prepared audio (seconds x
   data.sample_rate x the bytes of data.sample_format) does not fit the free space where it goes
   (`check_space`).
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

With `data.remove_archive`, an archive read in place is removed once the corpus is complete (`run`: after
the prepared folder is in place; the merge step: after manifest.csv, written last) and every member is in
the manifest or the rejects (`remove_archive`); a record beside it lets fetch write the raw folder again
without downloading it.

The split is a pure function of (split_seed, clip_id): adding, removing or reordering other
files never moves a clip between train and valid (except the guarantee that neither split
is empty, which moves the clip nearest the threshold). It does not depend on the shard size.
The tone corpus (`data.source: tones`) is split as it is defined instead: its last clip is held out
(acoustic_mlm.data.tones.splits; data.valid_fraction and data.split_seed are not read).

The files' names and columns, their writers and the later stages' reader (`load_prepared`) are
acoustic_mlm.artifacts.prepared's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import soundfile as sf

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.artifacts.checked import ReadError, read_csv_table, read_json
from acoustic_mlm.artifacts.prepared import (
    AUDIO,
    MANIFEST,
    MANIFEST_COLUMNS,
    PLAN,
    PLAN_COLUMNS,
    REJECTS,
    REJECTS_COLUMNS,
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
from acoustic_mlm.data import archive, tones
from acoustic_mlm.data.corpus import check_calibration_data
from acoustic_mlm.data.decode import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, Unusable, decode
from acoustic_mlm.data.sources import (
    GB,
    KNOWN_CORPORA,
    SAMPLE_BYTES,
    SOURCE_RECORD,
    check_room,
    gb_text,
    is_audio_name,
    not_audio_reason,
    removed_marker,
    walk,
)
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import (
    Progress,
    atomic_dir,
    file_sha256,
    glob_escape,
    log,
    recover_replaced,
    resumable_dir,
    write_json,
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
    source that fetch did not bring (the record's `skipped` list). The audio members of an archive
    read in place (`in_archive`) are files to decode too, at raw_dir / their path (not on disk).
    """
    raw_dir = Path(raw_dir)
    record = _fetch_record(raw_dir)
    listing = walk(raw_dir, skip_top=(SNAKEMAKE_MARKER, *((SOURCE_RECORD,) if record is not None else ())))
    skipped = [(str(s["path"]), str(s["reason"])) for s in (record or {}).get("skipped", [])]
    files = dict(listing.files)
    place = in_archive(raw_dir, record)
    for member in place[1] if place is not None else ():
        files.setdefault(member, raw_dir / member)
    return [files[r] for r in sorted(files)], sorted(listing.left_out + skipped)


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


def in_archive(raw_dir: Path, record: dict | None) -> tuple[Path, list[str]] | None:
    """(the archive, its audio members) where fetch's record says prepare reads them from a zip in place
    (`read_in_place`: FMA's), the archive found from the raw folder by the record's `archive_path`; else None."""
    if not record or record.get("read_in_place") is not True:
        return None
    rel, members = record.get("archive_path"), record.get("members")
    if not (isinstance(rel, str) and isinstance(members, list) and all(isinstance(m, str) for m in members)):
        raise ReadError(
            f"{Path(raw_dir) / SOURCE_RECORD}: 'archive_path' and 'members' must name the archive and its audio "
            "members; rerun the fetch stage"
        )
    return Path(os.path.normpath(Path(raw_dir).resolve() / rel)), members


def _archive_problem(raw_dir: Path, record: dict) -> str | None:
    """Why the archive fetch's record reads in place cannot be read (gone, removed once prepared, another
    size than fetch checked), or None."""
    path = in_archive(raw_dir, record)[0]
    if not path.is_file():
        marker = removed_marker(path)
        if marker.is_file():
            return (
                f"{path}: removed once an earlier prepare had prepared every member (data.remove_archive; "
                f"{marker}); to prepare again, delete that record and rerun the fetch stage (snakemake --forcerun "
                "fetch, or dvc repro -f fetch), which downloads the archive again"
            )
        return (
            f"{path}: not there, the archive {Path(raw_dir) / SOURCE_RECORD} reads its audio from; rerun the fetch "
            "stage (snakemake --forcerun fetch, or dvc repro -f fetch)"
        )
    size, fetched = path.stat().st_size, record.get("archive_bytes")
    if size != fetched:
        return (
            f"{path}: {size} bytes where fetch checked {fetched} ({Path(raw_dir) / SOURCE_RECORD}): another file or "
            "damaged since; rerun the fetch stage (snakemake --forcerun fetch, or dvc repro -f fetch)"
        )
    return None


def open_archive(cfg: C.Config, raw_dir: Path, record: dict) -> archive.ZipMembers:
    """The zip fetch's record reads in place, every member checked (archive.ZipMembers); one line when it is gone
    or not the file fetch checked."""
    problem = _archive_problem(raw_dir, record)
    if problem:
        raise UserError(problem)
    return archive.ZipMembers(in_archive(raw_dir, record)[0], archive.ExtractLimits.from_config(cfg.data))


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


def plan(cfg: C.Config, raw_dir: Path, out_dir: Path, check: bool = True) -> pd.DataFrame:
    """Write out_dir/shards.csv: every audio-named path under raw_dir with its clip id and shard.

    Paths are sorted and cut into shards of `data.shard_files` paths. Clip ids are decided here,
    over the whole corpus, so that they are unique across shards. Paths `scan` leaves out
    (hidden, not regular files) carry their reason in `skip` and go straight to the rejects.
    Before the plan is written, an archive read in place must be there, and (`check`) the prepared audio
    must fit the free space where out_dir goes (`check_space`; the shards out_dir already holds count
    as free: each shard job replaces its own).
    """
    frame = _planned(cfg, raw_dir)
    if check:
        there = sum(_size(p) for p in Path(out_dir).glob(f"shard-*/{AUDIO}"))
        check_space(cfg, raw_dir, out_dir, frame, there / GB)
    _write_plan(cfg, out_dir, frame)
    return frame


def _planned(cfg: C.Config, raw_dir: Path) -> pd.DataFrame:
    """The plan's rows (PLAN_COLUMNS), once an archive read in place is known to be there; nothing written."""
    raw_dir = Path(raw_dir)
    recover_replaced(raw_dir)  # a fetch killed while it replaced the folder: the previous one back, said in the log
    if not raw_dir.is_dir():
        raise UserError(f"prepare: {raw_dir} is not a folder; run fetch first")
    files, left_out = scan(raw_dir)
    if not files and not left_out:
        raise UserError(f"prepare: no files under {raw_dir}")
    record = _fetch_record(raw_dir)
    if in_archive(raw_dir, record) is not None and (problem := _archive_problem(raw_dir, record)):
        raise UserError(problem)
    rel = [p.relative_to(raw_dir).as_posix() for p in files]
    rows = [(r, i, "") for r, i in zip(rel, plan_clip_ids(rel))] + [(r, "", why) for r, why in left_out]
    frame = pd.DataFrame(sorted(rows), columns=["path", "clip_id", "skip"])
    frame.insert(2, "shard", np.arange(len(frame)) // int(cfg.data.shard_files))
    return frame[list(PLAN_COLUMNS)]


def _write_plan(cfg: C.Config, out_dir: Path, frame: pd.DataFrame) -> None:
    write_plan(out_dir, frame)
    log.info(
        "prepare: %d files (%d to decode) in %d shard(s) of up to %d files",
        len(frame),
        int((frame["skip"] == "").sum()),
        frame["shard"].nunique(),
        cfg.data.shard_files,
    )


def _header_seconds(path: Path) -> float:
    """A file's length by its header (libsndfile reads the header only; an MP3's Xing header, where LAME wrote
    one), 0 for what prepare will reject: not audio, an implausible sample rate."""
    try:
        info = sf.info(str(path))
    except Exception:  # noqa: BLE001 - not audio: rejected by prepare, nothing to store
        return 0.0
    return float(info.duration) if MIN_SAMPLE_RATE <= info.samplerate <= MAX_SAMPLE_RATE else 0.0


def check_space(cfg: C.Config, raw_dir: Path, out_dir: Path, todo: pd.DataFrame, freed_gb: float = 0.0) -> float:
    """Refuse, in one line before any work, prepared audio that would not fit where out_dir goes.

    Needed: the seconds of the plan's rows `todo` still to decode x data.sample_rate x the bytes per sample of
    data.sample_format (mono). Seconds: a file's header (`_header_seconds`); an archive member read in place,
    the mean track length of its named corpus as its publisher states it (sources.KNOWN_CORPORA: 30 s for
    fma_large's clips; the same numbers as fetch's plan and preflight), since its header lies inside the zip.
    `freed_gb`: prepared shards already on disk that the stage replaces or takes (a killed run's). Returns the GB
    needed.
    """
    raw_dir = Path(raw_dir)
    record = _fetch_record(raw_dir)
    place = in_archive(raw_dir, record)
    members = set(place[1]) if place is not None else set()
    known = KNOWN_CORPORA.get(str((record or {}).get("source")))
    per_member = known.hours * 3600.0 / known.tracks if known is not None else 0.0  # unknown: FMA's are all known
    paths = todo.loc[todo["skip"] == "", "path"].tolist()
    in_zip = sum(p in members for p in paths)
    seconds = in_zip * per_member + sum(_header_seconds(raw_dir / p) for p in paths if p not in members)
    fmt, rate = cfg.data.sample_format, int(cfg.data.sample_rate)
    needed = seconds * rate * SAMPLE_BYTES[fmt] / GB
    on_disk = len(paths) - in_zip
    how = []
    if in_zip:
        name = place[0].name
        how.append(
            f"{per_member:,.0f} s a track in {name}, {record['source']}'s published length"
            if known is not None
            else f"{in_zip:,} members of {name} of unknown length not counted"
        )
    if on_disk or not how:
        how.append(f"{'the other files ' if in_zip else ''}by their headers")
    free, where = check_room(
        f"prepare: {len(paths):,} files need {gb_text(needed)} GB of prepared audio ({seconds / 3600:,.2f} h, "
        f"{' and '.join(how)}; {fmt} at {rate} Hz)"
        + (f", {gb_text(freed_gb)} GB of it in shards already there" if freed_gb else ""),
        needed - freed_gb,
        out_dir,
    )
    log.info(
        "prepare: %d files need %s GB of prepared audio; %s has %s GB free",
        len(paths),
        gb_text(needed),
        where,
        gb_text(free),
    )
    return needed


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
    place = in_archive(raw_dir, record)
    members = set(place[1]) if place is not None else set()
    for rel_path, skip in zip(todo["path"], todo["skip"]):  # before writing anything
        if not skip and rel_path not in members and (raw_dir / rel_path).is_file():
            check_snapshot(raw_dir, rel_path, record)
    from_zip = any(not skip and p in members for p, skip in zip(todo["path"], todo["skip"]))
    # the archive's members, every one checked before the shard's folder is made; read one at a time, in memory
    with (
        open_archive(cfg, raw_dir, record) if from_zip else contextlib.nullcontext() as zipped,
        atomic_dir(out_dir / shard_name(shard)) as tmp,
    ):
        with (
            AudioWriter(tmp / AUDIO, cfg.data.sample_format) as writer,
            Progress(len(todo), f"prepare {shard_name(shard)}", unit="file") as bar,
        ):
            for rel_path, clip_id, skip in zip(todo["path"], todo["clip_id"], todo["skip"]):
                try:
                    if skip:
                        raise Unusable(skip)
                    source = zipped.read(rel_path) if rel_path in members else raw_dir / rel_path
                    audio, orig_sr, orig_ch = decode(source, sample_rate, min_samples)
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
    ids = manifest["clip_id"].tolist()
    manifest["split"] = (
        tones.splits(ids, cfg.data.synthetic.n_clips)
        if cfg.data.source == "tones"
        else assign_splits(ids, cfg.data.valid_fraction, cfg.data.split_seed)
    )
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
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    todo = _planned(cfg, raw_dir)
    # before a killed run's folder is claimed (any failure past that point removes it): its finished shards are
    # on disk already, and the old out_dir stays until the new one replaces it
    finished = out_dir.parent.glob(f".{glob_escape(out_dir.name)}.tmp-*/shard-*/{SHARD_RECORD}")
    check_space(cfg, raw_dir, out_dir, todo, sum(_size(p.parent / AUDIO) for p in finished) / GB)
    with resumable_dir(out_dir, "prepare") as parts:
        _write_plan(cfg, parts.tmp, todo)
        parts.match(_resume_key(cfg, raw_dir, parts.tmp / PLAN))  # shards.csv included: same plan, same shards
        for shard in sorted(todo["shard"].unique()):
            if not parts.take(shard_name(shard), SHARD_RECORD, check=shard_problem):
                prepare_shard(cfg, raw_dir, parts.tmp, shard)
        parts.done()
        merge(cfg, parts.tmp)
    remove_archive(cfg, raw_dir, out_dir)  # only now: out_dir is in place, whole


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def remove_archive(cfg: C.Config, raw_dir: Path, out_dir: Path) -> Path | None:
    """data.remove_archive: remove the archive prepare read in place, once out_dir's corpus is complete.

    Complete: out_dir's manifest.csv (written last) is there, and it and rejects.csv hold every member fetch's
    record lists; otherwise one line and the archive stays. First the record fetch writes the raw folder again
    from is written beside the archive (`sources.removed_marker`, atomically), then the archive is removed, and
    one log line says so. Returns the archive removed; None when the option is off, the audio was not read in
    place (an extracted archive, a folder: nothing to remove) or the archive is gone already.
    """
    if not cfg.data.remove_archive:
        return None
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    record = _fetch_record(raw_dir)
    place = in_archive(raw_dir, record)
    if place is None:
        log.info(
            "prepare: data.remove_archive: %s's audio was not read in place from an archive; nothing removed",
            (record or {}).get("source", raw_dir),
        )
        return None
    path, members = place
    if not path.is_file():
        return None
    manifest, rejects = out_dir / MANIFEST, out_dir / REJECTS
    if not manifest.is_file():
        raise UserError(f"{manifest}: not there, the corpus is not complete; {path.name} is kept (rerun prepare)")
    done = set(read_csv_table(manifest, "the manifest", "prepare", ("path",), empty_ok=True)["path"])
    done |= set(read_csv_table(rejects, "the rejects", "prepare", REJECTS_COLUMNS, empty_ok=True)["path"])
    missing = [m for m in members if m not in done]
    if missing:
        raise UserError(
            f"{manifest}: {len(missing)} members of {path.name} are neither prepared nor rejected (first: "
            f"{missing[0]}); the archive is kept: rerun prepare"
        )
    size = path.stat().st_size
    marker = removed_marker(path)
    write_json(
        marker,
        {
            "archive": path.name,
            "archive_bytes": size,
            "removed_by": "amlm prepare (data.remove_archive)",
            "prepared": str(out_dir),
            "manifest_sha256": file_sha256(manifest),
            "members": len(members),
            "source_record": record,  # fetch writes it again as data/raw's SOURCE.json, without downloading
        },
    )
    path.unlink()
    log.info(
        "prepare: removed %s (%s GB; data.remove_archive): all %d of its audio members are prepared or rejected in "
        "%s; fetch writes %s again from %s without downloading",
        path,
        gb_text(size / GB),
        len(members),
        out_dir,
        SOURCE_RECORD,
        marker.name,
    )
    return path


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
