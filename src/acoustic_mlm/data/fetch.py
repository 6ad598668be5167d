"""Fetch stage: put raw audio files into one folder (`data/raw` by default).

One function per kind of `data.source`; each fills a temporary folder and returns what it made,
which lands in `SOURCE.json` next to the audio. The folder appears at `out_dir` only when
complete (utils.atomic_dir), so a failed fetch leaves the previous corpus, or nothing.

- `synthetic`: procedural music (acoustic_mlm.data.synth), offline.
- `tones`: the tone corpus of the small-scale rounds (acoustic_mlm.data.tones), offline: float32 WAV files,
  the samples exactly as generated, from `data.synthetic`'s n_clips, clip_seconds (whole EnCodec frames)
  and seed.
- `fma_*`, `librispeech-*`, `url`: an archive (sources.py says where, with which hash) is
  downloaded through pooch into the downloads folder (`data/downloads/` by default, next to
  `out_dir`, so that DVC can version it), checked against its hash, and kept: a later fetch
  re-checks the hash and reuses it. Downloads retry network errors and resume a broken transfer
  with HTTP Range requests (data/download.py); a hash mismatch is final unless the bytes
  came partly from an earlier transfer (then the file is downloaded once more from the start). Extraction
  (archive.extract) checks every member first and writes only audio files (wav, flac, ogg,
  mp3); FMA's known-corrupt tracks are never extracted. FMA's zips (`sources.reads_in_place`) are not
  extracted at all: fetch checks every member the same way (archive.survey) and lists the audio members
  in SOURCE.json (`read_in_place`, `members`, `archive_path` relative to `out_dir`), and prepare decodes
  them straight from the zip. Where prepare removed such an archive once every member was prepared
  (`data.remove_archive`), the record it left beside it (`<archive>.removed.json`) holds this SOURCE.json:
  fetch writes it again without downloading (so that a rerun of fetch, which DVC makes when the removal
  changed data/downloads, leaves data/raw as it was); deleting the record makes fetch download the archive.
- `librosa`: librosa's example recordings, file by file from `data.base_url`, each checked
  against its sha256 (sources.LIBROSA_SHA256) and kept in `downloads/librosa/`.
- `folder`: every audio file under `data.folder` (recursive; audio by name, else by content:
  whatever libsndfile recognises) appears in `out_dir` at the same relative path, as a hard link
  when the folder is on the same filesystem (no second copy of a large corpus; nothing in the
  pipeline writes to these files, and replacing `out_dir` only removes the links) and as a copy
  otherwise. A real folder rather than symlinks: DVC caches file contents, and a symlinked corpus
  would change under it.

Every path of the source that fetch does not bring (hidden, not audio, an unsupported format such
as .m4a, a broken link or loop, a FIFO, a device, a name that is not UTF-8; in an archive: members
that are not audio-named, links, devices, FIFOs) is listed with its reason in SOURCE.json's
`skipped`, which prepare copies into rejects.csv: every file is accounted for.

Decoding is prepare's job: fetch never opens the audio, so a bad file travels on to prepare,
which lists it in rejects.csv with its reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

import soundfile as sf

from acoustic_mlm import __version__
from acoustic_mlm import config as C
from acoustic_mlm.artifacts.checked import Advice, read_json
from acoustic_mlm.data import archive, sources, synth, tones
from acoustic_mlm.data.download import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, download
from acoustic_mlm.data.sources import AUDIO_SUFFIXES
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import Progress, atomic_dir, file_sha256, log, write_json


@dataclass(frozen=True)
class Context:
    """What a source function may use besides the config."""

    out_dir: Path  # the final raw folder (sources write into a temporary sibling)
    downloads_dir: Path  # where archives are downloaded and kept
    retries: int = DEFAULT_RETRIES
    timeout: float = DEFAULT_TIMEOUT_S


# ------------------------------------------------------------------------------------------
# Sources


def _fetch_synthetic(cfg: C.Config, out: Path, ctx: Context) -> dict:
    """Procedural music (acoustic_mlm.data.synth): offline, identical for a seed."""
    p = cfg.data.synthetic
    log.info(
        "fetch: generating %d synthetic clips of %.1f s at %d Hz (seed %d)",
        p.n_clips,
        p.clip_seconds,
        p.sample_rate,
        p.seed,
    )
    paths = synth.generate_corpus(out, p.n_clips, p.clip_seconds, p.sample_rate, p.seed)
    return {
        "params": {k: getattr(p, k) for k in ("n_clips", "clip_seconds", "sample_rate", "seed")},
        "format": "FLAC PCM_16",
        "generator": f"acoustic_mlm.data.synth {__version__}",
        "files": len(paths),
        "total_seconds": round(sum(sf.info(str(q)).duration for q in paths), 3),
    }


def _fetch_tones(cfg: C.Config, out: Path, ctx: Context) -> dict:
    """The tone corpus (acoustic_mlm.data.tones): offline, identical for a seed, the samples exactly as drawn."""
    p = cfg.data.synthetic
    frames = tones.frames_in(p.clip_seconds)
    log.info("fetch: generating %d tone clips of %d frames (%.2f s) at %d Hz (seed %d)", p.n_clips, frames,
             p.clip_seconds, tones.RATE, p.seed)  # fmt: skip
    paths = tones.write_clips(out, p.n_clips, frames, p.seed)
    return {
        "params": {k: getattr(p, k) for k in ("n_clips", "clip_seconds", "sample_rate", "seed")},
        "frames_per_clip": frames,
        "held_out": tones.clip_name(p.n_clips - 1, p.n_clips),
        "format": " ".join(tones.FORMAT),
        "generator": f"acoustic_mlm.data.tones {__version__}",
        "files": len(paths),
        "total_seconds": round(len(paths) * frames * tones.HOP / tones.RATE, 3),
    }


def _archive_skipped(path: Path, done: archive.Extracted, src: sources.ArchiveSource) -> list[dict]:
    """Every archive member not extracted (but folders), with its reason, for SOURCE.json and the rejects."""

    def why(rel: str) -> str:
        if src.excluded(rel):
            return f"known-corrupt track of {src.name} (not extracted)"
        if PurePosixPath(rel).suffix.lower() in sources.UNSUPPORTED_AUDIO:
            return f"{sources.not_audio_reason(rel)} (not extracted)"
        return "not an audio file name (not extracted)"

    skipped = [{"path": r, "reason": why(r)} for r in done.not_kept]
    if done.links_skipped or done.other_skipped:  # name them: one more pass over the member list
        for m in archive.list_members(path):
            if m.path is None or m.kind in ("file", "dir"):
                continue
            if m.kind in ("symlink", "hardlink"):
                reason = f"{'hard' if m.kind == 'hardlink' else 'symbolic'} link inside the archive (not extracted)"
            else:
                ref = m.ref
                kind = (
                    "FIFO"
                    if getattr(ref, "isfifo", lambda: False)()
                    else "character device"
                    if getattr(ref, "ischr", lambda: False)()
                    else "block device"
                    if getattr(ref, "isblk", lambda: False)()
                    else "special file"
                )
                reason = f"not a regular file ({kind}) in the archive (not extracted)"
            skipped.append({"path": m.path.as_posix(), "reason": reason})
    return sorted(skipped, key=lambda d: d["path"])


def _fetch_archive(cfg: C.Config, out: Path, ctx: Context) -> dict:
    """fma_*, librispeech-*, url: download (or reuse) the archive, extract its audio files, or, for a zip prepare
    reads in place (FMA's), check and list them."""
    src = sources.archive_for(cfg.data)
    in_place = sources.reads_in_place(cfg.data)
    if in_place and (again := _removed_record(cfg, src, ctx)) is not None:
        return again
    path = download(src, ctx.downloads_dir, ctx.retries, ctx.timeout)
    limits = archive.ExtractLimits.from_config(cfg.data)

    def keep(rel: str) -> bool:
        return sources.is_audio_name(rel) and not src.excluded(rel)

    if in_place:
        log.info(
            "fetch: checking and listing the audio members of %s (%.1f MB); prepare reads them from the zip, "
            "nothing is extracted",
            path.name,
            path.stat().st_size / 1e6,
        )
        done = archive.survey(path, keep=keep, limits=limits)
    else:
        log.info("fetch: extracting the audio files of %s (%.1f MB)", path.name, path.stat().st_size / 1e6)
        done = archive.extract(path, out, keep=keep, limits=limits)
    excluded = sorted(r for r in done.not_kept if sources.is_audio_name(r))
    if not done.files:
        raise UserError(
            f"fetch: {path.name} holds no audio files ({', '.join(AUDIO_SUFFIXES)})"
            + (f" besides {len(excluded)} known-corrupt ones" if excluded else "")
        )
    off_layout = [f for f in done.files if not src.expects(f)]
    if src.layout is not None and len(off_layout) == len(done.files):
        raise UserError(
            f"fetch: {path.name} does not look like {src.name}: no audio member matches "
            f"{src.layout!r} (first: {off_layout[0]!r})"
        )
    if off_layout:
        log.warning(
            "fetch: %d audio files in %s do not match %s's layout (first: %s); kept",
            len(off_layout),
            path.name,
            src.name,
            off_layout[0],
        )
    if excluded:
        log.info("fetch: left out %d known-corrupt tracks: %s", len(excluded), ", ".join(excluded))
    skipped = _archive_skipped(path, done, src)
    _log_skipped(skipped, path.name)
    info = {
        "url": src.url,
        "known_hash": src.known_hash,
        "archive": path.name,
        "archive_bytes": path.stat().st_size,
        "files": len(done.files),
        "bytes": done.bytes,
        "excluded_known_corrupt": excluded,
        "other_files_skipped": len(done.not_kept) - len(excluded),  # regular members that are not audio-named
        "links_skipped": done.links_skipped,
        "special_skipped": done.other_skipped,  # devices, FIFOs
        "off_layout": len(off_layout),
        "skipped": skipped,  # every member not extracted (but folders): prepare lists them in rejects.csv
    }
    if in_place:  # prepare reads these members from the archive at archive_path (relative to the raw folder)
        info.update(read_in_place=True, archive_path=_relative(path, ctx.out_dir), members=sorted(done.files))
        marker = sources.removed_marker(path)
        if marker.is_file():  # the archive is back: the record of its removal no longer holds
            marker.unlink()
            log.info("fetch: %s is here again; removed %s, the record of its removal", path.name, marker.name)
    return info


def _relative(path: Path, folder: Path) -> str:
    """`path` relative to `folder` (both resolved; '..' where needed), as prepare finds it from the raw folder."""
    return Path(os.path.relpath(Path(path).resolve(), Path(folder).resolve())).as_posix()


def _removed_record(cfg: C.Config, src: sources.ArchiveSource, ctx: Context) -> dict | None:
    """What fetch wrote for `src` before prepare removed its archive (data.remove_archive), from the record prepare
    left beside it, when the archive is gone and the record is for this very archive; else None (download it)."""
    kept = ctx.downloads_dir / src.filename
    marker = sources.removed_marker(kept)
    if kept.exists() or not marker.is_file():
        return None
    advice = Advice(f"delete it and rerun the fetch stage (it downloads {src.filename} again)")
    was = read_json(marker, "the record of a removed archive", advice, required={"source_record": dict})
    was = was["source_record"]
    same = (was.get("source"), was.get("url"), was.get("known_hash"), was.get("archive"))
    if same != (cfg.data.source, src.url, src.known_hash, src.filename) or was.get("read_in_place") is not True:
        log.info("fetch: %s records the removal of another archive than %s's; downloading it", marker, src.name)
        return None
    info = {k: v for k, v in was.items() if k != "source"}
    info["archive_path"] = _relative(kept, ctx.out_dir)
    log.info(
        "fetch: %s was removed once prepared (data.remove_archive); %s written again from %s, nothing downloaded "
        "(preparing again needs the archive: delete that record and rerun fetch)",
        src.filename,
        sources.SOURCE_RECORD,
        marker,
    )
    return info


def _log_skipped(skipped: list[dict], where: str) -> None:
    if skipped:
        kinds = Counter(s["reason"].split(" (")[0].split(";")[0] for s in skipped)
        log.info(
            "fetch: left out %d files of %s (%s); prepare lists them in rejects.csv",
            len(skipped),
            where,
            ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())),
        )


