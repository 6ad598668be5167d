"""`amlm`: one subcommand per pipeline stage. Snakemake rules and DVC stages call these.

    amlm fetch      make or download the raw audio            -> data/raw/
    amlm prepare    decode, mono, 24 kHz, split, in shards     -> data/prepared/
    amlm tokenize   EnCodec codes (8 x 1024 at 75 Hz), by shard -> data/codes/
    amlm train      one arm of the ablation                    -> results/runs/{run}/
    amlm aggregate  every arm's metrics as one tidy CSV        -> results/loss_curves.csv
    amlm figure     the loss-vs-steps chart (png, pdf, svg)    -> results/figures/
    amlm stability  loss beside gradient norm, attention logits -> results/figures/stability.{png,pdf,svg}
    amlm claims     the figure's claims checked, with verdicts -> results/claims.{json,md}
    amlm compare    the paper's curves beside the reproduction -> results/figures/paper_vs_reproduction.png
    amlm metrics    final losses and verdicts, one flat file   -> results/metrics.json
    amlm map        a sweep's runs as one table                -> results/stability_map.csv
    amlm map-figure final loss vs learning rate, per arm       -> results/figures/lr_sensitivity.{png,pdf,svg}
    amlm map-claims LR sensitivity and the settings' promises  -> results/map_claims.{json,md}
    amlm decide     the decisive experiments' pre-registered verdicts -> results/decisive/
    amlm experiment a round's plan, its declaration against git, its verdicts -> results/experiments/
    amlm preflight  measure every arm before a GPU run        -> results/preflight.{json,md}
    amlm status     one line per arm and seed while runs train (reads results/runs/)
    amlm verify     this installation's run against the shipped reference run, in bits
    amlm validate   check a configuration file and exit
    amlm dvc-yaml   the DVC pipeline for a configuration (its sweep too) -> dvc.yaml

Every subcommand reads and validates `--config` before doing any work.
"""

from __future__ import annotations

import argparse
import signal
import sys

from acoustic_mlm import __version__, kernels
from acoustic_mlm import config as C
from acoustic_mlm.config.cli_options import Parser, access_refusal, check_outputs, check_values
from acoustic_mlm.config.config_commands import validate_command
from acoustic_mlm.data.data_commands import fetch_command, prepare_command
from acoustic_mlm.dvcgen_commands import dvc_yaml_command
from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments.commands import experiment_command
from acoustic_mlm.preflight.preflight_commands import preflight_command
from acoustic_mlm.report import report_commands as R
from acoustic_mlm.report.headline_commands import metrics_command
from acoustic_mlm.tokenizer.tokenizer_commands import tokenize_command
from acoustic_mlm.train.train_commands import train_command
from acoustic_mlm.utils import final_names, setup_logging

# The subcommands in the order `amlm --help` lists them; each stage declares its own (its options,
# entry and output paths) beside the stage, importing the stage only when it runs.
COMMANDS = {
    c.name: c
    for c in (
        fetch_command,
        prepare_command,
        tokenize_command,
        train_command,
        R.aggregate_command,
        R.figure_command,
        R.stability_command,
        R.claims_command,
        R.compare_command,
        metrics_command,
        R.map_command,
        R.map_figure_command,
        R.map_claims_command,
        R.decide_command,
        experiment_command,
        preflight_command,
        R.status_command,
        R.verify_command,
        validate_command,
        dvc_yaml_command,
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="amlm",
        description="Reproduce MERT's acoustic-MLM stability figure: codebook-0 loss vs training steps.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # argparse lists the subcommands (their docstrings' first lines); the docstring's table above, with
        # each one's outputs, is for readers of this file, and the epilog is its last paragraph alone.
        epilog=__doc__.strip().split("\n\n")[-1],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="STAGE")
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def dispatch(args: argparse.Namespace) -> int | None:
    """Read and validate --config (every stage that reads one, before any work), then run the stage's entry."""
    command = COMMANDS[args.command]
    cfg = C.load(args.config) if command.reads_config else None
    return command.entry(args, cfg)


def _terminate(signum, _frame):
    """SIGTERM ends the stage as Ctrl-C does: every `finally` runs, so temporary outputs are removed."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "verbose", False) and getattr(args, "quiet", False):
        print(f"amlm {args.command}: error: -q/--quiet and -v/--verbose together; choose one", file=sys.stderr)
        return 2
    setup_logging(getattr(args, "verbose", False), getattr(args, "quiet", False))
    signal.signal(signal.SIGTERM, _terminate)
    try:
        mismatch = kernels.check_config_read(getattr(args, "config", None))
        if mismatch:  # the kernels were pinned for another file than the one argparse read
            raise UserError(mismatch)
        check_values(args, COMMANDS[args.command])
        check_outputs(args, COMMANDS[args.command])
        code = dispatch(args)
    except UserError as exc:
        # Problems with the user's input: one line, no traceback. Anything else is a bug and keeps its traceback.
        message = " ".join(final_names(str(exc)).splitlines())  # one line, whatever a value held
        print(f"amlm {args.command}: error: {message}", file=sys.stderr)
        return 2
    except OSError as exc:  # a folder or file this user may not write or read (a read-only results folder)
        refusal = access_refusal(exc)
        if refusal is None:
            raise
        print(f"amlm {args.command}: error: {refusal}", file=sys.stderr)
        return 2
    return code or 0  # a check that ran and failed (amlm verify): 1


if __name__ == "__main__":
    sys.exit(main())
