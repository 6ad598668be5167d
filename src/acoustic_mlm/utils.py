"""Small shared helpers: atomic outputs, logging, progress reporting, torch threads."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

from acoustic_mlm.errors import UserError

log = logging.getLogger("acoustic_mlm")

# float16's largest finite value (torch.finfo(torch.float16).max): larger magnitudes overflow to inf.
# The one home of the number: the diagnostics' fp16 fraction, the stability figure's limit line, the
# stability map's reach and the decisive experiments' threshold all read it from here.
FP16_MAX = 65504.0


def setup_logging(verbose: bool = False, quiet: bool = False) -> None:
    """Log lines to stderr: debug with `verbose`, warnings and errors alone with `quiet` (which also
    silences Progress), else info."""
    Progress.quiet = quiet
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for handler in logging.getLogger().handlers:  # messages name final paths, never temporary ones
        if not any(isinstance(f, _FinalNames) for f in handler.filters):
            handler.addFilter(_FinalNames())


# ----------------------------------------------------------------------------- temporary names
#
# Outputs are written under a temporary sibling name, `.<name>.tmp-<pid>-<random>`, then renamed.
# Messages name the final path (final_names); a stage killed by SIGTERM or SIGINT removes its
# temporary names on the way out (cli.main turns SIGTERM into SystemExit, so every `finally` runs);
# a stage killed harder (SIGKILL, a power cut) leaves them, and the next stage writing the same
# output removes those whose process is gone (remove_debris).
#
# Replacing an existing output: the old one is renamed aside (`.<name>.old-<pid>-<random>`), the
# new one renamed in, then the old one removed; SIGTERM and SIGINT are held (held_signals) from the
# first rename to the second, and from a temporary name's creation until the code that removes it
# on a stop is in force, so a stop never finds the final name missing nor a temporary name that
# nothing will remove. After a SIGKILL between the two renames, the next command that writes or
# reads the output puts the old one back under its name (recover_replaced) and says so.
_FINAL_OF: dict[str, str] = {}  # temporary path -> final path, for every temporary name of this process
_TMP_PID = re.compile(r"\.tmp-(\d+)-")
_OLD_PID = re.compile(r"\.old-(\d+)-")


def final_names(text: str) -> str:
    """`text` with every temporary output name of this process replaced by its final path."""
    for tmp, final in sorted(_FINAL_OF.items(), key=lambda kv: -len(kv[0])):
        if tmp in text:
            text = text.replace(tmp, final)
    return text


class _FinalNames(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if _FINAL_OF:
            message = record.getMessage()
            renamed = final_names(message)
            if renamed != message:
                record.msg, record.args = renamed, ()
        return True


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


_STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGINT", None)) if s is not None)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """SIGTERM and SIGINT arriving inside the block are delivered when it ends (to the handlers in
    force before it), so a few renames or a temporary name's creation run whole. Only the main
    thread receives Python signals: elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    try:
        for sig in _STOP_SIGNALS:
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, lambda signum, _frame: pending.append(signum))
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)  # the handler in force now runs (cli: SystemExit), after the block


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def recover_replaced(final: str | Path) -> Path | None:
    """Put back an output that a killed command was replacing: when `final` is missing and an old
    copy of it lies aside (`.<name>.old-<pid>-*`, its process gone: killed between renaming the old
    one aside and the new one in), the old copy, complete, returns under its name; asides beside an
    existing `final` (killed while removing the old copy) are removed. Says so in one log line each;
    returns the path restored, if any."""
    final = Path(final)
    with contextlib.suppress(OSError):
        asides = []
        for p in final.parent.glob(f".{glob_escape(final.name)}.old-*"):
            m = _OLD_PID.search(p.name[len(final.name) + 1 :])
            if m is not None and not _pid_alive(int(m.group(1))):
                asides.append(p)
        if not asides:
            return None
        asides.sort(key=lambda p: p.lstat().st_ctime)  # renamed aside last: the one that was in place
        restored = None
        if not (final.exists() or final.is_symlink()):
            restored = asides.pop()
            os.rename(restored, final)
            log.warning(
                "%s: put back the previous copy, which a stopped command had renamed aside (%s) to "
                "replace it and was killed before the new copy was in place",
                final,
                restored.name,
            )
        for p in asides:
            with contextlib.suppress(OSError):
                _remove(p)
                log.info("%s: removed the previous copy (%s) that a killed command had left beside it", final, p.name)
        return final if restored is not None else None
    return None


