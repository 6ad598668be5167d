"""How a training job starts its processes: one process, torchrun on one machine, or torchrun on
`train.nodes` machines under SLURM. Standard library only: the Snakemake workflow imports it.

A run has train.nodes x train.processes DDP processes (world size). `train.batch_size` is the global
micro-batch, split evenly between all of them, and `train.accum_steps` micro-batches make one
update, so an update sees batch_size x accum_steps crops whatever the number of machines. MERT-330M
(yizhilll/MERT mert_fairseq/config/pretrain/MERT_RVQ-VAE_CQT_330M.yaml: distributed_world_size 64,
nprocs_per_node 8, max_tokens 900,000 samples = 7 crops of 122,880, update_freq 8) is 8 nodes x 8
processes, batch_size 448 (7 per process), accum_steps 8: 3,584 crops per update.

Several machines: one `torchrun` per node, started by `srun` inside the SLURM allocation, the
processes meeting through a c10d rendezvous on the allocation's first node (torchrun's
--rdzv_backend c10d --rdzv_endpoint host:port; the job id names the rendezvous).
"""

from __future__ import annotations

RDZV_PORT = 29500  # the rendezvous port on the first node of the allocation
FIRST_NODE = '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'  # evaluated inside the job


def torchrun(nodes: int, processes: int, endpoint: str, rdzv_id: str) -> list[str]:
    """torchrun's arguments (before `-m acoustic_mlm`) for `nodes` machines of `processes` each."""
    if nodes == 1:
        return ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    return [
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--nproc_per_node",
        str(processes),
        "--rdzv_id",
        rdzv_id,
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        endpoint,
    ]


def train_launcher(train: dict, src: str) -> str:
    """The shell prefix that runs `python -m acoustic_mlm` for a training job of the `train:` section
    (the subcommand and its arguments follow it). `src` is the package's source folder."""
    nodes, processes = int(train.get("nodes", 1)), int(train["processes"])
    env = f'PYTHONPATH="{src}"'
    if nodes == 1 and processes == 1:
        return f"{env} python -m acoustic_mlm"
    if nodes == 1:
        return f"{env} python {' '.join(torchrun(1, processes, '', ''))} -m acoustic_mlm"
    args = torchrun(nodes, processes, f'"{FIRST_NODE}:{RDZV_PORT}"', '"$SLURM_JOB_ID"')
    gpus = f"--gpus-per-task {processes} " if train.get("device") == "cuda" else ""  # each node's torchrun: its GPUs
    return (
        f"srun --nodes {nodes} --ntasks-per-node 1 {gpus}--kill-on-bad-exit=1 env {env} "
        f"python {' '.join(args)} -m acoustic_mlm"
    )


def slurm_resources(train: dict) -> dict:
    """snakemake-executor-plugin-slurm resources of a training job beyond its GPUs: `nodes`, and for
    several nodes one task per node (`tasks`; `tasks_per_gpu: 0` keeps the plugin from asking for
    tasks per GPU) and `mpi: srun`, which makes the plugin run the job's command as it is, so that
    its own `srun` starts one torchrun per node."""
    nodes = int(train.get("nodes", 1))
    if nodes == 1:
        return {}
    return {"nodes": nodes, "tasks": nodes, "tasks_per_gpu": 0, "mpi": "srun"}
