"""What every `amlm` subcommand shares: the `Command` each stage declares (its name, help, options,
entry and output paths), the options several stages declare alike, and the checks made before any
stage runs (output paths that can be written, one line for an access error).

Each stage's command lives beside the stage (`data/data_commands.py`, `report/report_commands.py`,
...); `cli.py` is their table. Standard library only: `amlm --help` imports no stage.
"""

from __future__ import annotations

import argparse
import errno
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from acoustic_mlm.errors import UserError
from acoustic_mlm.kernels import DEFAULT_CONFIG
from acoustic_mlm.utils import final_names


class Parser(argparse.ArgumentParser):
    """argparse's parser, with no abbreviations (`--run` never completes to `--runs-dir`) and its
    errors in one line, as every other refusal: `amlm <stage>: error: <what>` and exit 2."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


@dataclass(frozen=True)
class Option:
    """One argparse argument as a row: its flags, its help and argparse's other keywords. `rule`: what
    its value must satisfy, checked before any work (check_values): the dotted configuration key it
    stands for (its declared schema and ceiling), or JSON schema keywords of its own. `needs`: the
    option without which it means nothing (`--record`): given alone, it is refused."""

    flags: tuple[str, ...]
    help: str
    keywords: dict = field(default_factory=dict)
    rule: str | dict | None = None
    needs: str | None = None

    def add(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(*self.flags, help=self.help, **self.keywords)

    @property
    def dest(self) -> str:
        if "dest" in self.keywords:
            return self.keywords["dest"]
        long = [f for f in self.flags if f.startswith("--")]
        return (long[0] if long else self.flags[0]).lstrip("-").replace("-", "_")

    @property
    def name(self) -> str:
        long = [f for f in self.flags if f.startswith("--")]
        return long[0] if long else self.keywords.get("metavar", self.flags[0])


def path_value(text: str) -> Path:
    """A path from the command line; an empty one (an unset shell variable) is refused, never read as
    the working folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?); name a file or folder")
    return Path(text)


