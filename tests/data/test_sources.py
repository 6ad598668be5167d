"""sources.py: what counts as audio, every entry of a folder in exactly one list with its reason, the
hash and file-name rules, and a file set's download URLs. The named corpora's URLs and checksums
and `archive_for` on a URL are in test_fetch.py."""

import os

import pytest
from data_helpers import data_section

from acoustic_mlm.data import sources
from acoustic_mlm.errors import UserError


def test_audio_is_judged_by_suffix_whatever_its_case():
    assert sources.is_audio_name("a/b/Song.FLAC") and sources.is_audio_name("x.opus")
    assert not sources.is_audio_name("notes.txt") and not sources.is_audio_name("wav")
    assert sources.not_audio_reason("a/track.M4A").startswith("unsupported audio format (.m4a): convert it to")
    assert sources.not_audio_reason("a/readme.md") == "not audio (libsndfile does not recognise its content)"


def test_walk_puts_every_entry_in_one_list_with_its_reason(tmp_path):
    for rel in ("b.wav", "a/c.flac", "a/notes.txt", ".hidden.wav", ".cache/d.wav", "SOURCE.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    (tmp_path / "alias.wav").symlink_to("b.wav")  # a link to a file: taken
    (tmp_path / "gone.wav").symlink_to("missing.wav")
    (tmp_path / "folder_link").symlink_to("a")
    os.mkfifo(tmp_path / "pipe.wav")
    listing = sources.walk(tmp_path, skip_top=("SOURCE.json",))
    assert [rel for rel, _ in listing.files] == ["a/c.flac", "a/notes.txt", "alias.wav", "b.wav"]
    assert listing.left_out == [
        (".cache/d.wav", sources.HIDDEN),
        (".hidden.wav", sources.HIDDEN),
        ("folder_link", "symbolic link to a folder (not followed)"),
        ("gone.wav", "broken symbolic link"),
        ("pipe.wav", "not a regular file (FIFO)"),
    ]
    assert sources.find_audio(tmp_path) == [tmp_path / "a/c.flac", tmp_path / "alias.wav", tmp_path / "b.wav"]


def test_a_name_that_is_not_utf8_is_left_out_and_written_safely(tmp_path):
    name = os.fsdecode(b"caf\xe9.wav")  # Latin-1 bytes: a surrogate escape in Python
    (tmp_path / name).write_bytes(b"x")
    listing = sources.walk(tmp_path)
    assert listing.files == []
    assert listing.left_out == [("caf\\xe9.wav", "file name is not valid UTF-8 (rename the file to include it)")]
    assert sources.safe_name("café.wav") == "café.wav"  # valid UTF-8 stays as it is


@pytest.mark.parametrize(
    "given, normal",
    [
        ("SHA256:" + "AB" * 32, "sha256:" + "ab" * 32),
        ("sha1:" + "0" * 40, "sha1:" + "0" * 40),
        ("Md5:" + "F" * 32, "md5:" + "f" * 32),
    ],
)
def test_hashes_are_normalised_to_lower_case(given, normal):
    assert sources.normalise_hash(given) == normal


@pytest.mark.parametrize(
    "bad, message",
    [
        ("ab" * 32, "is not <algorithm>:<hex>"),  # no algorithm
        ("sha512:" + "0" * 128, "is not <algorithm>:<hex>"),
        ("sha256:" + "g" * 64, "is not <algorithm>:<hex>"),
        ("md5:" + "0" * 40, "a md5 digest has 32 hex digits"),
    ],
)
def test_a_malformed_hash_is_one_line_naming_the_key(bad, message):
    with pytest.raises(UserError, match=message) as err:
        sources.normalise_hash(bad, key="data.known_hash")
    assert str(err.value).startswith("data.known_hash: ") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "url, name",
    [
        ("https://host/a/b/corpus.tar.gz", "corpus.tar.gz"),
        ("https://host/My%20Songs%20(2).zip?token=x#frag", "My_Songs__2_.zip"),
        ("https://host/.hidden.zip", "hidden.zip"),  # no leading dot: the file stays visible
        ("https://host/%2E%2E%2Fetc%2Fpasswd", "_etc_passwd"),  # a decoded slash cannot name a folder
        ("https://host", "download"),
    ],
)
def test_the_download_file_name_comes_from_the_url_made_safe(url, name):
    assert sources.filename_from_url(url) == name


