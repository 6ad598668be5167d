"""A round is a declaration: `config/experiments/<round>.yaml`, read strictly into a typed `Round`.

    round: 3                         # the round's number: the `round` column of its runs
    rules: pairs                     # which of the rules (experiments.rules) judge it
    base: config/proxy.yaml          # the preset every run starts from ...
    size: {model.dim: 32, ...}       # ... with these overrides (keys the preset has)
    corpus: tones                    # what it trains on: tones, or a preset that makes it (experiments.corpora)
    tables: data/reference/confirm_round   # runs.csv (and curves, spikes) of its runs
    verdict: verdicts_restated.json  # the file judge writes beside them
    arms: {prenorm_clip1: {norm: pre, attention: softmax, clip: 1.0}, ...}
    cells: {S1: {lr: 0.05}, D12: {lr: 0.01, overrides: {model.layers: 12}}}
    seeds: {main: 101..112}          # named seed lists, fresh per round (a list, or A..B)
    promises: [{id, says, favoured, against, cell, seeds, outcome, test, sided, alpha, family}, ...]
    families: {confirmatory: {alpha: 0.025, control: holm, members: [confirm_round/P1, ...]}}
    pilot: config/experiments/<pilot>.yaml   # the round it depends on, if any

Every key is checked: an unknown key, a value of the wrong kind and a contradiction (a promise whose
arm, cell, seeds or family is not declared, a promise's alpha unlike its family's, DeepNorm with
Pre-Norm, an override the preset lacks) are one line naming the file and the key (`UserError`),
before anything is read or trained.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from acoustic_mlm import config as C
from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import corpora

RULES = ("pairs", "fp16_gains", "pilot", "sizing", "decisive", "range", "dose_response", "equivalence")
OUTCOMES = ("trained", "trained_through", "verdict", "final_loss")
TESTS = (
    "fisher",
    "rules",
    "exact_shift",
    "equivalence",
)  # rules: the round's own rule decides (the decisive map, the fp16 range);
# exact_shift: a dose-response's exact conditional test, the rates as strata (experiments.dose);
# equivalence: the Welch interval of a difference in final loss against a margin (rules.judge_equivalence)
ROLES = ("confirmatory", "calibration", "secondary", "control")  # control: a positive control (a planted difference)
SIDES = ("greater",)
CONTROLS = ("holm",)
NORMS, ATTENTIONS = ("pre", "post", "deepnorm"), ("softmax", "pb_relax", "unfused", "qk_norm")
TOP = {
    "round": int,
    "rules": str,
    "says": str,
    "base": str,
    "size": dict,
    "corpus": str,
    "tables": str,
    "verdict": str,
    "arms": dict,
    "cells": dict,
    "seeds": dict,
    "promises": list,
    "families": dict,
    "pilot": str,
    "sensitivity": dict,
    "reference": dict,
    "params": dict,
}
REQUIRED = ("round", "rules", "tables", "verdict")
PROMISE = {
    "id": str,
    "says": str,
    "favoured": str,
    "against": str,
    "cell": str,
    "cell_against": str,
    "seeds": str,
    "seeds_against": str,
    "outcome": str,
    "test": str,
    "sided": str,
    "alpha": float,
    "family": str,
    "role": str,
}
ARM = {"norm": str, "attention": str, "clip": float}
CELL = {"lr": float, "rates": list, "gain": float, "overrides": dict}
FAMILY = {"alpha": float, "control": str, "members": list}
SENSITIVITY = {"cell": str, "arms": list, "rates": list, "seed": int}
REFERENCE = {"tables": str, "size": str, "arm": str, "lr": float, "seed": int}


@dataclass(frozen=True)
class Promise:
    id: str
    says: str
    favoured: str
    against: str
    cell: str
    seeds: tuple[int, ...]
    seeds_against: tuple[int, ...]
    cell_against: str = ""  # the against arm's cell where it differs (a dose-response across widths)
    outcome: str = "trained"
    test: str = "fisher"
    sided: str = "greater"
    alpha: float = 0.025
    family: str | None = None
    role: str = "confirmatory"  # calibration (A/A), secondary (estimated, no verdict), control: never in a family


@dataclass(frozen=True)
class Family:
    name: str
    alpha: float
    control: str
    members: tuple[str, ...]  # "<round name>/<promise id>"


@dataclass(frozen=True)
class Round:
    """A round's declaration, typed (see the module's docstring)."""

    path: Path
    name: str
    number: int
    rules: str
    tables: Path
    verdict: str
    says: str = ""
    base: Path | None = None
    size: dict = field(default_factory=dict)
    corpus: str = ""
    arms: dict = field(default_factory=dict)
    cells: dict = field(default_factory=dict)
    seeds: dict = field(default_factory=dict)
    promises: tuple[Promise, ...] = ()
    families: dict = field(default_factory=dict)
    pilot: Path | None = None
    sensitivity: dict | None = None
    reference: dict | None = None
    params: dict = field(default_factory=dict)

    def promise(self, pid: str) -> Promise:
        return next(p for p in self.promises if p.id == pid)


def _fail(path: Path, key: str, what: str) -> UserError:
    return UserError(f"{path}: '{key}' {what}")


def _kind(path: Path, key: str, value, kind):
    """value as `kind` (an int is a float where a float goes; a bool is never a number)."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and kind in (int, float) or not isinstance(value, kind):
        raise _fail(path, key, f"is {value!r}, not {'a number' if kind is float else 'a ' + kind.__name__}")
    return value


