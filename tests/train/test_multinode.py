"""Several machines: the launch command, the SLURM resources, and two "nodes" (two torchrun launches
meeting through a c10d rendezvous on 127.0.0.1, gloo, one process each) that train as one process."""

import copy
import re
import socket
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from helpers import train_argv

from acoustic_mlm import config as C
from acoustic_mlm.train.launch import slurm_resources, torchrun, train_launcher

TOLERANCE_BITS = 2e-3  # float reduction order differs between 1 and 2 processes; nothing else may


def test_launcher_for_one_process_one_node_and_several_nodes(root):
    paper = C.read_yaml(root / "config" / "paper.yaml")["train"]
    one_node = C.read_yaml(root / "config" / "paper-1node.yaml")["train"]
    smoke = C.read_yaml(root / "config" / "smoke.yaml")["train"]
    assert train_launcher(smoke, "src") == 'PYTHONPATH="src" python -m acoustic_mlm'
    assert train_launcher(one_node, "src") == (
        'PYTHONPATH="src" python -m torch.distributed.run --standalone --nproc_per_node 8 -m acoustic_mlm'
    )
    cmd = train_launcher(paper, "src")
    assert cmd.startswith("srun --nodes 8 --ntasks-per-node 1 --gpus-per-task 8 ")
    assert "--nnodes 8 --nproc_per_node 8" in cmd and "--rdzv_backend c10d" in cmd
    assert '--rdzv_endpoint "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):29500"' in cmd
    assert cmd.endswith("-m acoustic_mlm")
    assert slurm_resources(paper) == {"nodes": 8, "tasks": 8, "tasks_per_gpu": 0, "mpi": "srun"}
    assert slurm_resources(one_node) == {} == slurm_resources(smoke)


def test_slurm_dry_run_shows_multinode_training_jobs(root, tmp_path):
    from helpers import copy_repo

    repo = copy_repo(root, tmp_path / "repo")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--configfile", "config/paper.yaml", "-n"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    blocks = [b for b in out.split("\n\n") if "rule train:" in b]
    assert len(blocks) == 4
    for b in blocks:
        resources = re.search(r"resources: (.*)", b).group(1).split(", ")  # their order is Snakemake's
        assert {"gpu=64", "nodes=8", "tasks=8", "tasks_per_gpu=0", "mpi=srun"} <= set(resources), resources
        assert "srun --nodes 8 --ntasks-per-node 1" in b and "--nnodes 8 --nproc_per_node 8" in b


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_match_one_process(data_dirs, smoke_cfg, tmp_path):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(
        steps=12,
        warmup_steps=2,
        log_interval=4,
        batch_size=4,
        valid_crops=3,
        crop_seconds=0.4,
        checkpoint_interval=0,
        nodes=2,
        processes=1,
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    one = subprocess.run(
        train_argv("postnorm_deepnorm_clip1", path, data_dirs, tmp_path / "one"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    node = [sys.executable] + torchrun(2, 1, f"127.0.0.1:{_free_port()}", "amlm-test") + ["-m", "acoustic_mlm"]
    procs = [
        subprocess.Popen(
            train_argv("postnorm_deepnorm_clip1", path, data_dirs, tmp_path / "two", launcher=node),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-2000:] for log in logs)
    a, b = pd.read_csv(tmp_path / "one" / "metrics.csv"), pd.read_csv(tmp_path / "two" / "metrics.csv")
    assert a["step"].tolist() == b["step"].tolist() == [1, 2, 4, 8, 12]
    for col in ["train_loss_cb0", "train_loss_cb7", "valid_loss_cb0", "grad_norm"]:
        diff = (a[col] - b[col]).abs().max()
        assert diff < TOLERANCE_BITS, (col, diff)
    assert a["clip_frac"].tolist() == b["clip_frac"].tolist()
