"""The report stage's commands: aggregate, figure, stability, claims, compare, map, map-figure,
map-claims, decide, status and verify; their options and entries (the stages: `report/`)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.config.cli_options import amount, command, count, opt
from acoustic_mlm.errors import UserError


@command(
    "aggregate",
    "runs_dir",
    opt("--out", default=Path("results/loss_curves.csv"), help="output CSV (default: %(default)s)"),
    opt(
        "--finals",
        metavar="JSON",
        help="also write each arm's final codebook-0 loss, keyed by its role, to JSON (dvc exp show)",
    ),
    files=("out",),
)
def aggregate_command(args, cfg) -> None:
    """collect every arm's metrics into one tidy CSV

    Read results/runs/<run>/metrics.csv for every run in the config; write the tidy loss curves (run, label, seed,
    step, split, codebook, loss_bits).
    """
    from acoustic_mlm.report import aggregate

    aggregate.run(cfg, args.runs_dir, args.out, finals_path=args.finals)


@command(
    "figure",
    "curves",
    opt(
        "--reference",
        help="paper curves CSV, overlaid when figure.overlay_paper (default: data/reference/paper_curves.csv)",
    ),
    "figures",
    folders=("out",),
)
def figure_command(args, cfg) -> None:
    """draw the codebook-0 loss vs training steps chart

    Draw the figure from the loss curves CSV as PNG (300 dpi), PDF and SVG.
    """
    from acoustic_mlm.report import figure

    figure.run(cfg, args.curves, args.out, reference_path=args.reference)


@command(
    "stability",
    "curves",
    opt("--diagnostics", default=Path("results/diagnostics.csv"), help="tidy diagnostics CSV (default: %(default)s)"),
    "figures",
    folders=("out",),
)
def stability_command(args, cfg) -> None:
    """draw the stability figure: loss, gradient norm, attention logits

    Draw the codebook-0 loss, the gradient norm before clipping (clip thresholds drawn), the largest attention logit
    (fp16 limit drawn) and the fp16 loss scale against training steps, every loss spike marked on every panel; PNG
    (300 dpi), PDF and SVG.
    """
    from acoustic_mlm.report import stability

    stability.run(cfg, args.curves, args.diagnostics, args.out)


@command(
    "claims",
    "curves",
    "reference",
    opt(
        "--diagnostics",
        default=Path("results/diagnostics.csv"),
        help="tidy diagnostics CSV: what they show at each spike (default: %(default)s)",
    ),
    opt("--out-json", default=Path("results/claims.json"), help="verdicts as JSON (default: %(default)s)"),
    opt("--out-md", default=Path("results/claims.md"), help="verdicts as a markdown table (default: %(default)s)"),
    files=("out_json", "out_md"),
)
def claims_command(args, cfg) -> None:
    """check the figure's claims on the reproduced curves

    Evaluate each claim of the paper's figure (start near 10 bits, clip 10 lowest, clip 1 slowest, Post-Norm spike,
    Attn. Relax in between, stable by 40% of the x-range) with numbers and a verdict.
    """
    from acoustic_mlm.report import claims

    claims.run(
        cfg,
        args.curves,
        args.out_json,
        args.out_md,
        reference_path=args.reference,
        diagnostics_path=args.diagnostics,
    )


@command(
    "compare",
    "curves",
    "reference",
    opt("--out", default=Path("results/figures/paper_vs_reproduction.png"), help="output PNG (default: %(default)s)"),
    files=("out",),
)
def compare_command(args, cfg) -> None:
    """draw the paper's curves beside the reproduction

    Two panels: the paper's digitised curves (data/reference/) and the reproduced codebook-0 curves.
    """
    from acoustic_mlm.report import figure

    figure.compare(cfg, args.curves, args.out, reference_path=args.reference)


@command(
    "map",
    "runs_dir",
    opt("--out", default=Path("results/stability_map.csv"), help="output CSV (default: %(default)s)"),
)
def map_command(args, cfg) -> None:
    """tabulate a sweep's runs: the stability map

    One row per sweep point and seed: arm, role, swept values, status, final codebook-0 loss (train, valid),
    flattened, largest gradient norm, largest attention logit and its float16 share, clipped share, fp16 overflow
    skips (results/stability_map.csv).
    """
    from acoustic_mlm.report import stability_map

    stability_map.run_table(cfg, args.runs_dir, args.out)


@command("map-figure", "map", "figures")
def map_figure_command(args, cfg) -> None:
    """draw the learning-rate sensitivity of a sweep

    Final codebook-0 loss against peak learning rate, one panel per depth x precision, one line per arm (diverged
    runs at the loss at initialisation); below, the largest attention logit against the rate with float16's limit.
    PNG (300 dpi), PDF and SVG.
    """
    from acoustic_mlm.report import stability_map_figure

    stability_map_figure.run_figure(cfg, args.map, args.out)


@command(
    "map-claims",
    "map",
    opt(
        "--out-json",
        type=Path,
        default=Path("results/map_claims.json"),
        help="verdicts as JSON (default: %(default)s)",
    ),
    opt(
        "--out-md",
        type=Path,
        default=Path("results/map_claims.md"),
        help="verdicts as markdown (default: %(default)s)",
    ),
)
def map_claims_command(args, cfg) -> None:
    """judge the stability settings' promises on a sweep

    Each arm's LR sensitivity (Wortsman et al. 2023) with its seed spread, best and largest stable rate, and one
    verdict per promise: clipping, DeepNorm against Post-Norm at depth, PB-Relax in fp16 (rules: docs/stability.md).
    """
    from acoustic_mlm.report import stability_map

    stability_map.run_claims(cfg, args.map, args.out_json, args.out_md)


@command(
    "decide",
    "runs_dir",
    opt(
        "--codes",
        default=Path("data/codes"),
        help="codes folder: its tokenizer.json gives the plateau (default: data/codes)",
    ),
    opt(
        "--numerics",
        help="benchmarks/attention_fp16.py's table (PB-Relax's arithmetic); without it that part is inconclusive",
    ),
    opt("--out", default=Path("results/decisive"), help="output folder (default: results/decisive)"),
    opt(
        "--runs-table",
        metavar="CSV",
        help="judge a published runs.csv (e.g. data/reference/decisive/runs.csv) instead of run folders "
        "(default: none, the run folders of --runs-dir)",
    ),
    folders=("out",),
)
def decide_command(args, cfg) -> None:
    """judge the decisive experiments by their pre-registered rules

    Every run folder of a sweep, its settings read from its summary.json: a table of runs (final, capped and lowest
    loss, late fall, spikes, trained, collapsed), of comparisons per cell and budget (gap, resolution from 2 SE and
    the A/A pair, catch-up guard, Fisher's exact test) and each promise's verdict (rules: docs/stability.md,
    'Decisive experiments').
    """
    from acoustic_mlm.report import decisive

    decisive.run(args.runs_dir, args.codes, args.out, args.numerics, args.runs_table)


@command(
    "status",
    "runs_dir",
    amount(
        "--stale-after",
        above=0,
        default=30.0,
        metavar="MINUTES",
        help="a seed without a new metrics row or state for this long is stopped (default: 30)",
    ),
)
def status_command(args, cfg) -> None:
    """where every arm and seed stands, while they train

    Read results/runs/ (only files training writes atomically) and print one line per arm and seed: step of total,
    last codebook-0 loss, updates per second, time left, the fp16 loss scale and overflow skips, and the status:
    waiting, running, stopped (no new metrics row or state for --stale-after minutes), completed,
    completed_with_nonfinite or diverged.
    """
    from acoustic_mlm.report import status

    if not args.stale_after > 0:
        raise UserError(f"--stale-after must be a positive number of minutes, not {args.stale_after}")
    status.run(cfg, args.runs_dir, stale_after=60.0 * args.stale_after)


@command(
    "verify",
    "runs_dir",
    opt(
        "--reference",
        help="a reference folder, or a folder of one per CPU vendor (default: data/reference/smoke_run for the "
        "smoke preset, else data/reference/default_run)",
    ),
    opt(
        "--out",
        default=Path("results/figures/reference_check.png"),
        help="figure of both runs' curves (default: results/figures/reference_check.png)",
    ),
    amount(
        "--tolerance",
        least=0,
        metavar="BITS",
        help="largest difference allowed (default: 0 bits for the exact check, else the reference's measured "
        "tolerance)",
    ),
    opt(
        "--record",
        metavar="DIR",
        help="write a reference of --runs-dir into DIR (tolerance: --tolerance) instead of comparing",
    ),
    count(
        "--until-step",
        needs="--record",
        metavar="STEP",
        help="with --record: --tolerance holds up to this step, --late-tolerance after it (docs/reference_run.md)",
    ),
    amount(
        "--late-tolerance",
        least=0,
        needs="--until-step",
        metavar="BITS",
        help="with --record and --until-step: the median difference allowed after that step",
    ),
    amount(
        "--native-tolerance",
        least=0,
        needs="--until-step",
        metavar="BITS",
        help="with --record and --until-step: the median difference allowed up to that step for a run "
        "on native kernels (its codes differ from a pinned reference's)",
    ),
    opt(
        "--data",
        default=Path("data"),
        help="data folder whose stages' outputs are hashed against the reference's (default: data)",
    ),
)
def verify_command(args, cfg) -> int | None:
    """compare this installation's run with the shipped reference run

    Compare every arm's losses in bits (each codebook, train and valid, every metrics row) in --runs-dir with a
    known-good reference run of the same preset and of this CPU's vendor (data/reference/default_run/<vendor>/: the
    default; data/reference/smoke_run/<vendor>/: the smoke preset): 0 bits on every row for a pinned run on a vendor
    with a reference, measured tolerances otherwise; print per arm the difference, draw both runs' codebook-0
    curves, exit 1 when an arm differs by more than allowed. --record writes a reference from --runs-dir instead.
    """
    from acoustic_mlm.report import verify

    if args.tolerance is not None and not args.tolerance >= 0:
        raise UserError(f"--tolerance must be a number of bits >= 0, not {args.tolerance}")
    if args.record is not None:
        command = (
            f"snakemake --cores all --configfile {args.config}, then amlm verify --config {args.config} "
            f"--runs-dir {args.runs_dir} --record {args.record}"
        )
        verify.record(
            cfg,
            Path(args.config),
            args.runs_dir,
            args.record,
            command,
            **({} if args.tolerance is None else {"tolerance_bits": args.tolerance}),
            until_step=args.until_step,
            late_tolerance_bits=args.late_tolerance,
            native_tolerance_bits=args.native_tolerance,
            data_dir=args.data,
        )
        return 0
    ref = args.reference or verify.default_reference(args.config)
    return verify.run(cfg, args.runs_dir, ref, args.out, args.tolerance, args.data)
