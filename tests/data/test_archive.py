"""archive.py called directly: a member escaping the folder refused before anything is written, the
kind judged by content, every member in exactly one count, and the compression-ratio rule's floor.
Unsafe archives through `amlm fetch` are in test_fetch.py, bombs and conflicting names in
tests/pipeline/test_hostile.py."""

import io
import zipfile

import pytest
from data_helpers import data_section
from helpers import make_tar, make_zip

from acoustic_mlm.data import archive


def _write(tmp_path, name: str, blob: bytes):
    path = tmp_path / name
    path.write_bytes(blob)
    return path


@pytest.mark.parametrize(
    "name, blob, member",
    [
        ("p.tar.gz", make_tar({"c/ok.wav": b"ok", "c/../../evil.wav": b"x"}), "c/../../evil.wav"),
        ("h.tar.gz", make_tar({"c/ok.wav": b"ok"}, hardlinks={"c/h.wav": "../outside.wav"}), "c/h.wav"),
        ("s.tar.gz", make_tar({"c/ok.wav": b"ok"}, symlinks={"c/s.wav": "/etc/passwd"}), "c/s.wav"),
        ("a.zip", make_zip({"c/ok.wav": b"ok", "/tmp/evil.wav": b"x"}), "/tmp/evil.wav"),
        ("d.zip", make_zip({"c/ok.wav": b"ok", "C:\\evil.wav": b"x"}), "C:\\evil.wav"),
    ],
    ids=["tar-parent", "tar-hardlink-out", "tar-symlink-absolute", "zip-absolute", "zip-drive-letter"],
)
def test_a_member_escaping_the_folder_is_refused_and_nothing_is_written(tmp_path, name, blob, member):
    path, dest = _write(tmp_path, name, blob), tmp_path / "out"
    with pytest.raises(archive.UnsafeArchiveError) as err:
        archive.extract(path, dest)
    assert str(err.value).startswith(f"refusing {name}: member {member!r} ")
    assert str(err.value).endswith("; nothing was extracted")
    assert not dest.exists() and sorted(p.name for p in tmp_path.iterdir()) == [name]  # c/ok.wav came first


def test_the_kind_is_read_from_the_content_not_the_name(tmp_path):
    assert archive.archive_kind(_write(tmp_path, "really_a_zip.tar.gz", make_zip({"a.wav": b"a"}))) == "zip"
    assert archive.archive_kind(_write(tmp_path, "really_a_tar.zip", make_tar({"a.wav": b"a"}))) == "tar"
    with pytest.raises(archive.ArchiveError, match="notes.zip: neither a zip nor a tar archive"):
        archive.archive_kind(_write(tmp_path, "notes.zip", b"plain text, not an archive"))


def test_every_member_lands_in_exactly_one_count(tmp_path):
    blob = make_tar({"c/a.wav": b"aaaa", "c/b.wav": b"bb", "c/notes.txt": b"n"}, symlinks={"c/l.wav": "a.wav"})
    done = archive.extract(_write(tmp_path, "x.tar.gz", blob), tmp_path / "out", keep=lambda rel: rel.endswith(".wav"))
    assert done.files == ["c/a.wav", "c/b.wav"] and done.bytes == 6
    assert done.not_kept == ["c/notes.txt"] and done.links_skipped == 1 and done.other_skipped == 0
    assert (tmp_path / "out" / "c" / "a.wav").read_bytes() == b"aaaa" and not (tmp_path / "out/c/notes.txt").exists()


