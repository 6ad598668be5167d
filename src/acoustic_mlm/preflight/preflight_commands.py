"""`amlm preflight`: its options and entry (the stage: `preflight.run`)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm import config as C
from acoustic_mlm.cli_options import Command, torch_threads


def _preflight_options(p) -> None:
    """What is measured, and where."""
    p.add_argument(
        "--out",
        type=Path,
        default=Path("results"),
        help="folder for preflight.json and preflight.md (default: results)",
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        metavar="N",
        help="crops per measured micro-batch (default: train.batch_size / train.processes; 1 for a CUDA "
        "preset measured on CPU)",
    )
    p.add_argument(
        "--micro-batches",
        type=int,
        default=None,
        metavar="N",
        help="timed micro-batches per model (default: 4; 1 for a CUDA preset measured on CPU)",
    )
    p.add_argument(
        "--optimizer-steps",
        type=int,
        default=None,
        metavar="N",
        help="timed optimizer steps per model (default: 2; 1 for a CUDA preset measured on CPU)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        metavar="N",
        help="untimed updates of one micro-batch first: compilation, kernels, Adam state (default: 1; 0 "
        "for a CUDA preset measured on CPU)",
    )
    p.add_argument(
        "--no-full-update",
        dest="full_update",
        action="store_false",
        default=None,
        help="do not run a whole update even when it is projected under a minute (a CUDA preset "
        "measured on CPU never runs one)",
    )
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default=None, help="override train.device")
    p.add_argument("--precision", choices=C.PRECISIONS, default=None, help="override train.precision")
    _projection_options(p)


def _projection_options(p) -> None:
    """How the measured times become the figure's cost: the GPUs, their links, the corpus."""
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the device's peak for MFU (default: from a table of known GPUs; none on CPU)",
    )
    p.add_argument(
        "--every-model",
        action="store_true",
        help="a CUDA preset measured on CPU: measure each distinct arm's model (default: the first only)",
    )
    p.add_argument(
        "--utilisation",
        type=float,
        default=None,
        metavar="U",
        help="share of a GPU's peak assumed when projecting a CUDA preset measured on CPU (default: 0.35)",
    )
    p.add_argument(
        "--intra-node-gb-s",
        type=float,
        default=None,
        metavar="GB_S",
        help="all-reduce bandwidth per GPU within a node, GB/s (default: 450, NVLink of an H100/H200 SXM)",
    )
    p.add_argument(
        "--inter-node-gb-s",
        type=float,
        default=None,
        metavar="GB_S",
        help="all-reduce bandwidth per GPU across nodes, GB/s (default: 50, one 400 Gb/s InfiniBand port)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="nodes for the whole-figure projection (default: train.nodes, one run's nodes)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="GPUs per node for the projection (default: the GPUs visible here; on CPU train.processes)",
    )
    p.add_argument(
        "--corpus-hours",
        type=float,
        default=None,
        help="hours of audio, for the disk estimate of a source whose size is unknown before fetching",
    )


def _preflight(args, cfg) -> None:
    from acoustic_mlm.preflight import run as preflight

    preflight.run(cfg, args.config, args.out, preflight.Options.from_namespace(args, torch_threads(args, cfg)))


PREFLIGHT = Command(
    "preflight",
    "measure time, memory and disk of every arm before a run",
    "Build each arm's model at the preset's size on its device and precision, time a few "
    "micro-batches and optimizer steps on synthetic inputs, and project the time per update, per "
    "arm and for the whole figure, the memory (and the micro-batch that fits) and the disk.",
    _preflight_options,
    _preflight,
    threads=True,
    folders=("out",),
)
