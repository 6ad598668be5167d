"""Downloading one file (an archive, a checkpoint) into a folder, checked against its hash, with
retries and resumed transfers: the fetch stage's downloads and the tokenizer's EnCodec checkpoint.

pooch downloads and checks the hash; `ResumableHTTPDownloader` resumes a broken HTTP transfer with
Range requests; `download` retries network errors (not a hash mismatch, unless the bytes came
partly from an earlier transfer).
"""

from __future__ import annotations

import ftplib
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

from acoustic_mlm.data import sources
from acoustic_mlm.errors import UserError, one_line
from acoustic_mlm.utils import Progress, log

DEFAULT_RETRIES = 3  # further attempts after a network error or a resumed download that failed its hash
DEFAULT_TIMEOUT_S = 60.0  # seconds to connect, and between two received chunks


class DownloadError(UserError, ValueError):
    """A download that failed for good (network, HTTP status, hash mismatch); one line."""


class PermanentHTTPError(Exception):
    """An HTTP client error (404, 403, ...): not worth retrying."""


# ------------------------------------------------------------------------------------------
# Downloading


class ResumableHTTPDownloader:
    """A pooch downloader (`downloader=`) for http(s) that resumes partial downloads.

    Bytes go to `part` (`<archive>.part` in the downloads folder). When a transfer breaks, the
    part stays; the next attempt (pooch's retry, or the next `amlm fetch`) asks only for the
    rest with `Range: bytes=<have>-`. A server that ignores Range (status 200) restarts the
    file; a 416 (the part is as long as the file or longer) starts over too. A short transfer
    raises a requests exception, which `download` retries. When complete, the part is moved onto
    pooch's temporary file, which pooch hash-checks and renames onto the archive or deletes:
    a corrupted part is therefore never resumed twice. Client errors (404, 403) are not retried.
    """

    def __init__(self, part: Path, timeout: float = DEFAULT_TIMEOUT_S, chunk_size: int = 1 << 20):
        self.part, self.timeout, self.chunk_size = Path(part), timeout, chunk_size
        self.resumed = False

    def __call__(self, url: str, output_file, pooch, check_only: bool = False):
        import requests

        if check_only:
            response = requests.head(url, timeout=self.timeout, allow_redirects=True)
            return response.status_code == 200
        self.resumed = False
        have = self.part.stat().st_size if self.part.exists() else 0
        response = self._get(url, have)
        if have and (response.status_code == 416 or (response.status_code == 206 and _range_start(response) != have)):
            response.close()  # nothing left to ask for, or not the bytes asked for: start over
            have = 0
            response = self._get(url, 0)
        with response:
            if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
                raise PermanentHTTPError(f"HTTP {response.status_code} {response.reason} for {url}")
            response.raise_for_status()
            resumed = have > 0 and response.status_code == 206
            if not resumed:
                have = 0  # a 200: the server sends the whole file
            length = response.headers.get("Content-Length")
            expected = have + int(length) if length is not None else None
            if resumed:
                log.info("fetch: resuming %s at %.1f MB", self.part.name, have / 1e6)
            with (
                open(self.part, "ab" if resumed else "wb") as out,
                Progress(int(length or 0), f"download {self.part.stem}", unit="B", unit_scale=True) as bar,
            ):
                for chunk in self._chunks(response):
                    out.write(chunk)
                    bar.update(len(chunk))
        self.resumed = resumed  # the bytes came partly from an earlier transfer
        got = self.part.stat().st_size
        if expected is not None and got != expected:
            raise requests.exceptions.ConnectionError(f"{url}: transfer ended at byte {got} of {expected}")
        os.replace(self.part, output_file)

    def _chunks(self, response):
        """The body as it arrives: read1 returns what the socket has, so a broken connection
        loses no received byte (iter_content would drop a partly filled chunk)."""
        import requests
        import urllib3

        raw = response.raw
        try:
            if hasattr(raw, "read1"):  # urllib3 >= 2
                while chunk := raw.read1(self.chunk_size):
                    yield chunk
            else:
                yield from response.iter_content(chunk_size=self.chunk_size)
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # a requests exception: download() retries it
            raise requests.exceptions.ConnectionError(f"{response.url}: {exc}") from exc

    def _get(self, url: str, start: int):
        import requests

        # identity: byte offsets must be those of the file, not of a compressed transfer
        headers = {"Accept-Encoding": "identity"}
        if start:
            headers["Range"] = f"bytes={start}-"
        return requests.get(url, headers=headers, stream=True, timeout=self.timeout, allow_redirects=True)


