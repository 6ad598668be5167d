"""The configuration's JSON schema, generated from its dataclasses (config/sections.py and the model's
model/config.py), which declare every key once (`acoustic_mlm.declare.setting`): the field's type gives
the JSON type, its metadata the bounds, enums and description. Validation (config/checks.py) uses the
generated schema; the shipped file next to this module is the same schema for DVC, and
workflow/schemas/config.schema.yaml the same again as YAML, where the Snakemake workflow catalog looks
for it and Snakemake's validator reads it (workflow/rules/common.smk); tests/config/test_schema.py and
tests/pipeline/test_workflow.py hold them equal.

    python -m acoustic_mlm.config --write    # rewrite config.schema.json and workflow/schemas/config.schema.yaml
    python -m acoustic_mlm.config --check    # exit 1 if either shipped file differs from the dataclasses
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from functools import lru_cache
from pathlib import Path

from acoustic_mlm import declare

SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
# The workflow's copy, in the repository beside src/ (absent from an installed package: then not written).
WORKFLOW_SCHEMA_PATH = Path(__file__).parents[3] / "workflow" / "schemas" / "config.schema.yaml"
_HEADER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "acoustic-mlm configuration",
    "description": "One file is Snakemake's configfile and DVC's params file. Unknown keys are errors.",
}
_SCALARS = {int: "integer", float: "number", bool: "boolean", str: "string", type(None): "null"}


def _merge(base: dict, extra: dict) -> dict:
    """`base` with `extra`'s keywords, nested dicts merged; an enum or const stands in for the type."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    if "enum" in out or "const" in out:
        out.pop("type", None)
    return out


def _of_type(tp) -> dict:
    """The JSON schema a Python type annotation gives: scalars, `X | None`, tuples, dicts of sections,
    dataclasses (objects)."""
    if dataclasses.is_dataclass(tp):
        return of_dataclass(tp)
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        kinds = [_of_type(a) for a in args]
        if all(set(k) == {"type"} for k in kinds):
            return {"type": [k["type"] for k in kinds]}
        raise TypeError(f"no JSON schema for {tp}")
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _of_type(args[0])}
        if len(set(args)) == 1:
            return {"type": "array", "minItems": len(args), "maxItems": len(args), "items": _of_type(args[0])}
    if origin is dict and args[0] is str:
        return {"type": "object", "additionalProperties": _of_type(args[1])}
    raise TypeError(f"no JSON schema for {tp}")


def of_field(f: dataclasses.Field, tp) -> dict:
    """One key's schema: its `replace`, else its type's with its declared keywords and description."""
    if declare.REPLACE in f.metadata:
        node = dict(f.metadata[declare.REPLACE])
    else:
        node = _merge(_of_type(tp), f.metadata.get(declare.SCHEMA, {}))
    if declare.DOC in f.metadata:
        node["description"] = f.metadata[declare.DOC]
    return node


def of_dataclass(cls) -> dict:
    """A section's schema: an object of its keys, unknown keys refused, every key not declared optional
    required (sorted, so that the first missing key named is the first in the alphabet)."""
    hints = typing.get_type_hints(cls)
    keys = [f for f in dataclasses.fields(cls) if not f.metadata.get(declare.NOT_A_KEY)]
    return {
        "type": "object",
        "additionalProperties": False,
        "required": sorted(f.name for f in keys if not f.metadata.get(declare.OPTIONAL)),
        "properties": {f.name: of_field(f, hints[f.name]) for f in keys},
    }


@lru_cache(maxsize=1)
def _generated() -> str:
    from acoustic_mlm.config.sections import Config

    schema = {**_HEADER, **of_dataclass(Config)}
    return json.dumps(schema, indent=2) + "\n"  # JSON text: tuples become lists, as in the file


def generate() -> dict:
    """The whole configuration's JSON schema (a fresh copy), from the dataclasses."""
    return json.loads(_generated())


def text() -> str:
    """The schema file's text: generate() as indented JSON."""
    return _generated()


def yaml_text() -> str:
    """The workflow's schema file's text: generate() as YAML, keys in the JSON file's order."""
    import yaml

    return yaml.safe_dump(generate(), sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write or check the configuration's JSON schema from its dataclasses.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite {SCHEMA_PATH.name}")
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 if the shipped file is stale")
    args = p.parse_args(argv)
    files = [(SCHEMA_PATH, text())]
    if WORKFLOW_SCHEMA_PATH.parent.is_dir():
        files.append((WORKFLOW_SCHEMA_PATH, yaml_text()))
    if args.check:
        stale = [path for path, want in files if (path.read_text() if path.exists() else "") != want]
        for path in stale:
            print(f"{path}: stale; run python -m acoustic_mlm.config --write", file=sys.stderr)
        return 1 if stale else 0
    from acoustic_mlm.utils import atomic_path

    for path, want in files:
        with atomic_path(path) as tmp:
            tmp.write_text(want)
        print(f"{path}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
