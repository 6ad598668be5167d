"""`amlm metrics`: its options and entry (the stage: `acoustic_mlm.report.headline`, imported when it runs)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.config.cli_options import command, opt


@command(
    "metrics",
    opt(
        "--finals",
        default=Path("results/final_losses.json"),
        help="each arm's final loss, from aggregate --finals (default: %(default)s)",
    ),
    opt("--claims", default=Path("results/claims.json"), help="the claims' verdicts (default: %(default)s)"),
    opt("--out", default=Path("results/metrics.json"), help="the flat metrics file (default: %(default)s)"),
    files=("out",),
)
def metrics_command(args, cfg) -> None:
    """the headline numbers in one flat file

    Write each arm's final codebook-0 loss and each claim's verdict as one flat JSON object: the metrics file
    DVC reads (dvc exp show's columns) and a one-look summary of a run (acoustic_mlm.report.headline).
    """
    from acoustic_mlm.report import headline

    headline.run(args.finals, args.claims, args.out)
