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


NARROW_CONV = ((8, 10, 5), (8, 8, 4), (8, 4, 4), (8, 2, 2), (8, 2, 2))  # stride 320, receptive field 345


def tiny_config(**overrides):
    """A tiny ModelConfig for unit tests of the model and the objective."""
    from acoustic_mlm.config import ModelConfig

    base = dict(
        conv_layers=NARROW_CONV, dim=32, layers=2, heads=4, ffn_dim=64, dropout=0.0, attention_dropout=0.0,
        pos_conv_kernel=4, pos_conv_groups=4, final_dim=16, logit_temp=0.1, relax_alpha=32.0,
        feature_penalty=10.0, mask_prob=0.8, mask_length=5, mask_min_masks=2, codebooks=2, codebook_size=32,
    )  # fmt: skip
    base.update(overrides)
    return ModelConfig(**base)
