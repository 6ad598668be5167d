"""Validating a configuration: the hand-written checks (acoustic_mlm.config.checks) against a pydantic v2
model of the `train:` section, built from the same declarations (the dataclass fields and their
`declare.setting` metadata). Answers: is pydantic faster, and are its messages as good (one line, the key
named) for five bad inputs: an unknown key, a wrong type, a value out of range, a bad enum, a missing key.

    python benchmarks/config_validation.py [--repeats 200]

Times are medians over `--repeats` calls in this process, after one warm-up call. The pydantic model
covers one section; the checks validate the whole file (schema, then the rules across keys), so the
section's share of the checks' time is measured too: `jsonschema` on the `train:` section alone.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.metadata
import statistics
import sys
import time
import typing
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import jsonschema  # noqa: E402
import pydantic  # noqa: E402

from acoustic_mlm import config as C  # noqa: E402
from acoustic_mlm import declare  # noqa: E402
from acoustic_mlm.config import checks  # noqa: E402
from acoustic_mlm.config import schema as config_schema  # noqa: E402

PRESETS = ("config/config.yaml", "config/paper.yaml")
_BOUNDS = {
    "minimum": "ge",
    "exclusiveMinimum": "gt",
    "maximum": "le",
    "exclusiveMaximum": "lt",
    "minLength": "min_length",
}
# Scalars strict (no "3" for 3, no 1.0 for 1, no 1 for True), as the checks refuse them; lists stay
# accepted for tuples (YAML has no tuples).
_STRICT = {int: pydantic.StrictInt, bool: pydantic.StrictBool, str: pydantic.StrictStr, float: pydantic.StrictFloat}


def _strict(tp):
    if tp in _STRICT:
        return _STRICT[tp]
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple:
        return tuple[tuple(a if a is Ellipsis else _strict(a) for a in args)]
    if args and type(None) in args:
        return _strict(args[0]) | None
    return tp


def train_model() -> type[pydantic.BaseModel]:
    """A strict pydantic model of the `train:` section from TrainSection's fields: their types, their
    bounds and enums (the `declare.setting` metadata), their defaults; unknown keys forbidden."""
    hints = typing.get_type_hints(C.TrainSection)
    specs = {}
    for f in dataclasses.fields(C.TrainSection):
        meta = f.metadata.get(declare.SCHEMA, {})
        tp = _strict(hints[f.name])
        if "enum" in meta:
            tp = Literal[tuple(meta["enum"])]
        if "items" in meta and "enum" in meta["items"]:
            tp = tuple[Literal[tuple(meta["items"]["enum"])], ...]
        kwargs = {word: meta[key] for key, word in _BOUNDS.items() if key in meta}
        default = f.default if f.default is not dataclasses.MISSING else ...
        specs[f.name] = (tp, pydantic.Field(default, **kwargs))
    config = pydantic.ConfigDict(extra="forbid", frozen=True)
    return pydantic.create_model("TrainModel", __config__=config, **specs)


def pydantic_line(model, section: dict, source: str) -> str | None:
    """pydantic's first error as one line naming the key, as the checks write theirs; None if valid."""
    try:
        model.model_validate(section)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(["train", *(str(p) for p in err["loc"])])
        return f"{source}: '{key}': {err['msg']}"
    return None


def checks_line(cfg: dict, source: str) -> str | None:
    try:
        checks.validate(cfg, source)
    except C.ConfigError as exc:
        return str(exc)
    return None


def median_ms(call, repeats: int) -> float:
    call()  # warm-up: imports, caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


BAD = {  # what is wrong -> how the `train:` section is spoiled
    "unknown key": lambda t: t.update(lrr=1e-3),
    "wrong type": lambda t: t.update(steps="ten"),
    "out of range": lambda t: t.update(lr=-1.0),
    "bad enum": lambda t: t.update(precision="fp8"),
    "missing key": lambda t: t.pop("lr"),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args(argv)
    model = train_model()
    train_schema = config_schema.generate()["properties"]["train"]
    validator = jsonschema.Draft202012Validator(train_schema)
    versions = f"pydantic {pydantic.VERSION}, jsonschema {importlib.metadata.version('jsonschema')}"
    print(f"{versions}, median of {args.repeats} calls")
    print()
    print("| preset | checks.validate, whole file (ms) | jsonschema, train: only (ms) | pydantic, train: only (ms) |")
    print("| --- | ---: | ---: | ---: |")
    for preset in PRESETS:
        cfg = C.read_yaml(ROOT / preset)
        assert checks_line(copy.deepcopy(cfg), preset) is None and pydantic_line(model, cfg["train"], preset) is None
        whole = median_ms(lambda c=cfg, s=preset: checks.validate(copy.deepcopy(c), s), args.repeats)
        js = median_ms(lambda t=cfg["train"]: list(validator.iter_errors(t)), args.repeats)
        pd_ms = median_ms(lambda t=cfg["train"]: model.model_validate(t), args.repeats)
        print(f"| `{preset}` | {whole:.2f} | {js:.3f} | {pd_ms:.3f} |")
    print()
    print("| bad input (config/config.yaml) | checks.validate | pydantic |")
    print("| --- | --- | --- |")
    for what, spoil in BAD.items():
        cfg = C.read_yaml(ROOT / PRESETS[0])
        spoil(cfg["train"])
        ours, theirs = checks_line(copy.deepcopy(cfg), "config.yaml"), pydantic_line(model, cfg["train"], "config.yaml")
        assert ours and theirs, what
        print(f"| {what} | {ours} | {theirs} |".replace("\n", " "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
