"""Downloads from a local HTTP server (tests/conftest.py's `server`): the hash and its prefixes,
retries, transfers resumed with a range request or restarted, and one-line failures."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from data_helpers import corpus, files_under, url_cfg
from helpers import make_tar, make_zip, sha256

from acoustic_mlm.data import download, fetch


def test_hash_prefixes_sha1_and_md5_and_upper_case(server, tmp_path):
    blob = make_tar(corpus())
    url = server.serve("/good/hashes.tar.gz", blob)
    for i, known in enumerate(
        ["sha1:" + hashlib.sha1(blob).hexdigest().upper(), "MD5:" + hashlib.md5(blob).hexdigest()]
    ):
        # a config file's schema refuses an upper-case algorithm; a Config made otherwise reaches the stage
        cfg = url_cfg(url, "sha256:" + "0" * 64)
        fetch.run(
            replace(cfg, data=replace(cfg.data, known_hash=known)), tmp_path / f"d{i}" / "raw", retries=0, timeout=10
        )
        assert (tmp_path / f"d{i}" / "raw" / "corpus" / "a" / "one.wav").is_file()


def test_wrong_hash_is_a_one_line_error_and_writes_nothing(server, tmp_path):
    blob = make_zip(corpus())
    url = server.serve("/bad/hash.zip", blob)
    data = tmp_path / "data"
    with pytest.raises(download.DownloadError, match=r"SHA256 hash of downloaded file .* does not match") as err:
        fetch.run(url_cfg(url, "sha256:" + "0" * 64), data / "raw", retries=3, timeout=10)
    assert "\n" not in str(err.value) and "data.known_hash" in str(err.value)
    assert not data.exists()  # no raw folder, no downloads folder, no partial file
    assert [p for p, _ in server.requests].count("/bad/hash.zip") == 1  # a complete download is not fetched again


def test_truncated_download_is_resumed_with_a_range_request(server, tmp_path):
    blob = make_tar(corpus()) + b"\0" * 50_000  # long enough to cut in two
    url = server.serve("/flaky/corpus.tar.gz", blob)
    server.truncate_once.add("/flaky/corpus.tar.gz")
    data = tmp_path / "data"
    fetch.run(url_cfg(url, sha256(blob)), data / "raw", retries=2, timeout=10)
    asked = [r for p, r in server.requests if p == "/flaky/corpus.tar.gz"]
    assert asked[0] is None and asked[1] == f"bytes={(len(blob)) // 2}-"  # the second asks for the rest only
    assert len(asked) == 2
    assert (data / "downloads" / "corpus.tar.gz").read_bytes() == blob
    assert (data / "raw" / "corpus" / "a" / "one.wav").read_bytes() == corpus()["corpus/a/one.wav"]


def test_broken_download_fails_cleanly_then_resumes_on_the_next_fetch(server, tmp_path):
    blob = make_zip(corpus()) + b"\0" * 50_000
    url = server.serve("/flaky/again.zip", blob)
    server.truncate_once.add("/flaky/again.zip")
    data = tmp_path / "data"
    with pytest.raises(download.DownloadError, match=r"failed after 1 attempt: .*") as err:
        fetch.run(url_cfg(url, sha256(blob)), data / "raw", retries=0, timeout=10)
    assert "\n" not in str(err.value)
    assert not (data / "raw").exists()
    assert files_under(data) == ["downloads/again.zip.part"]  # kept to resume
    fetch.run(url_cfg(url, sha256(blob)), data / "raw", retries=0, timeout=10)
    assert [r for p, r in server.requests if p == "/flaky/again.zip"][-1] == f"bytes={len(blob) // 2}-"
    assert files_under(data / "downloads") == ["again.zip"]
    assert (data / "raw" / "corpus" / "b" / "three.wav").is_file()


def test_server_that_ignores_range_restarts_the_file(server, tmp_path):
    blob = make_zip(corpus()) + b"\0" * 50_000
    path = "/norange/corpus.zip"
    url = server.serve(path, blob)
    server.truncate_once.add(path)
    server.ignore_range.add(path)
    fetch.run(url_cfg(url, sha256(blob)), tmp_path / "data" / "raw", retries=1, timeout=10)
    assert (tmp_path / "data" / "downloads" / "corpus.zip").read_bytes() == blob


def test_partial_content_from_the_wrong_offset_restarts_the_file(server, tmp_path):
    blob = make_zip(corpus()) + b"\0" * 50_000
    path = "/badrange/corpus.zip"
    url = server.serve(path, blob)
    server.truncate_once.add(path)
    server.range_from_zero.add(path)
    fetch.run(url_cfg(url, sha256(blob)), tmp_path / "data" / "raw", retries=1, timeout=10)
    assert (tmp_path / "data" / "downloads" / "corpus.zip").read_bytes() == blob
    assert [r for p, r in server.requests if p == path] == [None, f"bytes={len(blob) // 2}-", None]


def test_stale_part_longer_than_the_file_starts_over(server, tmp_path):
    blob = make_zip(corpus())
    url = server.serve("/stale/corpus.zip", blob)
    (tmp_path / "data" / "downloads").mkdir(parents=True)
    (tmp_path / "data" / "downloads" / "corpus.zip.part").write_bytes(b"x" * (len(blob) + 10))  # 416
    fetch.run(url_cfg(url, sha256(blob)), tmp_path / "data" / "raw", retries=0, timeout=10)
    assert (tmp_path / "data" / "downloads" / "corpus.zip").read_bytes() == blob


def test_corrupt_partial_download_is_discarded_by_the_hash_check(server, tmp_path):
    blob = make_zip(corpus())
    url = server.serve("/stale/corrupt.zip", blob)
    (tmp_path / "data" / "downloads").mkdir(parents=True)
    (tmp_path / "data" / "downloads" / "corrupt.zip.part").write_bytes(b"garbage!")  # resumed, wrong bytes
    fetch.run(url_cfg(url, sha256(blob)), tmp_path / "data" / "raw", retries=1, timeout=10)
    assert (tmp_path / "data" / "downloads" / "corrupt.zip").read_bytes() == blob


def test_missing_file_is_a_one_line_error_without_retries(server, tmp_path):
    with pytest.raises(download.DownloadError, match=r"404") as err:
        fetch.run(
            url_cfg(server.url("/nowhere.zip"), "sha256:" + "1" * 64), tmp_path / "data" / "raw", retries=3, timeout=10
        )
    assert "\n" not in str(err.value)
    assert not (tmp_path / "data").exists()
    assert [p for p, _ in server.requests].count("/nowhere.zip") == 1  # a client error is not worth retrying


def test_a_damaged_archive_in_the_downloads_folder_is_a_checksum_failure_not_a_network_one(server, tmp_path):
    """The server is unreachable (as offline); the archive kept from an earlier fetch was damaged
    since: named with its expected and actual hash at once, no download tried, no retries."""
    blob = make_zip(corpus())
    url = server.url("/gone/corpus.zip")  # never served: a download would fail as a network error
    known = "sha1:" + hashlib.sha1(blob).hexdigest()
    kept = tmp_path / "data" / "downloads" / "corpus.zip"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(blob[:-100] + bytes(100))  # its last 100 bytes zeroed
    actual = hashlib.sha1(kept.read_bytes()).hexdigest()
    cfg = url_cfg(url, "sha256:" + "0" * 64)
    cfg = replace(cfg, data=replace(cfg.data, known_hash=known))
    with pytest.raises(download.DownloadError) as err:
        fetch.run(cfg, tmp_path / "data" / "raw", retries=3, timeout=10)
    message = str(err.value)
    assert message.startswith(f"{kept}: sha1 is {actual}, expected {hashlib.sha1(blob).hexdigest()} for corpus.zip")
    assert "damaged or another file; remove it and fetch again" in message and "\n" not in message
    assert server.requests == [] or all(p != "/gone/corpus.zip" for p, _ in server.requests)
    assert kept.read_bytes() != blob and kept.is_file()  # left for the user to look at
    kept.write_bytes(blob)  # the archive as it should be: taken without a download
    fetch.run(cfg, tmp_path / "data" / "raw", retries=0, timeout=10)
    assert (tmp_path / "data" / "raw" / "corpus" / "a" / "one.wav").is_file()
