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
are each one line naming what the file says (the grid, the key, the values). Validation is linear
in the points (validate_points: each swept value checked once, each point by the rules across keys
only); a 10,000-point sweep validates in about a second (BENCHMARKS.md). Standard library and
config only: Snakemake imports this without torch.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
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


def _show(value) -> str:
    return repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def _check_arms(cfg: dict, grid: dict, where: str, source: str) -> list[str]:
    """The grid's `arms:` (every arm when absent): a list naming each arm under `runs` once."""
    if "arms" not in grid or grid["arms"] is None:
        return list(cfg["runs"])
    arms = grid["arms"]
    if not isinstance(arms, list) or not arms:
        raise ConfigError(
            f"{source}: '{where}.arms' must be a non-empty list of arm names (- prenorm_clip1); leave "
            "it out to sweep every arm"
        )
    seen = set()
    for arm in arms:
        if not isinstance(arm, str) or arm not in cfg["runs"]:
            raise ConfigError(
                f"{source}: '{where}.arms' names {_show(arm)}, which is not an arm under 'runs' "
                f"(the arms: {', '.join(cfg['runs'])})"
            )
        if arm in seen:
            raise ConfigError(f"{source}: '{where}.arms' lists '{arm}' twice; list each arm once (a point is one run)")
        seen.add(arm)
    return arms


def _check_values(key: str, values, where: str, source: str, allowed) -> None:
    """One grid key's values: a non-empty list of scalars (seeds: whole numbers), no two equal and no
    two that round to one point name."""
    if key != SEEDS and allowed is not None and key not in allowed:
        raise ConfigError(
            f"{source}: '{where}.grid.{key}' is not a setting of a training run; a sweep may set "
            "'seeds' and the model./train. keys training depends on (not threads, workers, "
            "checkpoint_interval or a whole section)"
        )
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{source}: '{where}.grid.{key}' must be a non-empty list of values")
    named: dict[str, object] = {}
    for v in values:
        if key == SEEDS:
            if not isinstance(v, int) or isinstance(v, bool):
                raise ConfigError(f"{source}: '{where}.grid.seeds' holds {v!r}; seeds are whole numbers")
        elif isinstance(v, (list, dict)) or v is None:
            raise ConfigError(f"{source}: '{where}.grid.{key}' holds {v!r}; a sweep sets numbers, strings or booleans")
        elif isinstance(v, str) and text_number(v) is not None:
            raise ConfigError(f"{source}: '{where}.grid.{key}' holds {v!r}, {text_number(v)}")
        elif isinstance(v, str) and not _PART.match(v):
            raise ConfigError(
                f"{source}: '{where}.grid.{key}' holds {v!r}; string values in a sweep "
                "use a-z, 0-9 and _ (they become part of run names)"
            )
        name = format_value(v) if key != SEEDS else str(v)
        if name in named:
            first = named[name]
            if first == v and type(first) is type(v) or key == SEEDS:
                raise ConfigError(f"{source}: '{where}.grid.{key}' lists {_show(v)} twice; list each value once")
            raise ConfigError(
                f"{source}: '{where}.grid.{key}' holds {_show(first)} and {_show(v)}, which name one "
                f"point ('{_short(key)}-{name}': a point's name keeps 7 significant digits); keep "
                "one, or make them differ within 7 digits"
            )
        named[name] = v


# The points of the configurations seen last, by what they are made of (the sweep, the arms and their
# seeds): every stage, Snakemake's plan and DVC's generation ask for them once per run.
_CACHE: dict[str, dict[str, Point]] = {}
_CACHE_SIZE = 8


def _cache_key(cfg: dict, source: str, allowed) -> str:
    runs = cfg.get("runs")
    seeds = {a: r.get("seeds") for a, r in runs.items()} if isinstance(runs, dict) else runs
    return json.dumps([cfg.get("sweep"), seeds, source, sorted(allowed) if allowed is not None else None], default=repr)


def points(cfg: dict, source: str = "config", allowed=None) -> dict[str, Point]:
    """Every point of the sweep by name, in order (grids, then arms, then values); {} without a sweep.
    Raises ConfigError (one line) naming what the file says that is wrong: a refused value, an arm
    unknown or listed twice in a grid, a grid of seeds only, two values of a key that are equal or
    round to one name, a point given by two grids; with `allowed` (the keys a sweep may set:
    config.validate passes the model./train. keys of config.STEP_KEYS["train"]), a key outside it.

    Linear in the points; the result is kept for the same sweep and arms (do not change it)."""
    if cfg.get("sweep") is None:
        return {}
    key = _cache_key(cfg, source, allowed)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _points(cfg, source, allowed)
    return _CACHE[key]


