"""`amlm preflight`: its options and entry (the stage: `preflight.run`)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm import config as C
from acoustic_mlm.config.cli_options import amount, command, count, opt, torch_threads

_PROJECTION = (
    amount(
        "--peak-tflops", above=0, help="the device's peak for MFU (default: from a table of known GPUs; none on CPU)"
    ),
    opt(
        "--every-model",
        action="store_true",
        help="a CUDA preset measured on CPU: measure each distinct arm's model (default: the first only)",
    ),
    opt(
        "--utilisation",
        type=float,
        rule={"exclusiveMinimum": 0, "maximum": 1},
        metavar="U",
        help="share of a GPU's peak when projecting a CUDA preset measured on CPU (default: the MFU a GPU measured for "
        "the preset's shape, acoustic_mlm.preflight.measured, else 0.35)",
    ),
    amount(
        "--intra-node-gb-s",
        above=0,
        metavar="GB_S",
        help="all-reduce bandwidth per GPU within a node, GB/s (default: 450, NVLink of an H100/H200 SXM)",
    ),
    amount(
        "--inter-node-gb-s",
        above=0,
        metavar="GB_S",
        help="all-reduce bandwidth per GPU across nodes, GB/s (default: 50, one 400 Gb/s InfiniBand port)",
    ),
    opt(
        "--nodes",
        type=int,
        rule="train.nodes",
        help="nodes for the whole-figure projection (default: train.nodes, one run's nodes)",
    ),
    opt(
        "--gpus-per-node",
        type=int,
        rule="train.processes",
        help="GPUs per node for the projection (default: the GPUs visible here; on CPU train.processes)",
    ),
    amount(
        "--corpus-hours",
        above=0,
        help="hours of audio, for the disk estimate of a source whose size is unknown before fetching",
    ),
)


@command(
    "preflight",
    opt("--out", default=Path("results"), help="folder for preflight.json and preflight.md (default: results)"),
    count(
        "--micro-batch",
        help="crops per measured micro-batch (default: train.batch_size / train.processes; 1 for a CUDA "
        "preset measured on CPU)",
    ),
    count("--micro-batches", help="timed micro-batches per model (default: 4; 1 for a CUDA preset measured on CPU)"),
    count(
        "--optimizer-steps", help="timed optimizer steps per model (default: 2; 1 for a CUDA preset measured on CPU)"
    ),
    count(
        "--warmup",
        least=0,
        help="untimed updates of one micro-batch first: compilation, kernels, Adam state (default: 1; 0 "
        "for a CUDA preset measured on CPU)",
    ),
    opt(
        "--no-full-update",
        dest="full_update",
        action="store_false",
        default=None,
        help="do not run a whole update even when it is projected under a minute (a CUDA preset "
        "measured on CPU never runs one)",
    ),
    opt("--device", type=None, choices=("cpu", "cuda", "auto"), default=None, help="override train.device"),
    opt("--precision", type=None, choices=C.PRECISIONS, default=None, help="override train.precision"),
    *_PROJECTION,
    threads=True,
    folders=("out",),
)
def preflight_command(args, cfg) -> None:
    """measure time, memory and disk of every arm before a run

    Build each arm's model at the preset's size on its device and precision, time a few micro-batches and optimizer
    steps on synthetic inputs, and project the time per update, per arm and for the whole figure, the memory (and
    the micro-batch that fits) and the disk.
    """
    from acoustic_mlm.preflight import run as preflight

    preflight.run(cfg, args.config, args.out, preflight.Options.from_namespace(args, torch_threads(args, cfg)))