def _libsndfile_reads(path: Path) -> bool:
    """Whether libsndfile recognises the content of a regular file (its header only)."""
    try:
        sf.info(str(path))
    except Exception:  # noqa: BLE001 - any failure means: not a format it reads
        return False
    return True


def _fetch_folder(cfg: C.Config, out: Path, ctx: Context) -> dict:
    """A local folder: its audio files hard-linked (same filesystem) or copied, paths kept; every
    other path listed with the reason it is left out."""
    folder = Path(cfg.data.folder).expanduser()
    if not folder.is_dir():
        raise UserError(f"data.folder: {folder} is not a folder")
    folder, final = folder.resolve(), ctx.out_dir.resolve()
    if folder == final or final in folder.parents or folder in final.parents:
        raise UserError(f"data.folder: {folder} and the output folder {final} must not contain each other")
    listing = sources.walk(folder)
    files, skipped = [], [{"path": r, "reason": why} for r, why in listing.left_out]
    for rel, src in listing.files:
        if rel == sources.SOURCE_RECORD:
            skipped.append({"path": rel, "reason": "the name of fetch's own record (rename the file to include it)"})
        elif sources.is_audio_name(rel) or _libsndfile_reads(src):  # by name, else by content (AIFF as .dat)
            files.append((rel, src))
        else:
            skipped.append({"path": rel, "reason": sources.not_audio_reason(rel)})
    skipped.sort(key=lambda d: d["path"])
    if not files:
        raise UserError(f"data.folder: no audio files under {folder} ({len(skipped)} other files)")
    linked = copied = size = 0
    hashes = {}
    with Progress(len(files), "fetch", unit="file") as bar:
        for rel, src in files:
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src.resolve(), dest)
                linked += 1
            except OSError:  # another filesystem, or links not allowed
                shutil.copy2(src, dest)
                copied += 1
            size += dest.stat().st_size
            hashes[rel] = file_sha256(dest)  # the snapshot: prepare refuses a file changed since
            bar.update(1)
    _log_skipped(skipped, str(folder))
    return {
        "folder": str(folder),
        "files": len(files),
        "bytes": size,
        "hard_linked": linked,
        "copied": copied,
        "sha256": hashes,
        "hidden_skipped": sum(s["reason"] == sources.HIDDEN for s in skipped),
        "skipped": skipped,
    }  # every other path under the folder: prepare lists them in rejects.csv


