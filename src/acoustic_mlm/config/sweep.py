"""Sweeps: the optional `sweep:` section crosses training settings with the arms.

    sweep:
      - grid:                        # every combination of these values ...
          train.lr: [0.001, 0.003]
          model.layers: [4, 16]
          seeds: [1, 2]              # the seeds of each point's run (default: the arm's own)
        arms: [prenorm_clip1]        # ... with these arms (default: every arm)

Each combination of values with each arm is a *point*: a training run of its own, named
`<arm>__<key>-<value>__...` (one part per grid key but `seeds`, in the grid's order; the key is the
last part of the dotted name, the value written without dots: 0.002 -> `2e-3`, 1.5e-3 -> `1p5e-3`),
with its own folder `results/runs/<name>/`. A point's configuration (`point_config`) is the file's
configuration with the point's values in place and `runs:` holding only that point, so every stage
that trains or fingerprints a run treats a point exactly as an arm. Without `sweep:` the runs are the
arms, as before.

Several grids may be listed (their points are united): a learning-rate grid for every arm in fp32
and another in fp16 for two arms, say. Only settings a training run's numbers depend on may be swept
(config.STEP_KEYS["train"]: `model.*` and `train.*` but threads, workers and checkpoint_interval),
with scalar values; a refused key, a point that would be invalid, and two points of the same name
are each one line. Standard library and config only: Snakemake imports this without torch.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass

from acoustic_mlm.errors import ConfigError

SEEDS = "seeds"  # the grid key that sets the seeds of each point's run
SEPARATOR = "__"  # between the arm and each <key>-<value> part of a point's name
MAX_NAME_BYTES = 200  # a point's folder name (and the names built from it) stays under the 255-byte limit
_PART = re.compile(r"^[a-z0-9_]+$")


@dataclass(frozen=True)
class Point:
    """One training run of a sweep: an arm with some settings replaced."""

    name: str
    arm: str
    values: tuple[tuple[str, object], ...]  # (dotted key, value) in the grid's order, seeds excluded
    seeds: tuple[int, ...]

    @property
    def settings(self) -> dict:
        return dict(self.values)


def format_value(value) -> str:
    """A value as it appears in a point's name: no dots, lower case, filesystem-safe."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value == int(value) and abs(value) < 1e6:
            return str(int(value))
        mantissa, exponent = f"{value:.6e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".").replace(".", "p")
        return f"{mantissa}e{int(exponent)}"
    return str(value)


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def point_name(arm: str, values) -> str:
    return SEPARATOR.join([arm] + [f"{_short(k)}-{format_value(v)}" for k, v in values])


def _grids(cfg: dict, source: str) -> list[dict]:
    sweep = cfg.get("sweep")
    if sweep is None:
        return []
    if not isinstance(sweep, list) or not sweep:
        raise ConfigError(f"{source}: 'sweep' must be a list of grids (- grid: {{key: [values]}})")
    return sweep