def _range_start(response) -> int | None:
    """The first byte of a 206 response (`Content-Range: bytes <start>-<end>/<total>`)."""
    value = response.headers.get("Content-Range", "")
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def check_kept(path: Path, src: sources.ArchiveSource) -> None:
    """An archive already in the downloads folder matches its known hash; else one line naming the
    file and both hashes (a damaged or other file there is the cause, not the network: it is never
    downloaded over, and never reported as a network failure after retries)."""
    import pooch

    if src.known_hash is None:  # the caller checks it (the EnCodec checkpoint: its name's hash prefix)
        return
    algorithm, expected = src.algorithm.lower(), src.known_hash.split(":", 1)[1].lower()
    actual = pooch.file_hash(str(path), alg=algorithm)
    if actual != expected:
        raise DownloadError(
            f"{path}: {algorithm} is {actual}, expected {expected} for {src.filename}: the archive in the "
            "downloads folder is damaged or another file; remove it and fetch again (it is downloaded anew)"
        )


def download(
    src: sources.ArchiveSource, downloads_dir: Path, retries: int = DEFAULT_RETRIES, timeout: float = DEFAULT_TIMEOUT_S
) -> Path:
    """The archive `src` in `downloads_dir`: reused when its hash matches, else downloaded and checked."""
    import pooch
    import requests

    downloads_dir = Path(downloads_dir)
    # pooch downloads and checks the hash; the retries are ours, because pooch would also retry a
    # hash mismatch, downloading a whole archive again (93 GiB for fma_large) for a wrong known_hash.
    store = pooch.create(
        path=downloads_dir,
        base_url="",
        registry={src.filename: src.known_hash},
        urls={src.filename: src.url},
        retry_if_failed=0,
    )
    http = urlsplit(src.url).scheme.lower() in ("http", "https")
    downloader = ResumableHTTPDownloader(downloads_dir / f"{src.filename}.part", timeout) if http else None
    attempts = f"{retries + 1} attempt{'s' if retries else ''}"
    kept = downloads_dir / src.filename
    if kept.is_file():  # hashed once here (minutes for the largest corpora), never taken on its name
        log.info(
            "fetch: checking the %s of %s (%.1f MB) against %s",
            src.algorithm,
            kept.name,
            kept.stat().st_size / 1e6,
            src.known_hash,
        )
        check_kept(kept, src)
        return kept
    for attempt in range(retries + 1):
        try:
            return Path(store.fetch(src.filename, downloader=downloader, progressbar=not http))
        except PermanentHTTPError as exc:
            raise DownloadError(f"fetch: downloading {src.url} failed: {exc}") from None
        except requests.RequestException as exc:  # network: retry, resuming where the transfer broke
            if attempt == retries:
                raise DownloadError(f"fetch: downloading {src.url} failed after {attempts}: {one_line(exc)}") from None
            log.warning(
                "fetch: download of %s failed (%s); %d more attempt(s)", src.filename, one_line(exc), retries - attempt
            )
            time.sleep(min(attempt + 1, 10))
        except ftplib.all_errors as exc:
            raise DownloadError(f"fetch: downloading {src.url} failed: {one_line(exc)}") from None
        except ValueError as exc:  # pooch: hash mismatch (the download is deleted)
            if downloader is not None and downloader.resumed and attempt < retries:
                # the bytes of an earlier, broken transfer may be at fault: once more, from the start
                log.warning(
                    "fetch: the resumed download of %s failed its hash check; downloading it again", src.filename
                )
                continue
            hint = (
                "; check data.known_hash"
                if src.name == "url"
                else "; check data.base_url"
                if src.name in sources.FILE_SETS
                else ""
            )
            raise DownloadError(f"fetch: {src.url}: {one_line(exc)}{hint}") from None
    raise AssertionError("unreachable")