def _fetch_file_set(cfg: C.Config, out: Path, ctx: Context) -> dict:
    """librosa: each file downloaded (or reused) into downloads/<source>/, hash-checked, then linked
    (or copied) into the raw folder. Its licence files travel with the audio; prepare lists them
    in rejects.csv as not audio."""
    fs = sources.file_set_for(cfg.data)
    store = ctx.downloads_dir / fs.name
    store.mkdir(parents=True, exist_ok=True)
    size = linked = 0
    with Progress(len(fs.files), f"fetch {fs.name}", unit="file") as bar:
        for member in fs.members():
            path = download(member, store, ctx.retries, ctx.timeout)
            try:
                os.link(path, out / member.filename)
                linked += 1
            except OSError:  # another filesystem, or links not allowed
                shutil.copy2(path, out / member.filename)
            size += path.stat().st_size
            bar.update(1)
    audio = sum(sources.is_audio_name(f) for f in fs.files)
    log.info("fetch: %s: %d files (%d audio) from %s, every sha256 checked", fs.name, len(fs.files), audio, fs.base_url)
    return {
        "base_url": fs.base_url,
        "files": len(fs.files),
        "audio_files": audio,
        "bytes": size,
        "hard_linked": linked,
        "known_hashes": dict(sorted(fs.files.items())),
        "skipped": [],
    }


