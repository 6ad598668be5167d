"""What every `amlm` subcommand shares: the `Command` each stage declares (its name, help, options,
entry and output paths), the options several stages declare alike, and the checks made before any
stage runs (output paths that can be written, one line for an access error).

Each stage's command lives beside the stage (`data/data_commands.py`, `report/report_commands.py`,
...); `cli.py` is their table. Standard library only: `amlm --help` imports no stage.
"""

from __future__ import annotations

import argparse
import errno
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from acoustic_mlm.errors import UserError
from acoustic_mlm.kernels import DEFAULT_CONFIG
from acoustic_mlm.utils import final_names


@dataclass(frozen=True)
class Command:
    """One subcommand: `options(parser)` declares the stage's own options (after --config, --threads
    and -v); `entry(args, cfg)` runs it with the validated configuration and returns its exit status
    (None: 0). `folders` and `files` name the options (argparse attributes) that are output paths."""

    name: str
    help: str
    description: str
    options: Callable[[argparse.ArgumentParser], None]
    entry: Callable[..., int | None]
    threads: bool = False  # --threads: the stages whose torch threads it sets (train, preflight)
    folders: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def add_parser(self, sub) -> argparse.ArgumentParser:
        """The command's parser: --config, --threads where it sets torch's threads, -v, then its own."""
        p = sub.add_parser(self.name, help=self.help, description=self.description)
        p.add_argument("--config", default=DEFAULT_CONFIG, help=f"configuration YAML (default: {DEFAULT_CONFIG})")
        if self.threads:
            p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: train.threads)")
        p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
        self.options(p)
        return p


def torch_threads(args: argparse.Namespace, cfg) -> int:
    """--threads, else the configuration's train.threads."""
    return args.threads if args.threads is not None else cfg.train.threads


# Paths several stages take alike: key -> (flag, default, help); each a Path.
SHARED = {
    "prepared": ("--prepared", Path("data/prepared"), "prepared folder (default: data/prepared)"),
    "codes": ("--codes", Path("data/codes"), "codes folder (default: data/codes)"),
    "runs_dir": ("--runs-dir", Path("results/runs"), "runs folder (default: results/runs)"),
    "curves": ("--curves", Path("results/loss_curves.csv"), "tidy loss curves CSV (default: %(default)s)"),
    "reference": ("--reference", None, "paper curves CSV (default: data/reference/paper_curves.csv)"),
    "map": ("--map", Path("results/stability_map.csv"), "stability map CSV (default: %(default)s)"),
    "figures": ("--out", Path("results/figures"), "output folder (default: results/figures)"),
}


def shared(p: argparse.ArgumentParser, *keys: str) -> None:
    """Add the shared options `keys` (of SHARED) to `p`, in that order."""
    for key in keys:
        flag, default, help_ = SHARED[key]
        p.add_argument(flag, type=Path, default=default, help=help_)


def step_options(p: argparse.ArgumentParser, first: str, first_help: str, verb: str, merge_help: str) -> None:
    """One step of a sharded stage (Snakemake runs them as separate jobs); none: every step in turn."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(first, action="store_true", help=first_help)
    g.add_argument("--shard", type=int, metavar="K", help=f"only {verb} shard K into shard-<K>/")
    g.add_argument("--merge", action="store_true", help=merge_help)


def check_outputs(args: argparse.Namespace, command: Command) -> None:
    """Every output path can be written as what it will be (a folder or a file): not an existing
    file where a folder goes (or the reverse), and no file where a folder above it must be."""
    for attr, kind in [(a, "folder") for a in sorted(command.folders)] + [(a, "file") for a in sorted(command.files)]:
        path = getattr(args, attr, None)
        if path is None:
            continue
        path, option = Path(path), "--" + attr.replace("_", "-")
        if kind == "folder" and path.exists() and not path.is_dir():
            raise UserError(
                f"{path}: {option} names an existing file, not a folder; name a folder (or remove the file)"
            )
        if kind == "file" and path.is_dir():
            raise UserError(f"{path}: {option} names an existing folder, not a file; name a file")
        for above in path.parents:
            if above.exists() or above.is_symlink():
                if not above.is_dir():
                    raise UserError(f"{path}: {option} lies under {above}, which is a file, not a folder")
                break


_NO_ACCESS = {errno.EACCES, errno.EPERM, errno.EROFS}


def access_refusal(exc: OSError) -> str | None:
    """One line for an error of access (permission denied, a read-only file system), naming the
    final path (never a temporary name); None for any other OSError, which keeps its traceback."""
    if exc.errno not in _NO_ACCESS:
        return None
    path = final_names(str(exc.filename)) if exc.filename is not None else "a file or folder"
    path = re.sub(r"(^|/)\.([^/]+?)\.(tmp|old)-\d+-[^/]*", r"\1\2", path)  # temporary names not yet registered
    cause = "a read-only file system" if exc.errno == errno.EROFS else "permission denied"
    return f"{path}: {cause}; give this user access to it (or its folder), or name another path"