def remove_debris(final: Path) -> list[Path]:
    """Remove the temporary names of `final` left by killed earlier runs (their process is gone);
    a name of a live process (a run in progress) is left alone; an old copy a killed run had
    renamed aside is put back or removed (recover_replaced). Returns what was removed."""
    recover_replaced(final)
    removed = []
    with contextlib.suppress(OSError):
        for p in final.parent.glob(f".{glob_escape(final.name)}.tmp-*"):
            m = _TMP_PID.search(p.name[len(final.name) + 1 :])
            if m is None or _pid_alive(int(m.group(1))):
                continue
            with contextlib.suppress(OSError):
                _remove(p)
                removed.append(p)
    if removed:
        log.info("removed %d temporary name(s) of a killed earlier run beside %s", len(removed), final)
    return removed


def claim_killed_run(final: str | Path) -> Path | None:
    """The newest temporary folder that a killed run (its process gone: SIGKILL, the OOM killer, a lost
    node) left for `final`, renamed to a temporary name of this process, for the caller to take its
    finished parts from (each written atomically inside it) and then remove; None when there is none.
    The name carries this process's id: no other run removes it meanwhile, and if this one is killed
    too the next run claims it again. SIGINT removes its own temporary folder; a hard kill and, for a
    resumable stage, SIGTERM (a scheduler's preemption) leave one to claim."""
    final = Path(final)
    dead = []
    with contextlib.suppress(OSError):
        for p in final.parent.glob(f".{glob_escape(final.name)}.tmp-*"):
            m = _TMP_PID.search(p.name[len(final.name) + 1 :])
            if m is not None and not _pid_alive(int(m.group(1))) and p.is_dir() and not p.is_symlink():
                dead.append(p)
    if not dead:
        return None
    newest = max(dead, key=lambda p: p.stat().st_mtime)
    claimed = final.parent / f".{final.name}.tmp-{os.getpid()}-resume-{os.urandom(4).hex()}"
    with held_signals():
        os.rename(newest, claimed)
        _register(claimed, final)
    return claimed


RESUME = "resume.json"  # in a run's temporary folder only: the inputs its finished parts were made from


class Resumable:
    """A stage's temporary folder (`tmp`, from `resumable_dir`) and the folder a killed earlier run
    left for the same output, whose finished parts it may take once `match` finds the same inputs."""

    def __init__(self, tmp: Path, claimed: Path | None, stage: str):
        self.tmp, self.stage = tmp, stage
        self._claimed = claimed
        self._earlier: Path | None = None  # until match() finds the same inputs

    def match(self, key: dict) -> bool:
        """Record `key` (what the parts depend on) in tmp; the killed run's parts become takeable when
        it recorded the same key. Call before taking any part, after writing what the key hashes."""
        write_json(self.tmp / RESUME, key)
        if self._claimed is None:
            return False
        try:
            same = json.loads((self._claimed / RESUME).read_text()) == json.loads(json.dumps(key))
        except (OSError, ValueError):
            return False
        if not same:
            log.info("%s: a killed earlier run's parts were made from other inputs; redoing every part", self.stage)
        self._earlier = self._claimed if same else None
        return same

    def take(self, name: str, record: str, check=None) -> bool:
        """Move the killed run's finished part `name` (a folder whose `record` file says it is whole) into
        tmp. `check(folder)`: why the part's content does not match its record (a file cut or changed
        since), or None; a part that fails it is redone, never taken on trust."""
        if self._earlier is None or not (self._earlier / name / record).is_file():
            return False
        problem = None
        if check is not None:
            try:
                problem = check(self._earlier / name)
            except UserError as exc:  # its record unreadable
                problem = str(exc)
        if problem:
            log.warning("%s %s: left by the killed earlier run but %s; redoing it", self.stage, name, problem)
            return False
        os.rename(self._earlier / name, self.tmp / name)
        log.info("%s %s: finished by the killed earlier run, checked against its record and taken", self.stage, name)
        return True

    def done(self) -> None:
        """Every part is in tmp: drop the inputs record before the stage joins the parts."""
        (self.tmp / RESUME).unlink(missing_ok=True)


