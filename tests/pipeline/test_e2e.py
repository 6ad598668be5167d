"""End to end on the smoke preset: Snakemake and DVC, each in a copy of the session's smoke run
(conftest.py: `smoke_run`, the pipeline through Snakemake in a fresh copy of the repository)."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import RUN_NAMES, SMOKE_GROUP, copy_run, tool_env

from acoustic_mlm.report import verify

pytestmark = pytest.mark.e2e

# `dvc exp show` in 80 columns: the changed params and each arm's final codebook-0 loss (docs/pipeline.md)
EXP_SHOW = ["--drop", ".*", "--keep", "Experiment|clip10|clip1|deepnorm|attn_relax", "--precision", "4"]
# `dvc exp run --dry` runs in a fresh temporary copy without the pipeline's outputs: these let it tell
# the changed stages from the unchanged ones (docs/pipeline.md)
DRY_RUN = [
    "--allow-missing",
    "-C",
    "results/config_check.txt",
    "-C",
    "data/prepared",
    "-C",
    "data/codes",
    "-C",
    "results/runs",
    "-C",
    "results/loss_curves.csv",
    "-C",
    "results/diagnostics.csv",
]
FIGURES = [
    f"results/figures/{stem}.{e}"
    for stem in ("acoustic_mlm_loss_codebook0", "stability")
    for e in ("png", "pdf", "svg")
]


def _env() -> dict:
    env = tool_env(git=True)
    env.pop("PYTHONPATH", None)
    return env


def _run(cmd, cwd, timeout=900):
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def _set_clip(path: Path, run: str, clip: float) -> None:
    cfg = yaml.safe_load(path.read_text())
    cfg["runs"][run]["clip"] = clip
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def _check_outputs(repo: Path):
    curves = pd.read_csv(repo / "results" / "loss_curves.csv")
    assert set(curves["run"]) == set(RUN_NAMES)
    cb0 = curves[(curves.split == "train") & (curves.codebook == 0)]
    for run, g in cb0.groupby("run"):
        g = g.sort_values("step")
        first, last = g["loss_bits"].iloc[0], g["loss_bits"].iloc[-1]
        assert 9.0 < first < 11.5, (run, first)  # near the 10-bit uniform guess
        assert last < first - 0.1, f"{run}: codebook-0 loss did not fall ({first:.3f} -> {last:.3f})"
    for f in FIGURES:
        assert (repo / f).stat().st_size > 1000
    for run in RUN_NAMES:
        metrics = pd.read_csv(repo / "results" / "runs" / run / "metrics.csv")
        assert {"step", "train_loss_cb0", "valid_loss_cb0", "lr", "grad_norm", "clipped", "wall_time"} <= set(
            metrics.columns
        )
    # PB-Relax is the identity in exact arithmetic: in fp32 with the same seed, data and masks the
    # relaxed arm must track Pre-Norm clip 1 at every logged step.
    a = cb0[cb0.run == "prenorm_clip1"].sort_values("step")["loss_bits"].to_numpy()
    b = cb0[cb0.run == "prenorm_attnrelax_clip1"].sort_values("step")["loss_bits"].to_numpy()
    assert len(a) == len(b) and abs(a - b).max() < 0.05, abs(a - b).max()
    claims = json.loads((repo / "results" / "claims.json").read_text())
    assert [c["id"] for c in claims["claims"]] == ["a", "b", "c", "d", "e", "f"]
    assert {c["verdict"] for c in claims["claims"]} <= {"reproduced", "not reproduced", "inconclusive"}
    assert "| " in (repo / "results" / "claims.md").read_text()
    assert "## What the diagnostics show at each spike" in (repo / "results" / "claims.md").read_text()
    diagnostics = pd.read_csv(repo / "results" / "diagnostics.csv")
    assert {"grad_norm_max", "attn_logit_max", "grad_norm_block0", "update_ratio_heads", "valid_acc_cb0"} <= set(
        diagnostics["diagnostic"]
    )
    assert (repo / "results" / "figures" / "paper_vs_reproduction.png").stat().st_size > 1000
    return curves


@pytest.fixture(scope="module")
def smoke_repo(smoke_run, tmp_path_factory):
    """The smoke pipeline through Snakemake, run once per session (conftest.py: `smoke_run`), copied for
    the module: the default tier's one pipeline (its outputs checked below) and the slow tier's kill and
    rerun tests, which change it."""
    return copy_run(smoke_run, tmp_path_factory.mktemp("smoke") / "repo")


@pytest.mark.xdist_group(SMOKE_GROUP)
def test_snakemake_smoke_end_to_end(smoke_repo):
    repo = smoke_repo
    _check_outputs(repo)
    # the fresh run against the shipped known-good smoke run of this CPU's vendor (data/reference/smoke_run/<vendor>,
    # docs/reference_run.md)
    verified = _run(
        ["env", "PYTHONPATH=src", sys.executable, "-m", "acoustic_mlm", "verify", "--config", "config/smoke.yaml"], repo
    )
    assert "this installation trains as the reference" in verified, verified
    # pinned kernels: every data stage's outputs are the reference's bytes on any x86-64 CPU with AVX2
    assert all(f"data: {stage:<9} same" in verified for stage in ("fetch", "prepare", "tokenize")), verified
    ref_dir, own = verify.reference_for(repo / "data" / "reference" / "smoke_run", verify.cpu_vendor())
    if own:  # a CPU of a vendor with a reference of its own: every row of every arm to the bit
        assert "exact: pinned kernels on this CPU" in verified, verified
        assert all(
            re.search(rf"^{run} +largest difference 0 bits \(every row equal\)  ok$", verified, re.M)
            for run in RUN_NAMES
        ), verified
    else:  # another vendor: held row by row to the cross-vendor tolerance, and told so
        assert "not exact: no reference of this CPU's vendor" in verified, verified
        assert all(
            re.search(rf"^{run} +largest difference at steps <= 150 \S+ bits .* ok$", verified, re.M)
            for run in RUN_NAMES
        ), verified
    meta = json.loads((ref_dir / "reference.json").read_text())
    for stage, files in meta["data_hashes"].items():
        for rel, digest in files.items():
            assert hashlib.sha256((repo / "data" / rel).read_bytes()).hexdigest() == digest, (stage, rel)
    assert (repo / "results" / "figures" / "reference_check.png").stat().st_size > 1000
    for run in RUN_NAMES:
        assert (repo / "results" / "logs" / "train" / f"{run}.log").stat().st_size > 0
    # 12 clips in shards of 4: three prepare jobs and three tokenize jobs, one log each
    for stage in ("prepare", "tokenize"):
        assert sorted(p.name for p in (repo / "results" / "logs" / stage).glob("shard-*.log")) == [
            f"shard-{k:05d}.log" for k in range(3)
        ]
    assert sorted(p.name for p in (repo / "data" / "codes").iterdir()) == [
        "files.csv",
        "model",
        "shard-00000",
        "shard-00001",
        "shard-00002",
        "tokenizer.json",
    ]
    again = _run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config/smoke.yaml", "-n"], repo)
    assert "Nothing to be done" in again, again


@pytest.mark.slow
@pytest.mark.xdist_group(SMOKE_GROUP)
def test_snakemake_smoke_survives_a_kill_reports_and_reruns_only_what_changed(smoke_repo):
    repo = smoke_repo
    # SIGKILL mid-training through Snakemake, then run it again: the same metrics, timing aside.
    run_dir = repo / "results" / "runs" / "prenorm_clip1"
    reference = pd.read_csv(run_dir / "metrics.csv").drop(columns=["wall_time"])
    (run_dir / "metrics.csv").unlink()
    shutil.rmtree(run_dir / "seeds")  # the job must retrain its seed, not reuse it
    # downstream files are up to date, so ask for this one (first: --configfile takes several values)
    smk = [
        sys.executable,
        "-m",
        "snakemake",
        "results/runs/prenorm_clip1/metrics.csv",
        "--cores",
        "2",
        "--configfile",
        "config/smoke.yaml",
    ]
    proc = subprocess.Popen(
        smk, cwd=repo, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            states = sorted((run_dir / "state" / "seed1").glob("step-*.pt"))
            if states and int(states[-1].stem.split("-")[1]) >= 40:
                break
            assert proc.poll() is None, "training finished before it could be killed"
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # Snakemake and its training job
        proc.wait()
    assert not (run_dir / "metrics.csv").exists()
    _run([sys.executable, "-m", "snakemake", "--unlock", "--configfile", "config/smoke.yaml"], repo)
    log = _run(smk, repo)
    resumed = pd.read_csv(run_dir / "metrics.csv").drop(columns=["wall_time"])
    pd.testing.assert_frame_equal(resumed, reference, check_exact=True)
    assert "resuming after step" in (repo / "results" / "logs" / "train" / "prenorm_clip1.log").read_text(), log

    _run(
        [sys.executable, "-m", "snakemake", "--configfile", "config/smoke.yaml", "--report", "results/report.html"],
        repo,
    )
    html = (repo / "results" / "report.html").read_text(errors="replace")
    assert "paper_vs_reproduction.png" in html and "claims.md" in html and "metrics.csv" in html
    assert "stability.png" in html

    # Reruns are minimal: a new clip for one arm retrains that arm only, then the summaries.
    _set_clip(repo / "config" / "smoke.yaml", "prenorm_clip10", 5.0)
    plan = _run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config/smoke.yaml", "-n"], repo)
    assert re.search(r"^train\s+1$", plan, re.M), plan
    assert "train prenorm_clip10 " in plan and "train prenorm_clip1 " not in plan
    assert not re.search(r"^(fetch|plan|prepare\w*|fit_tokenizer|tokenize\w*)\s", plan, re.M), plan


@pytest.mark.slow
@pytest.mark.xdist_group(SMOKE_GROUP)
def test_dvc_repro_smoke_end_to_end(smoke_run, tmp_path):
    # The session's smoke run, copied: the first `dvc repro` runs every stage of dvc.yaml (fetch, prepare
    # and tokenize make the data again), and each train stage finds its arm's seed completed by Snakemake
    # under the same settings (train/state.py: the fingerprint; the seeds folder is persist: true) and
    # writes the arm's metrics and summary from it instead of training it again. `dvc exp run` below
    # trains an arm through DVC.
    repo = copy_run(smoke_run, tmp_path / "repo")
    shutil.copy(repo / "config" / "smoke.yaml", repo / "config" / "config.yaml")  # the documented preset switch
    _run(["git", "init", "-q"], repo)
    _run(["git", "add", "-A"], repo)
    _run(["git", "commit", "-qm", "init"], repo)
    _run([sys.executable, "-m", "dvc", "repro"], repo)
    _check_outputs(repo)
    again = _run([sys.executable, "-m", "dvc", "repro"], repo)
    assert "Running stage" not in again, again
    status = _run([sys.executable, "-m", "dvc", "status"], repo)
    assert "up to date" in status, status
    metrics = _run([sys.executable, "-m", "dvc", "metrics", "show"], repo)
    assert "clip10" in metrics and "claim_a" in metrics  # results/metrics.json, the one metrics file
    assert "final_train_loss_cb0" not in metrics  # summary.json is an output, not a metric
    plots = json.loads(_run([sys.executable, "-m", "dvc", "plots", "show", "--json"], repo))["data"]
    (curves,) = plots["results/loss_curves.csv"]  # the one plot: the arms overlaid, log x
    assert curves["content"]["encoding"]["x"]["scale"] == {"type": "log"}
    assert {v["run"] for v in curves["content"]["data"]["values"]} == set(RUN_NAMES)

    # Reruns are minimal: a new clip for one arm invalidates that arm's stage and the summaries only.
    original = (repo / "config" / "config.yaml").read_text()
    _set_clip(repo / "config" / "config.yaml", "prenorm_clip10", 5.0)
    status = _run([sys.executable, "-m", "dvc", "status"], repo)
    assert "train@prenorm_clip10:" in status
    for stage in ("train@prenorm_clip1:", "train@postnorm_deepnorm_clip1:", "tokenize:", "prepare:", "fetch:"):
        assert stage not in status, status
    # An invalid config stops `dvc repro` at its first stage, before any stage deletes its outputs.
    bad = yaml.safe_load(original)
    bad["model"]["heads"] = 3  # the width is not divisible by it: a cross-field rule, not the schema
    (repo / "config" / "config.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repo, env=_env(), capture_output=True, text=True)
    assert proc.returncode != 0 and "must be divisible by 'model.heads'" in proc.stdout + proc.stderr
    for run in RUN_NAMES:
        assert (repo / "results" / "runs" / run / "metrics.csv").is_file(), run
    assert (repo / "results" / "loss_curves.csv").is_file() and (repo / "data" / "codes").is_dir()
    (repo / "config" / "config.yaml").write_text(original)
    _run([sys.executable, "-m", "dvc", "repro"], repo)  # only the check reruns: its marker is unchanged

    # Round trip: push to a local remote, pull into a fresh clone, nothing to retrain.
    remote = tmp_path / "remote"
    _run([sys.executable, "-m", "dvc", "remote", "add", "-d", "local", str(remote)], repo)
    _run(["git", "add", "-A"], repo)
    _run(["git", "commit", "-qm", "results"], repo)
    _run([sys.executable, "-m", "dvc", "push"], repo)
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(repo), str(clone)], tmp_path)
    _run([sys.executable, "-m", "dvc", "pull"], clone)
    for rel in [
        "data/codes/shard-00002/codes.npy",
        "data/prepared/shard-00002/audio.npy",
        "results/runs/prenorm_clip1/seeds/seed1/checkpoint.pt",
        "results/runs/prenorm_clip1/metrics.csv",
        "results/loss_curves.csv",
        *FIGURES,
    ]:
        assert (clone / rel).is_file(), rel
    assert "up to date" in _run([sys.executable, "-m", "dvc", "status"], clone)
    again = _run([sys.executable, "-m", "dvc", "repro"], clone)
    assert "Running stage" not in again, again
    _run(["amlm", "figure", "--config", "config/config.yaml"], clone)  # regenerates without retraining
    # Pulled files get new modification times in pull order; `snakemake --touch` records them.
    _run([sys.executable, "-m", "snakemake", "--cores", "1", "--touch"], clone)
    plan = _run([sys.executable, "-m", "snakemake", "--cores", "1", "-n"], clone)
    assert "Nothing to be done" in plan, plan

    _experiment_round_trip(repo)


def _stages(log: str) -> set[str]:
    return set(re.findall(r"^Running stage '([^']+)'", log, re.M))


def _experiment_round_trip(repo: Path) -> None:
    """DVC experiments on the finished smoke run (docs/pipeline.md): the dry run lists the stages the
    run then reruns, which are exactly the changed arm and the stages after it; `dvc exp show` gives
    each arm's final loss under its role; a sweep queues; `dvc plots diff` overlays two curves."""
    change = ["-S", "config/config.yaml:runs.prenorm_clip1.clip=2.0"]
    dry = _run([sys.executable, "-m", "dvc", "exp", "run", "--dry", *DRY_RUN, *change], repo)
    done = _run([sys.executable, "-m", "dvc", "exp", "run", "-n", "clip2", *change], repo)
    after = {"check_config", "train@prenorm_clip1", "aggregate", "figure", "stability", "claims", "metrics", "compare"}
    assert _stages(done) == after, done
    # A dry run lists the stages whose own params or copied deps changed; `metrics` has no params and its
    # inputs change only once aggregate and claims really run, so DVC's dry run leaves it out (docs/pipeline.md).
    assert _stages(dry) == _stages(done) - {"metrics"}, (dry, done)
    show = _run([sys.executable, "-m", "dvc", "exp", "show", "--no-pager", *EXP_SHOW], repo)
    lines = [line for line in show.splitlines() if line.strip()]
    assert all(len(line) <= 80 for line in lines), show
    assert all(name in show for name in ("clip10", "clip1", "deepnorm", "attn_relax", "clip2")), show
    _run(
        [
            sys.executable,
            "-m",
            "dvc",
            "exp",
            "run",
            "--queue",
            "-S",
            "config/config.yaml:runs.prenorm_clip1.clip=0.5,5.0",
        ],
        repo,
    )
    queued = _run([sys.executable, "-m", "dvc", "queue", "status"], repo)
    assert queued.count("Queued") == 2, queued
    _run([sys.executable, "-m", "dvc", "queue", "remove", "--queued"], repo)
    diff = json.loads(_run([sys.executable, "-m", "dvc", "plots", "diff", "HEAD", "clip2", "--json"], repo))["data"]
    (curves,) = diff["results/loss_curves.csv"]  # both revisions' arms in the one plot, log x
    assert curves["content"]["encoding"]["x"]["scale"] == {"type": "log"}
    assert {v["rev"] for v in curves["content"]["data"]["values"]} == {"HEAD", "clip2"}, curves["revisions"]
