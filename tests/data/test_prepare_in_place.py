"""Prepare reads FMA's MP3s straight from the zip: no extracted copy anywhere, the same prepared audio as the
extract-then-decode path; data.remove_archive removes the archive only once every member is prepared (and
fetch then writes data/raw again without downloading); prepare refuses, in one line before any work, prepared
audio that does not fit the free space.

The archive is tests/fma_rehearsal.py's (10 tracks of 4 s of procedural music as MP3 in fma_large's layout,
with FMA's README.txt and checksums), served on 127.0.0.1 in place of fma_large's URL.
"""

from __future__ import annotations

import io
import json
import logging
import tempfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from data_helpers import preset
from fma_rehearsal import TRACKS, member
from fma_rehearsal import archive as rehearsal_archive
from helpers import make_config, run_command, sha256

from acoustic_mlm.artifacts.prepared import AUDIO, MANIFEST, PLAN, RECORD, REJECTS, shard_name
from acoustic_mlm.data import archive, decode, fetch, prepare, sources
from acoustic_mlm.data.data_commands import prepare_command
from acoustic_mlm.errors import UserError

NAME = "fma_large"  # the rehearsal archive's root folder
ZIP = f"{NAME}.zip"
SHARDS = 3  # 10 tracks, 4 a shard


@pytest.fixture(scope="module")
def blob() -> bytes:
    return rehearsal_archive()


def _cfg(**data) -> dict:
    keys = dict(source=NAME, url=None, known_hash=None, folder=None, sample_format="int16", shard_files=4)
    cfg = preset(**{**keys, **data})
    cfg["train"]["crop_seconds"] = 0.5
    return cfg


def _serve(server, monkeypatch, tmp_path, blob: bytes, seconds_a_track: float = 4.0) -> str:
    """fma_large's archive served from 127.0.0.1 at a path of this test's own, with the rehearsal's size as its
    published one (fetch's disk plan and prepare's check use it); returns its URL."""
    url = server.serve(f"/fma/{tmp_path.name}/{ZIP}", blob)
    monkeypatch.setitem(sources.ARCHIVES, NAME, replace(sources.ARCHIVES[NAME], url=url, known_hash=sha256(blob)))
    n = len(TRACKS)
    known = sources.KnownCorpus(len(blob) / 2**30, n * seconds_a_track / 3600, n, "tests/fma_rehearsal.py")
    monkeypatch.setitem(sources.KNOWN_CORPORA, NAME, known)
    return url


def _fetch(cfg: dict, data: Path) -> None:
    fetch.run(make_config(cfg), data / "raw", data / "downloads", retries=0, timeout=10)


def _requests(server, url: str) -> int:
    return [p for p, _ in server.requests].count("/" + url.split("/", 3)[3])


def test_members_are_decoded_from_the_zip_with_no_copy_on_disk_and_the_audio_is_the_extracted_paths(
    server, monkeypatch, tmp_path, blob
):
    url = _serve(server, monkeypatch, tmp_path, blob)
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}
    scratch = tmp_path / "scratch"  # the temporary folder of anything the stages might write aside
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    data = tmp_path / "in_place"
    _fetch(_cfg(), data)
    prepare.run(make_config(_cfg()), data / "raw", data / "prepared")

    # nothing extracted: data/raw is fetch's record; no file anywhere holds a member's bytes, under any name
    assert [p.name for p in (data / "raw").iterdir()] == ["SOURCE.json"]
    record = json.loads((data / "raw" / "SOURCE.json").read_text())
    assert record["members"] == sorted(member(t) for t in TRACKS) and record["archive_path"] == f"../downloads/{ZIP}"
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != ZIP]
    assert not [p for p in written if p.read_bytes() in members.values()]
    assert list(scratch.iterdir()) == [] and not list(tmp_path.rglob("*.mp3"))
    assert sorted(p.name for p in (data / "downloads").iterdir()) == [ZIP]

    # the extract-then-decode path (a url source of the same zip: fetch extracts it) prepares the same bytes
    extracted = tmp_path / "extracted"
    _fetch(_cfg(source="url", url=url, known_hash=sha256(blob)), extracted)
    assert sorted(p.relative_to(extracted / "raw").as_posix() for p in (extracted / "raw").rglob("*.mp3")) == sorted(
        member(t) for t in TRACKS
    )
    prepare.run(
        make_config(_cfg(source="url", url=url, known_hash=sha256(blob))), extracted / "raw", extracted / "prepared"
    )
    for shard in range(SHARDS):
        mine, theirs = (d / "prepared" / shard_name(shard) / AUDIO for d in (data, extracted))
        assert mine.read_bytes() == theirs.read_bytes(), shard
    for name in (PLAN, MANIFEST, REJECTS, RECORD):
        assert (data / "prepared" / name).read_bytes() == (extracted / "prepared" / name).read_bytes(), name
    rejects = (data / "prepared" / REJECTS).read_text().splitlines()
    assert rejects[1:] == [
        f"{NAME}/README.txt,not an audio file name (not extracted)",
        f"{NAME}/checksums,not an audio file name (not extracted)",
    ]


