"""Which keys of the configuration file each DVC stage lists as `params` (acoustic_mlm.dvcgen writes
them into dvc.yaml): the settings its steps' outputs depend on (steps.result_keys), written as
keys of the file, a section whose every key is listed named once, an arm's keys templated on the
arm, a sweep point's keys as the file's (its swept values in its name, its grid's seeds).
`cfg`: a `Config` or its mapping.
"""

from __future__ import annotations

from acoustic_mlm.config import sweep as S
from acoustic_mlm.config.sections import get
from acoustic_mlm.config.steps import DVC_STAGES, result_keys
from acoustic_mlm.errors import UserError


def _mapping(cfg) -> dict:
    return cfg if isinstance(cfg, dict) else cfg.mapping


def _leaf_keys(node, prefix: str) -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaf_keys(v, f"{prefix}.{k}")]
    return [prefix]


def compact(cfg, keys: list[str]) -> list[str]:
    """The keys in order, without repeats, each section whose every key is listed named once
    (`model` for all of model's keys), as dvc.yaml's params."""
    cfg = _mapping(cfg)
    chosen, out = set(keys), []
    for key in keys:
        parts, short = key.split("."), key
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            try:
                node = get(cfg, prefix)
            except (KeyError, TypeError, IndexError):  # under a list (sweep.0.grid.seeds): keep the key
                break
            if set(_leaf_keys(node, prefix)) <= chosen:
                short = prefix
                break
        if short not in out:
            out.append(short)
    return out


def stage_params(cfg, stage: str, run: str | None = None) -> list[str]:
    """A DVC stage's params: its keys (stage_keys), each wholly listed section named once (compact)."""
    return compact(cfg, stage_keys(cfg, stage, run))


def stage_keys(cfg, stage: str, run: str | None = None) -> list[str]:
    """The config keys a DVC stage's outputs depend on: result_keys of its steps, in order, once."""
    cfg = _mapping(cfg)
    keys: list[str] = []
    for step in DVC_STAGES[stage]:
        keys += [k for k in result_keys(step, cfg, run) if k not in keys]
    return keys


def arm_params(cfg) -> list[str]:
    """The train stage's params templated on the arm (`runs.${key}.clip`): the same for every arm."""
    cfg = _mapping(cfg)
    lists = {}
    for arm in cfg["runs"]:
        prefix = f"runs.{arm}."
        lists[arm] = [
            f"runs.${{key}}.{k[len(prefix) :]}" if k.startswith(prefix) else k
            for k in compact(cfg, stage_keys(cfg, "train", arm))
        ]
    first = next(iter(lists.values()))
    for arm, keys in lists.items():
        if keys != first:
            raise UserError(
                f"config: the arms' training keys differ ({arm} has {sorted(set(keys) ^ set(first))}); "
                "dvc.yaml's train stage needs the same keys in every arm"
            )
    return first


def grid_of_points(cfg) -> dict[str, int]:
    """The grid (index under `sweep:`) each point comes from."""
    cfg = _mapping(cfg)
    return {name: i for i, grid in enumerate(cfg["sweep"]) for name in S.points({**cfg, "sweep": [grid]})}


def point_params(cfg, point: S.Point, grid: int) -> list[str]:
    """A point's training keys as keys of the file: its swept keys left out (its name holds them), its
    arm's keys for its own, its grid's seeds when the grid sets them."""
    cfg = _mapping(cfg)
    own = f"runs.{point.name}."
    swept = dict(point.values)
    seeds_from_grid = S.SEEDS in cfg["sweep"][grid]["grid"]
    keys = []
    for key in result_keys("train", S.point_config(cfg, point.name), point.name):
        if key in swept:
            continue
        if key.startswith(own):
            leaf = key[len(own) :]
            key = f"sweep.{grid}.grid.{S.SEEDS}" if leaf == "seeds" and seeds_from_grid else f"runs.{point.arm}.{leaf}"
        keys.append(key)
    return compact(cfg, keys)