# data.source -> function(cfg, temporary out folder, context) -> description for SOURCE.json
SOURCES: dict[str, Callable[[C.Config, Path, Context], dict]] = {
    "synthetic": _fetch_synthetic,
    "tones": _fetch_tones,
    "folder": _fetch_folder,
    "url": _fetch_archive,
    **{name: _fetch_archive for name in sources.ARCHIVES},
    **{name: _fetch_file_set for name in sources.FILE_SETS},
}


def check_disk(cfg: C.Config, out_dir: Path, downloads_dir: Path) -> None:
    """Refuse, in one line naming both numbers, a named corpus whose peak on disk (archive, extracted members or
    none where prepare reads the zip in place, prepared audio, codes, the archive removed after prepare with
    data.remove_archive: sources.disk_plan) does not fit the free space where the data goes; an archive already
    downloaded counts as there. Sources of unknown size pass, and so does an archive prepare removed once prepared
    (nothing is downloaded: fetch writes its record again)."""
    from acoustic_mlm import encodec

    d = cfg.data
    known = sources.KNOWN_CORPORA.get(d.source)
    if known is None:
        return
    kept = downloads_dir / sources.archive_for(d).filename
    if not kept.exists() and sources.removed_marker(kept).is_file():
        return
    k = encodec.codebooks(float(cfg.tokenizer.bandwidth))
    plan = sources.disk_plan(
        known.hours * 3600.0, known.download_gib * sources.GIB / sources.GB, d.sample_rate, d.sample_format, k,
        encodec.FRAME_RATE, in_place=sources.reads_in_place(d), remove_archive=d.remove_archive,
    )  # fmt: skip
    have = kept.stat().st_size / sources.GB if kept.is_file() else 0.0
    needs = (
        f"fetch: {d.source} needs {plan.peak_gb:,.0f} GB at its peak ({plan.parts(d.sample_format)}), "
        f"{plan.peak_gb - have:,.0f} GB more than is here"
    )
    free, where = sources.check_room(needs, plan.peak_gb - have, out_dir)
    log.info("fetch: %s needs %.0f GB at its peak; %s has %.0f GB free", d.source, plan.peak_gb, where, free)


