"""Safe extraction of zip and tar archives (tar, tar.gz, tar.bz2, tar.xz; zip with Deflate64).

`extract(archive, dest, keep)` checks EVERY member before it writes anything and refuses the
whole archive, naming the member, when one could land outside `dest`:

- an absolute path (`/x`, `C:\\x`), a parent reference (`..` as a path component), a NUL byte;
- a symbolic link whose target is absolute or climbs out of the archive root;
- a hard link (tar) whose target is such a path.
Tar links are judged by tarfile's own `data` extraction filter (PEP 706, `tarfile.data_filter`), zip
links (no such filter) by `_link_escapes`.

It also refuses, naming the member, two members whose paths conflict (a file `a.wav` and a
member `a.wav/b.wav`, or the same path twice) and a name longer than the file system allows
(a component over NAME_MAX bytes, a path over PATH_MAX). Against decompression bombs it refuses,
from the member headers and before writing anything, an archive whose regular files add up to
more than `ExtractLimits.max_bytes` or a member (or a whole tar) that expands more than
`ExtractLimits.max_ratio` times its compressed size; while writing it counts the bytes really
decompressed, so a header that lies about a size cannot get past either limit.

Then it writes only the regular-file members that `keep(name)` selects, itself (never through
`tarfile.extract` or `zipfile.extract`): links, devices and FIFOs are never created, so no
later member can be written through one. Links that stay inside the archive are skipped (they
would only duplicate a file the archive already holds) and counted.

`survey(archive, keep, limits)` makes the same checks and the same counts without writing anything, and
`ZipMembers(archive, limits)` reads a zip's regular-file members one at a time into memory, every member
checked first and each read held to its header and the limits as `extract` holds its writes: the prepare
stage decodes FMA's MP3s straight from the zip, with no extracted copy on disk.
"""

from __future__ import annotations

import io
import lzma
import re
import stat
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Callable

import zipfile_deflate64  # noqa: F401  (import before zipfile: patches it to read Deflate64, as FMA's zips need)

import zipfile  # isort: skip

from acoustic_mlm.errors import UserError, one_line
from acoustic_mlm.utils import OutOfSpaceError, is_out_of_space

if TYPE_CHECKING:
    from acoustic_mlm.config import DataConfig

_DRIVE = re.compile(r"^[A-Za-z]:")
# What reading a damaged archive raises (zip: bad CRC, unsupported method; gzip/xz: bad stream).
_READ_ERRORS = (
    zipfile.BadZipFile,
    tarfile.TarError,
    EOFError,
    NotImplementedError,
    RuntimeError,
    zlib.error,
    lzma.LZMAError,
    OSError,
)


_FILTER_ROOT = "/nonexistent-archive-root"  # where tarfile's filter places members: a name only, never written to
NAME_MAX = 255  # bytes in one path component (Linux, macOS, Windows)
PATH_MAX = 4096  # bytes in a whole path (Linux)
RATIO_MIN_BYTES = 1 << 20  # members smaller than this are not held to the ratio (tiny files compress well)


@dataclass(frozen=True)
class ExtractLimits:
    """How much an archive may expand: `data.max_extract_gb` and `data.max_compression_ratio`.

    Defaults: 256 GB (FMA large, the biggest named corpus, is about 100 GB of MP3s, stored) and a
    ratio of 100. Compressed audio (MP3, FLAC, Ogg) does not compress further and PCM WAV of real
    recordings deflates by well under 3x; only near-silence reaches 100x, which prepare would
    reject as digital silence anyway. A 1 GB WAV of zeros deflates about 1000x.
    """

    max_bytes: int = 256 * 10**9
    max_ratio: float = 100.0

    @classmethod
    def from_config(cls, data: DataConfig) -> "ExtractLimits":
        """From the typed `data:` section (`Config.data`)."""
        return cls(max_bytes=int(float(data.max_extract_gb) * 1e9), max_ratio=float(data.max_compression_ratio))


class UnsafeArchiveError(UserError, ValueError):
    """An archive member would land outside the extraction folder; nothing was extracted."""


class ArchiveError(UserError, ValueError):
    """An archive that cannot be read (not a zip or tar, truncated, bad CRC)."""


@dataclass
class Member:
    name: str  # as stored in the archive
    path: PurePosixPath | None  # normalised relative path; None for the archive root itself
    kind: str  # file | dir | symlink | hardlink | other
    size: int
    link: str | None = None  # link target (symlink, hardlink)
    ref: object = field(default=None, repr=False)  # ZipInfo or TarInfo
    compressed: int | None = None  # bytes stored in the archive (zip members; None for tar)


