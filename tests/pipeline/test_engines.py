"""Both engines rerun exactly the same stages for the same change of any one setting.

`acoustic_mlm.config.STEP_KEYS` is the one statement of which settings each step's outputs
depend on; the Snakemake rules take their params from it and dvc.yaml lists the same keys. Here
both engines are brought to "up to date" on the smoke preset (the data stages run for real, the
training and summary outputs are stand-ins recorded with `snakemake --touch` and `dvc commit`),
then every key of the config is changed one at a time, and the stages each engine would rerun
must be the same, and those that STEP_KEYS names with everything downstream of them:
`snakemake -n` lists every job to run; `dvc status` names the stages whose params changed, and
`dvc repro` would run those and the stages after them.

With a `sweep:` (helpers.SWEEP on the smoke preset) the same holds point by point: after one value
changes (a swept value, an arm's setting, a grid's seeds, a setting the sweep overrides...) and
`amlm dvc-yaml` writes dvc.yaml again, both engines rerun exactly the points whose configuration
changed (DVC: stages whose params changed, and new stages, those of points with a new value).
"""

import copy
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from helpers import RUN_NAMES, SWEEP, copy_repo, tool_env

from acoustic_mlm import cli, dvcgen
from acoustic_mlm import config as C
from acoustic_mlm.config import sweep

# Both tests read one module fixture (both_up_to_date, which the sweep's copies): one xdist worker
# for the module, so that it is made once under `pytest -n 2 --dist loadgroup`.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("engines")]

# Snakemake rule -> DVC stage (DVC runs each group of steps as one stage)
STAGE_OF_RULE = {
    "fetch": "fetch",
    "plan": "prepare",
    "prepare_shard": "prepare",
    "prepare": "prepare",
    "encodec_checkpoint": "tokenize",  # pretrained mode: the checkpoint's local rule; DVC's tokenize stage brings it
    "fit_tokenizer": "tokenize",
    "tokenize_shard": "tokenize",
    "tokenize": "tokenize",
    "aggregate": "aggregate",
    "figure": "figure",
    "claims": "claims",
    "metrics": "metrics",
    "compare": "compare",
    "stability": "stability",
}
# A changed value for keys whose generic change (below) would make the config invalid or no change.
CHANGED = {
    "data.source": "fma_small",
    "data.sample_format": "int16",
    "data.url": "http://127.0.0.1:9/x.zip",
    "data.known_hash": "sha256:" + "0" * 64,
    "data.folder": "/tmp/some-folder",
    "data.base_url": "http://127.0.0.1:9/mirror/",
    "tokenizer.loudness": "none",
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
    "cpu_kernels": "native",
    "model.cqt_impl": "fft",
}


FIXED = {"data.sample_rate"}
# Keys whose change is valid only with another key changed too (same step): the companion's new value.
# noise must fit the smoke crop  # the schema allows one value (EnCodec 24 kHz): there is no change to compare
COMPANION = {"model.mixture_prob": ("model.mixture_samples", [1200, 3500])}


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


def _get(settings: dict, dotted: str):
    """The value at a dotted key of a configuration file's mapping."""
    node = settings
    for part in dotted.split("."):
        node = node[part]
    return node


def _set(cfg, dotted, value):
    *parents, last = dotted.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    node[last] = value


def _env() -> dict:
    env = tool_env(git=True)
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
    stand_ins = [
        "data/downloads/x",
        "results/loss_curves.csv",
        "results/claims.json",
        "results/final_losses.json",
        "results/claims.md",
        "results/metrics.json",
        "results/figures/paper_vs_reproduction.png",
    ]
    stand_ins += [
        f"results/figures/{stem}.{e}"
        for stem in ("acoustic_mlm_loss_codebook0", "stability")
        for e in ("png", "pdf", "svg")
    ] + ["results/diagnostics.csv"]
    for run in RUN_NAMES:
        stand_ins += [f"results/runs/{run}/{f}" for f in ("metrics.csv", "summary.json", "seeds/x")]
    for rel in stand_ins:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("{}" if rel.endswith(".json") else "x")
    # --forcerun: touch records the params only of jobs it would run; the stand-ins are newer than the data
    _run(
        smk + ["--touch", "--forcerun", "train", "aggregate", "figure", "claims", "metrics", "compare", "stability"],
        repo,
    )
    _run(["git", "init", "-q"], repo)
    _run(["git", "add", "-A"], repo)
    _run(["git", "commit", "-qm", "init"], repo)
    assert (
        cli.main(
            [
                "validate",
                "--config",
                str(repo / "config" / "config.yaml"),
                "--out",
                str(repo / "results" / "config_check.txt"),
            ]
        )
        == 0
    )
    _run([sys.executable, "-m", "dvc", "commit", "-f"], repo)
    assert "Nothing to be done" in _run(smk + ["-n"], repo)
    assert json.loads(_run([sys.executable, "-m", "dvc", "status", "--json"], repo)) == {}
    return repo


