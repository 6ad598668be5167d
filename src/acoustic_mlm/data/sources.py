"""The corpora `data.source` can name: where each archive lives, its hash, what it should hold.

Nothing here touches the network; `fetch` downloads and extracts what `archive_for` resolves (FMA's zips it only
checks and lists: prepare reads their members in place, `reads_in_place`). The disk each named corpus takes
through the data stages (`disk_plan`) and the one-line refusal when it does not fit (`check_room`) are here too.

- `fma_small | fma_medium | fma_large | fma_full`: the Free Music Archive (Defferrard et al., ISMIR 2017,
  github.com/mdeff/fma), MP3s laid out as `fma_<size>/<3-digit folder>/<6-digit track id>.mp3`: 30 s
  clips, except fma_full's untrimmed tracks (the same 106,574 tracks as fma_large, whole).
  URLs and sha1 sums from the FMA README. The zips use Deflate64 (read with zipfile-deflate64).
  Six tracks are known to be corrupt and are never extracted nor read (`FMA_CORRUPT_TRACKS`).
- `librispeech-<subset>`: LibriSpeech (Panayotov et al., ICASSP 2015, OpenSLR SLR12), 16 kHz
  FLAC speech, `LibriSpeech/<subset>/<speaker>/<chapter>/<speaker>-<chapter>-<utterance>.flac`.
  sha256 sums copied from torchaudio 2.9.1, `torchaudio/datasets/librispeech.py` (`_CHECKSUMS`).
- `url`: any zip or tar(.gz, .bz2, .xz) at `data.url`, checked against `data.known_hash`.
- `librosa`: librosa's example recordings (14 Ogg files, 11 min of music, speech and field
  sounds, each with its licence .txt), downloaded file by file from `data.base_url` (null: the
  published https://librosa.org/data/audio/), each checked against its sha256 from librosa's
  registry (librosa/util/example_data/registry.txt).

The corpora generated offline are not here: `synthetic` (acoustic_mlm.data.synth) and `tones`
(acoustic_mlm.data.tones), written by fetch; `folder` is a local folder.

`AUDIO_SUFFIXES` and `find_audio` say what counts as audio, for fetch and prepare alike.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

from acoustic_mlm.errors import UserError

if TYPE_CHECKING:
    from acoustic_mlm.config import DataConfig

FMA_URL = "https://os.unil.cloud.switch.ch/fma/{name}.zip"
FMA_SHA1 = {  # github.com/mdeff/fma README, "Data"
    "fma_small": "ade154f733639d52e35e32f5593efe5be76c6d70",  # 8,000 tracks, 7.2 GiB
    "fma_medium": "c67b69ea232021025fca9231fc1c7c1a063ab50b",  # 25,000 tracks, 22 GiB
    "fma_large": "497109f4dd721066b5ce5e5f250ec604dc78939e",  # 106,574 tracks, 93 GiB
    "fma_full": "0f0ace23fbe9ba30ecb7e95f763e435ea802b8ab",  # the same tracks untrimmed, 879 GiB
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
# librosa's example recordings (music, speech, field sounds; Ogg Vorbis, 22.05 kHz mono, 11 min in all,
# each with its licence and attribution in a .txt beside it), served file by file. sha256 sums from
# librosa's registry, librosa/util/example_data/registry.txt (github.com/librosa/librosa); base URL
# from librosa/util/files.py. The .hq.ogg variants in that registry are left out.
LIBROSA_URL = "https://librosa.org/data/audio/"
# fmt: off
LIBROSA_SHA256 = {
    "147793__setuniman__sweet-waltz-0i-22mi.ogg": "4baff8ebf1771c33618b58aa12ac3fbac1e0462894ae74247f2fb8e649d1c63b",
    "147793__setuniman__sweet-waltz-0i-22mi.txt": "6e6e9265ae9a9a36033ce305a893abdc15f43bb5a41ec29efba368ad91905f43",
    "198-209-0000.ogg": "0473ba9613befa1026db5e254546f105aeffba8366b5468fc5e8d474d844ca1d",
    "198-209-0000.txt": "c5bf58b2a4aa0d6bf1e6051690312f3238960d455776a6d37e469d80db1da167",
    "3436-172162-0000.ogg": "780e482b52f2c8a500356babf60178ce005449cc171a8537eb3ef2961eb3e855",
    "3436-172162-0000.txt": "8cf4b20e148c4366205bc607f447c169256e945d62c64ead43d0a4dfa7d3ab98",
    "442789__lena-orsa__happy-music-pistachio-ice-cream-ragtime.ogg":
        "9617c9be55c128177b13c20fbc52178ed482e3545094517efb30a7db2798991e",
    "442789__lena-orsa__happy-music-pistachio-ice-cream-ragtime.txt":
        "99f9c44368918572ac154ae4a2fec4020d1d4bb418ae7bf241864916d68f9d04",
    "456440__inspectorj__bird-whistling-robin-single-13.ogg":
        "57c2b861d028e25d7c086b48853f20eda1ae9a7a33e1125a1f3bec91539b4208",
    "456440__inspectorj__bird-whistling-robin-single-13.txt":
        "34d25a379408d9144fbc4ce8cceb72be5196aeb6140cec6c90e6bdcb0567cb6e",
    "5703-47212-0000.ogg": "a284612b46af0535f7e1873758c4387bb8369f6dbbe192ffdec1f171108f98dd",
    "5703-47212-0000.txt": "1c5bd5eb792ff0d2fbe895e3a3dd0acf3beb48ee364e64e12cde3a646304a9f4",
    "Hungarian_Dance_number_5_-_Allegro_in_F_sharp_minor_(string_orchestra).ogg":
        "919b48aa4cc66a0357d2cd5728664c5ab8f15c4b3469460df4b59470d35d3e49",
    "Hungarian_Dance_number_5_-_Allegro_in_F_sharp_minor_(string_orchestra).txt":
        "0c857ef8a7365e3df9d5c25c2b08ec3169c0585e3ec08c9c6423d2a04d72fe5f",
    "Karissa_Hobbs_-_Let's_Go_Fishin'.ogg": "27b3667c396c1831511aa3c415fcf582b6e8be560cafb844c5b67b76b72c1cb3",
    "Karissa_Hobbs_-_Let's_Go_Fishin'.txt": "199bf3408b98916cd9d28a22b2b43c1935ab70072b46fa05c0b9f40e7882802e",
    "Kevin_MacLeod_-_P_I_Tchaikovsky_Dance_of_the_Sugar_Plum_Fairy.ogg":
        "b5c1a3e26310e6618d3c124f458654cd235650fcb9db7d711302644566600484",
    "Kevin_MacLeod_-_P_I_Tchaikovsky_Dance_of_the_Sugar_Plum_Fairy.txt":
        "059acb340170385d2bfa4c7ab7c2a06b1d8f8af3e0f11cb4f46ff4049e950915",
    "Kevin_MacLeod_-_Vibe_Ace.ogg": "6c23aed3dd5aa57f2b1652ecab68d15d9b82ad257f54e639eb2880ca09bc118a",
    "Kevin_MacLeod_-_Vibe_Ace.txt": "6c71e0525cb0452ea74c6d6f5fde6fa1e221223db7b2aa35b9914b98367ee7b9",
    "admiralbob77_-_Choice_-_Drum-bass.ogg": "ac644f9645e7c15174e4a4f8561e4d1448d7f6e59ff6b0556b310ebbced879bc",
    "admiralbob77_-_Choice_-_Drum-bass.txt": "76525d6a4fd135053c5ff7463ae43a8ffcf064b575e8ef2fc3eb37786a45342b",
    "glacier-bay-humpback.ogg": "64395c617b28b5e31a03032b99b4617bc96b926f3bc5c141862cd13fb79ccd8e",
    "glacier-bay-humpback.txt": "bec2c73fe2368604f161ffdd44b7afea5f597473e2d51c03906bb05c22113910",
    "pibble.ogg": "c596c027f604defa522a1734f599c6db5624fa62dd3f1be2a933d85b077f7400",
    "pibble.txt": "341fdf46cae7c165875667ed729f6d18983e8cfe32e491816705e7be00d57c76",
    "sorohanro_-_solo-trumpet-06.ogg": "8374466fd3951d24509da6e799b132a0db0bdeda69d99c69d989a6888d3d727d",
    "sorohanro_-_solo-trumpet-06.txt": "750a191b9d0cc94b2f19cfbf11acc13783f75bedcccfcf562f5b076efd068aba",
}
# fmt: on
HASH_ALGORITHMS = ("sha256", "sha1", "md5")  # the prefixes data.known_hash may carry
# File names of formats libsndfile decodes: what fetch extracts from archives without looking inside.
# In a folder, fetch and prepare also take a file of any other name whose content libsndfile reads.
AUDIO_SUFFIXES = (
    ".wav",
    ".flac",
    ".ogg",
    ".mp3",
    ".oga",
    ".opus",
    ".aif",
    ".aiff",
    ".aifc",
    ".au",
    ".snd",
    ".caf",
    ".w64",
    ".rf64",
)
# Audio formats libsndfile cannot decode: named as such in the rejects, with what to do.
UNSUPPORTED_AUDIO = (".m4a", ".mp4", ".m4b", ".aac", ".alac", ".wma", ".ape", ".wv", ".mka", ".webm", ".amr", ".ac3")
SOURCE_RECORD = "SOURCE.json"  # fetch's record at the top of the raw folder: never audio, never a clip
HIDDEN = "hidden file or folder"  # the reject reason of a path with a part that starts with "."


def is_audio_name(rel: str) -> bool:
    return PurePosixPath(rel).suffix.lower() in AUDIO_SUFFIXES


def not_audio_reason(rel: str) -> str:
    """Why a file that libsndfile cannot read is not taken: its format, judged by name."""
    suffix = PurePosixPath(rel).suffix.lower()
    if suffix in UNSUPPORTED_AUDIO:
        return f"unsupported audio format ({suffix}): convert it to FLAC, WAV, Ogg or MP3"
    return "not audio (libsndfile does not recognise its content)"


def safe_name(rel: str) -> str:
    """A path as text that any file can hold: bytes that are not UTF-8 (surrogate escapes) as \\xNN."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_FILE_KINDS = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "special file")


