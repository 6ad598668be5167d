"""The two engines: Snakemake (lint, DAG, env files) and DVC (stage definitions).

The end-to-end runs of both engines on the smoke preset are in test_e2e.py.
"""

import re
from pathlib import Path
import subprocess
import sys
import tomllib

import pytest
import yaml
from helpers import copy_repo, RUN_NAMES


SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_conda_env_names_the_same_dependencies_as_pyproject(root):
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((root / "workflow" / "envs" / "amlm.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(pip) == sorted(project)  # same names and the same version specifiers
    assert "torch==2.9.1" in pip and "torchaudio==2.9.1" in pip
    # Snakemake copies env files before creating them: no relative local paths allowed.
    assert not any(p.startswith((".", "/", "-e")) for p in pip)


def test_every_rule_has_log_threads_and_conda(root):
    text = "\n".join(p.read_text() for p in (root / "workflow" / "rules").glob("*.smk"))
    rules = re.split(r"^(?:rule|checkpoint) ", text, flags=re.M)[1:]
    assert {r.split(":")[0] for r in rules} == {"fetch", "plan", "prepare_shard", "prepare", "fit_tokenizer",
                                                "tokenize_shard", "tokenize", "train", "aggregate", "figure",
                                                "stability", "claims", "compare", "preflight"}
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


@pytest.mark.parametrize("preset, gpu", [("smoke.yaml", 0), ("paper.yaml", 1)])
def test_snakemake_dry_run_dag(root, tmp_path, preset, gpu):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        SNAKEMAKE + ["-n", "--cores", "2", "--configfile", f"config/{preset}", "--printshellcmds"],
        cwd=repo, capture_output=True, text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for run in RUN_NAMES:
        assert f"train {run} " in out
    assert re.search(r"train\s+4", out)  # four training jobs in the job table
    assert f"--config {repo}/config/{preset}" in out or f"--config config/{preset}" in out


def test_snakemake_preflight_target_is_not_part_of_all(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(SNAKEMAKE + ["-n", "--cores", "1", "--printshellcmds", "preflight", "--configfile",
                                       "config/paper.yaml"], cwd=repo, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"preflight --config config/paper\.yaml --threads \d+ --out results", out), out
    assert not re.search(r"\btrain\s+\d", out)  # no data or training jobs: preflight needs none
    proc = subprocess.run(SNAKEMAKE + ["-n", "--cores", "1"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0 and "rule preflight" not in proc.stdout + proc.stderr


def test_snakemake_refuses_command_line_overrides(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(SNAKEMAKE + ["-n", "--cores", "1", "--config", "figure={split: valid}"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--config figure=...: command-line overrides are not supported" in proc.stdout + proc.stderr


def test_snakemake_refuses_invalid_config(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    cfg = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())
    cfg["train"]["stepz"] = 1
    (repo / "config" / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(SNAKEMAKE + ["-n", "--cores", "1", "--configfile", "config/bad.yaml"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "stepz" in proc.stdout + proc.stderr


def test_dvc_stages_call_the_same_commands_as_the_rules(root):
    dvc = yaml.safe_load((root / "dvc.yaml").read_text())
    rules = "\n".join(p.read_text() for p in (root / "workflow" / "rules").glob("*.smk"))
    stages = dvc["stages"]
    assert set(stages) == {"check_config", "fetch", "prepare", "tokenize", "train", "aggregate", "figure",
                           "stability", "claims", "compare"}
    # Snakemake runs the same check while it parses the workflow (common.smk), DVC as its first stage
    assert "amlm_config.load(CONFIGFILE)" in rules
    del stages["check_config"]
    for name, stage in stages.items():
        cmd = (stage.get("do") or stage)["cmd"]
        sub = cmd.split()[1]
        assert cmd.startswith("amlm ") and f"{{params.cli}} {sub} " in rules, name
    assert stages["train"]["foreach"] == "${runs}"


def test_slurm_profile_dry_run_requests_gpus(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        SNAKEMAKE + ["--profile", "profiles/slurm", "--configfile", "config/paper.yaml", "-n"],
        cwd=repo, capture_output=True, text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    blocks = re.split(r"\n(?=(?:local)?rule \w+:)", out)
    train_blocks = [b for b in blocks if re.match(r"(local)?rule train:", b.strip())]
    assert len(train_blocks) == 4
    assert all("gpu=64" in b and "nodes=8" in b and "runtime=2880" in b for b in train_blocks)  # 8 nodes x 8 GPUs


# ----------------------------------------------------------------------------- one statement of what each stage depends on

# The module each DVC stage runs; the modules it imports (transitively) shape its outputs.
STAGE_MODULE = {"fetch": "fetch", "prepare": "prepare", "tokenize": "tokenizer", "train": "train",
                "aggregate": "aggregate", "figure": "figure", "claims": "claims", "compare": "figure",
                "stability": "stability"}
# Modules that shape no result: messages, logging and progress, device choice, the command line.
NO_RESULT = {"utils", "errors", "devices", "cli", "__init__", "__main__"}


def _imports(root, module: str) -> set[str]:
    """Package modules `module` imports, transitively (lazy imports inside functions included)."""
    import ast

    pkg = root / "src" / "acoustic_mlm"
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(ast.parse((pkg / f"{name}.py").read_text())):
            found = []
            if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith("acoustic_mlm")):
                mod = (node.module or "").removeprefix("acoustic_mlm").lstrip(".")
                found = [mod] if mod else [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name.split(".", 1)[1] for a in node.names if a.name.startswith("acoustic_mlm.")]
            todo += [f.split(".")[0] for f in found if (pkg / f"{f.split('.')[0]}.py").is_file()]
    return seen


def _dvc_param_leaves(cfg: dict, entries: list[str], run: str) -> set[str]:
    from acoustic_mlm import config as C

    leaves = set()
    for entry in entries:
        key = entry.replace("${key}", run)
        leaves |= set(_leaves_of(C.get(cfg, key), key))
    return leaves


def _leaves_of(node, prefix):
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves_of(v, f"{prefix}.{k}")]
    return [prefix]


@pytest.mark.parametrize("preset", ["config.yaml", "smoke.yaml", "gpu-small.yaml", "paper.yaml"])
def test_dvc_params_are_the_settings_each_stage_depends_on(root, preset):
    """dvc.yaml's params, expanded to the config's keys, equal config.result_keys of the stage's steps."""
    from acoustic_mlm import config as C

    cfg = C.load(root / "config" / preset)
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    check = stages.pop("check_config")  # the first stage: every key, so an invalid file stops DVC first
    assert check["params"] == [{"config/config.yaml": None}] and check["cmd"].startswith("amlm validate")
    assert all("results/config_check.txt" in s.get("do", s)["deps"] for s in stages.values())
    assert set(stages) == set(C.DVC_STAGES)
    run = RUN_NAMES[2]
    for name, stage in stages.items():
        stage = stage.get("do", stage)
        entries = [k for block in stage.get("params", []) for k in block["config/config.yaml"]]
        declared = _dvc_param_leaves(cfg, entries, run)
        expected = {k for step in C.DVC_STAGES[name] for k in C.result_keys(step, cfg, run)}
        assert declared == expected, f"dvc.yaml stage {name}: extra {sorted(declared - expected)}, missing {sorted(expected - declared)}"


def test_dvc_deps_name_every_module_a_stage_imports(root):
    """A change to code that shapes a stage's outputs reruns that stage in DVC."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    for name, module in STAGE_MODULE.items():
        stage = stages[name].get("do", stages[name])
        deps = {Path(d).stem for d in stage["deps"] if d.startswith("src/acoustic_mlm/")}
        needed = _imports(root, module) - NO_RESULT
        assert needed <= deps, f"dvc.yaml stage {name} lacks deps on {sorted(needed - deps)}"
        assert deps <= needed, f"dvc.yaml stage {name} depends on modules it does not import: {sorted(deps - needed)}"


def test_snakemake_rules_take_their_params_from_result_keys(root):
    text = "\n".join(p.read_text() for p in (root / "workflow" / "rules").glob("*.smk"))
    from acoustic_mlm import config as C

    steps = re.findall(r'settings_for\("(\w+)"', text)
    assert sorted(steps) == sorted(C.STEP_KEYS), "every step's rule passes settings_for(step) as params, once"
    assert "without(" not in text and 'config["runs"][wildcards' not in text