def _keys(path: Path, where: str, obj: dict, spec: dict, required=()) -> dict:
    """obj's keys all in spec, each of its kind, the `required` ones present: an unknown or missing key
    is refused, naming the first."""
    if not isinstance(obj, dict):
        raise _fail(path, where, f"is {obj!r}, not a mapping")
    name = lambda k: f"{where}.{k}" if where else str(k)  # noqa: E731
    for k in obj:
        if k not in spec:
            raise _fail(path, name(k), f"is not a key of a round (known: {', '.join(spec)})")
    for k in required:
        if k not in obj:
            raise _fail(path, name(k), "is missing" + ("" if where else ": every round names it"))
    return {k: _kind(path, name(k), v, spec[k]) for k, v in obj.items()}


def _choice(path: Path, key: str, value: str, allowed: tuple) -> str:
    if value not in allowed:
        raise _fail(path, key, f"is {value!r}, not one of {', '.join(allowed)}")
    return value


def seed_list(path: Path, key: str, value) -> tuple[int, ...]:
    """A seed list: [1, 2, 3], or "A..B" for A to B inclusive; positive, no seed twice."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*", value)
        if not m or int(m[1]) > int(m[2]):
            raise _fail(path, key, f"is {value!r}, not a list of seeds or A..B with A <= B")
        seeds = tuple(range(int(m[1]), int(m[2]) + 1))
    elif isinstance(value, list) and value:
        seeds = tuple(_kind(path, key, s, int) for s in value)
    else:
        raise _fail(path, key, f"is {value!r}, not a list of seeds or A..B")
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise _fail(path, key, "lists a seed twice or a negative seed")
    return seeds


def load(path: str | Path) -> Round:
    """The declaration at `path`, checked whole (module docstring); any fault is one UserError line."""
    path = Path(path)
    raw = C.read_yaml(path)
    d = _keys(path, "", raw, TOP, REQUIRED)
    rules = _choice(path, "rules", d["rules"], RULES)
    base = Path(d["base"]) if "base" in d else None
    size = dict(d.get("size", {}))
    if base is not None:
        _check_overrides(path, "size", base, size)
    arms = {}
    for name, arm in d.get("arms", {}).items():
        a = _keys(path, f"arms.{name}", arm, ARM, ARM)
        _choice(path, f"arms.{name}.norm", a["norm"], NORMS)
        _choice(path, f"arms.{name}.attention", a["attention"], ATTENTIONS)
        if a["clip"] < 0:
            raise _fail(path, f"arms.{name}.clip", "is negative (0 turns clipping off)")
        arms[name] = a
    cells = {}
    for name, cell in d.get("cells", {}).items():
        c = _keys(path, f"cells.{name}", cell, CELL)
        if base is not None and c.get("overrides"):
            _check_overrides(path, f"cells.{name}.overrides", base, c["overrides"])
        if "lr" in c and not c["lr"] > 0:
            raise _fail(path, f"cells.{name}.lr", "must be a positive rate")
        if "rates" in c:
            if "lr" in c:
                raise _fail(path, f"cells.{name}.rates", "is given with 'lr'; a cell has one rate or a list of rates")
            rates = [_kind(path, f"cells.{name}.rates", r, float) for r in c["rates"]]
            if len(rates) < 2 or len(set(rates)) != len(rates) or min(rates) <= 0 or rates != sorted(rates):
                raise _fail(path, f"cells.{name}.rates", "must list two or more positive rates, rising, none twice")
            c["rates"] = rates
        if (rules == "dose_response") != ("rates" in c):
            need = "a list of 'rates'" if rules == "dose_response" else "one 'lr' (rates: belong to a dose_response)"
            raise _fail(path, f"cells.{name}", f"needs {need}")
        cells[name] = c
    seeds = {name: seed_list(path, f"seeds.{name}", v) for name, v in d.get("seeds", {}).items()}
    families = {}
    for name, fam in d.get("families", {}).items():
        f = _keys(path, f"families.{name}", fam, FAMILY, FAMILY)
        _choice(path, f"families.{name}.control", f["control"], CONTROLS)
        _alpha(path, f"families.{name}.alpha", f["alpha"])
        members = tuple(_kind(path, f"families.{name}.members", m, str) for m in f["members"])
        if len(set(members)) != len(members) or not all(re.fullmatch(r"[\w-]+/[\w-]+", m) for m in members):
            raise _fail(path, f"families.{name}.members", "must name each member once as <round>/<promise id>")
        families[name] = Family(name, f["alpha"], f["control"], members)
    rnd_name = path.stem
    promises = [
        _promise(path, i, p, arms, cells, seeds, families, rnd_name) for i, p in enumerate(d.get("promises", []))
    ]
    ids = [p.id for p in promises]
    if len(set(ids)) != len(ids):
        raise _fail(path, "promises", "gives one id to two promises")
    sensitivity = None
    if "sensitivity" in d:
        sensitivity = _keys(path, "sensitivity", d["sensitivity"], SENSITIVITY)
        for arm in sensitivity.get("arms", []):
            if arm not in arms:
                raise _fail(path, "sensitivity.arms", f"names {arm!r}, not an arm of the round")
        if sensitivity.get("cell") not in cells:
            raise _fail(path, "sensitivity.cell", f"is {sensitivity.get('cell')!r}, not a cell of the round")
    reference = _keys(path, "reference", d["reference"], REFERENCE) if "reference" in d else None
    return Round(
        path=path,
        name=rnd_name,
        number=d["round"],
        rules=rules,
        tables=Path(d["tables"]),
        verdict=_file_name(path, d["verdict"]),
        says=d.get("says", ""),
        base=base,
        size=size,
        corpus=corpora.check(path, d.get("corpus", "")),
        arms=arms,
        cells=cells,
        seeds=seeds,
        promises=tuple(promises),
        families=families,
        pilot=Path(d["pilot"]) if "pilot" in d else None,
        sensitivity=sensitivity,
        reference=reference,
        params=dict(d.get("params", {})),
    )


def _file_name(path: Path, name: str) -> str:
    if "/" in name or name in ("", ".", "..") or not name.endswith(".json"):
        raise _fail(path, "verdict", f"is {name!r}, not a .json file name (the file goes beside the tables)")
    return name


def _alpha(path: Path, key: str, alpha: float) -> None:
    if not 0 < alpha < 0.5:
        raise _fail(path, key, f"is {alpha}, not a level between 0 and 0.5")


def _promise(path, i, raw, arms, cells, seeds, families, rnd_name) -> Promise:
    where = f"promises[{i}]"
    p = _keys(path, where, raw, PROMISE, ("id", "says", "favoured", "against", "cell", "seeds"))
    for k in ("favoured", "against"):
        if p[k] not in arms:
            raise _fail(path, f"{where}.{k}", f"names {p[k]!r}, not an arm of the round")
    for k in ("cell", "cell_against"):
        if k in p and p[k] not in cells:
            raise _fail(path, f"{where}.{k}", f"names {p[k]!r}, not a cell of the round")
    for k in ("seeds", "seeds_against"):
        if k in p and p[k] not in seeds:
            raise _fail(path, f"{where}.{k}", f"names {p[k]!r}, not a seed list of the round")
    role = _choice(path, f"{where}.role", p.get("role", "confirmatory"), ROLES)
    same_cell = p.get("cell_against", p["cell"]) == p["cell"]
    if p["favoured"] == p["against"] and same_cell and role != "calibration":
        raise _fail(path, f"{where}.against", "is the favoured arm itself; an A/A pair is role: calibration")
    test = _choice(path, f"{where}.test", p.get("test", "fisher"), TESTS)
    if (test == "exact_shift") != ("rates" in cells[p["cell"]]):
        raise _fail(path, f"{where}.test", "is exact_shift exactly where the promise's cell lists rates")
    alpha = p.get("alpha", 0.025)
    _alpha(path, f"{where}.alpha", alpha)
    family = p.get("family")
    if family is not None:
        if role != "confirmatory":
            raise _fail(path, f"{where}.family", f"is set for a {role} promise; a family holds confirmatory tests")
        if family not in families:
            raise _fail(path, f"{where}.family", f"names {family!r}, not a family of the round")
        fam = families[family]
        if abs(fam.alpha - alpha) > 1e-12:
            raise _fail(path, f"{where}.alpha", f"is {alpha} but its family {family!r} controls at {fam.alpha}")
        if f"{rnd_name}/{p['id']}" not in fam.members:
            raise _fail(path, f"{where}.family", f"is {family!r}, whose members do not list {rnd_name}/{p['id']}")
    return Promise(
        id=p["id"],
        says=p["says"],
        favoured=p["favoured"],
        against=p["against"],
        cell=p["cell"],
        seeds=seeds[p["seeds"]],
        seeds_against=seeds[p.get("seeds_against", p["seeds"])],
        cell_against=p.get("cell_against", p["cell"]),
        outcome=_choice(path, f"{where}.outcome", p.get("outcome", "trained"), OUTCOMES),
        test=test,
        sided=_choice(path, f"{where}.sided", p.get("sided", "greater"), SIDES),
        alpha=alpha,
        family=family,
        role=role,
    )


def _check_overrides(path: Path, key: str, base: Path, overrides: dict) -> None:
    """Each dotted override names a key the base preset has (one path that overrides any field)."""
    preset = C.read_yaml(base)
    for dotted in overrides:
        section, _, name = str(dotted).partition(".")
        if not (isinstance(preset.get(section), dict) and name in preset[section]):
            raise _fail(path, f"{key}.{dotted}", f"is not a key of {base}")


def settings(
    rnd: Round, arm: str, cell: str, seed: int, lr: float | None = None, gain: float | None = None
) -> C.Config:
    """One run's configuration: the base preset, the round's size, the cell's overrides, rate (or `lr`)
    and qk gain (or `gain`), one arm and one seed, no sweep; validated and typed by the package's
    configuration."""
    import copy

    s = copy.deepcopy(C.read_yaml(rnd.base))
    s.pop("sweep", None)
    c = rnd.cells[cell]
    values = {**rnd.size, **c.get("overrides", {}), **({"train.lr": c["lr"]} if "lr" in c else {})}
    values |= {"model.qk_gain": c["gain"]} if "gain" in c else {}
    values |= {"train.lr": lr} if lr is not None else {}
    values |= {"model.qk_gain": gain} if gain is not None else {}
    for dotted, value in values.items():
        section, _, key = dotted.partition(".")
        s[section][key] = value
    s["runs"] = {arm: {"label": arm, **rnd.arms[arm], "seeds": [seed]}}
    return C.from_mapping(s, f"{rnd.path} ({cell}, {arm}, seed {seed})")