@dataclass
class Listing:
    """Everything under a folder: the regular files to consider, and the rest with the reason it is left out."""

    files: list[tuple[str, Path]] = field(default_factory=list)  # (relative POSIX path, path), sorted
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (relative path, safe as text; reason), sorted


def walk(folder: Path, skip_top: tuple[str, ...] = ()) -> Listing:
    """Every entry under `folder` (recursive, links not followed into folders), each in exactly one list.

    Regular files (and links to them) are `files`. Left out, with their reason: hidden files and
    everything in hidden folders (names starting with "."), names that are not valid UTF-8,
    broken links, link loops, links to folders, FIFOs, devices, sockets, unreadable folders.
    Nothing is opened: a FIFO cannot block. `skip_top`: names at the top level to pass over silently.
    """
    folder = Path(folder)
    out = Listing()

    def visit(path: Path, rel: str, hidden: bool) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as exc:
            out.left_out.append((safe_name(rel + "/"), f"folder not readable ({exc.strerror or exc})"))
            return
        for e in entries:
            r = f"{rel}/{e.name}" if rel else e.name
            if not rel and e.name in skip_top:
                continue
            h = hidden or e.name.startswith(".")
            try:
                if e.is_dir(follow_symlinks=False):
                    visit(Path(e.path), r, h)
                    continue
                mode = e.stat(follow_symlinks=False).st_mode
            except OSError as exc:
                out.left_out.append((safe_name(r), f"cannot read: {exc.strerror or exc}"))
                continue
            reason = None
            if stat.S_ISLNK(mode):
                try:
                    mode = os.stat(e.path).st_mode
                except OSError as exc:
                    reason = (
                        "symbolic link loop"
                        if exc.errno == errno.ELOOP
                        else "broken symbolic link"
                        if exc.errno == errno.ENOENT
                        else f"unreadable symbolic link ({exc.strerror})"
                    )
                else:
                    if stat.S_ISDIR(mode):
                        reason = "symbolic link to a folder (not followed)"
            if reason is None and not stat.S_ISREG(mode):
                reason = f"not a regular file ({_kind(mode)})"
            if reason is None and h:
                reason = HIDDEN
            if reason is None and r != safe_name(r):
                reason = "file name is not valid UTF-8 (rename the file to include it)"
            if reason is None:
                out.files.append((r, Path(e.path)))
            else:
                out.left_out.append((safe_name(r), reason))

    visit(folder, "", False)
    out.files.sort()
    out.left_out.sort()
    return out