@contextlib.contextmanager
def resumable_dir(final: str | Path, stage: str) -> Iterator[Resumable]:
    """`atomic_dir(final)` for a stage made of parts (shards, a fitted model), each written whole into
    the temporary folder: a run killed hard leaves them, and the next run for `final` claims that
    folder (`claim_killed_run`) and takes the parts made from its own inputs (`Resumable.match`,
    `.take`); the claimed folder is removed at the end, whatever happens."""
    claimed = claim_killed_run(final)
    try:
        with atomic_dir(final, keep_on_sigterm=True) as tmp:
            yield Resumable(tmp, claimed, stage)
    finally:
        if claimed is not None:
            shutil.rmtree(claimed, ignore_errors=True)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _register(tmp: Path, final: Path) -> None:
    _FINAL_OF[str(tmp)] = str(final)
    if not tmp.is_absolute():
        _FINAL_OF[str(tmp.absolute())] = str(final.absolute())


def _swap_in(tmp: Path, final: Path) -> Path | None:
    """Rename `tmp` onto `final`; an existing `final` is first renamed aside, and its aside name is
    returned for the caller to remove (or put back). Call with signals held."""
    old = None
    if final.exists() or final.is_symlink():
        old = final.with_name(f".{final.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.rename(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None:
            os.rename(old, final)  # the old one back: nothing changed
        raise
    return old


def _settle(old: Path | None, final: Path) -> None:
    """After a stop: the old copy renamed aside is removed when the new one is in place, else put back."""
    if old is None or not (old.exists() or old.is_symlink()):
        return
    if final.exists() or final.is_symlink():
        with contextlib.suppress(OSError):
            _remove(old)
    else:
        os.rename(old, final)


@contextlib.contextmanager
def atomic_dir(final: str | Path, keep_on_sigterm: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces `final` by two renames.

    Nothing half-written ever sits at `final`: an exception, SIGINT or SIGTERM removes the
    temporary folder; a harder kill leaves it, and the next run for `final` removes it. An
    existing `final` is renamed aside before the new one is renamed in and removed after, so
    `final` is the old folder or the new one, complete, whenever a stop comes. `keep_on_sigterm`: a
    SIGTERM (a scheduler preempting the job) leaves the temporary folder, as a hard kill does, for the
    next run to claim and take its finished parts from (`resumable_dir`).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_debris(final)
    tmp = old = None
    try:
        with held_signals():  # a stop right after mkdtemp must find `tmp` set, so that it is removed
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
            _register(tmp, final)
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes 0700; outputs get the usual permissions
        yield tmp
        with held_signals():  # from the old one's rename aside to the new one's rename in
            old = _swap_in(tmp, final)
            tmp = None
        if old is not None:
            _remove(old)
            old = None
    except BaseException as exc:
        written = _tree_bytes(tmp) if tmp is not None and is_out_of_space(exc) else 0
        preempted = keep_on_sigterm and isinstance(exc, SystemExit) and exc.code == 128 + signal.SIGTERM
        if tmp is not None and preempted:
            log.info("stopped by SIGTERM: the finished parts stay in %s for the next run to take", tmp.name)
        elif tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _settle(old, final)
        if (
            isinstance(exc, OutOfSpaceError) and tmp is not None
        ):  # from a file inside: name it where it was meant to land
            raise exc.moved(tmp, final) from None
        if is_out_of_space(exc):
            raise OutOfSpaceError(final, written) from None
        raise


@contextlib.contextmanager
def atomic_path(final: str | Path, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary sibling file name; on success it is renamed onto `final`.

    A full disk or a file-size limit while writing becomes one OutOfSpaceError line naming
    `final` and the bytes needed (`needed`, when the caller knows it), and the partial file is removed.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_debris(final)
    tmp = None
    try:
        with held_signals():  # a stop right after mkstemp must find `tmp` set, so that it is removed
            fd, name = tempfile.mkstemp(
                prefix=f".{final.name}.tmp-{os.getpid()}-", suffix=final.suffix, dir=final.parent
            )
            os.close(fd)
            tmp = Path(name)
            _register(tmp, final)
        tmp.chmod(0o666 & ~_umask())  # mkstemp makes 0600
        yield tmp
        os.replace(tmp, final)  # one rename: `final` is the old file or the new one
    except BaseException as exc:
        written = tmp.stat().st_size if tmp is not None and tmp.exists() else 0
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OutOfSpaceError) and tmp is not None:
            raise exc.moved(tmp, final) from None
        if is_out_of_space(exc):
            raise OutOfSpaceError(final, written, needed) from None
        raise


@contextlib.contextmanager
def atomic_group(folder: str | Path, names: tuple[str, ...]) -> Iterator[Path]:
    """Yield a temporary folder for the files `names`, which belong together (a judgement in four
    files); on success `folder` is replaced as a whole (atomic_dir), so that a stop leaves either
    every old file or every new one, never a mix. Other entries of an existing `folder` are carried
    into the new one (hard links where the file system allows, else copies)."""
    folder = Path(folder)
    with atomic_dir(folder) as tmp:
        yield tmp
        lacking = [n for n in names if not (tmp / n).exists()]
        if lacking:
            raise RuntimeError(f"atomic_group({folder}): {', '.join(lacking)} not written")
        if folder.is_dir():
            for entry in folder.iterdir():
                if entry.name in names or entry.name.startswith(".") or (tmp / entry.name).exists():
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, tmp / entry.name, symlinks=True, copy_function=_link_or_copy)
                else:
                    _link_or_copy(entry, tmp / entry.name)


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


# What a write that ran out of room raises: OSError ENOSPC (disk full), EDQUOT (quota), EFBIG
# (the file-size limit, `ulimit -f`, with SIGXFSZ ignored); numpy's tofile reports a short write
# without an errno; torch.save's archive writer a RuntimeError without one.
_NO_ROOM_ERRNOS = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written|unexpected pos|failed writing|file write failed", re.I)


def is_out_of_space(exc: BaseException) -> bool:
    """Whether `exc` says a write found no room (disk full, quota, file-size limit)."""
    if isinstance(exc, OSError) and exc.errno in _NO_ROOM_ERRNOS:
        return True
    return isinstance(exc, (OSError, RuntimeError)) and bool(_SHORT_WRITE.search(str(exc)))


class OutOfSpaceError(UserError):
    """A write stopped by a full disk, a quota or the file-size limit; the partial output was removed."""

    def __init__(self, path: Path, written: int, needed: int | None = None):
        self.path, self.written, self.needed = Path(path), int(written), needed
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and self.written >= limit:
            cause, advice = f"stopped by the file-size limit (ulimit -f) of {limit} bytes", "raise the limit"
        else:
            try:
                free = shutil.disk_usage(_existing_parent(self.path)).free
            except OSError:
                free = -1
            cause, advice = f"no space left on its file system ({free} bytes free)", "free some space"
        need = f"{needed} bytes" if needed is not None and needed > self.written else f"more than {self.written} bytes"
        super().__init__(
            f"{self.path}: not written: {cause}; it needs {need}; {advice} and rerun (nothing partial was kept)"
        )

    def moved(self, tmp: Path, final: Path) -> "OutOfSpaceError":
        """The same error naming the path under `final` instead of its temporary name `tmp`."""
        try:
            path = Path(final) / self.path.relative_to(tmp)
        except ValueError:
            path = Path(final) if self.path == Path(tmp) else self.path
        return OutOfSpaceError(path, self.written, self.needed)


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink())


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's content (hashlib.file_digest reads it in blocks)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | Path, obj) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def benchmark_header(script: str, argv: list[str] | None, device=None, **fields) -> dict:
    """The head of a benchmark's result: `command`, its command line (the script's file name, then its
    arguments: `argv`, or the process's when None), then `fields` (the config it read, ...), then, given
    a device, `machine`: where it ran (machine_info)."""
    head = {"command": " ".join([Path(script).name] + (sys.argv[1:] if argv is None else list(argv)))}
    head |= fields
    if device is not None:
        head["machine"] = machine_info(device)
    return head