def text_value(text: str) -> str:
    """A word from the command line (a run name, a config file); an empty one is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty value (an unset shell variable?); give one")
    return text


def opt(*flags: str, help: str, rule: str | dict | None = None, needs: str | None = None, **keywords) -> Option:
    """An option row; a value is a Path unless `type` or `action` says otherwise (`type=None`: a str).
    Neither may be empty."""
    if "action" not in keywords:
        keywords.setdefault("type", Path)
        if keywords["type"] is Path:
            keywords["type"] = path_value
        elif keywords["type"] is None:
            keywords["type"] = text_value
    return Option(flags, help, keywords, rule, needs)


def count(*flags: str, help: str, least: int = 1, **keywords) -> Option:
    """A whole-number option of at least `least` (metavar N unless given)."""
    keywords.setdefault("metavar", "N")
    return opt(*flags, type=int, rule={"minimum": least}, help=help, **keywords)


def amount(*flags: str, help: str, above: float | None = None, least: float | None = None, **keywords) -> Option:
    """A real-number option above `above` (exclusive) or of at least `least`."""
    rule = {"exclusiveMinimum": above} if above is not None else {"minimum": least}
    return opt(*flags, type=float, rule=rule, help=help, **keywords)


@dataclass(frozen=True)
class Steps:
    """One step of a sharded stage (Snakemake runs them as separate jobs); none: every step in turn."""

    first: str  # the step before the shards (--plan, --fit)
    first_help: str
    verb: str  # what --shard K does to its shard
    merge_help: str

    def add(self, p: argparse.ArgumentParser) -> None:
        g = p.add_mutually_exclusive_group()
        g.add_argument(self.first, action="store_true", help=self.first_help)
        g.add_argument("--shard", type=int, metavar="K", help=f"only {self.verb} shard K into shard-<K>/")
        g.add_argument("--merge", action="store_true", help=self.merge_help)


# Paths several stages take alike, named in a command's options by their key.
SHARED = {
    "prepared": opt("--prepared", default=Path("data/prepared"), help="prepared folder (default: data/prepared)"),
    "codes": opt("--codes", default=Path("data/codes"), help="codes folder (default: data/codes)"),
    "runs_dir": opt("--runs-dir", default=Path("results/runs"), help="runs folder (default: results/runs)"),
    "curves": opt(
        "--curves", default=Path("results/loss_curves.csv"), help="tidy loss curves CSV (default: %(default)s)"
    ),
    "reference": opt("--reference", help="paper curves CSV (default: data/reference/paper_curves.csv)"),
    "map": opt("--map", default=Path("results/stability_map.csv"), help="stability map CSV (default: %(default)s)"),
    "figures": opt("--out", default=Path("results/figures"), help="output folder (default: results/figures)"),
}

# What every command opens with: --config, --threads where it sets torch's threads, -v, -q.
CONFIG = opt("--config", type=None, default=DEFAULT_CONFIG, help=f"configuration YAML (default: {DEFAULT_CONFIG})")
THREADS = opt("--threads", type=int, rule="train.threads", help="CPU threads for torch (default: train.threads)")
VERBOSE = opt("-v", "--verbose", action="store_true", help="debug logging")
QUIET = opt("-q", "--quiet", action="store_true", help="warnings and errors only: no progress or info lines")


@dataclass(frozen=True)
class Command:
    """One subcommand: `options` are its own options in help order (rows: an `Option`, a `Steps`
    group, or a key of SHARED), after --config, --threads and -v; `entry(args, cfg)` runs it with the
    validated configuration (None where the command reads none) and returns its exit status (None: 0).
    `folders` and `files` name the options (argparse attributes) that are output paths."""

    name: str
    help: str
    description: str
    options: tuple[Option | Steps | str, ...]
    entry: Callable[..., int | None]
    threads: bool = False  # --threads: the stages whose torch threads it sets (train, preflight)
    reads_config: bool = True  # --config: False for a command whose input names its own (a round's base)
    folders: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    @classmethod
    def of(cls, name: str, entry: Callable[..., int | None], options: tuple = (), **paths) -> Command:
        """The command `name` run by `entry`, whose docstring's first line is its one-line help and the
        rest its description (argparse reflows both)."""
        help_, _, description = inspect.cleandoc(entry.__doc__ or "").partition("\n")
        if not help_ or not description.strip():
            raise ValueError(f"{entry.__qualname__}: its docstring must give a one-line help, then a description")
        return cls(name, help_, description.strip(), options, entry, **paths)

    def __call__(self, args: argparse.Namespace, cfg) -> int | None:
        return self.entry(args, cfg)

    def add_parser(self, sub) -> argparse.ArgumentParser:
        """The command's parser: --config, --threads where it sets torch's threads, -v, then its own."""
        p = sub.add_parser(self.name, help=self.help, description=self.description, allow_abbrev=False)
        for row in self.rows():
            row.add(p)
        return p

    def rows(self) -> list[Option | Steps]:
        """Every option row of the command, in help order: --config, --threads, -v, then its own."""
        config = [CONFIG] if self.reads_config else []
        rows = (*config, *([THREADS] if self.threads else []), VERBOSE, QUIET, *self.options)
        return [SHARED[row] if isinstance(row, str) else row for row in rows]


def command(name: str, *options: Option | Steps | str, **paths) -> Callable[[Callable], Command]:
    """Declare the function below as the subcommand `name` with these options (rows in help order);
    `paths`: Command's threads, folders and files. Its docstring is its help, then its description."""

    def declare(entry: Callable[..., int | None]) -> Command:
        return Command.of(name, entry, options, **paths)

    return declare


def torch_threads(args: argparse.Namespace, cfg) -> int:
    """--threads, else the configuration's train.threads."""
    return args.threads if args.threads is not None else cfg.train.threads


def value_problem(rule: str | dict, value) -> str | None:
    """Why `value` breaks `rule` (a dotted configuration key: the schema it declares and its ceiling,
    config/checks.py's rule for the same key in a file; or JSON schema keywords), or None."""
    if isinstance(rule, str):
        from acoustic_mlm.config.checks import key_value_problem

        return key_value_problem(rule, value)
    import math

    import jsonschema

    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    errors = list(jsonschema.Draft202012Validator(rule).iter_errors(value))
    return errors[0].message if errors else None


def check_values(args: argparse.Namespace, command: Command) -> None:
    """Every option's value against its rule (the configuration key it stands for, or its own bounds),
    and no option given without the one it needs; one line naming the option otherwise."""
    rows = [r for r in command.rows() if isinstance(r, Option)]
    for row in rows:
        value = getattr(args, row.dest, None)
        if value is None or row.rule is None or isinstance(value, bool):
            continue
        problem = value_problem(row.rule, value)
        if problem:
            stands = f" (it stands for '{row.rule}')" if isinstance(row.rule, str) else ""
            raise UserError(f"{row.name} {value}{stands}: {problem}")
    for row in rows:
        if row.needs is not None and getattr(args, row.dest, None) not in (None, False):
            needed = next(r for r in rows if r.name == row.needs)
            if getattr(args, needed.dest, None) in (None, False):
                raise UserError(f"{row.name} means something only with {row.needs}; add {row.needs} or leave it out")


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
