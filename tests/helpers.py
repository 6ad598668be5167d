"""Shared test helpers (imported by test modules; pytest puts tests/ on sys.path)."""

import shutil
from pathlib import Path

# Generated or local-only paths that a fresh clone does not have.
_PATTERNS = shutil.ignore_patterns(".git", ".snakemake", "*.egg-info", "__pycache__", ".pytest_cache", ".venv", ".*.tmp-*")


def _ignore(folder: str, names: list[str]) -> set[str]:
    ignored = set(_PATTERNS(folder, names))
    if Path(folder).name == ".dvc":  # DVC's local state, never committed
        ignored |= {"cache", "tmp", "config.local"} & set(names)
    return ignored

_GENERATED = ("data/raw", "data/prepared", "data/codes", "data/downloads", "results/runs", "results/logs",
              "results/figures", "results/loss_curves.csv", "results/claims.json", "results/claims.md")


def copy_repo(root: Path, dest: Path) -> Path:
    """The repository as a fresh clone would have it: tracked sources, no generated outputs."""
    shutil.copytree(root, dest, ignore=_ignore)
    for rel in _GENERATED:
        p = dest / rel
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    return dest