def find_audio(folder: Path) -> list[Path]:
    """Audio-named regular files under folder (recursive, hidden files and folders skipped), sorted by relative path."""
    return [p for rel, p in walk(folder).files if is_audio_name(rel)]


@dataclass(frozen=True)
class ArchiveSource:
    """One downloadable corpus: where it is, how to check it, what its audio members look like. (The
    tokenizer downloads EnCodec's checkpoint as one too, named "tokenizer.checkpoint".)"""

    name: str  # the data.source value
    url: str
    known_hash: str | None  # "<algorithm>:<hex>", lower case, as pooch reads it; None: the caller checks
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


@dataclass(frozen=True)
class FileSetSource:
    """A corpus served file by file from one base URL, each file with its own hash."""

    name: str  # the data.source value
    base_url: str  # ends with "/"
    files: dict[str, str]  # file name -> "<algorithm>:<hex>"

    def members(self) -> list[ArchiveSource]:
        """One download per file (download.download's unit), in name order."""
        return [
            ArchiveSource(name=self.name, url=self.base_url + quote(f), known_hash=h, filename=f)
            for f, h in sorted(self.files.items())
        ]


FILE_SETS: dict[str, dict[str, str]] = {  # data.source -> {file: known_hash}; the default base URL is below
    "librosa": {f: f"sha256:{h}" for f, h in LIBROSA_SHA256.items()},
}
FILE_SET_URLS = {"librosa": LIBROSA_URL}


