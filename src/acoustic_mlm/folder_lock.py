"""One writer per folder: `folder_lock` holds a folder's lock while a command writes it (a second
writer is refused in one line naming the first), `folder_busy` says who holds it now. The lock is the
filelock library's (the kernel's flock on `<folder>/.amlm.lock`), so a killed holder releases it."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator

from acoustic_mlm.errors import UserError

LOCK_NAME = ".amlm.lock"  # in a folder one command writes, while it writes (folder_lock)


def _lock_path_problem(path: Path) -> str | None:
    """Why `path` cannot be a folder's lock file: anything but a regular file with one name (a symbolic
    link, a folder, a FIFO, a hard link to a file elsewhere) would let the lock write, or block, outside
    the folder; None when it is one, or absent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if not stat.S_ISREG(st.st_mode):
        return "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
    if st.st_nlink != 1:
        return f"a file with {st.st_nlink} names (a hard link to a file that may lie elsewhere)"
    return None


def _write_holder(line: str):
    """filelock's on_acquired: the holder's line into the lock file, through the descriptor just locked,
    only when it is the folder's own regular file of one name."""

    def write(fd: int) -> None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            raise PermissionError(errno.EACCES, "the lock path is not a regular file of one name")
        os.ftruncate(fd, 0)
        os.pwrite(fd, line.encode(), 0)

    return write


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str) -> Iterator[None]:
    """Hold `folder`'s lock while the block runs: a second command that would write the same folder
    meanwhile is refused in one UserError line naming the folder and the first one's process.

    The lock is the `filelock` library's (the kernel's flock on `<folder>/.amlm.lock`, opened without
    following a link), so a killed holder releases it; this adds the one-line refusal, the holder's
    line in the file, and the refusal of a lock path that is not a plain file of the folder (a symbolic
    link, a folder, a FIFO, a hard link): nothing outside the folder is written through it. The holder
    removes the lock file (and the folder, if it made it and it stayed empty) on its way out, still
    holding the lock; a process that locked a file so removed meanwhile tries again (filelock)."""
    import filelock

    folder = Path(folder)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME

    def refuse_odd_path() -> None:
        problem = _lock_path_problem(path)
        if problem is not None:
            raise UserError(
                f"{path}: {problem}, not the lock file amlm writes there; remove it (nothing outside "
                f"{folder} is written through it), then run {what} again"
            )

    refuse_odd_path()
    lock = filelock.FileLock(
        path,
        timeout=0,
        thread_local=False,
        on_acquired=_write_holder(f"amlm {what} (pid {os.getpid()} on {_host()})"),
    )
    try:
        lock.acquire()
    except filelock.Timeout:
        raise UserError(
            f"{folder}: {folder_busy(folder) or 'another process'} is writing this folder now; a second "
            f"{what} would mix its files with the first's: wait for it to end (or stop it), or write elsewhere"
        ) from None
    except OSError as exc:  # the path changed into a link or a folder since it was looked at
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.EACCES, errno.ENXIO):
            raise
        refuse_odd_path()
        raise UserError(f"{path}: cannot be locked ({exc.strerror}); remove it, then run {what} again") from None
    try:
        yield
    finally:
        try:
            with contextlib.suppress(OSError):
                if _lock_path_problem(path) is None:
                    path.unlink()  # still held: whoever locked this file meanwhile tries again on a new one
            if made:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when nothing else was written
        finally:
            lock.release()


def folder_busy(folder: str | Path) -> str | None:
    """Who holds `folder`'s lock now (folder_lock), e.g. 'amlm train x (pid 42 on host)'; None when
    nobody does (no lock file, or its holder ended). Creates nothing and follows no link."""
    import fcntl

    path = Path(folder) / LOCK_NAME
    if _lock_path_problem(path) is not None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
    finally:
        os.close(fd)
    return None


def _host() -> str:
    import socket

    return socket.gethostname()
