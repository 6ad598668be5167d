"""dvc.yaml, generated: the DVC pipeline for one configuration file, stated by what the package knows.

    amlm dvc-yaml --config config/proxy.yaml && dvc repro     # write dvc.yaml for a preset, then run it

The stages are the Snakemake rules' (each one `amlm` subcommand). Nothing in the file is written by
hand: each stage's `params` are `config.result_keys` of its steps (`config.STEP_KEYS`, grouped by
`config.DVC_STAGES`), each stage's source `deps` are the package modules its entry module imports,
followed through the import graph (`imports`), so a key or a module cannot be listed twice or
forgotten. The committed dvc.yaml is this module's output for config/config.yaml, byte for byte
(tests/pipeline/test_workflow.py), and the first stage checks that the file still is the generated one
(`amlm dvc-yaml --check`): a sweep's points are stages, so after a change of the sweep (or of which
keys the file holds) a stale dvc.yaml stops `dvc repro` with one line instead of training old points.

**Without `sweep:`** the runs are the arms: one `train` stage with `foreach: ${runs}` (stage names
`train@<arm>`), its params templated on the arm (`runs.${key}.clip`). The file then serves every
configuration with the same keys copied onto the path it names.

**With `sweep:`** every point (`acoustic_mlm.config.sweep`) is a stage of its own, `train-<point>`, then
`map`, `map_figure` and `map_claims` instead of aggregate, figure, stability, claims and compare (as
Snakemake's map.smk). DVC reads params from the YAML file by key, and a point's values live in lists
under `sweep:`, where a key such as `train.lr` cannot be addressed. So a point's stage states its
dependence on the settings in three parts, which together are `result_keys("train", point_config)`:

- its swept values are in its name and in its command (`amlm train --run <point>`): change one value
  and the points holding it become new stages that DVC has never run, while every other point keeps
  its name, command and params and is not rerun; the swept keys are left out of its params, since
  the file's value of a swept key is not the one the point trains with;
- the point's own settings that come from its arm are the arm's keys (`runs.<arm>.clip`), and its
  seeds, when the grid sets them, the grid's list (`sweep.<i>.grid.seeds`, which DVC can address);
- every other training setting is the file's key, as for an arm.

Changing one value therefore reruns exactly the points whose configuration it changes, as in
Snakemake, whose train rule takes `settings_for("train", point)` as params (tests/pipeline/test_engines.py
checks both). One difference is left: inserting a grid before another renumbers the second grid's
`sweep.<i>.grid.seeds` keys, which DVC sees as changed params; put new grids last.

Generic DVC stages are `Stage` values rendered by `render`; to add a stage or a DVC feature (an
experiment's `--set-param` convenience, say), add it to `stages` and, if it needs a new field, to
`Stage` and `_render_stage`.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from acoustic_mlm import config as C
from acoustic_mlm.config import params as P
from acoustic_mlm.config import sweep as S
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import atomic_path

SRC = Path(__file__).parent  # the package's modules: the import graph is read from here
PACKAGE = "src/acoustic_mlm"  # where those modules lie in the repository, as dvc.yaml names them
CHECK = "results/config_check.txt"  # the first stage's marker: every other stage depends on it
# Modules that shape no result: messages, logging and progress, device choice, the command line.
NO_RESULT = frozenset({"utils", "errors", "devices", "cli", "__init__", "__main__", "dvcgen"})
# The modules each stage runs (cli.dispatch); what they import shapes the stage's outputs. Training
# runs through sweep.point_config (a sweep point's settings).
ENTRY = {
    # kernels: `python -m acoustic_mlm` pins the CPU kernels these stages compute with (cpu_kernels)
    "fetch": ("data.fetch", "kernels"),
    "prepare": ("data.prepare", "kernels"),
    "tokenize": ("tokenizer.stage", "kernels"),
    "train": ("train.loop", "config.sweep", "kernels"),
    "aggregate": ("report.aggregate",),
    "figure": ("report.figure",),
    "stability": ("report.stability",),
    "claims": ("report.claims",),
    "compare": ("report.figure",),
    "metrics": ("report.headline",),
    "map": ("report.stability_map",),
    "map_figure": ("report.stability_map",),
    "map_claims": ("report.stability_map",),
    "decide": ("report.decisive",),
}
REFERENCE = "data/reference/paper_curves.csv"
DECISIVE = "results/decisive"  # amlm decide's folder (a sweep's pre-registered verdicts)
WIDTH = 104  # folded commands wrap before this column
COMMENT_COLUMN = 40  # trailing comments start here (or two spaces after a longer line)


# ----------------------------------------------------------------------------- what a stage is


@dataclass
class Out:
    """An output (or metrics or plots file) with DVC's options for it, each with an optional comment."""

    path: str
    options: dict = field(default_factory=dict)  # e.g. {"persist": True}
    comments: dict = field(default_factory=dict)  # option (or "" for the path itself) -> comment


