"""Fetch: archives from a url arrive intact, safe extraction, named corpora, folder sources (the
downloads themselves: test_download.py).

Every download is served by `Server`, an http.server on 127.0.0.1 in a thread that the tests
start themselves; nothing here reaches the network.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml
from data_helpers import SR, corpus, data_section, files_under, make_cfg, preset, tone_bytes, url_cfg
from helpers import make_config, make_tar, make_zip, real_audio_dir, real_audio_missing, sha256

from acoustic_mlm.artifacts.prepared import load_prepared
from acoustic_mlm.config import SCHEMA_PATH
from acoustic_mlm.data import archive, download, fetch, prepare, sources
from acoustic_mlm.errors import UserError

FIXTURES = Path(__file__).parents[1] / "fixtures"


# ------------------------------------------------------------------------------------------
# url source: the right files arrive


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_archive_from_url_arrives_intact(server, tmp_path, kind):
    members = corpus()
    blob = make_zip(members) if kind == "zip" else make_tar(members)
    url = server.serve(f"/good/corpus.{kind}", blob)
    data = tmp_path / "data"
    fetch.run(url_cfg(url, sha256(blob)), data / "raw", retries=0, timeout=10)

    audio = {k: v for k, v in members.items() if not k.endswith(".txt")}
    assert files_under(data / "raw") == sorted(["SOURCE.json", *audio])
    for name, payload in audio.items():
        assert (data / "raw" / name).read_bytes() == payload
    assert (data / "downloads" / f"corpus.{kind}").read_bytes() == blob  # kept for DVC
    assert files_under(data / "downloads") == [f"corpus.{kind}"]  # no .part left
    info = json.loads((data / "raw" / "SOURCE.json").read_text())
    assert info["source"] == "url" and info["url"] == url and info["known_hash"] == sha256(blob)
    assert info["files"] == 3 and info["other_files_skipped"] == 1 and info["archive"] == f"corpus.{kind}"
    assert not [p for p in data.iterdir() if p.name.startswith(".")]  # no temporary folders

    # A second fetch reuses the archive (its hash matches): no new request.
    before = len(server.requests)
    fetch.run(url_cfg(url, sha256(blob)), data / "raw", retries=0, timeout=10)
    assert len(server.requests) == before
    assert files_under(data / "raw") == sorted(["SOURCE.json", *audio])


def test_downloads_folder_is_configurable(server, tmp_path):
    blob = make_zip(corpus())
    url = server.serve("/good/elsewhere.zip", blob)
    fetch.run(url_cfg(url, sha256(blob)), tmp_path / "data" / "raw", tmp_path / "cache", retries=0, timeout=10)
    assert (tmp_path / "cache" / "elsewhere.zip").is_file()
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["raw"]


# ------------------------------------------------------------------------------------------
# Failures: not an archive, no audio in it (failed downloads: test_download.py)


def test_not_an_archive_is_a_one_line_error(server, tmp_path):
    blob = b"<html>a login page, not the archive</html>"
    url = server.serve("/html/corpus.zip", blob)
    with pytest.raises(archive.ArchiveError, match="neither a zip nor a tar"):
        fetch.run(url_cfg(url, sha256(blob)), tmp_path / "data" / "raw", retries=0, timeout=10)
    assert not (tmp_path / "data" / "raw").exists()


def test_archive_without_audio_is_an_error(server, tmp_path):
    blob = make_zip({"docs/README.txt": b"text only"})
    url = server.serve("/noaudio.zip", blob)
    with pytest.raises(UserError, match="holds no audio files"):
        fetch.run(url_cfg(url, sha256(blob)), tmp_path / "data" / "raw", retries=0, timeout=10)
    assert not (tmp_path / "data" / "raw").exists()


# ------------------------------------------------------------------------------------------
# Unsafe archives: refused before anything is written, the member named


def _unsafe_archives(outside: Path) -> dict[str, tuple[str, bytes, str]]:
    """case -> (file name, archive bytes, the member the error must name)."""
    good = {"corpus/ok.wav": tone_bytes("wav")}  # listed first: nothing may be written before the check
    wav = tone_bytes("wav", seconds=0.1)
    absolute = str(outside / "abs_evil.wav")
    return {
        "zip-parent": ("p.zip", make_zip({**good, "corpus/../../evil.wav": wav}), "corpus/../../evil.wav"),
        "zip-absolute": ("a.zip", make_zip({**good, absolute: wav}), absolute),
        "zip-symlink": (
            "s.zip",
            make_zip(good, symlinks={"corpus/link.wav": "../../../outside.wav"}),
            "corpus/link.wav",
        ),
        "zip-backslash": ("b.zip", make_zip({**good, "..\\evil.wav": wav}), "..\\evil.wav"),
        "tar-parent": ("p.tar.gz", make_tar({**good, "../evil.wav": wav}), "../evil.wav"),
        "tar-absolute": ("a.tar.gz", make_tar({**good, absolute: wav}), absolute),
        "tar-symlink": ("s.tar.gz", make_tar(good, symlinks={"corpus/passwd.wav": "/etc/passwd"}), "corpus/passwd.wav"),
        "tar-symlink-up": ("u.tar.gz", make_tar(good, symlinks={"corpus/up": "../.."}), "corpus/up"),
        "tar-hardlink": (
            "h.tar.gz",
            make_tar(good, hardlinks={"corpus/hard.wav": "../outside.wav"}),
            "corpus/hard.wav",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "zip-parent",
        "zip-absolute",
        "zip-symlink",
        "zip-backslash",
        "tar-parent",
        "tar-absolute",
        "tar-symlink",
        "tar-symlink-up",
        "tar-hardlink",
    ],
)
def test_unsafe_archive_is_refused_naming_the_member(server, tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    name, blob, member = _unsafe_archives(outside)[case]
    url = server.serve(f"/unsafe/{case}/{name}", blob)
    data = tmp_path / "project" / "data"
    with pytest.raises(archive.UnsafeArchiveError) as err:
        fetch.run(url_cfg(url, sha256(blob)), data / "raw", retries=0, timeout=10)
    msg = str(err.value)
    assert repr(member) in msg and name in msg and "nothing was extracted" in msg and "\n" not in msg
    assert not (data / "raw").exists()
    assert files_under(tmp_path) == [f"project/data/downloads/{name}"]  # nothing else, anywhere


def test_links_inside_the_archive_are_skipped_not_followed(tmp_path):
    blob = make_tar(
        {"c/a.wav": tone_bytes("wav")},
        symlinks={"c/alias.wav": "a.wav", "c/d/up.wav": "../a.wav"},
        hardlinks={"c/hard.wav": "c/a.wav"},
    )
    (tmp_path / "x.tar.gz").write_bytes(blob)
    done = archive.extract(tmp_path / "x.tar.gz", tmp_path / "out")
    assert done.files == ["c/a.wav"] and done.links_skipped == 3
    assert files_under(tmp_path / "out") == ["c/a.wav"]
    assert not any(p.is_symlink() for p in (tmp_path / "out").rglob("*"))


def test_member_names_and_link_targets_that_leave_the_root_are_unsafe():
    ok, why = archive._relative("./a//b/./c.wav")
    assert ok.as_posix() == "a/b/c.wav" and why is None
    assert archive._relative("a/../../b")[1] and archive._relative("C:/x.wav")[1] and archive._relative("a\x00b")[1]
    assert archive._relative("a/..b/c..wav")[1] is None  # dots inside names are fine
    assert not archive._link_escapes(archive._relative("a/b/l")[0], "../c.wav", hard=False)
    assert archive._link_escapes(archive._relative("a/l")[0], "../../c.wav", hard=False)
    assert archive._link_escapes(archive._relative("a/l")[0], "../c.wav", hard=True)  # hard links: from the root


# ------------------------------------------------------------------------------------------
# Named corpora: FMA (Deflate64) and LibriSpeech, resolved without downloading


def test_source_definitions_match_the_design_and_the_schema():
    schema = json.loads(SCHEMA_PATH.read_text())
    enum = set(schema["properties"]["data"]["properties"]["source"]["enum"])
    assert set(fetch.SOURCES) == enum
    assert set(sources.ARCHIVES) == enum - {"synthetic", "tones", "folder", "url", *sources.FILE_SETS}
    assert set(sources.FILE_SETS) == {"librosa"}

    sha1 = {
        "fma_small": "ade154f733639d52e35e32f5593efe5be76c6d70",  # DESIGN.md section 1
        "fma_medium": "c67b69ea232021025fca9231fc1c7c1a063ab50b",
        "fma_large": "497109f4dd721066b5ce5e5f250ec604dc78939e",
    }
    for name, digest in sha1.items():
        s = sources.ARCHIVES[name]
        assert s.url == f"https://os.unil.cloud.switch.ch/fma/{name}.zip"
        assert (s.algorithm, s.known_hash) == ("sha1", f"sha1:{digest}") and s.filename == f"{name}.zip"
        assert s.expects(f"{name}/000/000002.mp3") and s.expects(f"{name}/155/155066.mp3")
        assert not s.expects(f"{name}/README.txt") and not s.expects("fma_full/000/000002.mp3")
        assert s.excluded(f"{name}/098/098565.mp3") and not s.excluded(f"{name}/000/000002.mp3")
    assert sources.FMA_CORRUPT_TRACKS == {"098565", "098567", "098569", "099134", "108925", "133297"}

    subsets = [
        "dev-clean",
        "dev-other",
        "test-clean",
        "test-other",
        "train-clean-100",
        "train-clean-360",
        "train-other-500",
    ]
    for subset in subsets:
        s = sources.ARCHIVES[f"librispeech-{subset}"]
        assert s.url == f"https://www.openslr.org/resources/12/{subset}.tar.gz"
        assert s.algorithm == "sha256" and len(s.known_hash) == len("sha256:") + 64
        assert s.expects(f"LibriSpeech/{subset}/84/121123/84-121123-0000.flac")
        assert not s.expects(f"LibriSpeech/{subset}/84/121123/84-121123.trans.txt") and not s.excluded("x/1-2-3.flac")
    assert sources.ARCHIVES["librispeech-dev-clean"].known_hash.endswith(
        "76f87d090650617fca0cac8f88b9416e0ebf80350acb97b343a85fa903728ab3"
    )


def test_librispeech_checksums_match_torchaudio():
    """The table's provenance: torchaudio's own list, when torchaudio is installed."""
    ls = pytest.importorskip("torchaudio.datasets.librispeech")
    theirs = {url.rsplit("/", 1)[1].removesuffix(".tar.gz"): h for url, h in ls._CHECKSUMS.items()}
    assert theirs == sources.LIBRISPEECH_SHA256


def test_url_source_resolution():
    s = sources.archive_for(
        data_section(
            source="url", url="https://example.org/path/My%20Corpus.tar.gz?x=1", known_hash="SHA256:" + "AB" * 32
        )
    )
    assert s.filename == "My_Corpus.tar.gz" and s.known_hash == "sha256:" + "ab" * 32 and s.layout is None
    assert sources.filename_from_url("https://example.org/") == "download"
    with pytest.raises(UserError, match="has 64 hex digits"):
        sources.archive_for(data_section(source="url", url="https://e.org/a.zip", known_hash="sha256:abc"))
    with pytest.raises(UserError, match="not an http"):
        sources.archive_for(data_section(source="url", url="file:///tmp/a.zip", known_hash="md5:" + "0" * 32))


def test_fma_deflate64_fixture_skips_the_corrupt_track(server, tmp_path, monkeypatch):
    blob = (FIXTURES / "fma_small_deflate64.zip").read_bytes()
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:  # the fixture really is Deflate64 (method 9)
        assert {i.compress_type for i in zf.infolist() if not i.is_dir()} == {9}
    real = sources.ARCHIVES["fma_small"]
    url = server.serve("/fma/fma_small.zip", blob)
    monkeypatch.setitem(
        sources.ARCHIVES, "fma_small", replace(real, url=url, known_hash="sha1:" + hashlib.sha1(blob).hexdigest())
    )
    monkeypatch.delitem(sources.KNOWN_CORPORA, "fma_small")  # a small fixture in its place: no disk plan
    data = tmp_path / "data"
    cfg = preset(source="fma_small", url=None, known_hash=None, folder=None, sample_rate=SR)
    fetch.run(make_config(cfg), data / "raw", retries=0, timeout=10)
    assert files_under(data / "raw") == ["SOURCE.json"]  # FMA's zips are read in place by prepare: nothing extracted
    info = json.loads((data / "raw" / "SOURCE.json").read_text())
    assert info["excluded_known_corrupt"] == ["fma_small/098/098565.mp3"] and info["other_files_skipped"] == 1
    assert info["off_layout"] == 0 and info["archive"] == "fma_small.zip"
    assert info["read_in_place"] is True and info["members"] == ["fma_small/000/000002.mp3"]
    assert info["archive_path"] == "../downloads/fma_small.zip"
    with archive.ZipMembers(data / "downloads" / "fma_small.zip") as zipped:
        x, sr = sf.read(io.BytesIO(zipped.read("fma_small/000/000002.mp3")))
    assert sr == SR and len(x) == SR and np.abs(x).max() > 0.2  # the Deflate64 member decompressed intact


def test_fma_archive_with_the_wrong_layout_is_refused(server, tmp_path, monkeypatch):
    blob = make_zip({"music/song.mp3": tone_bytes("mp3")})
    url = server.serve("/fma/wrong.zip", blob)
    monkeypatch.setitem(
        sources.ARCHIVES, "fma_medium", replace(sources.ARCHIVES["fma_medium"], url=url, known_hash=sha256(blob))
    )
    monkeypatch.delitem(sources.KNOWN_CORPORA, "fma_medium")  # a small fixture in its place: no disk plan
    cfg = preset(source="fma_medium", url=None, known_hash=None, folder=None, sample_rate=SR)
    with pytest.raises(UserError, match=r"does not look like fma_medium.*'music/song.mp3'"):
        fetch.run(make_config(cfg), tmp_path / "data" / "raw", retries=0, timeout=10)


def test_librispeech_like_tar_gz(server, tmp_path, monkeypatch):
    flac = tone_bytes("flac", sr=16000)
    blob = make_tar(
        {
            "LibriSpeech/dev-clean/84/121123/84-121123-0000.flac": flac,
            "LibriSpeech/dev-clean/84/121123/84-121123-0001.flac": flac,
            "LibriSpeech/dev-clean/84/121123/84-121123.trans.txt": b"84-121123-0000 HELLO\n",
            "LibriSpeech/LICENSE.TXT": b"CC BY 4.0\n",
        }
    )
    url = server.serve("/openslr/dev-clean.tar.gz", blob)
    monkeypatch.setitem(
        sources.ARCHIVES,
        "librispeech-dev-clean",
        replace(sources.ARCHIVES["librispeech-dev-clean"], url=url, known_hash=sha256(blob)),
    )
    cfg = preset(source="librispeech-dev-clean", url=None, known_hash=None, folder=None, sample_rate=SR)
    fetch.run(make_config(cfg), tmp_path / "data" / "raw", retries=0, timeout=10)
    assert files_under(tmp_path / "data" / "raw") == [
        "LibriSpeech/dev-clean/84/121123/84-121123-0000.flac",
        "LibriSpeech/dev-clean/84/121123/84-121123-0001.flac",
        "SOURCE.json",
    ]
    assert (tmp_path / "data" / "downloads" / "librispeech-dev-clean.tar.gz").is_file()


# ------------------------------------------------------------------------------------------
# folder source


def test_folder_source_links_or_copies_audio_keeping_paths(tmp_path):
    src = tmp_path / "music"
    (src / "album" / "disc1").mkdir(parents=True)
    (src / ".cache").mkdir()
    (src / "album" / "disc1" / "01.flac").write_bytes(tone_bytes("flac"))
    (src / "album" / "02.MP3").write_bytes(tone_bytes("mp3"))
    (src / "cover.jpg").write_bytes(b"\xff\xd8 not audio")
    (src / ".cache" / "x.wav").write_bytes(tone_bytes("wav"))
    cfg = preset(source="folder", folder=str(src), url=None, known_hash=None, sample_rate=SR)
    out = tmp_path / "data" / "raw"
    fetch.run(make_config(cfg), out)
    assert files_under(out) == ["SOURCE.json", "album/02.MP3", "album/disc1/01.flac"]
    assert (out / "album" / "02.MP3").read_bytes() == (src / "album" / "02.MP3").read_bytes()
    info = json.loads((out / "SOURCE.json").read_text())
    assert info["files"] == 2 and info["hard_linked"] + info["copied"] == 2 and info["hidden_skipped"] == 1
    assert info["hard_linked"] == 2  # same filesystem (tmp_path)
    fetch.run(make_config(cfg), out)  # again: replacing the links leaves the originals alone
    assert (src / "album" / "disc1" / "01.flac").read_bytes() == (out / "album" / "disc1" / "01.flac").read_bytes()


def test_folder_source_copies_across_filesystems(tmp_path, monkeypatch):
    src = tmp_path / "music"
    src.mkdir()
    (src / "a.wav").write_bytes(tone_bytes("wav"))

    def no_link(*a, **k):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(fetch.os, "link", no_link)
    cfg = preset(source="folder", folder=str(src), url=None, known_hash=None, sample_rate=SR)
    fetch.run(make_config(cfg), tmp_path / "raw")
    info = json.loads((tmp_path / "raw" / "SOURCE.json").read_text())
    assert (info["copied"], info["hard_linked"]) == (1, 0)
    assert (tmp_path / "raw" / "a.wav").stat().st_ino != (src / "a.wav").stat().st_ino


def test_folder_source_errors(tmp_path):
    def cfg(folder):
        return preset(source="folder", folder=str(folder), url=None, known_hash=None)

    with pytest.raises(UserError, match="is not a folder"):
        fetch.run(make_config(cfg(tmp_path / "missing")), tmp_path / "data" / "raw")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="no audio files"):
        fetch.run(make_config(cfg(tmp_path / "empty")), tmp_path / "data" / "raw")
    with pytest.raises(UserError, match="must not contain each other"):
        fetch.run(make_config(cfg(tmp_path / "data")), tmp_path / "data" / "raw")
    assert not (tmp_path / "data" / "raw").exists()


# ------------------------------------------------------------------------------------------
# End to end through the CLI


def _amlm(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_cli_fetch_and_prepare_from_a_url(server, tmp_path, root):
    members = {f"songs/s{i}.wav": tone_bytes("wav", seconds=1.0, hz=200 + 50 * i, sr=32000) for i in range(4)}
    buf = io.BytesIO()
    sf.write(buf, np.zeros(SR, np.float32), SR, format="WAV")
    members["songs/silent.wav"] = buf.getvalue()
    blob = make_tar(members)
    url = server.serve("/e2e/songs.tar.gz", blob)
    cfg = yaml.safe_load((root / "config" / "smoke.yaml").read_text())
    cfg["data"].update(source="url", url=url, known_hash=sha256(blob))
    cfg["tokenizer"]["mode"] = "pretrained"  # 4 s of audio: too little to calibrate a tokenizer on (prepare refuses)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))

    fetched = _amlm("fetch", "--config", "config.yaml", cwd=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "data" / "downloads" / "songs.tar.gz").is_file()
    prepared = _amlm("prepare", "--config", "config.yaml", cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    assert "kept 4 files, rejected 1" in prepared.stderr
    manifest = load_prepared(tmp_path / "data" / "prepared").manifest
    assert manifest["path"].tolist() == [f"songs/s{i}.wav" for i in range(4)]
    rejects = (tmp_path / "data" / "prepared" / "rejects.csv").read_text().splitlines()
    assert rejects[0] == "path,reason" and rejects[1].startswith("songs/silent.wav,digital silence")

    cfg["data"]["url"] = server.url("/e2e/missing.tar.gz")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    failed = _amlm("fetch", "--config", "bad.yaml", "--out", "data/raw2", cwd=tmp_path)
    assert failed.returncode == 2
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("amlm fetch: error: fetch: downloading ") and "404" in last
    assert not (tmp_path / "data" / "raw2").exists()
    assert [p for p, _ in server.requests].count("/e2e/missing.tar.gz") == 1  # a 404 is not retried


# ------------------------------------------------------------------------------------------
# The librosa example recordings: file by file, each with its sha256, from data.base_url


def shared_copy(name: str) -> Path:
    """The shared copy of a registry file (the shared folder drops the apostrophes of one name)."""
    return real_audio_dir() / name.replace("'", "")


@pytest.mark.skipif(real_audio_missing() is not None, reason=str(real_audio_missing()))
def test_librosa_source_downloads_every_file_and_checks_its_sha256(server, tmp_path):
    from urllib.parse import quote

    assert len(sources.LIBROSA_SHA256) == 28  # 14 recordings, each with its licence
    for name, _digest in sources.LIBROSA_SHA256.items():
        server.serve(f"/librosa-data/{quote(name)}", shared_copy(name).read_bytes())
    cfg = preset(source="librosa", base_url=server.url("/librosa-data/"), sample_rate=SR)
    out = tmp_path / "data" / "raw"
    fetch.run(make_config(cfg), out)
    got = sorted(p.name for p in out.iterdir())
    assert got == sorted([*sources.LIBROSA_SHA256, "SOURCE.json"])
    for name, digest in sources.LIBROSA_SHA256.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    info = json.loads((out / "SOURCE.json").read_text())
    assert (info["source"], info["files"], info["audio_files"], info["skipped"]) == ("librosa", 28, 14, [])
    asked = len(server.requests)
    fetch.run(make_config(cfg), out)  # again: every kept download passes its hash, nothing is asked for
    assert len(server.requests) == asked

    name = "pibble.ogg"  # a server that serves other bytes: refused, naming the key to check
    server.files[f"/librosa-data/{name}"] = b"not pibble"
    (tmp_path / "data" / "downloads" / "librosa" / name).unlink()
    with pytest.raises(download.DownloadError, match=r"pibble\.ogg.*check data\.base_url$"):
        fetch.run(make_config(cfg), tmp_path / "data" / "raw2")
    assert not (tmp_path / "data" / "raw2").exists()


def test_librosa_source_needs_an_http_base_url():
    with pytest.raises(UserError, match="^data.base_url: 'file:///x' is not an http"):
        sources.file_set_for(data_section(source="librosa", base_url="file:///x"))
    librosa = data_section(source="librosa", base_url=None)
    assert sources.file_set_for(librosa).base_url == "https://librosa.org/data/audio/"
    member = {m.filename: m for m in sources.file_set_for(librosa).members()}
    assert member["Karissa_Hobbs_-_Let's_Go_Fishin'.ogg"].url.endswith("Karissa_Hobbs_-_Let%27s_Go_Fishin%27.ogg")


def test_archive_members_that_are_not_files_are_counted_and_named(server, tmp_path):
    """Devices and FIFOs named *.wav in a tar are never extracted; SOURCE.json counts and names
    them, and prepare lists them in rejects.csv with the archive's other left-out members."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for i in range(2):
            data = tone_bytes("wav")
            info = tarfile.TarInfo(f"c/a{i}.wav")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, kind in (("c/fifo.wav", tarfile.FIFOTYPE), ("c/dev.wav", tarfile.CHRTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            tf.addfile(info)
        notes = b"notes"
        info = tarfile.TarInfo("c/notes.txt")
        info.size = len(notes)
        tf.addfile(info, io.BytesIO(notes))
    data = buf.getvalue()
    cfg = make_cfg(valid_fraction=0.5, split_seed=0, crop_seconds=0.1, shard_files=4)
    cfg["data"].update(source="url", url=server.serve("/special.tar.gz", data), known_hash=sha256(data))
    fetch.run(make_config(cfg), tmp_path / "raw")
    info = json.loads((tmp_path / "raw" / "SOURCE.json").read_text())
    assert (info["files"], info["special_skipped"], info["other_files_skipped"]) == (2, 2, 1)
    assert {s["path"]: s["reason"] for s in info["skipped"]} == {
        "c/dev.wav": "not a regular file (character device) in the archive (not extracted)",
        "c/fifo.wav": "not a regular file (FIFO) in the archive (not extracted)",
        "c/notes.txt": "not an audio file name (not extracted)",
    }
    prepare.run(make_config(cfg), tmp_path / "raw", tmp_path / "prepared")
    rejects = prepare.pd.read_csv(tmp_path / "prepared" / "rejects.csv")
    assert sorted(rejects["path"]) == ["c/dev.wav", "c/fifo.wav", "c/notes.txt"]
    assert sorted(load_prepared(tmp_path / "prepared").manifest["path"]) == ["c/a0.wav", "c/a1.wav"]


# ------------------------------------------------------------------------------------------
# Replacing a folder the user already has: stopped at any moment, data/raw is the old folder or the
# new one, complete, and no temporary name survives (or the next command removes it, and says so).
#
# The child runs `amlm fetch` with one call wrapped so that the process signals itself at an exact
# moment: right after the temporary folder is created, after the new folder is built, right after
# the old one is renamed aside, right after the new one is renamed in, when the old one is removed.

STOP_AT = r"""
import os, shutil, signal, sys, tempfile
from pathlib import Path
from acoustic_mlm import cli
from acoustic_mlm.data import fetch

moment, sig, final = sys.argv[1], getattr(signal, sys.argv[2]), Path(sys.argv[3]).absolute()
stop = lambda: os.kill(os.getpid(), sig)
real_rename, real_replace, real_mkdtemp, real_rmtree = os.rename, os.replace, tempfile.mkdtemp, shutil.rmtree

def mkdtemp(*a, **k):
    p = real_mkdtemp(*a, **k)
    if Path(p).name.startswith(f".{final.name}.tmp-"):
        stop()
    return p

def rename(src, dst, *a, **k):
    real_rename(src, dst, *a, **k)
    if ".old-" in Path(dst).name:
        stop()

def replace(src, dst, *a, **k):
    real_replace(src, dst, *a, **k)
    if Path(dst).absolute() == final:
        stop()

def rmtree(p, *a, **k):
    if ".old-" in Path(p).name and not getattr(rmtree, "done", False):
        rmtree.done = True
        stop()
    return real_rmtree(p, *a, **k)

def build(cfg, out, ctx, real=fetch.SOURCES["folder"]):
    info = real(cfg, out, ctx)
    stop()
    return info

if moment == "created":
    tempfile.mkdtemp = mkdtemp
elif moment == "built":
    fetch.SOURCES["folder"] = build
elif moment == "aside":
    os.rename = rename
elif moment == "swapped":
    os.replace = replace
elif moment == "removing":
    shutil.rmtree = rmtree
sys.exit(cli.main(sys.argv[4:]))
"""


@pytest.fixture()
def two_sources(tmp_path, root):
    """data/raw fetched from folder `old` (3 files); a config fetching folder `new` (2 other files)."""
    cfg = yaml.safe_load((root / "config" / "smoke.yaml").read_text())
    for name, n in (("old", 3), ("new", 2)):
        for i in range(n):
            (tmp_path / name / f"{name}{i}.wav").parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / f"{name}{i}.wav").write_bytes(tone_bytes("wav", hz=300 + 40 * i))
        cfg["data"].update(source="folder", folder=str(tmp_path / name))
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    assert _amlm("fetch", "--config", "old.yaml", "--out", "data/raw", cwd=tmp_path).returncode == 0
    return tmp_path


def _stopped_fetch(where, moment, sig):
    return subprocess.run(
        [sys.executable, "-c", STOP_AT, moment, sig, "data/raw", "fetch", "--config", "new.yaml", "--out", "data/raw"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _which(where) -> str:
    """'old' or 'new': the folder under data/raw, checked complete (every file of its source, its record)."""
    raw = where / "data" / "raw"
    record = json.loads((raw / "SOURCE.json").read_text())
    name = Path(record["folder"]).name
    assert files_under(raw) == sorted(["SOURCE.json", *(p.name for p in (where / name).iterdir())]), name
    for p in (where / name).iterdir():
        assert (raw / p.name).read_bytes() == p.read_bytes()
    return name


def _leftovers(where) -> list[str]:
    return sorted(p.name for p in (where / "data").iterdir() if p.name.startswith("."))


@pytest.mark.parametrize(
    "moment, kept",
    [
        ("created", "old"),  # the instant after the temporary folder exists
        ("built", "old"),  # the new folder complete under its temporary name
        ("aside", "new"),  # the old folder just renamed aside: the stop waits until the new one is in
        ("swapped", "new"),  # the new one just renamed in, the old one not yet removed
        ("removing", "new"),  # while the old one is removed
    ],
)
def test_a_sigterm_while_fetch_replaces_data_raw_leaves_the_old_or_the_new_folder_complete(two_sources, moment, kept):
    proc = _stopped_fetch(two_sources, moment, "SIGTERM")
    assert proc.returncode == 143 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert _which(two_sources) == kept
    assert _leftovers(two_sources) == []  # no temporary name, no old copy aside


@pytest.mark.slow
def test_a_sigkill_between_the_two_renames_is_recovered_by_the_next_command_which_says_so(two_sources):
    proc = _stopped_fetch(two_sources, "aside", "SIGKILL")
    assert proc.returncode == -9
    assert not (two_sources / "data" / "raw").exists()  # the one instant a kill can leave: both aside
    assert [n.split("-")[0] for n in _leftovers(two_sources)] == [".raw.old", ".raw.tmp"]
    planned = _amlm("prepare", "--config", "new.yaml", "--plan", "--out", "data/prepared", cwd=two_sources)
    assert planned.returncode == 0, planned.stderr
    assert "data/raw: put back the previous copy, which a stopped command had renamed aside" in planned.stderr
    assert _which(two_sources) == "old"
    assert planned.stderr.count("put back") == 1 and (two_sources / "data" / "prepared" / "shards.csv").is_file()
    again = _amlm("fetch", "--config", "new.yaml", "--out", "data/raw", cwd=two_sources)  # removes the rest
    assert again.returncode == 0 and "removed 1 temporary name(s) of a killed earlier run" in again.stderr
    assert _which(two_sources) == "new" and _leftovers(two_sources) == []


@pytest.mark.parametrize(
    "moment, kept, said",
    [
        ("created", "old", "removed 1 temporary name(s) of a killed earlier run beside data/raw"),
        ("built", "old", "removed 1 temporary name(s) of a killed earlier run beside data/raw"),
        ("removing", "new", "data/raw: removed the previous copy"),
    ],
)
def test_what_a_sigkill_leaves_beside_data_raw_the_next_fetch_removes_and_says_so(two_sources, moment, kept, said):
    assert _stopped_fetch(two_sources, moment, "SIGKILL").returncode == -9
    assert _which(two_sources) == kept and len(_leftovers(two_sources)) == 1
    again = _amlm("fetch", "--config", "old.yaml", "--out", "data/raw", cwd=two_sources)
    assert again.returncode == 0 and said in again.stderr, again.stderr
    assert _which(two_sources) == "old" and _leftovers(two_sources) == []


def _free(monkeypatch, gib: float) -> None:
    monkeypatch.setattr(sources.shutil, "disk_usage", lambda p: type("Usage", (), {"free": int(gib * 2**30)})())


def test_a_named_corpus_whose_peak_does_not_fit_is_refused_before_anything_is_downloaded(tmp_path, monkeypatch):
    cfg = make_config(preset(source="fma_small", sample_format="int16"))
    monkeypatch.setattr(fetch, "download", lambda *a, **k: pytest.fail("nothing is downloaded"))
    _free(monkeypatch, 15)
    with pytest.raises(UserError) as err:
        fetch.run(cfg, tmp_path / "data" / "raw")
    msg = str(err.value)
    # fma_small: 7.73 GB archive read in place (nothing extracted), 66.7 h as int16 at 24 kHz (11.5 GB), codes (0.3 GB)
    assert "\n" not in msg and msg.startswith("fetch: fma_small needs 20 GB at its peak (archive 7.7 read in place + ")
    assert f"and {tmp_path} has 16.1 GB free" in msg and "prepared audio 11.5 (int16) + codes 0.3" in msg
    assert not (tmp_path / "data").exists()  # refused before any folder was made
    # an archive already downloaded counts as there
    kept = tmp_path / "data" / "downloads" / "fma_small.zip"
    kept.parent.mkdir(parents=True)
    with open(kept, "wb") as fh:
        fh.truncate(int(7.2 * 2**30))  # sparse: its size, not its bytes
    monkeypatch.setattr(fetch, "download", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("download reached")))
    with pytest.raises(RuntimeError, match="download reached"):
        fetch.run(cfg, tmp_path / "data" / "raw")


def test_a_corpus_of_unknown_size_is_not_held_to_a_plan(tmp_path, monkeypatch):
    _free(monkeypatch, 0)
    fetch.check_disk(make_config(make_cfg()), tmp_path / "raw", tmp_path / "downloads")  # synthetic: passes