def test_the_option_removes_the_archive_once_prepared_and_fetch_then_downloads_nothing(
    server, monkeypatch, tmp_path, blob, caplog
):
    url = _serve(server, monkeypatch, tmp_path, blob)
    cfg = _cfg(remove_archive=True)
    data = tmp_path / "data"
    _fetch(cfg, data)
    assert _requests(server, url) == 1
    source = (data / "raw" / "SOURCE.json").read_bytes()
    kept = data / "downloads" / ZIP
    with caplog.at_level(logging.INFO, logger="acoustic_mlm"):
        prepare.run(make_config(cfg), data / "raw", data / "prepared")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prepare: removed")]
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].startswith(f"prepare: removed {kept} ({len(blob) / 1e9:.3g} GB; data.remove_archive): all 10 of")
    assert (
        f"prepared or rejected in {data / 'prepared'}; fetch writes SOURCE.json again from {ZIP}.removed.json"
        in said[0]
    )
    marker = data / "downloads" / f"{ZIP}.removed.json"
    assert not kept.exists() and sorted(p.name for p in kept.parent.iterdir()) == [marker.name]
    removed = json.loads(marker.read_text())
    assert removed["source_record"] == json.loads(source) and removed["archive_bytes"] == len(blob)
    assert removed["members"] == 10 and (data / "prepared" / MANIFEST).is_file()

    # fetch again (DVC reruns it, data/downloads having changed): data/raw as it was, nothing downloaded
    _fetch(cfg, data)
    assert _requests(server, url) == 1 and (data / "raw" / "SOURCE.json").read_bytes() == source
    # preparing again needs the archive: one line saying so, before any work
    with pytest.raises(UserError) as err:
        prepare.plan(make_config(cfg), data / "raw", tmp_path / "again")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{kept}: removed once an earlier prepare had prepared every member")
    assert f"{marker}); to prepare again, delete that record and rerun the fetch stage" in msg
    assert not (tmp_path / "again").exists()

    # the archive back in its place: fetch takes it (by its hash) and drops the record of its removal
    kept.write_bytes(blob)
    _fetch(cfg, data)
    assert _requests(server, url) == 1 and not marker.exists()
    # the record deleted and the archive gone: fetch downloads it again
    kept.unlink()
    _fetch(_cfg(), data)
    assert _requests(server, url) == 2 and kept.read_bytes() == blob