@dataclass
class Stage:
    name: str
    cmd: str
    deps: list[str] = field(default_factory=list)
    params: list[str] | None = field(default_factory=list)  # config keys; None: every key of the file
    outs: list[Out] = field(default_factory=list)
    metrics: list[Out] = field(default_factory=list)
    plots: list[Out] = field(default_factory=list)
    comment: str = ""  # lines written above the stage
    foreach: str | None = None  # DVC's foreach: the stage is its `do:` body


# ----------------------------------------------------------------------------- the import graph


def module_file(name: str, src: Path = SRC) -> Path | None:
    """The file of a package module named as a dotted path under acoustic_mlm ("" is the package)."""
    if not name:
        return src / "__init__.py"
    base = src.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def direct_imports(name: str, src: Path = SRC) -> set[str]:
    """Package modules one module imports (lazy imports inside functions count), as dotted names;
    importing ``a.b`` also runs the package ``a``'s ``__init__`` (unless ``a`` holds the importer)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module_file(name, src).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "acoustic_mlm":
            mod = (node.module or "").removeprefix("acoustic_mlm").lstrip(".")
            for alias in node.names:  # `from acoustic_mlm.data import prepare` imports a module
                sub = f"{mod}.{alias.name}" if mod else alias.name
                found.add(sub if module_file(sub, src) else mod)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("acoustic_mlm.") for a in node.names if a.name.startswith("acoustic_mlm.")}
    with_parents = set()
    for mod in found:
        parts = mod.split(".")
        with_parents |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}  # a module's own packages
    return {m for m in with_parents - own if m and m != name and module_file(m, src)}


def imports(*modules: str, src: Path = SRC) -> set[str]:
    """Package modules the given modules import, transitively, themselves included."""
    seen, todo = set(), list(modules)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += direct_imports(name, src)
    return seen


def shapes_results(name: str, src: Path = SRC) -> bool:
    """Whether a module's code can shape a stage's outputs: not one of NO_RESULT, and not a package
    face that holds nothing but its docstring."""
    if name.split(".")[-1] in NO_RESULT:
        return False
    body = ast.parse(module_file(name, src).read_text()).body
    return not all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def module_deps(entry: tuple[str, ...]) -> list[str]:
    """The source files whose code shapes a stage's outputs, sorted."""
    files = [module_file(m).relative_to(SRC).as_posix() for m in imports(*entry) if shapes_results(m)]
    return [f"{PACKAGE}/{f}" for f in sorted(files)]


# ----------------------------------------------------------------------------- params


# ----------------------------------------------------------------------------- the stages


def _cmd(*words: str) -> str:
    return " ".join(words)


def stages(cfg: C.Config, config_path: str) -> list[Stage]:
    """Every stage of the pipeline for this configuration, in the order they run."""
    q = shlex.quote(config_path)
    data = [
        Stage(
            "check_config",
            _cmd("amlm validate --config", q, "--out", CHECK, "&& amlm dvc-yaml --config", q, "--check"),
            params=None,
            outs=[Out(CHECK)],
            comment="DVC deletes a stage's outputs before running it: the configuration is checked first (and\n"
            "that this file is still the one `amlm dvc-yaml` writes for it), so an invalid file or a\n"
            "stale dvc.yaml stops `dvc repro` before any output is deleted. The marker's bytes never\n"
            "change, so a valid change of config reruns only the stages whose params changed.",
        ),
        Stage(
            "fetch",
            _cmd("amlm fetch --config", q, "--out data/raw --downloads data/downloads"),
            outs=[
                Out("data/raw"),
                Out(
                    "data/downloads",
                    {"persist": True},
                    {
                        "": "the downloaded archive, kept and versioned",
                        "persist": "never deleted before a rerun: fetch reuses it by hash",
                    },
                ),
            ],
        ),
        Stage(
            "prepare",
            _cmd("amlm prepare --config", q, "--raw data/raw --out data/prepared"),
            deps=["data/raw"],
            outs=[Out("data/prepared")],
        ),
        Stage(
            "tokenize",
            _cmd("amlm tokenize --config", q, "--prepared data/prepared --out data/codes"),
            deps=["data/prepared"],
            outs=[Out("data/codes")],
        ),
    ]
    for s in data[1:]:
        s.deps = [CHECK] + s.deps + module_deps(ENTRY[s.name])
        s.params = P.stage_params(cfg, s.name)
    pts = cfg.points
    return data + (_sweep_stages(cfg, q, pts) if pts else _arm_stages(cfg, q))