def file_set_for(data: DataConfig) -> FileSetSource:
    """The file set behind data.source, served from data.base_url (null: its published location);
    `data` is the typed `data:` section (`Config.data`)."""
    source = data.source
    base = data.base_url or FILE_SET_URLS[source]
    if urlsplit(base).scheme.lower() not in ("http", "https", "ftp"):
        raise UserError(f"data.base_url: '{base}' is not an http(s):// or ftp:// URL")
    return FileSetSource(name=source, base_url=base if base.endswith("/") else base + "/", files=FILE_SETS[source])


def normalise_hash(known_hash: str, key: str = "data.known_hash") -> str:
    """'SHA256:ABC..' -> 'sha256:abc..'; a one-line error for anything else."""
    alg, sep, digest = (known_hash or "").partition(":")
    alg, digest = alg.lower(), digest.lower()
    lengths = {"sha256": 64, "sha1": 40, "md5": 32}
    if not sep or alg not in lengths or not re.fullmatch(r"[0-9a-f]+", digest):
        raise UserError(
            f"{key}: '{known_hash}' is not <algorithm>:<hex> with algorithm one of {', '.join(HASH_ALGORITHMS)}"
        )
    if len(digest) != lengths[alg]:
        raise UserError(f"{key}: a {alg} digest has {lengths[alg]} hex digits, '{known_hash}' has {len(digest)}")
    return f"{alg}:{digest}"


def filename_from_url(url: str) -> str:
    """The archive's file name under the downloads folder: the URL's last path segment, made safe."""
    name = unquote(PurePosixPath(urlsplit(url).path).name)
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".")
    return name or "download"


def archive_for(data: DataConfig) -> ArchiveSource:
    """The archive behind a download source (`data` is the typed `data:` section, `Config.data`)."""
    source = data.source
    if source in ARCHIVES:
        return ARCHIVES[source]
    if source != "url":
        raise UserError(f"data.source: '{source}' is not a download source")
    url = data.url or ""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("http", "https", "ftp"):
        raise UserError(f"data.url: '{url}' is not an http(s):// or ftp:// URL")
    if not data.known_hash:
        raise UserError("data.known_hash: required for data.source url (sha256:<hex>, sha1:<hex> or md5:<hex>)")
    return ArchiveSource(
        name="url", url=url, known_hash=normalise_hash(data.known_hash), filename=filename_from_url(url)
    )


# ------------------------------------------------------------------------------------------
# Disk: what a named corpus takes on the way through the data stages, known before fetching

GB, GIB = 1e9, 2**30
SAMPLE_BYTES = {"float32": 4, "int16": 2}  # prepared audio per sample, by data.sample_format
CODE_BYTES = 2  # int16 codes (tokenizer stage)


@dataclass(frozen=True)
class KnownCorpus:
    """A named source's size as its publisher states it."""

    download_gib: float  # the archive
    hours: float  # audio
    tracks: int
    source: str


FMA_README = "github.com/mdeff/fma README (Defferrard et al., ISMIR 2017)"
KNOWN_CORPORA = {
    "fma_small": KnownCorpus(7.2, 8_000 * 30 / 3600, 8_000, FMA_README + ": 8,000 clips of 30 s, 7.2 GiB"),
    "fma_medium": KnownCorpus(22.0, 25_000 * 30 / 3600, 25_000, FMA_README + ": 25,000 clips of 30 s, 22 GiB"),
    "fma_large": KnownCorpus(93.0, 106_574 * 30 / 3600, 106_574, FMA_README + ": 106,574 clips of 30 s, 93 GiB"),
    # the abstract's "343 days of audio" is the full-length tracks' total
    "fma_full": KnownCorpus(
        879.0, 343 * 24, 106_574, FMA_README + ": 106,574 untrimmed tracks, 343 days of audio, 879 GiB"
    ),
}