@dataclass
class Extracted:
    """What `extract` did; every member is in exactly one count."""

    files: list[str] = field(default_factory=list)  # written, relative to dest, in archive order
    bytes: int = 0
    dirs: int = 0
    links_skipped: int = 0  # links that stay inside the archive
    not_kept: list[str] = field(default_factory=list)  # regular files keep() declined
    other_skipped: int = 0  # devices, FIFOs


def archive_kind(path: Path) -> str:
    """'zip' or 'tar', judged by content rather than by name."""
    if zipfile.is_zipfile(path):
        return "zip"
    try:
        if tarfile.is_tarfile(path):
            return "tar"
    except (OSError, EOFError, tarfile.TarError):
        pass
    raise ArchiveError(f"{path.name}: neither a zip nor a tar archive")


def _relative(name: str) -> tuple[PurePosixPath | None, str | None]:
    """(normalised relative path, None) or (None, why the name is unsafe)."""
    if "\x00" in name:
        return None, "has a NUL byte in its name"
    posix = name.replace("\\", "/")  # zips made on Windows; tar names never need a backslash
    if posix.startswith("/") or _DRIVE.match(posix):
        return None, "has an absolute path"
    parts = [p for p in posix.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None, "climbs out with '..'"
    return (PurePosixPath(*parts) if parts else None), None


def _link_escapes(member_path: PurePosixPath | None, target: str, hard: bool) -> bool:
    """Whether a link target points outside the archive root."""
    posix = target.replace("\\", "/")
    if not posix or posix.startswith("/") or _DRIVE.match(posix):
        return True
    base = [] if hard or member_path is None else list(member_path.parent.parts)  # symlinks: relative to their folder
    depth = len(base)
    for part in posix.split("/"):
        if part in ("", "."):
            continue
        depth = depth - 1 if part == ".." else depth + 1
        if depth < 0:
            return True
    return False


def _link_refusal(m: Member) -> str | None:
    """Why a link member is refused, or None. Tar: tarfile's own `data` filter (PEP 706) judges it, its reason
    kept on one line; zip (no such filter): `_link_escapes`."""
    if isinstance(m.ref, tarfile.TarInfo):
        try:
            tarfile.data_filter(m.ref, _FILTER_ROOT)
        except tarfile.FilterError as exc:
            kind = "hard" if m.kind == "hardlink" else "symbolic"
            return f"is a {kind} link refused by tarfile's data filter ({one_line(exc)})"
        return None
    if _link_escapes(m.path, m.link or "", m.kind == "hardlink"):
        return f"is a {'hard' if m.kind == 'hardlink' else 'symbolic'} link to {m.link!r}, outside the archive"
    return None


def _zip_members(zf: zipfile.ZipFile) -> list[Member]:
    members = []
    for info in zf.infolist():
        mode = info.external_attr >> 16
        if info.is_dir():
            kind = "dir"
        elif stat.S_ISLNK(mode):
            kind = "symlink"
        elif stat.S_IFMT(mode) and not stat.S_ISREG(mode):  # zipfile.writestr stores no file type: a file
            kind = "other"
        else:
            kind = "file"
        link = zf.read(info).decode("utf-8", "replace") if kind == "symlink" else None
        members.append(Member(info.filename, None, kind, info.file_size, link, info, info.compress_size))
    return members


def _tar_members(tf: tarfile.TarFile) -> list[Member]:
    members = []
    for info in tf.getmembers():
        if info.isreg():
            kind = "file"
        elif info.isdir():
            kind = "dir"
        elif info.issym():
            kind = "symlink"
        elif info.islnk():
            kind = "hardlink"
        else:
            kind = "other"
        members.append(Member(info.name, None, kind, info.size, info.linkname or None, info))
    return members


def check_members(members: list[Member], archive_name: str) -> None:
    """Fill each member's normalised path; raise UnsafeArchiveError on the first unsafe member."""
    for m in members:
        m.path, why = _relative(m.name)
        if why is None and m.kind in ("symlink", "hardlink"):
            why = _link_refusal(m)
        if why is None and m.kind == "file" and m.path is None:
            why = "has an empty name"
        if why is None and m.path is not None:
            why = _too_long(m.path)
        if why is not None:
            raise UnsafeArchiveError(f"refusing {archive_name}: member {m.name!r} {why}; nothing was extracted")
    _check_conflicts(members, archive_name)


def _too_long(path: PurePosixPath) -> str | None:
    """Why a path is longer than the file system allows, or None."""
    longest = max(path.parts, key=lambda part: len(part.encode("utf-8", "surrogateescape")))
    if len(longest.encode("utf-8", "surrogateescape")) > NAME_MAX:
        return f"has a name component of {len(longest.encode('utf-8', 'surrogateescape'))} bytes (at most {NAME_MAX})"
    if len(path.as_posix().encode("utf-8", "surrogateescape")) > PATH_MAX:
        return f"has a path of over {PATH_MAX} bytes"
    return None


def _check_conflicts(members: list[Member], archive_name: str) -> None:
    """Refuse a path used twice, or a non-folder member that another member needs as a folder."""
    seen: dict[PurePosixPath, Member] = {}
    for m in members:
        if m.path is None:
            continue
        other = seen.get(m.path)
        if other is not None and not (m.kind == other.kind == "dir"):
            raise UnsafeArchiveError(
                f"refusing {archive_name}: members {other.name!r} and {m.name!r} have the same "
                "path; nothing was extracted"
            )
        seen.setdefault(m.path, m)
    for m in members:
        if m.path is None:
            continue
        for parent in m.path.parents:
            holder = seen.get(parent)
            if holder is not None and holder.kind != "dir":
                raise UnsafeArchiveError(
                    f"refusing {archive_name}: member {m.name!r} needs {holder.name!r} to be a "
                    f"folder, but it is a {holder.kind}; nothing was extracted"
                )


def check_limits(members: list[Member], archive: Path, limits: ExtractLimits) -> None:
    """Refuse an archive whose headers promise more than `limits` allows (before writing anything)."""
    files = [m for m in members if m.kind == "file"]
    total = sum(m.size for m in files)
    if total > limits.max_bytes:
        raise UnsafeArchiveError(
            f"refusing {archive.name}: its files expand to {total} bytes, over the limit of "
            f"{limits.max_bytes} (data.max_extract_gb); nothing was extracted"
        )
    for m in files:
        if m.compressed is not None and m.size >= RATIO_MIN_BYTES and m.size > limits.max_ratio * max(m.compressed, 1):
            raise UnsafeArchiveError(
                f"refusing {archive.name}: member {m.name!r} expands {m.size / max(m.compressed, 1):.0f}x "
                f"({m.compressed} -> {m.size} bytes), over data.max_compression_ratio ({limits.max_ratio:g}); "
                "nothing was extracted"
            )
    stored = archive.stat().st_size
    if (
        any(m.compressed is None for m in files)
        and total >= RATIO_MIN_BYTES
        and total > limits.max_ratio * max(stored, 1)
    ):
        raise UnsafeArchiveError(
            f"refusing {archive.name}: it expands {total / max(stored, 1):.0f}x ({stored} -> {total} bytes), over "
            f"data.max_compression_ratio ({limits.max_ratio:g}); nothing was extracted"
        )


def list_members(archive: Path) -> list[Member]:
    """Every member of a zip or tar, checked (UnsafeArchiveError names the first unsafe one)."""
    archive = Path(archive)
    kind = archive_kind(archive)
    try:
        if kind == "zip":
            with zipfile.ZipFile(archive) as zf:
                members = _zip_members(zf)
        else:
            with tarfile.open(archive) as tf:
                members = _tar_members(tf)
    except _READ_ERRORS as exc:
        raise ArchiveError(f"{archive.name}: unreadable {kind} archive ({one_line(exc)})") from None
    check_members(members, archive.name)
    return members


def _select(members: list[Member], keep: Callable[[str], bool]) -> tuple[Extracted, list[Member]]:
    """Every member in exactly one count of an `Extracted` (its `files` and `bytes` left for the caller), and
    the regular files that `keep(relative path)` selects, in archive order."""
    done, chosen = Extracted(), []
    for m in members:
        if m.kind == "dir":
            done.dirs += 1
        elif m.kind in ("symlink", "hardlink"):
            done.links_skipped += 1
        elif m.kind != "file":
            done.other_skipped += 1
        elif not keep(m.path.as_posix()):
            done.not_kept.append(m.path.as_posix())
        else:
            chosen.append(m)
    return done, chosen


def survey(
    archive: Path, keep: Callable[[str], bool] = lambda name: True, limits: ExtractLimits | None = None
) -> Extracted:
    """What `extract` would write, without writing or decompressing anything: every member checked
    (list_members, check_limits) and counted as `extract` counts it; `files` and `bytes` (from the headers) are
    the regular files `keep` selects. The bytes really decompressed are checked when a member is read
    (`ZipMembers.read`)."""
    archive = Path(archive)
    members = list_members(archive)
    check_limits(members, archive, limits if limits is not None else ExtractLimits())
    done, chosen = _select(members, keep)
    done.files = [m.path.as_posix() for m in chosen]
    done.bytes = sum(m.size for m in chosen)
    return done


def extract(
    archive: Path, dest: Path, keep: Callable[[str], bool] = lambda name: True, limits: ExtractLimits | None = None
) -> Extracted:
    """Write the regular files of `archive` that `keep(relative path)` selects under `dest`.

    `dest` should be a fresh (temporary) folder: the caller makes the result appear atomically.
    `limits` (default: ExtractLimits()) bound the bytes written and the compression ratio.
    """
    archive, dest = Path(archive), Path(dest)
    limits = limits if limits is not None else ExtractLimits()
    members = list_members(archive)  # every member checked before anything is written
    check_limits(members, archive, limits)
    budget = _Budget(archive, limits)
    done, chosen = _select(members, keep)
    root = dest.resolve()
    kind = archive_kind(archive)
    opener = zipfile.ZipFile(archive) if kind == "zip" else tarfile.open(archive)
    with opener as handle:
        for m in chosen:
            rel = m.path.as_posix()
            target = dest / m.path
            if root not in target.resolve().parents:  # defence in depth; check_members already ensured it
                raise UnsafeArchiveError(f"refusing {archive.name}: member {m.name!r} resolves outside {dest}")
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                src = handle.open(m.ref) if kind == "zip" else handle.extractfile(m.ref)
                with src, open(target, "wb") as out:
                    budget.copy(src, out, m)
            except UnsafeArchiveError:
                raise
            except OSError as exc:
                if is_out_of_space(exc):  # a full disk: the path and the bytes this member needs
                    raise OutOfSpaceError(target, target.stat().st_size if target.exists() else 0, m.size) from None
                raise ArchiveError(f"{archive.name}: cannot extract member {m.name!r} ({one_line(exc)})") from None
            except _READ_ERRORS as exc:
                raise ArchiveError(f"{archive.name}: cannot extract member {m.name!r} ({one_line(exc)})") from None
            done.files.append(rel)
            done.bytes += m.size
    return done


class ZipMembers:
    """The regular-file members of a zip, read one at a time into memory and never written to disk.

    Opening it checks every member as `extract` does before it writes anything (list_members: names, links,
    conflicts, lengths; check_limits: the total and each member's ratio from the headers); `read` counts the
    bytes really decompressed against the member's header and the limits (`_Budget`, as `extract`), and
    zipfile checks the member's CRC-32 at its end. Memory: one member's bytes at a time (an MP3 is smaller
    than the audio it decodes to). Use it as a context manager (it holds the zip open).
    """

    def __init__(self, archive: Path, limits: ExtractLimits | None = None):
        self.archive = Path(archive)
        limits = limits if limits is not None else ExtractLimits()
        if archive_kind(self.archive) != "zip":
            raise ArchiveError(f"{self.archive.name}: not a zip archive (its members are read in place from zips only)")
        members = list_members(self.archive)  # every member checked before any is read
        check_limits(members, self.archive, limits)
        self.files = {m.path.as_posix(): m for m in members if m.kind == "file"}
        self._budget = _Budget(self.archive, limits, stopped="reading stopped")
        try:
            self._zip = zipfile.ZipFile(self.archive)
        except _READ_ERRORS as exc:
            raise ArchiveError(f"{self.archive.name}: unreadable zip archive ({one_line(exc)})") from None

    def read(self, rel: str) -> bytes:
        """The bytes of the regular-file member at relative path `rel` (as `survey` lists it)."""
        m = self.files.get(rel)
        if m is None:
            raise ArchiveError(f"{self.archive.name}: no regular-file member {rel!r}")
        buf = io.BytesIO()
        try:
            with self._zip.open(m.ref) as src:
                self._budget.copy(src, buf, m)
        except UnsafeArchiveError:
            raise
        except _READ_ERRORS as exc:
            raise ArchiveError(f"{self.archive.name}: cannot read member {m.name!r} ({one_line(exc)})") from None
        return buf.getvalue()

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> "ZipMembers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Budget:
    """Counts the bytes really decompressed, against each member's header size and the limits."""

    def __init__(self, archive: Path, limits: ExtractLimits, stopped: str = "extraction stopped"):
        self.archive, self.limits, self.total, self.stopped = archive, limits, 0, stopped
        self.stored = archive.stat().st_size

    def copy(self, src, out, m: Member) -> None:
        written = 0
        while block := src.read(1 << 20):
            written += len(block)
            self.total += len(block)
            why = None
            if written > m.size:
                why = f"decompresses to more than the {m.size} bytes its header declares"
            elif self.total > self.limits.max_bytes:
                why = f"takes the files past the limit of {self.limits.max_bytes} bytes (data.max_extract_gb)"
            elif written >= RATIO_MIN_BYTES and written > self.limits.max_ratio * max(m.compressed or self.stored, 1):
                why = f"expands over data.max_compression_ratio ({self.limits.max_ratio:g})"
            if why:
                raise UnsafeArchiveError(f"refusing {self.archive.name}: member {m.name!r} {why}; {self.stopped}")
            out.write(block)