def _train(name: str, run: str, q: str, params: list[str], entry: tuple[str, ...], comments: bool) -> Stage:
    folder = f"results/runs/{run}"
    return Stage(
        name,
        _cmd("amlm train --config", q, "--run", run, "--prepared data/prepared --codes data/codes --out", folder),
        deps=[CHECK, "data/prepared", "data/codes"] + module_deps(entry),
        params=params,
        outs=[
            Out(
                f"{folder}/seeds",
                {"persist": True},
                {
                    "": "per seed: metrics, summary, final checkpoint",
                    "persist": "completed seeds are kept and not retrained",
                }
                if comments
                else {},
            ),
            Out(f"{folder}/metrics.csv"),
            Out(
                f"{folder}/summary.json",
                comments={"": "an output, not a metric: results/metrics.json is"} if comments else {},
            ),
        ],
    )


def _summary(name: str, cmd: str, deps: list[str], cfg: C.Config, **outputs) -> Stage:
    return Stage(name, cmd, deps=[CHECK] + deps + module_deps(ENTRY[name]), params=P.stage_params(cfg, name), **outputs)


def _image_stage(name: str, cmd: str, deps: list[str], cfg: C.Config, stem: str) -> Stage:
    """A stage drawing `stem`.png, .pdf and .svg: the PNG is an image plot, which `dvc plots show` renders."""
    image = Out(f"{stem}.png", comments={"": "an image plot: dvc plots show renders it"})
    return _summary(name, cmd, deps, cfg, outs=[Out(f"{stem}.{e}") for e in ("pdf", "svg")], plots=[image])


FINALS = "results/final_losses.json"  # `amlm aggregate --finals`: each arm's final loss under its role
METRICS = "results/metrics.json"  # `amlm metrics`: the one flat metrics file (final losses, verdicts)
CLAIMS = "results/claims.json"
# The one top-level plot: the arms' codebook-0 curves overlaid on a log step axis (.dvc/plots/loss_curves.json).
CURVES_PLOT = Out(
    "results/loss_curves.csv",
    {"template": "loss_curves", "x": "step", "y": "loss_bits"},
    {"template": ".dvc/plots/loss_curves.json: codebook 0, a line per run and seed, log x axis"},
)


def _arm_stages(cfg: C.Config, q: str) -> list[Stage]:
    curves, diagnostics, figures = "results/loss_curves.csv", "results/diagnostics.csv", "results/figures"
    train = _train("train", "${key}", q, P.arm_params(cfg), ENTRY["train"], comments=True)
    train.foreach = "${runs}"
    return [
        train,
        _summary(
            "aggregate",
            _cmd("amlm aggregate --config", q, "--runs-dir results/runs --out", curves, "--finals", FINALS),
            ["results/runs"],
            cfg,
            outs=[
                Out(curves, comments={"": "the top-level plot (plots: below)"}),
                Out(diagnostics, comments={"": "gradient norms, clipping, stability diagnostics, tidy"}),
                Out(FINALS),
            ],
        ),
        _summary(
            "figure",
            _cmd("amlm figure --config", q, "--curves", curves, "--reference", REFERENCE, "--out", figures),
            [curves, REFERENCE],
            cfg,
            outs=[Out(f"{figures}/acoustic_mlm_loss_codebook0.{e}") for e in ("png", "pdf", "svg")],
        ),
        _image_stage(
            "stability",
            _cmd("amlm stability --config", q, "--curves", curves, "--diagnostics", diagnostics, "--out", figures),
            [curves, diagnostics],
            cfg,
            f"{figures}/stability",
        ),
        _summary(
            "claims",
            _cmd(
                "amlm claims --config",
                q,
                "--curves",
                curves,
                "--reference",
                REFERENCE,
                "--diagnostics",
                diagnostics,
                "--out-json results/claims.json --out-md results/claims.md",
            ),
            [curves, diagnostics, REFERENCE],
            cfg,
            outs=[Out("results/claims.md"), Out(CLAIMS)],
        ),
        Stage(
            "metrics",
            _cmd("amlm metrics --config", q, "--finals", FINALS, "--claims", CLAIMS, "--out", METRICS),
            deps=[CHECK, FINALS, CLAIMS] + module_deps(ENTRY["metrics"]),
            params=[],  # no setting: the numbers are the two files'
            metrics=[Out(METRICS, comments={"": "the one metrics file: final losses, verdicts (dvc exp show)"})],
        ),
        _summary(
            "compare",
            _cmd(
                "amlm compare --config",
                q,
                "--curves",
                curves,
                "--reference",
                REFERENCE,
                "--out",
                f"{figures}/paper_vs_reproduction.png",
            ),
            [curves, REFERENCE],
            cfg,
            outs=[Out(f"{figures}/paper_vs_reproduction.png")],
        ),
    ]


