"""The two engines: Snakemake (lint, DAG, env files) and DVC (stage definitions).

The end-to-end runs of both engines on the smoke preset are in test_e2e.py.
"""

import re
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
                                                "stability", "claims", "compare"}
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


def test_snakemake_refuses_command_line_overrides(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(SNAKEMAKE + ["-n", "--cores", "1", "--config", "figure={split: valid}"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "--config overrides are not supported" in proc.stdout + proc.stderr


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
    assert set(stages) == {"fetch", "prepare", "tokenize", "train", "aggregate", "figure", "stability", "claims",
                           "compare"}
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
    assert all("gpu=1" in b and "runtime=2880" in b for b in train_blocks)