def write_result(path: str | Path | None, result: dict) -> dict:
    """A benchmark's result written as JSON at `path` (its --json: write_json, atomic, folders made), or
    nowhere when None; returned, for its main to return."""
    if path is not None:
        write_json(path, result)
    return result


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to serve large blocks from the heap and keep freed memory for reuse.

    By default glibc maps every block above 32 MB (and, until it adapts, above 128 KB) afresh
    with mmap and returns it on free, so the encoder's large activations (EnCodec's first conv's,
    for a long clip) are page-faulted and zeroed by the kernel on every call, a large share of
    tokenization's CPU time (BENCHMARKS.md). Raising M_MMAP_THRESHOLD and M_TRIM_THRESHOLD (the same as
    MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in the environment) keeps that memory in the
    process instead, which makes tokenization faster. The process's memory then
    stays at its high-water mark. Returns False where there is no glibc mallopt (macOS, musl).
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold, big = -1, -3, ctypes.c_int(2**31 - 1)
    return bool(mallopt(m_mmap_threshold, big)) and bool(mallopt(m_trim_threshold, big))


def set_threads(threads: int) -> None:
    """Use exactly `threads` CPU threads in torch (Snakemake's `threads:` value)."""
    import torch

    torch.set_num_threads(max(1, int(threads)))
    with contextlib.suppress(RuntimeError):  # may only be set once per process
        torch.set_num_interop_threads(max(1, int(threads)))