def train_stage_name(point: str) -> str:
    """The DVC stage of a sweep point (`@` is DVC's own, for foreach stages)."""
    return f"train-{point}"


def _sweep_stages(cfg: C.Config, q: str, pts: dict[str, S.Point]) -> list[Stage]:
    grids = P.grid_of_points(cfg)
    trains = [
        _train(train_stage_name(name), name, q, P.point_params(cfg, p, grids[name]), ENTRY["train"], comments=i == 0)
        for i, (name, p) in enumerate(pts.items())
    ]
    trains[0].comment = (
        f"The sweep's {len(pts)} points, one stage each (acoustic_mlm.dvcgen). A point's swept values are in\n"
        "its name and command, so changing one makes new stages of the points holding it; its params are\n"
        "the file's other training keys, its arm's keys and its grid's seeds: exactly the points a change\n"
        "reaches rerun. After changing the sweep, run `amlm dvc-yaml` again."
    )
    table, figures = "results/stability_map.csv", "results/figures"
    runs = [f"results/runs/{name}/{f}" for name in pts for f in ("metrics.csv", "summary.json")]
    return trains + [
        _summary(
            "map",
            _cmd("amlm map --config", q, "--runs-dir results/runs --out", table),
            runs,
            cfg,
            outs=[Out(table, comments={"": "one row per point and seed"})],
        ),
        _image_stage(
            "map_figure",
            _cmd("amlm map-figure --config", q, "--map", table, "--out", figures),
            [table],
            cfg,
            f"{figures}/lr_sensitivity",
        ),
        _summary(
            "map_claims",
            _cmd(
                "amlm map-claims --config",
                q,
                "--map",
                table,
                "--out-json results/map_claims.json --out-md results/map_claims.md",
            ),
            [table],
            cfg,
            outs=[Out("results/map_claims.md")],
            metrics=[Out("results/map_claims.json")],
        ),
        _summary(
            "decide",
            _cmd("amlm decide --config", q, "--runs-dir results/runs --codes data/codes --out", DECISIVE),
            runs + ["data/codes/tokenizer.json"],
            cfg,
            outs=[Out(f"{DECISIVE}/{f}") for f in ("runs.csv", "cells.csv", "decisive.md")],
            metrics=[Out(f"{DECISIVE}/decisive.json")],
        ),
    ]


# ----------------------------------------------------------------------------- the text


def _scalar(value) -> str:
    """A YAML scalar: a string plain where it reads back as the same string, else double-quoted."""
    if not isinstance(value, str):
        return json.dumps(value)  # true, numbers: JSON's spelling is YAML's
    try:
        plain = yaml.safe_load(f"k: {value}") == {"k": value}
    except yaml.YAMLError:
        plain = False
    return value if plain else json.dumps(value)


def _line(text: str, comment: str = "") -> str:
    if not comment:
        return text
    return f"{text:<{COMMENT_COLUMN}}# {comment}" if len(text) < COMMENT_COLUMN else f"{text}  # {comment}"


def _cmd_lines(cmd: str, indent: str) -> list[str]:
    one = f"{indent}cmd: {_scalar(cmd)}"
    if len(one) <= WIDTH or "\n" in cmd or "  " in cmd:
        return [one]
    # Folded lines join with one space: break only between an option and the one before it.
    groups: list[str] = []
    for word in cmd.split(" "):
        if groups and not word.startswith(("--", "&&")):
            groups[-1] += f" {word}"
        else:
            groups.append(word)
    body, width = [""], WIDTH - len(indent) - 2
    for group in groups:
        if body[-1] and len(body[-1]) + 1 + len(group) > width:
            body.append("")
        body[-1] = f"{body[-1]} {group}" if body[-1] else group
    return [f"{indent}cmd: >-"] + [f"{indent}  {line}" for line in body]


def _file_lines(kind: str, files: list[Out], indent: str) -> list[str]:
    if not files:
        return []
    lines = [f"{indent}{kind}:"]
    for f in files:
        head = f"{indent}  - {_scalar(f.path)}" + (":" if f.options else "")
        lines.append(_line(head, f.comments.get("", "")))
        for key, value in f.options.items():
            lines.append(_line(f"{indent}      {key}: {_scalar(value)}", f.comments.get(key, "")))
    return lines