def test_a_file_set_downloads_each_file_from_its_base_url_quoted():
    fs = sources.file_set_for(data_section(source="librosa", base_url="http://127.0.0.1:8000/audio"))
    members = fs.members()
    assert fs.base_url == "http://127.0.0.1:8000/audio/" and len(members) == len(sources.LIBROSA_SHA256) == 28
    fishing = next(m for m in members if m.filename == "Karissa_Hobbs_-_Let's_Go_Fishin'.ogg")
    assert fishing.url == "http://127.0.0.1:8000/audio/Karissa_Hobbs_-_Let%27s_Go_Fishin%27.ogg"
    assert fishing.known_hash == "sha256:" + sources.LIBROSA_SHA256[fishing.filename]
    assert [m.filename for m in members] == sorted(sources.LIBROSA_SHA256)
    assert sources.file_set_for(data_section(source="librosa", base_url=None)).base_url == sources.LIBROSA_URL


def test_the_disk_plan_of_a_zip_read_in_place_and_of_an_extracted_archive():
    # 1000 h as int16 at 24 kHz: 172.8 GB; 8 codebooks at 75 Hz as int16: 4.32 GB; a 100 GB archive
    def plan(**kw):
        return sources.disk_plan(1000 * 3600, 100.0, 24000, "int16", 8, 75.0, **kw)

    extracted, in_place, removed = plan(), plan(in_place=True), plan(in_place=True, remove_archive=True)
    assert extracted.peak_gb == extracted.final_gb == pytest.approx(100 + 100 + 172.8 + 4.32)
    assert in_place.extracted_gb == 0 and in_place.peak_gb == in_place.final_gb == pytest.approx(100 + 172.8 + 4.32)
    assert removed.peak_gb == pytest.approx(100 + 172.8)  # prepare's end: the archive and the prepared audio
    assert removed.final_gb == pytest.approx(172.8 + 4.32)  # the archive gone, the codes written
    assert plan(remove_archive=True) == extracted  # only an archive read in place is removed
    assert in_place.parts("int16") == "archive 100.0 read in place + prepared audio 172.8 (int16) + codes 4.3"
    assert removed.parts("int16").startswith("archive 100.0 read in place, removed once prepared + prepared")
    assert extracted.parts("int16").startswith("archive 100.0 + extracted 100.0 + prepared audio 172.8")


def test_fmas_zips_are_read_in_place_and_other_archives_extracted():
    assert all(sources.reads_in_place(data_section(source=f"fma_{s}")) for s in ("small", "medium", "large", "full"))
    for source in ("librispeech-dev-clean", "url", "folder", "synthetic", "librosa"):
        assert not sources.reads_in_place(data_section(source=source)), source
    assert sources.removed_marker(sources.Path("d/fma_large.zip")) == sources.Path("d/fma_large.zip.removed.json")


def test_check_room_refuses_in_one_line_naming_both_numbers_and_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(sources.shutil, "disk_usage", lambda p: type("U", (), {"free": 3 * 10**9})())
    assert sources.check_room("x needs 2 GB", 2.0, tmp_path / "not" / "yet") == (3.0, str(tmp_path))
    with pytest.raises(UserError) as err:
        sources.check_room("x needs 4 GB", 4.0, tmp_path / "not" / "yet")
    assert str(err.value) == (
        f"x needs 4 GB, and {tmp_path} has 3.0 GB free: free space or run from a larger disk (amlm preflight shows "
        "the plan)"
    )
