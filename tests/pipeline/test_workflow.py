"""The two engines: Snakemake (lint, DAG, env files) and DVC (stage definitions).

The end-to-end runs of both engines on the smoke preset are in test_e2e.py.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import RUN_NAMES, copy_repo, write_sweep_config

SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_every_rule_has_log_threads_and_conda(root):
    text = "\n".join(p.read_text() for p in (root / "workflow" / "rules").glob("*.smk"))
    rules = re.split(r"^(?:rule|checkpoint) ", text, flags=re.M)[1:]
    assert {r.split(":")[0] for r in rules} == {
        "fetch",
        "plan",
        "prepare_shard",
        "prepare",
        "encodec_checkpoint",
        "fit_tokenizer",
        "tokenize_shard",
        "tokenize",
        "train",
        "aggregate",
        "figure",
        "stability",
        "claims",
        "metrics",
        "compare",
        "preflight",
        "stability_map",
        "map_figure",
        "map_claims",
        "decide",
        "status",
        "experiment_run",
        "experiment_judge",
    }
    for r in rules:
        name = r.split(":")[0]
        for directive in ("log:", "threads:", "conda:", "shell:"):
            assert directive in r, f"rule {name} lacks {directive}"
        assert "{params.cli}" in r, f"rule {name} does not call the package CLI"


def test_jobs_run_the_package_from_source_with_pythonpath(root):
    common = (root / "workflow" / "rules" / "common.smk").read_text()
    assert 'PYTHONPATH="{SRC}" python -m acoustic_mlm' in common


def test_snakemake_lint(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(SNAKEMAKE + ["--lint"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_snakefiles_are_snakefmt_clean(root):
    """`snakefmt --check .` (the workflow catalog's format check, settings in pyproject's [tool.snakefmt])
    finds every Snakefile and .smk file and would change none."""
    snakefiles = sorted(
        p.relative_to(root).as_posix() for p in [root / "Snakefile", *(root / "workflow").rglob("*")] if p.is_file()
    )
    snakefiles = [p for p in snakefiles if p.endswith((".smk", "Snakefile"))]
    proc = subprocess.run(
        [sys.executable, "-m", "snakefmt", "--check", "--verbose", "."],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"All {len(snakefiles)} file(s) would be left unchanged" in proc.stderr, proc.stderr


@pytest.mark.parametrize("preset, gpu", [("smoke.yaml", 0), ("paper.yaml", 1)])
def test_snakemake_dry_run_dag(root, tmp_path, preset, gpu):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        SNAKEMAKE + ["-n", "--cores", "2", "--configfile", f"config/{preset}", "--printshellcmds"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for run in RUN_NAMES:
        assert f"train {run} " in out
    assert re.search(r"train\s+4", out)  # four training jobs in the job table
    assert f"--config {repo}/config/{preset}" in out or f"--config config/{preset}" in out


def test_workflow_snakefile_alone_targets_the_pipeline_and_the_map(root, tmp_path):
    """`-s workflow/Snakefile` with no target (the catalog's call) plans the figure, or with a `sweep:` the
    stability map: `all` must live in the Snakefile, since an included file's `default_target` is reset."""
    repo = copy_repo(root, tmp_path / "repo")
    for preset, final in [("smoke.yaml", "metrics"), ("decisive.yaml", "map_claims")]:
        proc = subprocess.run(
            SNAKEMAKE + ["-s", "workflow/Snakefile", "-n", "--configfile", f"config/{preset}"],
            cwd=repo,
            capture_output=True,
            text=True,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert "Nothing to be done" not in out, out[-3000:]
        assert re.search(rf"^{final}\s+1$", out, re.M), out[-3000:]
        assert re.search(r"^all\s+1$", out, re.M), out[-3000:]


@pytest.mark.slow
def test_snakemake_preflight_target_is_not_part_of_all(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        SNAKEMAKE + ["-n", "--cores", "1", "--printshellcmds", "preflight", "--configfile", "config/paper.yaml"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"preflight --config config/paper\.yaml --threads \d+ --out results", out), out
    assert not re.search(r"\btrain\s+\d", out)  # no data or training jobs: preflight needs none
    proc = subprocess.run(SNAKEMAKE + ["-n", "--cores", "1"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0 and "rule preflight" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_snakemake_config_overrides_reach_every_job_through_one_merged_file(root, tmp_path):
    """`--config KEY=VALUE` (the catalog's way): the file's settings with the override merged in are
    written to results/config.yaml, which every job's command reads; a nested value is typed as YAML types it."""
    repo = copy_repo(root, tmp_path / "repo")
    smoke = yaml.safe_load((root / "config" / "smoke.yaml").read_text())
    assert smoke["cpu_kernels"] == "avx2" and smoke["train"]["steps"] != 20
    proc = subprocess.run(
        SNAKEMAKE
        + ["-n", "--cores", "1", "--printshellcmds", "--configfile", "config/smoke.yaml"]
        + ["--config", "cpu_kernels=native", "train={steps: 20, lr: 1e-3}"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    commands = [line for line in out.splitlines() if "python -m acoustic_mlm" in line]
    assert len(commands) >= 10 and all("--config results/config.yaml " in c for c in commands), commands
    assert re.search(r"train \S+ --config results/config\.yaml", out)
    merged = yaml.safe_load((repo / "results" / "config.yaml").read_text())
    expected = {**smoke, "cpu_kernels": "native", "train": {**smoke["train"], "steps": 20, "lr": 0.001}}
    assert merged == expected  # the override and nothing else: the other train keys are the file's
    # The next run's overrides replace the last's: the file is rewritten, the file's train section is back.
    again = subprocess.run(
        SNAKEMAKE + ["-n", "--cores", "1", "--configfile", "config/smoke.yaml", "--config", "cpu_kernels=native"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load((repo / "results" / "config.yaml").read_text())["train"] == smoke["train"]
    # Without overrides the jobs read the file itself, as before.
    plain = subprocess.run(
        SNAKEMAKE + ["-n", "--cores", "1", "--printshellcmds", "--configfile", "config/smoke.yaml"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 0 and "--config config/smoke.yaml " in plain.stdout + plain.stderr
    assert "results/config.yaml" not in plain.stdout + plain.stderr


@pytest.mark.parametrize(
    "override, needle",
    [
        ("cpu_kernels=avx9", "'cpu_kernels': 'avx9' is not one of ['avx2', 'native']"),
        ("train={steps: 5}", "'train.warmup_steps' (10) must be below 'train.steps' (5)"),
        ("steps=10", "unknown key 'steps'"),
    ],
)
def test_snakemake_refuses_an_invalid_override_in_one_line(root, tmp_path, override, needle):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        SNAKEMAKE + ["-n", "--cores", "1", "--configfile", "config/smoke.yaml", "--config", override],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line.lower() or "invalid" in line]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    prefix = "snakemake: invalid configuration: config/smoke.yaml with --config"
    assert len(errors) == 1 and errors[0].startswith(prefix)
    assert needle in errors[0], errors
    assert not (repo / "results" / "config.yaml").exists()  # nothing written for a refused override


@pytest.mark.slow
def test_the_catalog_test_config_draws_the_rule_graph(root, tmp_path):
    """The Snakemake workflow catalog's check: `.test/` holds the smoke preset, and the rule graph of
    `-s workflow/Snakefile -d .test` is the pipeline's."""
    link = root / ".test" / "config" / "config.yaml"
    assert link.resolve() == (root / "config" / "smoke.yaml").resolve()
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        SNAKEMAKE + ["-s", "workflow/Snakefile", "-d", ".test", "--rulegraph"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    labels = set(re.findall(r'label = "(\w+)"', proc.stdout))
    assert {"fetch", "plan", "prepare", "tokenize", "train", "aggregate", "figure", "claims", "all"} <= labels
    dry = subprocess.run(
        SNAKEMAKE + ["-s", "workflow/Snakefile", "-d", ".test", "-n", "--cores", "1", "--printshellcmds"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert 'PYTHONPATH="../src" python -m acoustic_mlm fetch --config config/config.yaml' in dry.stdout
    assert "--reference ../data/reference/paper_curves.csv" in dry.stdout


def test_the_workflow_schema_is_the_packages_schema(root):
    """workflow/schemas/config.schema.yaml (the catalog's place, read by Snakemake's validate) is the
    schema generated from the configuration's dataclasses, written as YAML by
    `python -m acoustic_mlm.config --write` (which `--check` also checks)."""
    from acoustic_mlm.config import schema

    path = root / "workflow" / "schemas" / "config.schema.yaml"
    assert schema.WORKFLOW_SCHEMA_PATH == path
    assert path.read_text() == schema.yaml_text(), "stale: run python -m acoustic_mlm.config --write"
    shipped = json.loads((root / "src/acoustic_mlm/config/config.schema.json").read_text())
    assert yaml.safe_load(path.read_text()) == shipped
    common = (root / "workflow" / "rules" / "common.smk").read_text()
    assert 'validate(_whole, str(ROOT / "workflow/schemas/config.schema.yaml")' in common
    assert "except ImportError" not in common  # Snakemake's validate runs on every parse, not as a fallback


def test_snakemakes_validate_refuses_what_the_package_refuses(root):
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    path = str(root / "workflow" / "schemas" / "config.schema.yaml")
    cfg = yaml.safe_load((root / "config" / "smoke.yaml").read_text())
    validate(dict(cfg), path, set_default=False)
    for bad in ({**cfg, "cpu_kernels": "avx9"}, {**cfg, "typo": 1}, {**cfg, "train": {**cfg["train"], "steps": "x"}}):
        with pytest.raises(WorkflowError):
            validate(bad, path, set_default=False)


def test_snakemake_refuses_invalid_config(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    cfg = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())
    cfg["train"]["stepz"] = 1
    (repo / "config" / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        SNAKEMAKE + ["-n", "--cores", "1", "--configfile", "config/bad.yaml"], cwd=repo, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "stepz" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_dvc_stages_call_the_same_commands_as_the_rules(root, tmp_path):
    rules = "\n".join(p.read_text() for p in (root / "workflow" / "rules").glob("*.smk"))
    # Snakemake runs the same check while it parses the workflow (common.smk), DVC as its first stage
    assert "amlm_config.from_mapping(_whole, source=_source)" in rules
    for stages in (_dvc(root)["stages"], _sweep_dvc(root, tmp_path)["stages"]):
        assert stages.pop("check_config")["cmd"].startswith("amlm validate")
        for name, stage in stages.items():
            cmd = (stage.get("do") or stage)["cmd"]
            sub = cmd.split()[1]
            assert cmd.startswith("amlm ") and f"{{params.cli}} {sub} " in rules, name
    assert _dvc(root)["stages"]["train"]["foreach"] == "${runs}"


def test_slurm_profile_dry_run_requests_gpus(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        SNAKEMAKE + ["--profile", "profiles/slurm", "--configfile", "config/paper.yaml", "-n"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    blocks = re.split(r"\n(?=(?:local)?rule \w+:)", out)
    train_blocks = [b for b in blocks if re.match(r"(local)?rule train:", b.strip())]
    assert len(train_blocks) == 4
    assert all("gpu=64" in b and "nodes=8" in b and "runtime=2880" in b for b in train_blocks)  # 8 nodes x 8 GPUs


# ------------------------------------------------------------------------- one statement of what each stage depends on
#
# dvc.yaml is generated (`amlm dvc-yaml`, acoustic_mlm.dvcgen) from config.STEP_KEYS and the import
# graph. The tests below hold the generated files to both, independently of the generator's code.

# The modules each DVC stage runs (cli.dispatch; training goes through sweep.point_config); the
# modules they import (transitively) shape its outputs.
# kernels: `python -m acoustic_mlm` pins the CPU kernels the computing stages run with (cpu_kernels)
STAGE_MODULE = {
    "fetch": ("data.fetch", "kernels"),
    "prepare": ("data.prepare", "kernels"),
    "tokenize": ("tokenizer.stage", "kernels"),
    "train": ("train.loop", "config.sweep", "kernels"),
    "aggregate": ("report.aggregate",),
    "figure": ("report.figure",),
    "claims": ("report.claims",),
    "compare": ("report.figure",),
    "stability": ("report.stability",),
    "map": ("report.stability_map",),
    "map_figure": ("report.stability_map",),
    "map_claims": ("report.stability_map",),
    "decide": ("report.decisive",),
    "metrics": ("report.headline",),
}
MAP_STAGES = {"map", "map_figure", "map_claims", "decide"}  # with a sweep, instead of aggregate ... compare
# Modules that shape no result: messages, logging and progress, device choice, the command line.
NO_RESULT = {"utils", "errors", "devices", "cli", "__init__", "__main__", "dvcgen"}


def _imports(root, *modules: str) -> set[str]:
    """Package modules `modules` import, transitively (lazy imports inside functions included), as
    dotted names: the generator's own reading of the import graph, on this checkout's sources,
    without the modules that shape no result and the package faces that hold only a docstring."""
    from acoustic_mlm.dvcgen import imports, shapes_results

    src = root / "src" / "acoustic_mlm"
    return {m for m in imports(*modules, src=src) if m.split(".")[-1] not in NO_RESULT and shapes_results(m, src)}


def _dotted(dep: str) -> str:
    """src/acoustic_mlm/data/fetch.py -> data.fetch; src/acoustic_mlm/config/__init__.py -> config."""
    module = Path(dep).relative_to("src/acoustic_mlm").with_suffix("").as_posix()
    return module.removesuffix("/__init__").replace("/", ".")


def _dvc(root) -> dict:
    return yaml.safe_load((root / "dvc.yaml").read_text())


def _sweep_dvc(root, tmp_path) -> dict:
    """dvc.yaml generated for a small sweep (helpers.SWEEP: 9 points) at config/sweep.yaml."""
    from acoustic_mlm import config as C
    from acoustic_mlm import dvcgen

    path = write_sweep_config(root, tmp_path / "config" / "sweep.yaml")
    return yaml.safe_load(dvcgen.render(C.load(path), "config/sweep.yaml"))


def _kind(stage: str) -> str:
    """The DVC stage a sweep point's training stage stands for."""
    return "train" if stage.startswith("train-") else stage


def _get(cfg, dotted: str):
    """A value at a key of the file as DVC reads it (dotted, list items by index)."""
    node = cfg
    for part in dotted.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _leaves_of(node, prefix):
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves_of(v, f"{prefix}.{k}")]
    return [prefix]


def _declared(cfg: dict, stage: dict, path: str) -> dict:
    """{key: value} of the settings a stage's params name, each section expanded to its keys."""
    entries = [k for block in stage.get("params", []) for k in block[path]]
    return {leaf: _get(cfg, leaf) for entry in entries for leaf in _leaves_of(_get(cfg, entry), entry)}


def test_committed_dvc_yaml_is_the_generated_one(root):
    from acoustic_mlm import config as C
    from acoustic_mlm import dvcgen

    expected = dvcgen.render(C.load(root / "config" / "config.yaml"), "config/config.yaml")
    assert (root / "dvc.yaml").read_text() == expected, "dvc.yaml is stale: run `amlm dvc-yaml`"


@pytest.mark.slow
def test_generated_params_name_each_key_once(root, tmp_path):
    """No key twice, and no key inside a section that is already listed (`model` and `model.dim`)."""
    for dvc, path in ((_dvc(root), "config/config.yaml"), (_sweep_dvc(root, tmp_path), "config/sweep.yaml")):
        for name, stage in dvc["stages"].items():
            stage = stage.get("do", stage)
            entries = [k for block in stage.get("params", []) if block[path] for k in block[path]]
            assert len(entries) == len(set(entries)), f"{name}: {entries}"
            nested = [(a, b) for a in entries for b in entries if b.startswith(a + ".")]
            assert not nested, f"{name}: {nested}"


@pytest.mark.parametrize("preset", ["config.yaml", "smoke.yaml", "gpu-small.yaml", "paper.yaml"])
def test_dvc_params_are_the_settings_each_stage_depends_on(root, preset):
    """dvc.yaml's params, expanded to the config's keys, equal config.result_keys of the stage's steps."""
    from acoustic_mlm import config as C

    cfg = C.load(root / "config" / preset)
    settings = C.read_yaml(root / "config" / preset)  # the file as DVC reads its params
    stages = _dvc(root)["stages"]
    check = stages.pop("check_config")  # the first stage: every key, so an invalid file stops DVC first
    assert check["params"] == [{"config/config.yaml": None}] and check["cmd"].startswith("amlm validate")
    assert "amlm dvc-yaml --config config/config.yaml --check" in check["cmd"]  # and a stale dvc.yaml
    assert all("results/config_check.txt" in s.get("do", s)["deps"] for s in stages.values())
    # `metrics` (the flat metrics file) reads two files and no setting: it is no step of config.DVC_STAGES
    assert set(stages) == set(C.DVC_STAGES) - MAP_STAGES | {"metrics"} and "params" not in stages["metrics"]
    for run in RUN_NAMES:
        for name, stage in stages.items():
            stage = stage.get("do", stage)
            entries = [
                k.replace("${key}", run) for block in stage.get("params", []) for k in block["config/config.yaml"]
            ]
            declared = {leaf for entry in entries for leaf in _leaves_of(_get(settings, entry), entry)}
            expected = {k for step in C.DVC_STAGES.get(name, ()) for k in C.result_keys(step, cfg, run)}
            assert declared == expected, (
                f"dvc.yaml stage {name}: extra {sorted(declared - expected)}, missing {sorted(expected - declared)}"
            )


@pytest.mark.slow
def test_sweep_dvc_params_state_exactly_each_points_settings(root, tmp_path):
    """A point's stage: its params (keys of the file) and its name (the swept values) together give
    exactly the settings its training depends on, result_keys of its own configuration."""
    from acoustic_mlm import config as C
    from acoustic_mlm.config import sweep

    stages = _sweep_dvc(root, tmp_path)["stages"]
    cfg = C.load(tmp_path / "config" / "sweep.yaml")
    settings = C.read_yaml(tmp_path / "config" / "sweep.yaml")  # the file as DVC reads its params
    points = cfg.points
    assert points == sweep.points(settings) and len(points) == 9
    assert {s for s in stages if s.startswith("train-")} == {f"train-{p}" for p in points}
    assert {_kind(s) for s in stages} == {"check_config", "fetch", "prepare", "tokenize", "train"} | MAP_STAGES
    for name, p in points.items():
        stage = stages[f"train-{name}"]
        assert f"--run {name} " in stage["cmd"] and f"--out results/runs/{name}" in stage["cmd"]
        declared = {}
        for key, value in _declared(settings, stage, "config/sweep.yaml").items():
            if key.startswith(f"runs.{p.arm}."):
                key = f"runs.{name}." + key.removeprefix(f"runs.{p.arm}.")
            elif re.fullmatch(r"sweep\.\d+\.grid\.seeds", key):
                key = f"runs.{name}.seeds"
            assert key not in declared, f"{name}: {key} twice"
            declared[key] = value
        assert not set(declared) & set(p.settings), f"{name}: a swept key is also a param"
        declared.update(p.settings)  # what its name states
        pc = cfg.point(name)
        expected = C.settings(pc, C.result_keys("train", pc, name))
        others = sorted(k for k in expected if declared.get(k, expected[k]) != expected[k])
        assert declared == expected, (
            f"{name}: extra {sorted(set(declared) - set(expected))}, "
            f"missing {sorted(set(expected) - set(declared))}, "
            f"other values {others}"
        )
    for name, stage in stages.items():
        if name in C.DVC_STAGES:
            expected = {k for step in C.DVC_STAGES[name] for k in C.result_keys(step, cfg)}
            assert set(_declared(settings, stage, "config/sweep.yaml")) == expected, name


@pytest.mark.slow
def test_dvc_deps_name_every_module_a_stage_imports(root, tmp_path):
    """A change to code that shapes a stage's outputs reruns that stage in DVC."""
    for stages in (_dvc(root)["stages"], _sweep_dvc(root, tmp_path)["stages"]):
        del stages["check_config"]
        for name, stage in stages.items():
            stage = stage.get("do", stage)
            deps = {_dotted(d) for d in stage["deps"] if d.startswith("src/acoustic_mlm/")}
            needed = _imports(root, *STAGE_MODULE[_kind(name)])
            assert needed <= deps, f"dvc.yaml stage {name} lacks deps on {sorted(needed - deps)}"
            assert deps <= needed, (
                f"dvc.yaml stage {name} depends on modules it does not import: {sorted(deps - needed)}"
            )


@pytest.mark.slow
def test_sweep_dvc_stages_are_snakemakes_jobs(root, tmp_path):
    """For a sweep, `amlm dvc-yaml` writes the stages of Snakemake's jobs, and DVC reads the file."""
    from acoustic_mlm import cli

    repo = copy_repo(root, tmp_path / "repo")
    write_sweep_config(root, repo / "config" / "sweep.yaml")
    assert cli.main(["dvc-yaml", "--config", str(repo / "config" / "sweep.yaml"), "--out", str(repo / "dvc.yaml")]) == 0
    stages = _dvc(repo)["stages"]
    proc = subprocess.run(
        SNAKEMAKE + ["-n", "--cores", "1", "--configfile", "config/sweep.yaml"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    jobs = set()
    for block in re.split(r"\n\s*\n", out):
        head = re.search(r"^(?:localrule|rule|checkpoint) (\w+):", block, re.M)
        if head and head.group(1) in ("train", "stability_map", "map_figure", "map_claims", "decide"):
            run = re.search(r"wildcards: run=(\S+)", block)
            jobs.add(f"train-{run.group(1)}" if run else {"stability_map": "map"}.get(head.group(1), head.group(1)))
    assert jobs == {s for s in stages if _kind(s) == "train" or s in MAP_STAGES}
    assert {"fetch", "prepare", "tokenize", "check_config"} <= set(stages) and len(stages) == len(jobs) + 4
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    for args in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):  # DVC needs a repo
        subprocess.run(args, cwd=repo, env=env, check=True, capture_output=True)
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {f"train-{n}" for n in ("prenorm_clip1__lr-2e-3", "prenorm_clip1__layers-3")} <= set(json.loads(proc.stdout))


def test_snakemake_rules_take_their_params_from_result_keys(root):
    text = "\n".join(p.read_text() for p in (root / "workflow" / "rules").glob("*.smk"))
    from acoustic_mlm import config as C

    steps = re.findall(r'settings_for\("(\w+)"', text)
    assert sorted(steps) == sorted(C.STEP_KEYS), "every step's rule passes settings_for(step) as params, once"
    assert "without(" not in text and 'config["runs"][wildcards' not in text
