"""Write docs/configuration.md, the reference of every configuration key, from the package's own
statements of them: the typed configuration (acoustic_mlm.config.sections and acoustic_mlm.model.config,
each key declared once: its Python type) and the JSON schema generated from it (acoustic_mlm.config.schema:
keys, allowed values, descriptions), the default preset's value and comment
(config/config.yaml; a sweep's keys from config/proxy.yaml) and the steps each key reruns
(acoustic_mlm.config.steps.STEP_KEYS).

    python docs/make_configuration.py            # rewrite docs/configuration.md
    python docs/make_configuration.py --check    # exit 1 if the file is stale or a key lacks its entry

tests/docs/test_configuration_reference.py runs the check.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from acoustic_mlm import config as C  # noqa: E402
from acoustic_mlm.config import schema as config_schema  # noqa: E402
from acoustic_mlm.config import sections, steps  # noqa: E402
from acoustic_mlm.model.config import ModelSection  # noqa: E402
from acoustic_mlm.utils import atomic_path  # noqa: E402

OUT = ROOT / "docs" / "configuration.md"
DEFAULT = "config/config.yaml"
SWEEP_PRESET = "config/proxy.yaml"  # the default has no `sweep:`; its keys are shown with this preset's values
NAME = "<NAME>"  # an arm's name (runs:) or a swept key (sweep[].grid)

# The typed configuration: each schema object's dataclass (None: a mapping of free names).
TYPED = {
    "": sections.Config,
    "data": sections.DataConfig,
    "data.synthetic": sections.SyntheticConfig,
    "tokenizer": sections.TokenizerConfig,
    "model": ModelSection,
    "train": sections.TrainSection,
    f"runs.{NAME}": sections.RunConfig,
    "figure": sections.FigureConfig,
    "claims": sections.ClaimThresholds,
    "sweep[]": sections.SweepGrid,
}
# Typed fields that are not keys of the file: where a value comes from, or the file's own mapping.
NOT_KEYS = {"source", "mapping", f"runs.{NAME}.name"}

SECTIONS = {
    "cpu_kernels": "Which CPU kernels torch, MKL, oneDNN and numpy use ([reproducibility.md](reproducibility.md)).",
    "data": "Where the audio comes from and how it is split ([pipeline.md](pipeline.md#data-sources)).",
    "tokenizer": "How the audio becomes EnCodec codes ([tokenizer.md](tokenizer.md)).",
    "model": "The architecture and the masked objective, the same for every arm ([recipe.md](recipe.md)).",
    "train": "The optimiser, schedule, precision and logging of every arm ([gpus.md](gpus.md) for devices).",
    "runs": "The arms: one entry per training run of the figure; `<NAME>` is the run's name.",
    "figure": "The figure's axes and split.",
    "claims": "The thresholds of the figure's claims ([stability.md](stability.md)).",
    "sweep": "A stability map: grids of values around the arms ([pipeline.md](pipeline.md#sweeps-the-stability-map)).",
}


def load_schema() -> dict:
    """The configuration's JSON schema, generated from the dataclasses (the shipped file is the same)."""
    return config_schema.generate()


def schema_keys(node: dict, path: str = "") -> list[tuple[str, dict]]:
    """Every leaf key of the schema as (dotted key, its schema), in the schema's order; each key's
    schema carries `_required`: whether it and every section above it are required."""
    out = []
    required = set(node.get("required", ()))
    children = dict(node.get("properties", {}))
    if isinstance(node.get("additionalProperties"), dict):
        children[NAME] = node["additionalProperties"]
    for name, sub in children.items():
        key = f"{path}.{name}" if path else name
        sub = sub | {"_required": (name in required or name == NAME) and node.get("_required", True)}
        items = sub.get("items") if sub.get("type") == "array" else None
        if sub.get("type") == "object" and (sub.get("properties") or isinstance(sub.get("additionalProperties"), dict)):
            out += schema_keys(sub, key)
        elif isinstance(items, dict) and items.get("type") == "object":
            out += schema_keys(items | {"_required": sub["_required"]}, f"{key}[]")
        else:
            out.append((key, sub))
    return out


