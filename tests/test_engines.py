"""Both engines rerun exactly the same stages for the same change of any one setting.

`acoustic_mlm.config.STEP_KEYS` is the one statement of which settings each step's outputs
depend on; the Snakemake rules take their params from it and dvc.yaml lists the same keys. Here
both engines are brought to "up to date" on the smoke preset (the data stages run for real, the
training and summary outputs are stand-ins recorded with `snakemake --touch` and `dvc commit`),
then every key of the config is changed one at a time, and the stages each engine would rerun
must be the same, and those that STEP_KEYS names with everything downstream of them:
`snakemake -n` lists every job to run; `dvc status` names the stages whose params changed, and
`dvc repro` would run those and the stages after them.
"""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import RUN_NAMES, copy_repo

from acoustic_mlm import config as C

pytestmark = pytest.mark.e2e

# Snakemake rule -> DVC stage (DVC runs each group of steps as one stage)
STAGE_OF_RULE = {"fetch": "fetch", "plan": "prepare", "prepare_shard": "prepare", "prepare": "prepare",
                 "fit_tokenizer": "tokenize", "tokenize_shard": "tokenize", "tokenize": "tokenize",
                 "aggregate": "aggregate", "figure": "figure", "claims": "claims", "compare": "compare",
                 "stability": "stability"}
# A changed value for keys whose generic change (below) would make the config invalid or no change.
CHANGED = {
    "data.source": "fma_small",
    "data.url": "http://127.0.0.1:9/x.zip",
    "data.known_hash": "sha256:" + "0" * 64,
    "data.folder": "/tmp/some-folder",
    "data.base_url": "http://127.0.0.1:9/mirror/",
    "tokenizer.level": "none",
    "model.mixture_segments": [1, 2],
    "model.mixture_samples": [12000, 24000],
    "train.crop_unit": "sample",
    "train.total_updates": 1000,
    "tokenizer.mode": "pretrained",
    "tokenizer.checkpoint": "/tmp/encodec_24khz-d7cc33bc.th",
    "tokenizer.device": "auto",
    "train.device": "auto",
    "train.precision": "bf16",
    "figure.split": "valid",
    "figure.x_max": 1000,
    "figure.y_min": 1.0,
    "figure.y_max": 20.0,
    "claims.seed_spread": "2std",
    "model.heads": 4,
    "model.dim": 128,
    "model.codebooks": 4,
    "tokenizer.bandwidth": 12.0,
    "claims.start_max": 10.8,
    "model.conv_layers": [[16, 10, 5], [32, 3, 2], [32, 3, 2], [32, 3, 2], [32, 3, 2], [32, 2, 2], [32, 2, 2]],
    "model.mask_prob": 0.65,
    "model.pos_conv_groups": 2,
    "claims.start_min": 8.5,
    "claims.recovery_margin": 0.1,
    "claims.stabilise_fraction": 0.5,
    "train.betas": [0.9, 0.99],
    "train.loggers": ["csv", "tensorboard"],  # trackers: no step reruns in either engine
    "train.wandb_project": "another-project",
}


FIXED = {"data.sample_rate"}
# Keys whose change is valid only with another key changed too (same step): the companion's new value.
COMPANION = {"model.mixture_prob": ("model.mixture_samples", [1200, 3500])}  # noise must fit the smoke crop  # the schema allows one value (EnCodec 24 kHz): there is no change to compare


def _changed(key, value):
    """Another valid value for `key`."""
    if key in CHANGED:
        return CHANGED[key]
    if key.endswith(".norm"):
        return "post" if value != "post" else "pre"
    if key.endswith(".attention"):
        return "pb_relax" if value == "softmax" else "softmax"
    if key.endswith(".role"):
        return None
    if key.endswith(".seeds"):
        return [*value, max(value) + 1]
    if key.endswith(".label"):
        return f"{value} (changed)"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 if value else 0.1
    raise AssertionError(f"no changed value for {key} = {value!r}: add it to CHANGED")


def _leaves(node, prefix=""):
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}.{k}" if prefix else k)]
    return [prefix]


def _set(cfg, dotted, value):
    *parents, last = dotted.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    node[last] = value


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    env.pop("PYTHONPATH", None)
    return env