def _render_stage(s: Stage, config_path: str) -> list[str]:
    lines = [f"  # {c}" if c else "  #" for c in s.comment.splitlines()] + [f"  {s.name}:"]
    indent = "    "
    if s.foreach is not None:
        lines += [f"    foreach: {s.foreach}", "    do:"]
        indent = "      "
    lines += _cmd_lines(s.cmd, indent)
    if s.deps:
        lines += [f"{indent}deps:"] + [f"{indent}  - {_scalar(d)}" for d in s.deps]
    if s.params is None:
        lines += [f"{indent}params:", _line(f"{indent}  - {_scalar(config_path)}:", "every key")]
    elif s.params:
        lines += [f"{indent}params:", f"{indent}  - {_scalar(config_path)}:"]
        lines += [f"{indent}      - {_scalar(k)}" for k in s.params]
    lines += _file_lines("outs", s.outs, indent)
    lines += _file_lines("metrics", s.metrics, indent)
    lines += _file_lines("plots", s.plots, indent)
    return lines


def render(cfg: C.Config, config_path: str) -> str:
    """The text of dvc.yaml for this configuration, read by DVC at `config_path` (relative to the
    folder of dvc.yaml)."""
    all_stages = stages(cfg, config_path)
    pts = cfg.points
    cmd = f"amlm dvc-yaml --config {shlex.quote(config_path)}"
    head = [
        f"# DVC pipeline: the same `amlm` stages as the Snakemake rules, params from {config_path}.",
        f"# Generated by `{cmd}` (acoustic_mlm.dvcgen) from the settings",
        "# each step depends on (config.STEP_KEYS) and the modules each stage imports: regenerate it,",
        "# do not edit it (its first stage checks that it is still the generated file).",
        "#   dvc repro                                                 this configuration",
        "#   amlm dvc-yaml --config config/smoke.yaml && dvc repro     another preset, or a sweep "
        "(git checkout dvc.yaml to undo)",
        "# Audio, codes, checkpoints, metrics and figures are cached outputs (dvc push / dvc pull).",
    ]
    if pts:
        head.insert(4, f"# The sweep's {len(pts)} training runs, then its stability map (as workflow/rules/map.smk).")
    lines = head + ([] if pts else ["vars:", f"  - {_scalar(config_path)}"]) + ["", "stages:"]
    for i, s in enumerate(all_stages):
        if i:
            lines.append("")
        lines += _render_stage(s, config_path)
    if not pts:  # the arms' curves overlaid: one plot for the whole pipeline, as DVC's top-level plots
        lines += [""] + _file_lines("plots", [CURVES_PLOT], "")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the file


def config_path_for(config: Path, out: Path) -> str:
    """The configuration's path as dvc.yaml names it: relative to the folder of dvc.yaml, inside it."""
    rel = Path(os.path.relpath(Path(config).resolve(), Path(out).resolve().parent))
    if rel.parts and rel.parts[0] == "..":
        raise UserError(
            f"{config}: outside {Path(out).resolve().parent}; DVC reads params only from files "
            "inside its repository: put the configuration under the folder of dvc.yaml"
        )
    return rel.as_posix()


def _check_out(out: Path) -> None:
    """--out names a file (or nothing yet), not a folder or something under a file."""
    out = Path(out)
    if out.is_dir():
        raise UserError(
            f"{out}: --out names an existing folder, not a file; name the file to write (e.g. {out / 'dvc.yaml'})"
        )
    for above in out.parents:
        if above.exists() or above.is_symlink():
            if not above.is_dir():
                raise UserError(f"{out}: --out lies under {above}, which is a file, not a folder")
            break


def write(cfg: C.Config, config: Path, out: Path) -> Path:
    _check_out(out)
    text = render(cfg, config_path_for(config, out))
    with atomic_path(Path(out)) as tmp:
        tmp.write_text(text)
    return Path(out)


def check(cfg: C.Config, config: Path, out: Path) -> None:
    """Raise UserError (one line) unless `out` holds exactly what `write` would write."""
    _check_out(out)
    path = Path(out)
    current = path.read_text() if path.is_file() else None
    if current != render(cfg, config_path_for(config, out)):
        what = "does not exist" if current is None else "is not the file generated for it"
        raise UserError(
            f"{path} {what} (its sweep or keys changed since): run `amlm dvc-yaml --config {config}` "
            "and then `dvc repro` again"
        )