def typed_fields() -> dict[str, str]:
    """Every key the typed configuration holds, with its Python type as written in the dataclass."""
    out = {}
    for prefix, cls in TYPED.items():
        hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
        for f in dataclasses.fields(cls):
            key = f"{prefix}.{f.name}" if prefix else f.name
            if key in NOT_KEYS or (prefix + "." + f.name).lstrip(".") in TYPED:
                continue
            if dataclasses.is_dataclass(hints[f.name]) or f.name in ("runs", "sweep"):
                continue  # a section: its own fields are listed
            out[key] = _type_name(hints[f.name])
    return out


def _type_name(tp) -> str:
    text = str(tp).replace("typing.", "").replace("NoneType", "None")
    return re.sub(r"<class '([\w.]+)'>", lambda m: m.group(1).rsplit(".", 1)[-1], text)


def field_comments() -> dict[str, str]:
    """The comment beside each field of the typed configuration's dataclasses, by dotted key."""
    out = {}
    for prefix, cls in TYPED.items():
        for m in re.finditer(r"^    (\w+): [^#\n]+#\s*(.+)$", inspect.getsource(cls), re.M):
            out[f"{prefix}.{m.group(1)}" if prefix else m.group(1)] = m.group(2).strip()
    return out


def yaml_comments(path: Path) -> dict[str, str]:
    """The trailing comment of each key's line in a preset, by dotted key (arms as runs.<NAME>)."""
    out, stack = {}, []
    for line in path.read_text().splitlines():
        m = re.match(r"^( *)([A-Za-z0-9_-]+):(.*)$", line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent, name, rest = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = [n for _, n in stack]
        if parent == ["runs"]:
            name = NAME
        stack.append((indent, name))
        key = ".".join(parent + [name])
        comment = rest.split(" #", 1)[1].strip() if " #" in rest else ""
        if comment and key not in out:
            out[key] = comment
    return out


def _value(mapping: dict, key: str):
    node = mapping
    for part in key.split("."):
        if part == NAME:
            node = next(iter(node.values()))
        elif part.endswith("[]"):
            node = node[part[:-2]][0]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return "*not set*"
    return f"`{json.dumps(node)}`"


def _allowed(schema: dict) -> str:
    parts = []
    if "enum" in schema:
        parts.append(" | ".join(f"`{json.dumps(v)}`" for v in schema["enum"]))
    if "const" in schema:
        parts.append(f"`{json.dumps(schema['const'])}` only")
    if "type" in schema:
        t = schema["type"]
        parts.append(" or ".join(t) if isinstance(t, list) else t)
    for word, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if word in schema:
            parts.append(f"{sign} {schema[word]}")
    if "minItems" in schema:
        parts.append(f"{schema['minItems']}-{schema.get('maxItems', 'n')} items")
    return ", ".join(parts) or "see the schema"


def _steps_of() -> dict[str, list[str]]:
    """For each doc key, the pipeline steps whose outputs depend on it (a change reruns them)."""
    default, sweep = C.load(ROOT / DEFAULT), C.load(ROOT / SWEEP_PRESET)
    out: dict[str, list[str]] = {}
    for step in steps.STEP_KEYS:
        for cfg in (default, sweep):
            first = next(iter(cfg.runs))
            for leaf in steps.result_keys(step, cfg, first):
                key = re.sub(r"^runs\.[^.]+\.", f"runs.{NAME}.", leaf)
                if step not in out.setdefault(key, []):
                    out[key].append(step)
    return out


def _reruns(key: str, by_key: dict[str, list[str]]) -> str:
    found = list(by_key.get(key, []))
    if key.startswith("sweep"):
        found = list(by_key.get("sweep", []))
    return ", ".join(f"`{s}`" for s in found) or "none: where or how fast, not what"


def render() -> str:
    schema = load_schema()
    default = json.loads(json.dumps(C.load(ROOT / DEFAULT).mapping))
    sweep = json.loads(json.dumps(C.load(ROOT / SWEEP_PRESET).mapping))
    comments = yaml_comments(ROOT / DEFAULT) | {
        k: v for k, v in yaml_comments(ROOT / SWEEP_PRESET).items() if k.startswith("sweep")
    }
    typed, by_key, fields = typed_fields(), _steps_of(), field_comments()
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python docs/make_configuration.py` from the JSON schema, the typed configuration,",
        "config/config.yaml and the steps' settings; do not edit: regenerate. -->",
        "",
        "Every key of a configuration file, section by section. One YAML file is the whole configuration:",
        "Snakemake's `--configfile` and DVC's params file ([pipeline.md](pipeline.md)). A key marked *optional*",
        "may be left out; unknown keys are refused, and `amlm validate --config FILE` checks a file in one line",
        "([refusals.md](refusals.md)). *Allowed* is the JSON schema's, generated from the typed configuration",
        "(`python -m acoustic_mlm.config --write` writes `src/acoustic_mlm/config/config.schema.json`), *typed as*",
        "the field of the typed configuration (`acoustic_mlm.config.sections`, `acoustic_mlm.model.config`, where",
        "each key is declared once), *default* the value in",
        f"`{DEFAULT}` (the `sweep` keys: `{SWEEP_PRESET}`'s), *reruns* the pipeline steps whose outputs",
        "depend on the key (`acoustic_mlm.config.steps.STEP_KEYS`): change it and Snakemake and DVC rerun",
        "those steps and the ones after them. Rules across keys (`model.dim` divisible by `model.heads`,",
        "`train.warmup_steps` below the updates, unique arm labels, ...) are checked by `acoustic_mlm.config.checks`.",
        "",
    ]
    keys = schema_keys(schema)
    for section in SECTIONS:
        rows = [(k, s) for k, s in keys if k == section or k.startswith((section + ".", section + "["))]
        lines += [f"## {section}", "", SECTIONS[section], ""]
        lines += ["| key | allowed | typed as | default | what | reruns |", "| --- | --- | --- | --- | --- | --- |"]
        for key, sub in rows:
            what = (
                sub.get("description") or comments.get(key) or fields.get(key) or fields.get(key.rsplit(".", 1)[0], "")
            )
            value = _value(sweep if key.startswith("sweep") else default, key)
            cells = [
                f"`{key}`" + ("" if sub["_required"] else " (optional)"),
                _allowed(sub),
                f"`{typed.get(key, typed.get(key.rsplit('.', 1)[0], '-'))}`",
                value,
                what,
                _reruns(key, by_key),
            ]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def missing(text: str) -> list[str]:
    """Keys of the schema or of the typed configuration without a row in `text`."""
    schema = load_schema()
    rows = set(re.findall(r"^\| `([^`]+)`(?: \(optional\))? \|", text, re.M))
    gaps = {k for k, _ in schema_keys(schema) if k not in rows}
    # a typed field holding a mapping of free names (sweep[].grid) is entered as its rows' prefix
    gaps |= {k for k in typed_fields() if k not in rows and not any(r.startswith(k + ".") for r in rows)}
    return sorted(gaps)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write docs/configuration.md from the schema and the typed configuration.")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale or incomplete")
    args = p.parse_args(argv)
    text = render()
    if missing(text):
        print(f"keys without an entry: {', '.join(missing(text))}", file=sys.stderr)
        return 1
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        gaps = missing(current)
        if current != text or gaps:
            print(
                f"{_shown(OUT)}: stale{' (no entry for ' + ', '.join(gaps) + ')' if gaps else ''}; "
                "run python docs/make_configuration.py",
                file=sys.stderr,
            )
            return 1
        return 0
    with atomic_path(OUT) as tmp:
        tmp.write_text(text)
    print(f"{_shown(OUT)}: {len(re.findall(r'^[|] `', text, re.M))} keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