def _run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def both_up_to_date(root, tmp_path_factory):
    repo = copy_repo(root, tmp_path_factory.mktemp("engines") / "repo")
    (repo / "config" / "config.yaml").write_text((repo / "config" / "smoke.yaml").read_text())
    smk = [sys.executable, "-m", "snakemake", "--cores", "1"]
    # The data stages for real (seconds at this size): `snakemake --touch` records no params for
    # directory outputs, so stand-ins would hide their param changes.
    _run(smk + ["--cores", "2", "data/codes/tokenizer.json"], repo)
    stand_ins = ["data/downloads/x", "results/loss_curves.csv", "results/claims.json",
                 "results/claims.md", "results/figures/paper_vs_reproduction.png"]
    stand_ins += [f"results/figures/{stem}.{e}" for stem in ("acoustic_mlm_loss_codebook0", "stability")
                  for e in ("png", "pdf", "svg")] + ["results/diagnostics.csv"]
    for run in RUN_NAMES:
        stand_ins += [f"results/runs/{run}/{f}" for f in ("metrics.csv", "summary.json", "seeds/x")]
    for rel in stand_ins:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("{}" if rel.endswith(".json") else "x")
    # --forcerun: touch records the params only of jobs it would run; the stand-ins are newer than the data
    _run(smk + ["--touch", "--forcerun", "train", "aggregate", "figure", "claims", "compare", "stability"], repo)
    _run(["git", "init", "-q"], repo)
    _run(["git", "add", "-A"], repo)
    _run(["git", "commit", "-qm", "init"], repo)
    _run([str(Path(sys.executable).parent / "amlm"), "validate", "--out", "results/config_check.txt"], repo)
    _run([sys.executable, "-m", "dvc", "commit", "-f"], repo)
    assert "Nothing to be done" in _run(smk + ["-n"], repo)
    assert json.loads(_run([sys.executable, "-m", "dvc", "status", "--json"], repo)) == {}
    return repo


def _downstream(stages: set[str], runs) -> set[str]:
    """The stages and every stage after them (dvc.yaml's DAG)."""
    after = {"fetch": {"prepare"}, "prepare": {"tokenize"}, "tokenize": {f"train@{r}" for r in runs},
             "aggregate": {"figure", "claims", "compare", "stability"}} | {f"train@{r}": {"aggregate"} for r in runs}
    out, todo = set(), list(stages)
    while todo:
        s = todo.pop()
        if s not in out:
            out.add(s)
            todo += after.get(s, ())
    return out


def _snakemake_reruns(out: str) -> set[str]:
    """DVC stage names of the jobs `snakemake -n` would run."""
    stages = set()
    for block in re.split(r"\n\s*\n", out):
        head = re.search(r"^(?:localrule|rule|checkpoint) (\w+):", block, re.M)
        if head and head.group(1) != "all":
            name = head.group(1)
            if name == "train":
                stages.add("train@" + re.search(r"wildcards: run=(\w+)", block).group(1))
            else:
                stages.add(STAGE_OF_RULE[name])
    return stages


def _dvc_reruns(out: str) -> set[str]:
    status = json.loads(out or "{}")
    return {stage for stage, changes in status.items() if stage != "check_config"  # checks every key
            and any("changed params" in c or "config/config.yaml" in json.dumps(c) for c in changes)}


def test_both_engines_rerun_the_same_stages_for_each_key(both_up_to_date):
    repo = both_up_to_date
    path = repo / "config" / "config.yaml"
    original = path.read_text()
    base = yaml.safe_load(original)
    keys = [k for k in _leaves(base) if (not k.startswith("runs.") or k.startswith(f"runs.{RUN_NAMES[1]}."))
            and k not in FIXED]
    mismatches, checked = [], 0
    try:
        for key in keys:
            cfg = copy.deepcopy(base)
            old = C.get(cfg, key)
            new = _changed(key, old)
            assert new != old, f"{key}: the changed value equals the old one"
            _set(cfg, key, new)
            if key in COMPANION:
                _set(cfg, *COMPANION[key])
            C.validate(copy.deepcopy(cfg), source=key)  # every change must give a valid config
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            smk = subprocess.Popen([sys.executable, "-m", "snakemake", "-n", "--cores", "1"], cwd=repo, env=_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            dvc = _run([sys.executable, "-m", "dvc", "status", "--json"], repo)
            smk_out = smk.communicate(timeout=300)[0]
            assert smk.returncode == 0, smk_out[-3000:]
            direct = {s for s, steps in C.DVC_STAGES.items() if s != "train"
                      and any(key in C.result_keys(step, cfg) for step in steps)}
            direct |= {f"train@{r}" for r in cfg["runs"] if key in C.result_keys("train", cfg, r)}
            expected = _downstream(direct, cfg["runs"])
            got_smk, got_dvc = _snakemake_reruns(smk_out), _downstream(_dvc_reruns(dvc), cfg["runs"])
            if not (got_smk == got_dvc == expected):
                mismatches.append(f"{key}: snakemake {sorted(got_smk)}, dvc {sorted(got_dvc)}, "
                                  f"STEP_KEYS {sorted(expected)}")
            checked += 1
    finally:
        path.write_text(original)
    assert not mismatches, "\n".join(mismatches)
    assert checked == len(keys) > 60