def test_a_member_that_cannot_be_read_midway_fails_prepare_and_the_archive_stays(server, monkeypatch, tmp_path, blob):
    last = member(sorted(TRACKS)[-1])  # in the last shard: two shards are prepared before it
    damaged = bytearray(blob)
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        info = zf.getinfo(last)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # its compressed bytes
    damaged[start + info.compress_size // 2] ^= 0xFF
    damaged = bytes(damaged)
    _serve(server, monkeypatch, tmp_path, damaged)
    cfg = _cfg(remove_archive=True)
    data = tmp_path / "data"
    _fetch(cfg, data)  # fetch checks names and sizes, never the data: the damage shows when prepare reads it
    prepared = []
    real = prepare.prepare_shard
    monkeypatch.setattr(prepare, "prepare_shard", lambda *a: prepared.append(a[3]) or real(*a))
    with pytest.raises(archive.ArchiveError) as err:
        prepare.run(make_config(cfg), data / "raw", data / "prepared")
    assert str(err.value).startswith(f"{ZIP}: cannot read member '{last}' (") and "\n" not in str(err.value)
    assert prepared == [0, 1, 2]  # midway: the first shards were done
    assert (data / "downloads" / ZIP).read_bytes() == damaged and sorted(
        p.name for p in (data / "downloads").iterdir()
    ) == [ZIP]
    assert not (data / "prepared").exists()


def test_the_merge_step_removes_the_archive_only_once_the_manifest_holds_every_member(
    server, monkeypatch, tmp_path, blob
):
    _serve(server, monkeypatch, tmp_path, blob)
    cfg = make_config(_cfg(remove_archive=True))
    data = tmp_path / "data"
    raw, out, kept = data / "raw", data / "prepared", data / "downloads" / ZIP
    _fetch(_cfg(), data)
    # Snakemake's jobs: the plan, each shard, then the merge
    todo = prepare.plan(cfg, raw, out)
    for shard in sorted(todo["shard"].unique()):
        prepare.prepare_shard(cfg, raw, out, shard)
    assert kept.is_file()  # every shard done, no manifest yet: kept
    with pytest.raises(UserError, match=r"manifest.csv: not there, the corpus is not complete; fma_large.zip is kept"):
        prepare.remove_archive(cfg, raw, out)
    # a manifest that lacks a member (and rejects.csv too) does not count as complete
    prepare.merge(cfg, out)
    whole = (out / MANIFEST).read_text()
    lines = whole.splitlines(keepends=True)
    (out / MANIFEST).write_text("".join(line for line in lines if member("000140") not in line))
    with pytest.raises(UserError) as err:
        prepare.remove_archive(cfg, raw, out)
    assert str(err.value) == (
        f"{out / MANIFEST}: 1 members of {ZIP} are neither prepared nor rejected (first: {member('000140')}); "
        "the archive is kept: rerun prepare"
    )
    assert kept.is_file() and not sources.removed_marker(kept).exists()
    # `amlm prepare --merge` (the rule's command): the merge, then the removal
    run_command(prepare_command, cfg, "--raw", str(raw), "--out", str(out), "--merge")
    assert (out / MANIFEST).read_text() == whole and not kept.exists() and sources.removed_marker(kept).is_file()
    # the option off: nothing is removed
    kept.write_bytes(blob)
    assert prepare.remove_archive(make_config(_cfg()), raw, out) is None and kept.is_file()


def _free(monkeypatch, gib: float) -> None:
    monkeypatch.setattr(sources.shutil, "disk_usage", lambda p: type("Usage", (), {"free": int(gib * 2**30)})())


def test_prepare_refuses_what_does_not_fit_in_one_line_before_any_work(server, monkeypatch, tmp_path, blob):
    _serve(server, monkeypatch, tmp_path, blob, seconds_a_track=3600.0)  # as if each track were an hour long
    data = tmp_path / "data"
    _free(monkeypatch, 1000)
    _fetch(_cfg(), data)
    _free(monkeypatch, 1)  # 1.07 GB; 10 tracks of an hour as int16 at 24 kHz: 10 x 3600 x 24000 x 2 = 1.73 GB
    monkeypatch.setattr(prepare, "decode", lambda *a: pytest.fail("nothing is decoded"))
    monkeypatch.setattr(archive.ZipMembers, "read", lambda *a: pytest.fail("nothing is read"))
    for step in (prepare.run, prepare.plan):  # DVC's whole stage; Snakemake's first job
        with pytest.raises(UserError) as err:
            step(make_config(_cfg()), data / "raw", data / "prepared")
        assert str(err.value) == (
            f"prepare: 10 files need 1.7 GB of prepared audio (10.00 h, 3,600 s a track in {ZIP}, {NAME}'s published "
            f"length; int16 at 24000 Hz), and {data} has 1.1 GB free: free space or run from a larger disk "
            "(amlm preflight shows the plan)"
        )
        assert sorted(p.name for p in data.iterdir()) == ["downloads", "raw"]  # no prepared folder, no temporary one
    _free(monkeypatch, 2)  # 2.15 GB: it fits
    assert len(prepare.plan(make_config(_cfg()), data / "raw", data / "prepared")) == 12
    assert (data / "prepared" / PLAN).is_file()


def test_the_space_needed_is_the_seconds_by_their_headers_times_the_rate_and_the_sample_bytes(tmp_path):
    import numpy as np
    import soundfile as sf

    raw = tmp_path / "raw"
    raw.mkdir()
    sf.write(raw / "a.wav", np.full(44100 * 3, 0.1, np.float32), 44100)  # 3 s
    sf.write(raw / "b.flac", np.full((16000 * 2, 2), 0.1, np.float32), 16000)  # 2 s, stereo: prepared as mono
    (raw / "c.txt").write_text("not audio")  # rejected: nothing stored
    for fmt, bytes_per_sample in (("float32", 4), ("int16", 2)):
        cfg = make_config(preset(source="folder", folder=str(raw), sample_format=fmt))
        todo = prepare.plan(cfg, raw, tmp_path / fmt, check=False)
        assert prepare.check_space(cfg, raw, tmp_path / fmt, todo) == pytest.approx(5 * 24000 * bytes_per_sample / 1e9)
        # a resumed run counts only the shards still to do
        assert prepare.check_space(cfg, raw, tmp_path / fmt, todo[todo["path"] == "b.flac"]) == pytest.approx(
            2 * 24000 * bytes_per_sample / 1e9
        )


def test_a_member_read_from_the_zip_decodes_as_its_file_does(tmp_path, blob):
    path = tmp_path / ZIP
    path.write_bytes(blob)
    with archive.ZipMembers(path) as zipped:
        for track in ("000002", "000140", "010250"):
            data = zipped.read(member(track))
            (tmp_path / f"{track}.mp3").write_bytes(data)
            from_bytes = decode.decode(data, 24000, 320)
            from_file = decode.decode(tmp_path / f"{track}.mp3", 24000, 320)
            assert (
                from_bytes[0].tobytes() == from_file[0].tobytes() and from_bytes[1:] == from_file[1:] == TRACKS[track]
            )


def test_the_whole_stage_counts_a_killed_runs_finished_shards_as_there(tmp_path, monkeypatch):
    import numpy as np
    import soundfile as sf

    raw, out = tmp_path / "raw", tmp_path / "prepared"
    raw.mkdir()
    for name in ("a.wav", "b.wav"):  # 2 x 3 s: 6 s x 24000 x 4 bytes = 576,000 bytes as float32
        sf.write(raw / name, np.full(3 * 24000, 0.1, np.float32), 24000)
    cfg = make_config(preset(source="folder", folder=str(raw), sample_format="float32"))
    monkeypatch.setattr(sources.shutil, "disk_usage", lambda p: type("Usage", (), {"free": 400_000})())
    with pytest.raises(UserError) as err:
        prepare.run(cfg, raw, out)
    assert str(err.value) == (
        "prepare: 2 files need 0.000576 GB of prepared audio (0.00 h, by their headers; float32 at 24000 Hz), and "
        f"{tmp_path} has 0.0004 GB free: free space or run from a larger disk (amlm preflight shows the plan)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]
    # a killed run's finished shard (its process gone) holds 300,000 bytes of it already: 276,000 more fit
    killed = tmp_path / ".prepared.tmp-999999999-abc" / shard_name(0)
    killed.mkdir(parents=True)
    (killed / AUDIO).write_bytes(bytes(300_000))
    (killed / "shard.json").write_text("{}")
    prepare.run(cfg, raw, out)
    assert (out / MANIFEST).is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["prepared", "raw"]