def test_a_truncated_archive_is_one_line_naming_it(tmp_path):
    blob = make_zip({"c/a.wav": bytes(range(256)) * 64})
    path = _write(tmp_path, "cut.zip", blob[: len(blob) // 2])
    with pytest.raises(archive.ArchiveError, match="cut.zip: ") as err:
        archive.extract(path, tmp_path / "out")
    assert "\n" not in str(err.value)


def test_small_members_are_not_held_to_the_compression_ratio(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("quiet.wav", bytes(archive.RATIO_MIN_BYTES - 1))  # about 1000x, but under 1 MiB
        zf.writestr("loud.wav", bytes(archive.RATIO_MIN_BYTES))  # the same ratio at 1 MiB
    path = _write(tmp_path, "zeros.zip", buf.getvalue())
    with pytest.raises(archive.UnsafeArchiveError, match=r"member 'loud.wav' expands \d+x"):
        archive.extract(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    done = archive.extract(path, tmp_path / "out", limits=archive.ExtractLimits(max_ratio=5000))
    assert done.files == ["quiet.wav", "loud.wav"]


def test_limits_from_the_data_section():
    smoke = data_section()  # max_extract_gb: 256, max_compression_ratio: 100, as the defaults
    assert archive.ExtractLimits.from_config(smoke) == archive.ExtractLimits(max_bytes=256 * 10**9, max_ratio=100.0)
    half = archive.ExtractLimits.from_config(data_section(max_extract_gb=0.5))
    assert half == archive.ExtractLimits(500_000_000, 100.0)


def test_survey_counts_as_extract_does_and_writes_nothing(tmp_path):
    blob = make_zip({"c/a.wav": b"aaaa", "c/b.mp3": b"bb", "c/notes.txt": b"n"}, symlinks={"c/l.wav": "a.wav"})
    path = _write(tmp_path, "x.zip", blob)
    seen = archive.survey(path, keep=lambda rel: rel.endswith((".wav", ".mp3")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.zip"]
    done = archive.extract(path, tmp_path / "out", keep=lambda rel: rel.endswith((".wav", ".mp3")))
    assert seen == done and seen.files == ["c/a.wav", "c/b.mp3"] and seen.bytes == 6 and seen.links_skipped == 1
    with pytest.raises(archive.UnsafeArchiveError, match=r"^refusing e.zip: member '/tmp/evil.wav' has an absolute"):
        archive.survey(_write(tmp_path, "e.zip", make_zip({"c/ok.wav": b"ok", "/tmp/evil.wav": b"x"})))


def test_zip_members_are_read_into_memory_every_member_checked_first(tmp_path, monkeypatch):
    path = _write(tmp_path, "x.zip", make_zip({"c/a.wav": b"aaaa", "c/b.wav": bytes(range(256)) * 4}))
    with archive.ZipMembers(path) as zipped:
        assert zipped.read("c/b.wav") == bytes(range(256)) * 4 and zipped.read("c/a.wav") == b"aaaa"
        with pytest.raises(archive.ArchiveError, match=r"^x.zip: no regular-file member 'c/z.wav'$"):
            zipped.read("c/z.wav")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.zip"]
    # an unsafe member anywhere refuses the whole archive before any member is read
    unsafe = _write(tmp_path, "u.zip", make_zip({"c/ok.wav": b"ok", "c/../../evil.wav": b"x"}))
    opened = []
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: opened.append(a) or pytest.fail("a member was read"))
    with pytest.raises(archive.UnsafeArchiveError, match=r"^refusing u.zip: member 'c/../../evil.wav' climbs out"):
        archive.ZipMembers(unsafe)
    with pytest.raises(archive.ArchiveError, match=r"^t.tar.gz: not a zip archive"):
        archive.ZipMembers(_write(tmp_path, "t.tar.gz", make_tar({"c/a.wav": b"a"})))
    assert opened == []


def test_a_zip_member_past_the_limits_or_damaged_is_one_line_naming_it(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.wav", bytes(archive.RATIO_MIN_BYTES))  # about 1000x
    with pytest.raises(archive.UnsafeArchiveError, match=r"^refusing zeros.zip: member 'zeros.wav' expands \d+x"):
        archive.ZipMembers(_write(tmp_path, "zeros.zip", buf.getvalue()))
    blob = bytearray(make_zip({"c/a.wav": bytes(range(256)) * 64}))
    blob[60] ^= 0xFF  # inside the member's compressed bytes (after its 30 + 7-byte local header)
    with archive.ZipMembers(_write(tmp_path, "bad.zip", bytes(blob))) as zipped:
        with pytest.raises(archive.ArchiveError) as err:
            zipped.read("c/a.wav")
    assert str(err.value).startswith("bad.zip: cannot read member 'c/a.wav' (") and "\n" not in str(err.value)