MAP_STAGES = {"map", "map_figure", "map_claims", "decide"}  # a sweep's summaries: not in a configuration without one


def _downstream(stages: set[str], runs) -> set[str]:
    """The stages and every stage after them (dvc.yaml's DAG)."""
    after = {
        "fetch": {"prepare"},
        "prepare": {"tokenize"},
        "tokenize": {f"train@{r}" for r in runs},
        "aggregate": {"figure", "claims", "compare", "stability", "metrics"},
        "claims": {"metrics"},  # the flat metrics file reads the verdicts
    } | {f"train@{r}": {"aggregate"} for r in runs}
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
        if head and head.group(1) not in ("all", "default"):  # the targets, not stages
            name = head.group(1)
            if name == "train":
                stages.add("train@" + re.search(r"wildcards: run=(\w+)", block).group(1))
            else:
                stages.add(STAGE_OF_RULE[name])
    return stages


def _dvc_reruns(out: str) -> set[str]:
    status = json.loads(out or "{}")
    return {
        stage
        for stage, changes in status.items()
        if stage != "check_config"  # checks every key
        and any("changed params" in c or "config/config.yaml" in json.dumps(c) for c in changes)
    }


def test_both_engines_rerun_the_same_stages_for_each_key(both_up_to_date):
    repo = both_up_to_date
    path = repo / "config" / "config.yaml"
    original = path.read_text()
    base = yaml.safe_load(original)
    keys = [
        k
        for k in _leaves(base)
        if (not k.startswith("runs.") or k.startswith(f"runs.{RUN_NAMES[1]}.")) and k not in FIXED
    ]
    mismatches, checked = [], 0
    try:
        for key in keys:
            cfg = copy.deepcopy(base)
            old = _get(cfg, key)
            new = _changed(key, old)
            assert new != old, f"{key}: the changed value equals the old one"
            _set(cfg, key, new)
            if key in COMPANION:
                _set(cfg, *COMPANION[key])
            C.validate(copy.deepcopy(cfg), source=key)  # every change must give a valid config
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            smk = subprocess.Popen(
                [sys.executable, "-m", "snakemake", "-n", "--cores", "1"],
                cwd=repo,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            dvc = _run([sys.executable, "-m", "dvc", "status", "--json"], repo)
            smk_out = smk.communicate(timeout=300)[0]
            assert smk.returncode == 0, smk_out[-3000:]
            direct = {
                s
                for s, steps in C.DVC_STAGES.items()
                if s != "train" and s not in MAP_STAGES and any(key in C.result_keys(step, cfg) for step in steps)
            }
            direct |= {f"train@{r}" for r in cfg["runs"] if key in C.result_keys("train", cfg, r)}
            expected = _downstream(direct, cfg["runs"])
            got_smk, got_dvc = _snakemake_reruns(smk_out), _downstream(_dvc_reruns(dvc), cfg["runs"])
            if not (got_smk == got_dvc == expected):
                mismatches.append(
                    f"{key}: snakemake {sorted(got_smk)}, dvc {sorted(got_dvc)}, STEP_KEYS {sorted(expected)}"
                )
            checked += 1
    finally:
        path.write_text(original)
    assert not mismatches, "\n".join(mismatches)
    assert checked == len(keys) > 60


# ----------------------------------------------------------------------------- a sweep, point by point

MAP_RULE = {"stability_map": "map", "map_figure": "map_figure", "map_claims": "map_claims", "decide": "decide"}
# One change each: (what, the keys and their new values). SWEEP: grid 0 sets train.lr for every arm,
# grid 1 model.layers and seeds for prenorm_clip1.
SWEEP_CHANGES = [  # (what, {key: new value}, how many points retrain)
    ("a swept value", {"sweep.0.grid.train.lr": [0.002, 0.005]}, 4),  # the 4 points of the new value
    ("a swept value removed", {"sweep.0.grid.train.lr": [0.002]}, 0),
    ("the file's value of a key grid 0 sweeps", {"train.lr": 0.001}, 1),  # grid 1's point trains with it
    ("the file's value of a key grid 1 sweeps", {"model.layers": 3}, 8),
    ("a setting no grid sweeps", {"train.steps": 149}, 9),
    ("an arm's setting", {f"runs.{RUN_NAMES[1]}.clip": 2.0}, 3),
    ("an arm's seeds (a grid sets its own for one point)", {f"runs.{RUN_NAMES[1]}.seeds": [1, 2]}, 2),
    ("a grid's seeds", {"sweep.1.grid.seeds": [1, 3]}, 1),
    ("an arm's label", {f"runs.{RUN_NAMES[0]}.label": "changed"}, 0),
    ("a setting of the map's verdicts", {"claims.min_final_gap": 0.05}, 0),
    ("a setting of training and the map", {"model.relax_alpha": 16.0}, 9),
    ("a data setting", {"data.split_seed": 1}, 9),
]


def _set_sweep(cfg, dotted, value):
    """_set, with `sweep.<i>.grid.<dotted key>` addressing a grid's list."""
    m = re.fullmatch(r"sweep\.(\d+)\.grid\.(.+)", dotted)
    if m:
        cfg["sweep"][int(m.group(1))]["grid"][m.group(2)] = value
    else:
        _set(cfg, dotted, value)


def _expected_sweep_reruns(old: dict, new: dict) -> set[str]:
    """STEP_KEYS' answer: the stages whose settings changed, the new points, everything after them."""
    direct = {
        s
        for s in ("fetch", "prepare", "tokenize", "map", "map_figure", "map_claims", "decide")
        if any(
            C.settings(old, C.result_keys(step, old)) != C.settings(new, C.result_keys(step, new))
            for step in C.DVC_STAGES[s]
        )
    }
    before = sweep.points(old)
    for name in sweep.points(new):
        pn = sweep.point_config(new, name)
        if name not in before or C.settings(pn, C.result_keys("train", pn, name)) != C.settings(
            sweep.point_config(old, name), C.result_keys("train", sweep.point_config(old, name), name)
        ):
            direct.add(dvcgen.train_stage_name(name))
    return _sweep_downstream(direct, sweep.points(new))


def _sweep_downstream(stages: set[str], points) -> set[str]:
    trains = {dvcgen.train_stage_name(p) for p in points}
    after = {"fetch": {"prepare"}, "prepare": {"tokenize"}, "tokenize": trains, "map": {"map_figure", "map_claims"}}
    after |= {t: {"map", "decide"} for t in trains}
    after["tokenize"] = trains | {"decide"}  # decide reads the codes' plateau
    out, todo = set(), list(stages)
    while todo:
        s = todo.pop()
        if s not in out:
            out.add(s)
            todo += after.get(s, ())
    return out


def _snakemake_sweep_reruns(out: str) -> set[str]:
    stages = set()
    for block in re.split(r"\n\s*\n", out):
        head = re.search(r"^(?:localrule|rule|checkpoint) (\w+):", block, re.M)
        if head and head.group(1) not in ("all", "default"):  # the targets, not stages
            name = head.group(1)
            if name == "train":
                stages.add(dvcgen.train_stage_name(re.search(r"wildcards: run=(\S+)", block).group(1)))
            else:
                stages.add(MAP_RULE.get(name) or STAGE_OF_RULE[name])
    return stages


@pytest.fixture(scope="module")
def sweep_up_to_date(both_up_to_date, tmp_path_factory):
    """The up-to-date smoke repository (its data stages reused), switched to a sweep: stand-ins for
    every point's training and the map, recorded by both engines."""
    repo = tmp_path_factory.mktemp("sweep") / "repo"
    shutil.copytree(both_up_to_date, repo, symlinks=True)  # modification times kept: Snakemake's data up to date
    path = repo / "config" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["sweep"] = copy.deepcopy(SWEEP)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    dvcgen.write(C.load(path), path, repo / "dvc.yaml")
    stand_ins = ["results/stability_map.csv", "results/map_claims.json", "results/map_claims.md"]
    stand_ins += [f"results/figures/lr_sensitivity.{e}" for e in ("png", "pdf", "svg")]
    stand_ins += [f"results/decisive/{f}" for f in ("runs.csv", "cells.csv", "decisive.json", "decisive.md")]
    for run in sweep.points(cfg):
        stand_ins += [f"results/runs/{run}/{f}" for f in ("metrics.csv", "summary.json", "seeds/x")]
    for rel in stand_ins:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("{}" if rel.endswith(".json") else "x")
    smk = [sys.executable, "-m", "snakemake", "--cores", "1"]
    _run(smk + ["--touch", "--forcerun", "train", "stability_map", "map_figure", "map_claims", "decide"], repo)
    _run(["git", "add", "-A"], repo)
    _run(["git", "commit", "-qm", "sweep"], repo)
    assert cli.main(["validate", "--config", str(path), "--out", str(repo / "results" / "config_check.txt")]) == 0
    _run([sys.executable, "-m", "dvc", "commit", "-f"], repo)
    assert "Nothing to be done" in _run(smk + ["-n"], repo)
    assert json.loads(_run([sys.executable, "-m", "dvc", "status", "--json"], repo)) == {}
    return repo


def _dvc_sweep_reruns(repo, out: str) -> set[str]:
    """Stages with changed params, and new stages (never run: not in dvc.lock), then those after them."""
    locked = set(yaml.safe_load((repo / "dvc.lock").read_text())["stages"])
    stages = set(yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]) - {"check_config"}  # checks every key
    changed = _dvc_reruns(out) | (stages - locked)
    return _sweep_downstream(changed, [s.removeprefix("train-") for s in stages if s.startswith("train-")])


