"""`amlm train`: its options and entry (the stage: `train.loop.run`)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.config.cli_options import command, opt, torch_threads
from acoustic_mlm.errors import UserError


@command(
    "train",
    opt("run_name", type=None, nargs="?", metavar="RUN", help="run name, a key of runs: in the config"),
    opt(
        "--run",
        type=None,
        help="the same, as an option (under torchrun use the positional form: torchrun takes --run for its "
        "own --run-path)",
    ),
    "prepared",
    "codes",
    opt("--out", help="run folder (default: results/runs/<RUN>)"),
    threads=True,
    folders=("out",),
)
def train_command(args, cfg) -> None:
    """train one arm of the ablation

    Train the acoustic MLM with one arm's stability settings (runs.<RUN> in the config); write metrics.csv (losses
    in bits), summary.json and checkpoint.pt into --out.
    """
    from acoustic_mlm.train import loop as train

    threads = torch_threads(args, cfg)
    if (args.run is None) == (args.run_name is None):
        raise UserError("name the run once: amlm train RUN (or --run RUN)")
    args.run = args.run or args.run_name
    out = args.out if args.out is not None else Path("results/runs") / args.run
    train.run(cfg, args.run, args.prepared, args.codes, out, threads=threads)