@dataclass(frozen=True)
class DiskPlan:
    """GB (decimal) each data stage leaves on disk. The archive is kept (a later fetch reuses it by hash) unless
    `data.remove_archive` removes it once prepared; a zip read in place (`reads_in_place`: FMA's) has nothing
    extracted, another archive's audio members are extracted beside it; then the prepared audio, then the codes."""

    download_gb: float  # the archive
    extracted_gb: float  # its members on disk (0 for a zip read in place; MP3s in a zip are stored as they are)
    prepared_gb: float  # data.sample_format at data.sample_rate
    codes_gb: float  # int16, codebooks x frame rate
    archive_removed: bool = False  # data.remove_archive on a zip read in place: removed once every member is prepared

    @property
    def peak_gb(self) -> float:
        """The most on disk at once: everything, or, when the archive goes after prepare, the larger of prepare's
        end (archive + prepared audio) and tokenize's (prepared audio + codes)."""
        if self.archive_removed:
            return self.extracted_gb + self.prepared_gb + max(self.download_gb, self.codes_gb)
        return self.download_gb + self.extracted_gb + self.prepared_gb + self.codes_gb

    @property
    def final_gb(self) -> float:
        kept = 0.0 if self.archive_removed else self.download_gb
        return kept + self.extracted_gb + self.prepared_gb + self.codes_gb

    def parts(self, sample_format: str) -> str:
        archive = f"archive {self.download_gb:,.1f}"
        if self.extracted_gb:
            archive += f" + extracted {self.extracted_gb:,.1f}"
        else:
            archive += f" read in place{', removed once prepared' if self.archive_removed else ''}"
        return f"{archive} + prepared audio {self.prepared_gb:,.1f} ({sample_format}) + codes {self.codes_gb:,.1f}"


def disk_plan(
    seconds: float,
    download_gb: float,
    sample_rate: int,
    sample_format: str,
    codebooks: int,
    frame_rate: float,
    in_place: bool = False,
    remove_archive: bool = False,
) -> DiskPlan:
    """The disk of `seconds` of audio from an archive of `download_gb` through prepare and tokenize: its members
    extracted beside it, or read in place (`in_place`, `reads_in_place`), and then removed (`remove_archive`,
    data.remove_archive: only an archive read in place is removed)."""
    return DiskPlan(
        download_gb=download_gb,
        extracted_gb=0.0 if in_place else download_gb,
        prepared_gb=seconds * sample_rate * SAMPLE_BYTES[sample_format] / GB,
        codes_gb=seconds * frame_rate * codebooks * CODE_BYTES / GB,
        archive_removed=in_place and remove_archive,
    )


def free_gb(path: Path) -> tuple[float, str]:
    """Free space (GB) on the filesystem that holds `path` (its nearest existing folder), and that folder."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free / GB, str(p)


def check_room(needs: str, needed_gb: float, path: Path) -> tuple[float, str]:
    """Refuse in one line, before any work, `needed_gb` more than the free space where `path` goes: `needs` (the
    stage and what it needs, both numbers), then the free space and the folder. Returns (free GB, folder)."""
    free, where = free_gb(path)
    if needed_gb > free:
        raise UserError(
            f"{needs}, and {where} has {gb_text(free)} GB free: free space or run from a larger disk "
            "(amlm preflight shows the plan)"
        )
    return free, where


def gb_text(x: float) -> str:
    """GB for a message: one decimal from 1 GB, three significant digits below (a small corpus is not 0.0 GB)."""
    return f"{x:,.1f}" if x >= 1 else f"{x:.3g}"


# ------------------------------------------------------------------------------------------
# Archives read in place, and removed once prepared

REMOVED_SUFFIX = ".removed.json"  # beside a removed archive: what prepare removed, and fetch's record to write again


def reads_in_place(data: DataConfig) -> bool:
    """Whether prepare reads `data.source`'s audio straight from its archive (nothing extracted): the named
    corpora whose archive is a zip, FMA's (stored MP3s, random access). Tar archives (LibriSpeech) and `url`
    sources are extracted by fetch."""
    src = ARCHIVES.get(data.source)
    return src is not None and src.filename.endswith(".zip")


def removed_marker(archive: Path) -> Path:
    """The record prepare writes beside an archive it removed (data.remove_archive): `<archive>.removed.json`."""
    archive = Path(archive)
    return archive.with_name(archive.name + REMOVED_SUFFIX)