def test_both_engines_rerun_the_same_points_of_a_sweep(sweep_up_to_date):
    repo = sweep_up_to_date
    path, dvc_yaml = repo / "config" / "config.yaml", repo / "dvc.yaml"
    original, original_dvc = path.read_text(), dvc_yaml.read_text()
    base = yaml.safe_load(original)
    mismatches = []
    try:
        for what, change, retrained in SWEEP_CHANGES:
            cfg = copy.deepcopy(base)
            for key, value in change.items():
                _set_sweep(cfg, key, value)
            C.validate(copy.deepcopy(cfg), source=what)
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            dvcgen.write(C.load(path), path, dvc_yaml)  # the stages follow the sweep: `amlm dvc-yaml`
            smk = subprocess.Popen(
                [sys.executable, "-m", "snakemake", "-n", "--cores", "1"],
                cwd=repo,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            dvc = _run([sys.executable, "-m", "dvc", "status", "--json"], repo)
            smk_out = smk.communicate(timeout=300)[0]
            assert smk.returncode == 0, smk_out[-3000:]
            expected = _expected_sweep_reruns(base, cfg)
            if len({s for s in expected if s.startswith("train-")}) != retrained:
                mismatches.append(f"{what}: STEP_KEYS retrains {sorted(expected)}, not {retrained} points")
            got_smk, got_dvc = _snakemake_sweep_reruns(smk_out), _dvc_sweep_reruns(repo, dvc)
            if not (got_smk == got_dvc == expected):
                mismatches.append(
                    f"{what} {change}: snakemake {sorted(got_smk)}, dvc {sorted(got_dvc)}, STEP_KEYS {sorted(expected)}"
                )
    finally:
        path.write_text(original)
        dvc_yaml.write_text(original_dvc)
    assert not mismatches, "\n".join(mismatches)
