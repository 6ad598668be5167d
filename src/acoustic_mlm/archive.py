"""Safe extraction of zip and tar archives (tar, tar.gz, tar.bz2, tar.xz; zip with Deflate64).

`extract(archive, dest, keep)` checks EVERY member before it writes anything and refuses the
whole archive, naming the member, when one could land outside `dest`:

- an absolute path (`/x`, `C:\\x`), a parent reference (`..` as a path component), a NUL byte;
- a symbolic link whose target is absolute or climbs out of the archive root;
- a hard link (tar) whose target is such a path.

Then it writes only the regular-file members that `keep(name)` selects, itself (never through
`tarfile.extract` or `zipfile.extract`): links, devices and FIFOs are never created, so no
later member can be written through one. Links that stay inside the archive are skipped (they
would only duplicate a file the archive already holds) and counted.
"""

from __future__ import annotations

import lzma
import re
import shutil
import stat
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

import zipfile_deflate64  # noqa: F401  (import before zipfile: patches it to read Deflate64, as FMA's zips need)
import zipfile  # isort: skip

_DRIVE = re.compile(r"^[A-Za-z]:")
# What reading a damaged archive raises (zip: bad CRC, unsupported method; gzip/xz: bad stream).
_READ_ERRORS = (zipfile.BadZipFile, tarfile.TarError, EOFError, NotImplementedError, RuntimeError,
                zlib.error, lzma.LZMAError, OSError)


class UnsafeArchiveError(ValueError):
    """An archive member would land outside the extraction folder; nothing was extracted."""


class ArchiveError(ValueError):
    """An archive that cannot be read (not a zip or tar, truncated, bad CRC)."""


@dataclass
class Member:
    name: str  # as stored in the archive
    path: PurePosixPath | None  # normalised relative path; None for the archive root itself
    kind: str  # file | dir | symlink | hardlink | other
    size: int
    link: str | None = None  # link target (symlink, hardlink)
    ref: object = field(default=None, repr=False)  # ZipInfo or TarInfo


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
        members.append(Member(info.filename, None, kind, info.file_size, link, info))
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
        if why is None and m.kind in ("symlink", "hardlink") and _link_escapes(m.path, m.link or "", m.kind == "hardlink"):
            why = f"is a {'hard' if m.kind == 'hardlink' else 'symbolic'} link to {m.link!r}, outside the archive"
        if why is None and m.kind == "file" and m.path is None:
            why = "has an empty name"
        if why is not None:
            raise UnsafeArchiveError(f"refusing {archive_name}: member {m.name!r} {why}; nothing was extracted")


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
        raise ArchiveError(f"{archive.name}: unreadable {kind} archive ({_one_line(exc)})") from None
    check_members(members, archive.name)
    return members


def extract(archive: Path, dest: Path, keep: Callable[[str], bool] = lambda name: True) -> Extracted:
    """Write the regular files of `archive` that `keep(relative path)` selects under `dest`.

    `dest` should be a fresh (temporary) folder: the caller makes the result appear atomically.
    """
    archive, dest = Path(archive), Path(dest)
    members = list_members(archive)  # every member checked before anything is written
    done = Extracted()
    root = dest.resolve()
    kind = archive_kind(archive)
    opener = zipfile.ZipFile(archive) if kind == "zip" else tarfile.open(archive)
    with opener as handle:
        for m in members:
            if m.kind == "dir":
                done.dirs += 1
                continue
            if m.kind in ("symlink", "hardlink"):
                done.links_skipped += 1
                continue
            if m.kind != "file":
                done.other_skipped += 1
                continue
            rel = m.path.as_posix()
            if not keep(rel):
                done.not_kept.append(rel)
                continue
            target = dest / m.path
            if root not in target.resolve().parents:  # defence in depth; check_members already ensured it
                raise UnsafeArchiveError(f"refusing {archive.name}: member {m.name!r} resolves outside {dest}")
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                src = handle.open(m.ref) if kind == "zip" else handle.extractfile(m.ref)
                with src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out, length=1 << 20)
            except _READ_ERRORS as exc:  # also OSError: a full disk is reported in one line too
                raise ArchiveError(f"{archive.name}: cannot extract member {m.name!r} ({_one_line(exc)})") from None
            done.files.append(rel)
            done.bytes += m.size
    return done


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