def points(cfg: dict, source: str = "config", allowed=None) -> dict[str, Point]:
    """Every point of the sweep by name, in order (grids, then arms, then values); {} without a sweep.
    Raises ConfigError (one line) for a refused value, an unknown arm, or colliding names, and with
    `allowed` (the keys a sweep may set: config.validate passes the model./train. keys of
    config.STEP_KEYS["train"]) for a key outside it."""
    out: dict[str, Point] = {}
    for g, grid in enumerate(_grids(cfg, source)):
        where = f"sweep[{g}]"
        if not isinstance(grid, dict) or not isinstance(grid.get("grid"), dict) or not grid["grid"]:
            raise ConfigError(f"{source}: '{where}' needs a 'grid:' of keys with lists of values")
        unknown = sorted(set(grid) - {"grid", "arms"})
        if unknown:
            raise ConfigError(f"{source}: unknown key '{where}.{unknown[0]}' (a grid has 'grid' and 'arms')")
        arms = grid.get("arms") or list(cfg["runs"])
        for arm in arms:
            if arm not in cfg["runs"]:
                raise ConfigError(f"{source}: '{where}.arms' names '{arm}', which is not an arm under 'runs'")
        keys = list(grid["grid"])
        for key in keys:
            values = grid["grid"][key]
            if key != SEEDS and allowed is not None:
                if key not in allowed:
                    raise ConfigError(
                        f"{source}: '{where}.grid.{key}' is not a setting of a training run; a sweep may set "
                        "'seeds' and the model./train. keys training depends on (not threads, workers, "
                        "checkpoint_interval or a whole section)")
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{source}: '{where}.grid.{key}' must be a non-empty list of values")
            for v in values:
                if key == SEEDS:
                    if not isinstance(v, int) or isinstance(v, bool):
                        raise ConfigError(f"{source}: '{where}.grid.seeds' holds {v!r}; seeds are whole numbers")
                elif isinstance(v, (list, dict)) or v is None:
                    raise ConfigError(f"{source}: '{where}.grid.{key}' holds {v!r}; a sweep sets numbers, "
                                        "strings or booleans")
                elif isinstance(v, str) and not _PART.match(v):
                    raise ConfigError(f"{source}: '{where}.grid.{key}' holds {v!r}; string values in a sweep "
                                        "use a-z, 0-9 and _ (they become part of run names)")
            if key != SEEDS and len(set(map(format_value, values))) != len(values):
                raise ConfigError(f"{source}: '{where}.grid.{key}' lists the same value twice")
        swept = [k for k in keys if k != SEEDS]
        seeds = grid["grid"].get(SEEDS)
        for arm in arms:
            for combo in itertools.product(*(grid["grid"][k] for k in swept)):
                values = tuple(zip(swept, combo))
                name = point_name(arm, values)
                if name in out:
                    raise ConfigError(f"{source}: sweep point '{name}' is listed twice ({where} repeats a point "
                                        "of an earlier grid); each point is one run")
                if name in cfg["runs"]:
                    raise ConfigError(f"{source}: sweep point '{name}' has the name of an arm under 'runs'")
                if len(name.encode()) > MAX_NAME_BYTES:
                    raise ConfigError(f"{source}: sweep point '{name[:60]}...' has a {len(name.encode())}-byte "
                                        f"name; shorten the arm name or sweep fewer keys (at most {MAX_NAME_BYTES})")
                out[name] = Point(name, arm, values, tuple(seeds) if seeds else tuple(cfg["runs"][arm]["seeds"]))
    return out


def run_names(cfg: dict) -> list[str]:
    """The training runs of a configuration: its sweep's points, else its arms."""
    return list(points(cfg)) or list(cfg["runs"])


def point_config(cfg: dict, name: str) -> dict:
    """The configuration one run of `cfg` trains under: for a sweep point, the file's settings with the
    point's values in place and `runs:` holding only the point; for an arm (no sweep), `cfg` itself."""
    pts = points(cfg)
    if not pts:
        return cfg
    if name not in pts:
        raise ConfigError(f"config: no sweep point '{name}' (the sweep has {len(pts)} points, e.g. {next(iter(pts))})")
    p = pts[name]
    out = copy.deepcopy({k: v for k, v in cfg.items() if k != "sweep"})
    for key, value in p.values:
        section, leaf = key.split(".", 1)
        out[section][leaf] = value
    arm = dict(out["runs"][p.arm])  # the arm's label: the map's legend draws arms, its table names points
    arm.update(seeds=list(p.seeds))
    out["runs"] = {name: arm}
    return out


def validate_points(cfg: dict, source: str, validate, allowed) -> None:
    """Every point's configuration passes `validate` (config.validate) as a file would, and every
    swept key is in `allowed`; one ConfigError line naming the point otherwise."""
    for name in points(cfg, source, allowed=set(allowed)):
        try:
            validate(point_config(cfg, name), source=f"{source} (sweep point {name})")
        except ConfigError as exc:
            raise ConfigError(str(exc)) from None
