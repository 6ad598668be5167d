"""launch.py: torchrun's arguments, the srun line as a shell runs it inside a SLURM job, and a
module the Snakemake workflow can load by path (standard library only).

The presets' launch lines and a SLURM dry run are in test_multinode.py.
"""

import ast
import importlib.util
import os
import shlex
import subprocess
import sys

from acoustic_mlm.train import launch
from acoustic_mlm.train.launch import slurm_resources, torchrun, train_launcher


def test_torchrun_on_one_machine_is_standalone():
    assert torchrun(1, 4, "ignored:1", "ignored") == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "4",
    ]


def test_torchrun_on_several_machines_meets_at_a_c10d_rendezvous():
    assert torchrun(3, 2, "node01:29500", "1234") == [
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "3",
        "--nproc_per_node",
        "2",
        "--rdzv_id",
        "1234",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "node01:29500",
    ]


def test_one_process_needs_no_torchrun_and_nodes_defaults_to_one():
    assert train_launcher({"processes": 1}, "/repo/src") == 'PYTHONPATH="/repo/src" python -m acoustic_mlm'
    assert train_launcher({"processes": 2}, "src").split() == [
        'PYTHONPATH="src"',
        "python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "acoustic_mlm",
    ]
    assert slurm_resources({"processes": 8}) == {}


def test_cpu_nodes_ask_for_no_gpus_and_cuda_nodes_for_one_gpu_per_process():
    cpu = train_launcher({"nodes": 2, "processes": 3, "device": "cpu"}, "src")
    cuda = train_launcher({"nodes": 2, "processes": 3, "device": "cuda"}, "src")
    assert cpu.startswith("srun --nodes 2 --ntasks-per-node 1 --kill-on-bad-exit=1 env ")
    assert cuda.startswith("srun --nodes 2 --ntasks-per-node 1 --gpus-per-task 3 --kill-on-bad-exit=1 env ")
    assert slurm_resources({"nodes": 2, "processes": 3}) == {"nodes": 2, "tasks": 2, "tasks_per_gpu": 0, "mpi": "srun"}


def test_inside_a_slurm_job_the_line_runs_torchrun_with_the_first_node_and_the_job_id(tmp_path):
    """The line as bash runs it in the job: `scontrol` names the allocation's nodes, `srun` runs its
    command on each; both are stand-ins here that print what they were given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\n[ "$*" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n'
    )
    (bin_dir / "srun").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    line = train_launcher({"nodes": 2, "processes": 4, "device": "cuda"}, "/repo/src") + " train --config c.yaml"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "4711",
    }
    proc = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "--nodes",
        "2",
        "--ntasks-per-node",
        "1",
        "--gpus-per-task",
        "4",
        "--kill-on-bad-exit=1",
        "env",
        "PYTHONPATH=/repo/src",
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "4",
        "--rdzv_id",
        "4711",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"gpu07:{launch.RDZV_PORT}",
        "-m",
        "acoustic_mlm",
        "train",
        "--config",
        "c.yaml",
    ]
    assert shlex.split(line)[0] == "srun"


def test_the_module_imports_only_the_standard_library_and_loads_by_path():
    tree = ast.parse(open(launch.__file__).read())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    spec = importlib.util.spec_from_file_location("amlm_launch", launch.__file__)  # as workflow/rules/common.smk
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.torchrun(2, 1, "h:1", "j") == torchrun(2, 1, "h:1", "j")