def _points(cfg: dict, source: str, allowed) -> dict[str, Point]:
    out: dict[str, Point] = {}
    origin: dict[str, int] = {}  # point name -> the grid that gave it
    for g, grid in enumerate(_grids(cfg, source)):
        where = f"sweep[{g}]"
        if not isinstance(grid, dict) or not isinstance(grid.get("grid"), dict) or not grid["grid"]:
            raise ConfigError(f"{source}: '{where}' needs a 'grid:' of keys with lists of values")
        unknown = sorted(set(grid) - {"grid", "arms"})
        if unknown:
            raise ConfigError(f"{source}: unknown key '{where}.{unknown[0]}' (a grid has 'grid' and 'arms')")
        arms = _check_arms(cfg, grid, where, source)
        keys = list(grid["grid"])
        for key in keys:
            _check_values(key, grid["grid"][key], where, source, allowed)
        swept = [k for k in keys if k != SEEDS]
        if not swept:
            raise ConfigError(
                f"{source}: '{where}.grid' sets only 'seeds'; a grid sweeps at least one model./train. "
                "setting (an arm's own seeds are 'runs.<arm>.seeds')"
            )
        seeds = grid["grid"].get(SEEDS)
        for arm in arms:
            arm_seeds = tuple(seeds) if seeds else tuple(cfg["runs"][arm]["seeds"])
            for combo in itertools.product(*(grid["grid"][k] for k in swept)):
                values = tuple(zip(swept, combo))
                name = point_name(arm, values)
                if name in out:
                    before = out[name].values
                    differ = [
                        f"{k} {_show(a)} there, {_show(b)} here"
                        for (k, a), (_, b) in zip(before, values)
                        if a != b or type(a) is not type(b)
                    ]
                    raise ConfigError(
                        f"{source}: '{where}' gives point '{name}', which 'sweep[{origin[name]}]' gives "
                        f"too{' (' + '; '.join(differ) + ')' if differ else ''}; each point is one run: "
                        "take it out of one grid"
                    )
                if name in cfg["runs"]:
                    raise ConfigError(f"{source}: sweep point '{name}' has the name of an arm under 'runs'")
                if len(name.encode()) > MAX_NAME_BYTES:
                    raise ConfigError(
                        f"{source}: sweep point '{name[:60]}...' has a {len(name.encode())}-byte "
                        f"name; shorten the arm name or sweep fewer keys (at most {MAX_NAME_BYTES})"
                    )
                out[name] = Point(name, arm, values, arm_seeds)
                origin[name] = g
    return out


def run_names(cfg: dict) -> list[str]:
    """The training runs of a configuration: its sweep's points, else its arms."""
    return list(points(cfg)) or list(cfg["runs"])


def _point_view(cfg: dict, p: Point) -> dict:
    """The point's configuration sharing every unchanged value with `cfg` (read it, do not change it)."""
    view = {k: v for k, v in cfg.items() if k != "sweep"}
    for section in dict.fromkeys(key.split(".", 1)[0] for key, _ in p.values):
        view[section] = dict(cfg[section])
    for key, value in p.values:
        section, leaf = key.split(".", 1)
        view[section][leaf] = value
    arm = dict(cfg["runs"][p.arm])  # the arm's label: the map's legend draws arms, its table names points
    arm.update(seeds=list(p.seeds))
    view["runs"] = {p.name: arm}
    return view


def point_config(cfg: dict, name: str) -> dict:
    """The configuration one run of `cfg` trains under: for a sweep point, the file's settings with the
    point's values in place and `runs:` holding only the point; for an arm (no sweep), `cfg` itself."""
    pts = points(cfg)
    if not pts:
        return cfg
    if name not in pts:
        raise ConfigError(f"config: no sweep point '{name}' (the sweep has {len(pts)} points, e.g. {next(iter(pts))})")
    return copy.deepcopy(_point_view(cfg, pts[name]))


def validate_points(cfg: dict, source: str, check_point, allowed, check_value=None) -> None:
    """A sweep of a configuration that passed config.validate, checked in time linear in its points:
    its grids (points, with `allowed` the keys a sweep may set), each swept value once against its
    key's own rules (`check_value(key, value, source, where)`: the schema, finiteness), then each
    point's configuration against the rules across keys (`check_point(cfg, source)`), as a file of
    those settings would be; one ConfigError line naming the grid or the point otherwise."""
    pts = points(cfg, source, allowed=set(allowed))
    if check_value is not None:
        for g, grid in enumerate(cfg["sweep"]):
            for key, values in grid["grid"].items():
                if key != SEEDS:
                    for v in values:
                        check_value(key, v, source, f"sweep[{g}].grid.{key}")
    for name, p in pts.items():
        check_point(_point_view(cfg, p), f"{source} (sweep point {name})")


def text_number(value: str) -> str | None:
    """For a string that reads as a number but that YAML 1.1 reads as text (1e-3: an exponent needs a
    decimal point there), what to write instead; None for any other string."""
    try:
        number = float(value)
    except ValueError:
        return None
    if not math.isfinite(number) or not value.strip():
        return None
    mantissa, e, exponent = repr(number).partition("e")
    written = f"{mantissa}{'' if '.' in mantissa else '.0'}e{exponent}" if e else repr(number)
    if "e" in value.lower():
        return f"which YAML reads as text, not a number (an exponent needs a decimal point there); write {written}"
    return f"which YAML reads as text, not a number; write it without quotes, as {written}"