def run(
    cfg: C.Config,
    out_dir: Path,
    downloads_dir: Path | None = None,
    *,
    retries: int = DEFAULT_RETRIES,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Fill `out_dir` with the raw audio of `data.source`, plus `SOURCE.json` describing it.

    Archives are downloaded into and kept in `downloads_dir` (default: `out_dir.parent /
    "downloads"`, i.e. data/downloads), which exists after every successful fetch. `cfg`: a `Config`
    (`config.load`).
    """
    source = cfg.data.source
    if source not in SOURCES:
        raise UserError(f"data.source: unknown source '{source}' (known: {', '.join(SOURCES)})")
    out_dir = Path(out_dir)
    downloads_dir = Path(downloads_dir) if downloads_dir is not None else out_dir.parent / "downloads"
    ctx = Context(out_dir=out_dir, downloads_dir=downloads_dir, retries=retries, timeout=timeout)
    # folders this call creates (downloads, data/): removed again if the fetch fails and they are empty
    created = {p for d in (downloads_dir, out_dir.parent) for p in (d, *d.parents) if not p.exists()}
    check_disk(cfg, out_dir, downloads_dir)  # before anything is downloaded or created
    try:
        downloads_dir.mkdir(parents=True, exist_ok=True)
        with atomic_dir(out_dir) as tmp:
            info = SOURCES[source](cfg, tmp, ctx)
            write_json(tmp / "SOURCE.json", {"source": source, **info})
    except BaseException:
        for folder in sorted(created, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty: a kept .part or archive stays
        raise
    amount = f"{info['total_seconds']:.1f} s of audio" if "total_seconds" in info else f"{info['bytes'] / 1e6:.1f} MB"
    log.info("fetch: %s: %d files, %s in %s", source, info["files"], amount, out_dir)
