"""Run a queue of commands, a given number at a time, and log each command's real exit status.

    python benchmarks/run_queue.py commands.txt --log queue_log.txt --jobs 1

commands.txt holds one shell command per line (blank lines and lines starting with # are skipped).
The log gets a `start` line, then one line per command as it ends: its UTC time, `rc=` the exit
status the command returned (a command killed by signal N logs rc=-N), its wall seconds and the
command; each command's output goes to `<log>.d/<line number>.log`. The queue's own exit status
is 0 when every command returned 0, else 1. (The decisive round's `queue_log.txt` was written by
a shell loop that logged the status of its `echo`, not of the command: rc=0 for points that exited 2.)
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import subprocess
import sys
import threading
import time
from pathlib import Path

_LOCK = threading.Lock()


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _log(log: Path, line: str) -> None:
    with _LOCK, log.open("a") as f:
        f.write(line + "\n")
        f.flush()


def run_one(number: int, command: str, log: Path) -> int:
    out = log.with_name(log.name + ".d") / f"{number}.log"
    t0 = time.perf_counter()
    with out.open("w") as f:
        rc = subprocess.run(command, shell=True, stdout=f, stderr=subprocess.STDOUT).returncode
    _log(log, f"{_now()} rc={rc} {time.perf_counter() - t0:.0f}s {command}")
    return rc


def commands(path: Path) -> list[tuple[int, str]]:
    lines = Path(path).read_text().splitlines()
    return [(i, c.strip()) for i, c in enumerate(lines, 1) if c.strip() and not c.strip().startswith("#")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("commands", type=Path)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args(argv)
    if not args.commands.is_file():
        print(f"{args.commands}: no such file", file=sys.stderr)
        return 2
    args.log.with_name(args.log.name + ".d").mkdir(parents=True, exist_ok=True)
    _log(args.log, f"{_now()} start")
    with cf.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rcs = list(pool.map(lambda nc: run_one(*nc, args.log), commands(args.commands)))
    _log(args.log, f"{_now()} end")
    return 0 if all(rc == 0 for rc in rcs) else 1


if __name__ == "__main__":
    sys.exit(main())
