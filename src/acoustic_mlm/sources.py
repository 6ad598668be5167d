"""The corpora `data.source` can name: where each archive lives, its hash, what it should hold.

Nothing here touches the network; `fetch` downloads and extracts what `archive_for` resolves.

- `fma_small | fma_medium | fma_large`: the Free Music Archive (Defferrard et al., ISMIR 2017,
  github.com/mdeff/fma), 30 s MP3 clips, `fma_<size>/<3-digit folder>/<6-digit track id>.mp3`.
  URLs and sha1 sums from the FMA README. The zips use Deflate64 (read with zipfile-deflate64).
  Six tracks are known to be corrupt and are never extracted (`FMA_CORRUPT_TRACKS`).
- `librispeech-<subset>`: LibriSpeech (Panayotov et al., ICASSP 2015, OpenSLR SLR12), 16 kHz
  FLAC speech, `LibriSpeech/<subset>/<speaker>/<chapter>/<speaker>-<chapter>-<utterance>.flac`.
  sha256 sums copied from torchaudio 2.9.1, `torchaudio/datasets/librispeech.py` (`_CHECKSUMS`).
- `url`: any zip or tar(.gz, .bz2, .xz) at `data.url`, checked against `data.known_hash`.

`AUDIO_SUFFIXES` and `find_audio` say what counts as audio, for fetch and prepare alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

FMA_URL = "https://os.unil.cloud.switch.ch/fma/{name}.zip"
FMA_SHA1 = {  # github.com/mdeff/fma README, "Data"
    "fma_small": "ade154f733639d52e35e32f5593efe5be76c6d70",  # 8,000 tracks, 7.2 GiB
    "fma_medium": "c67b69ea232021025fca9231fc1c7c1a063ab50b",  # 25,000 tracks, 22 GiB
    "fma_large": "497109f4dd721066b5ce5e5f250ec604dc78939e",  # 106,574 tracks, 93 GiB
}
# Track ids whose MP3s do not decode (github.com/mdeff/fma, "known issues"); skipped at extraction.
FMA_CORRUPT_TRACKS = frozenset({"098565", "098567", "098569", "099134", "108925", "133297"})

LIBRISPEECH_URL = "https://www.openslr.org/resources/12/{subset}.tar.gz"
# sha256 of each subset archive: torchaudio 2.9.1, torchaudio/datasets/librispeech.py, _CHECKSUMS
# (keyed there by the http:// URL; the https:// URL serves the same files).
LIBRISPEECH_SHA256 = {
    "dev-clean": "76f87d090650617fca0cac8f88b9416e0ebf80350acb97b343a85fa903728ab3",
    "dev-other": "12661c48e8c3fe1de2c1caa4c3e135193bfb1811584f11f569dd12645aa84365",
    "test-clean": "39fde525e59672dc6d1551919b1478f724438a95aa55f874b576be21967e6c23",
    "test-other": "d09c181bba5cf717b3dee7d4d592af11a3ee3a09e08ae025c5506f6ebe961c29",
    "train-clean-100": "d4ddd1d5a6ab303066f14971d768ee43278a5f2a0aa43dc716b0e64ecbbbf6e2",
    "train-clean-360": "146a56496217e96c14334a160df97fffedd6e0a04e66b9c5af0d40be3c792ecf",
    "train-other-500": "ddb22f27f96ec163645d53215559df6aa36515f26e01dd70798188350adcb6d2",
}
HASH_ALGORITHMS = ("sha256", "sha1", "md5")  # the prefixes data.known_hash may carry
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")  # what fetch extracts or links and prepare decodes


def find_audio(folder: Path) -> list[Path]:
    """Audio files under folder (recursive, hidden files and folders skipped), sorted by relative path."""
    folder = Path(folder)
    found = [
        p for p in folder.rglob("*")
        if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


@dataclass(frozen=True)
class ArchiveSource:
    """One downloadable corpus: where it is, how to check it, what its audio members look like."""

    name: str  # the data.source value
    url: str
    known_hash: str  # "<algorithm>:<hex>", lower case, as pooch reads it
    filename: str  # the archive's name under the downloads folder
    layout: str | None = None  # regex every audio member should fullmatch; None: any layout
    exclude_stems: frozenset[str] = field(default_factory=frozenset)  # members never extracted

    @property
    def algorithm(self) -> str:
        return self.known_hash.split(":", 1)[0]

    def expects(self, member: str) -> bool:
        """Whether an archive member path has the layout this corpus documents."""
        return self.layout is None or re.fullmatch(self.layout, member) is not None

    def excluded(self, member: str) -> bool:
        return PurePosixPath(member).stem in self.exclude_stems


def fma(name: str) -> ArchiveSource:
    return ArchiveSource(
        name=name,
        url=FMA_URL.format(name=name),
        known_hash=f"sha1:{FMA_SHA1[name]}",
        filename=f"{name}.zip",
        layout=rf"{name}/\d{{3}}/\d{{6}}\.mp3",
        exclude_stems=FMA_CORRUPT_TRACKS,
    )


def librispeech(subset: str) -> ArchiveSource:
    return ArchiveSource(
        name=f"librispeech-{subset}",
        url=LIBRISPEECH_URL.format(subset=subset),
        known_hash=f"sha256:{LIBRISPEECH_SHA256[subset]}",
        filename=f"librispeech-{subset}.tar.gz",
        layout=rf"LibriSpeech/{re.escape(subset)}/\d+/\d+/\d+-\d+-\d+\.flac",
    )


# Every named corpus, keyed by its data.source value (the schema's enum lists the same names).
ARCHIVES: dict[str, ArchiveSource] = {
    **{name: fma(name) for name in FMA_SHA1},
    **{f"librispeech-{s}": librispeech(s) for s in LIBRISPEECH_SHA256},
}


def normalise_hash(known_hash: str, key: str = "data.known_hash") -> str:
    """'SHA256:ABC..' -> 'sha256:abc..'; a one-line error for anything else."""
    alg, sep, digest = (known_hash or "").partition(":")
    alg, digest = alg.lower(), digest.lower()
    lengths = {"sha256": 64, "sha1": 40, "md5": 32}
    if not sep or alg not in lengths or not re.fullmatch(r"[0-9a-f]+", digest):
        raise ValueError(f"{key}: '{known_hash}' is not <algorithm>:<hex> with algorithm one of "
                         f"{', '.join(HASH_ALGORITHMS)}")
    if len(digest) != lengths[alg]:
        raise ValueError(f"{key}: a {alg} digest has {lengths[alg]} hex digits, '{known_hash}' has {len(digest)}")
    return f"{alg}:{digest}"


def filename_from_url(url: str) -> str:
    """The archive's file name under the downloads folder: the URL's last path segment, made safe."""
    name = unquote(PurePosixPath(urlsplit(url).path).name)
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".")
    return name or "download"


def archive_for(data: dict) -> ArchiveSource:
    """The archive behind a download source (`data` is the config's data section)."""
    source = data["source"]
    if source in ARCHIVES:
        return ARCHIVES[source]
    if source != "url":
        raise ValueError(f"data.source: '{source}' is not a download source")
    url = data.get("url") or ""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("http", "https", "ftp"):
        raise ValueError(f"data.url: '{url}' is not an http(s):// or ftp:// URL")
    if not data.get("known_hash"):
        raise ValueError("data.known_hash: required for data.source url (sha256:<hex>, sha1:<hex> or md5:<hex>)")
    return ArchiveSource(name="url", url=url, known_hash=normalise_hash(data["known_hash"]),
                         filename=filename_from_url(url))