class Progress:
    """A tqdm bar on a terminal; plain periodic log lines otherwise (CI, Snakemake logs).

    `update(n, **postfix)` advances by n; postfix values (e.g. loss) are shown in both modes.
    """

    quiet = False  # set by setup_logging(quiet=True) (`amlm -q`): nothing is shown

    def __init__(
        self, total: int, desc: str, unit: str = "it", every_s: float = 10.0, stream=None, unit_scale: bool = False
    ):
        """`unit_scale`: counts shown with SI prefixes (12.3MB, 4.56MB/s), as tqdm's `unit_scale`; for bytes."""
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.unit_scale = unit_scale
        self.stream = stream if stream is not None else sys.stderr
        self.n = 0
        self.t0 = self._last = time.monotonic()
        self.postfix: dict = {}
        self.bar = None
        if getattr(self.stream, "isatty", lambda: False)() and not self.quiet:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=self.stream, dynamic_ncols=True
            )

    def update(self, n: int = 1, **postfix) -> None:
        self.n += n
        self.postfix.update(postfix)
        if self.quiet:  # `amlm -q`: counted, not shown
            return
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s or self.n >= self.total:
            self._last = now
            self._line(now)

    def _line(self, now: float) -> None:
        elapsed = now - self.t0
        rate = self.n / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.n) / rate if rate > 0 else float("nan")
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.postfix.items())
        pct = 100.0 * self.n / self.total if self.total else 100.0
        done, total, speed = self.n, self.total, f"{rate:.3g} {self.unit}"
        if self.unit_scale:  # tqdm's own SI formatting, as the terminal bar shows it
            from tqdm import tqdm

            size = tqdm.format_sizeof
            done, total, speed = size(self.n, self.unit), size(self.total, self.unit), size(rate, self.unit)
        print(
            f"{self.desc}: {done}/{total} ({pct:.0f}%) {speed}/s "
            f"elapsed {elapsed:.0f}s eta {eta:.0f}s {extra}".rstrip(),
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def machine_info(device) -> dict:
    """Where a benchmark ran: versions, device, CPU count, threads, platform, load at the start."""
    import platform

    import torch

    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }
    if hasattr(os, "getloadavg"):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
