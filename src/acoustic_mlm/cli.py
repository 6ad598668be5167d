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
    amlm map        a sweep's runs as one table                -> results/stability_map.csv
    amlm map-figure final loss vs learning rate, per arm       -> results/figures/lr_sensitivity.{png,pdf,svg}
    amlm map-claims LR sensitivity and the settings' promises  -> results/map_claims.{json,md}
    amlm decide     the decisive experiments' pre-registered verdicts -> results/decisive/
    amlm preflight  measure every arm before a GPU run        -> results/preflight.{json,md}
    amlm status     one line per arm and seed while runs train (reads results/runs/)
    amlm verify     this installation's run against the shipped reference run, in bits
    amlm validate   check a configuration file and exit
    amlm dvc-yaml   the DVC pipeline for a configuration (its sweep too) -> dvc.yaml

Every subcommand reads and validates `--config` before doing any work.
"""

from __future__ import annotations

import argparse
import errno
import re
import signal
import sys
from pathlib import Path

from acoustic_mlm import __version__, kernels
from acoustic_mlm import config as C
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import final_names, log, setup_logging

DEFAULT_CONFIG = "config/config.yaml"


def _stage_parser(sub, name: str, help_: str, description: str, threads: bool = False) -> argparse.ArgumentParser:
    """A stage's parser with --config and -v; --threads only for the stages whose torch threads it sets
    (train, preflight)."""
    p = sub.add_parser(name, help=help_, description=description)
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"configuration YAML (default: {DEFAULT_CONFIG})")
    if threads:
        p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: train.threads)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def _step_options(p: argparse.ArgumentParser, first: str, first_help: str, verb: str, merge_help: str) -> None:
    """One step of a sharded stage (Snakemake runs them as separate jobs); none: every step in turn."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(first, action="store_true", help=first_help)
    g.add_argument("--shard", type=int, metavar="K", help=f"only {verb} shard K into shard-<K>/")
    g.add_argument("--merge", action="store_true", help=merge_help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amlm",
        description="Reproduce MERT's acoustic-MLM stability figure: codebook-0 loss vs training steps.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n")[1],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="STAGE")

    p = _stage_parser(
        sub,
        "fetch",
        "make or download the raw audio",
        "Write the corpus chosen by data.source into --out: synthetic (generated music, offline), "
        "folder (a local folder), url (a zip or tar(.gz) with its hash), fma_small/medium/large, "
        "librispeech-<subset>. Downloads are checksummed, resumable, kept in --downloads and "
        "extracted safely.",
    )
    p.add_argument("--out", type=Path, default=Path("data/raw"), help="raw audio folder (default: data/raw)")
    p.add_argument(
        "--downloads",
        type=Path,
        default=Path("data/downloads"),
        help="where downloaded archives are kept (default: data/downloads)",
    )

    p = _stage_parser(
        sub,
        "prepare",
        "decode, mix to mono, resample to 24 kHz, split",
        "Decode every audio file under --raw with soundfile, mix to mono, resample to 24 kHz, trim to "
        "whole EnCodec frames, in shards of data.shard_files files; split train/valid "
        "deterministically; write shard-<k>/audio.npy, manifest.csv and rejects.csv. Without a step "
        "option, all steps run in turn.",
    )
    p.add_argument("--raw", type=Path, default=Path("data/raw"), help="raw audio folder (default: data/raw)")
    p.add_argument("--out", type=Path, default=Path("data/prepared"), help="output folder (default: data/prepared)")
    _step_options(
        p,
        "--plan",
        "only write the shard plan, shards.csv",
        "decode",
        "only join the shards: manifest.csv, rejects.csv, prepare.json",
    )

    p = _stage_parser(
        sub,
        "tokenize",
        "EnCodec 24 kHz codes, frame-aligned with the audio",
        "Encode the prepared audio with EnCodec 24 kHz at tokenizer.bandwidth (6 kbps: 8 codebooks of "
        "1024 codes at 75 Hz), pretrained or calibrated (own k-means RVQ), shard by shard in padded "
        "batches; write model/, shard-<k>/codes.npy and tokenizer.json. Without a step option, all "
        "steps run in turn.",
    )
    p.add_argument(
        "--prepared", type=Path, default=Path("data/prepared"), help="prepared folder (default: data/prepared)"
    )
    p.add_argument("--out", type=Path, default=Path("data/codes"), help="output folder (default: data/codes)")
    # The codes depend on the thread count, so tokenize computes with tokenizer.threads; the Snakemake rules
    # pass that same value as --threads, accepted here and not offered in the help.
    p.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    _step_options(
        p,
        "--fit",
        "only fit (calibrated) or check (pretrained) the tokenizer: model/",
        "encode",
        "only summarise the shards' codes: tokenizer.json",
    )

    p = _stage_parser(
        sub,
        "train",
        "train one arm of the ablation",
        "Train the acoustic MLM with one arm's stability settings (runs.<RUN> in the config); write "
        "metrics.csv (losses in bits), summary.json and checkpoint.pt into --out.",
        threads=True,
    )
    p.add_argument("run_name", nargs="?", metavar="RUN", help="run name, a key of runs: in the config")
    p.add_argument(
        "--run",
        help="the same, as an option (under torchrun use the positional form: "
        "torchrun takes --run for its own --run-path)",
    )
    p.add_argument(
        "--prepared", type=Path, default=Path("data/prepared"), help="prepared folder (default: data/prepared)"
    )
    p.add_argument("--codes", type=Path, default=Path("data/codes"), help="codes folder (default: data/codes)")
    p.add_argument("--out", type=Path, default=None, help="run folder (default: results/runs/<RUN>)")

    p = _stage_parser(
        sub,
        "aggregate",
        "collect every arm's metrics into one tidy CSV",
        "Read results/runs/<run>/metrics.csv for every run in the config; write the tidy loss curves "
        "(run, label, seed, step, split, codebook, loss_bits).",
    )
    p.add_argument("--runs-dir", type=Path, default=Path("results/runs"), help="runs folder (default: results/runs)")
    p.add_argument(
        "--out", type=Path, default=Path("results/loss_curves.csv"), help="output CSV (default: %(default)s)"
    )
    p.add_argument(
        "--finals",
        type=Path,
        default=None,
        metavar="JSON",
        help="also write each arm's final codebook-0 loss, keyed by its role, to JSON (dvc exp show)",
    )

    p = _stage_parser(
        sub,
        "figure",
        "draw the codebook-0 loss vs training steps chart",
        "Draw the figure from the loss curves CSV as PNG (300 dpi), PDF and SVG.",
    )
    p.add_argument(
        "--curves",
        type=Path,
        default=Path("results/loss_curves.csv"),
        help="tidy loss curves CSV (default: %(default)s)",
    )
    p.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="paper curves CSV, overlaid when figure.overlay_paper (default: data/reference/paper_curves.csv)",
    )
    p.add_argument("--out", type=Path, default=Path("results/figures"), help="output folder (default: results/figures)")

    p = _stage_parser(
        sub,
        "stability",
        "draw the stability figure: loss, gradient norm, attention logits",
        "Draw the codebook-0 loss, the gradient norm before clipping (clip thresholds drawn), the "
        "largest "
        "attention logit (fp16 limit drawn) and the fp16 loss scale against training steps, every loss "
        "spike marked on every panel; PNG (300 dpi), PDF and SVG.",
    )
    p.add_argument(
        "--curves",
        type=Path,
        default=Path("results/loss_curves.csv"),
        help="tidy loss curves CSV (default: %(default)s)",
    )
    p.add_argument(
        "--diagnostics",
        type=Path,
        default=Path("results/diagnostics.csv"),
        help="tidy diagnostics CSV (default: %(default)s)",
    )
    p.add_argument("--out", type=Path, default=Path("results/figures"), help="output folder (default: results/figures)")

    p = _stage_parser(
        sub,
        "claims",
        "check the figure's claims on the reproduced curves",
        "Evaluate each claim of the paper's figure (start near 10 bits, clip 10 lowest, clip 1 slowest, "
        "Post-Norm spike, Attn. Relax in between, stable by 40% of the x-range) with numbers and a "
        "verdict.",
    )
    p.add_argument(
        "--curves",
        type=Path,
        default=Path("results/loss_curves.csv"),
        help="tidy loss curves CSV (default: %(default)s)",
    )
    p.add_argument(
        "--reference", type=Path, default=None, help="paper curves CSV (default: data/reference/paper_curves.csv)"
    )
    p.add_argument(
        "--diagnostics",
        type=Path,
        default=Path("results/diagnostics.csv"),
        help="tidy diagnostics CSV: what they show at each spike (default: %(default)s)",
    )
    p.add_argument(
        "--out-json", type=Path, default=Path("results/claims.json"), help="verdicts as JSON (default: %(default)s)"
    )
    p.add_argument(
        "--out-md",
        type=Path,
        default=Path("results/claims.md"),
        help="verdicts as a markdown table (default: %(default)s)",
    )

    p = _stage_parser(
        sub,
        "compare",
        "draw the paper's curves beside the reproduction",
        "Two panels: the paper's digitised curves (data/reference/) and the reproduced codebook-0 curves.",
    )
    p.add_argument(
        "--curves",
        type=Path,
        default=Path("results/loss_curves.csv"),
        help="tidy loss curves CSV (default: %(default)s)",
    )
    p.add_argument(
        "--reference", type=Path, default=None, help="paper curves CSV (default: data/reference/paper_curves.csv)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("results/figures/paper_vs_reproduction.png"),
        help="output PNG (default: %(default)s)",
    )

    p = _stage_parser(
        sub,
        "map",
        "tabulate a sweep's runs: the stability map",
        "One row per sweep point and seed: arm, role, swept values, status, final codebook-0 loss "
        "(train, valid), flattened, largest gradient norm, largest attention logit and its float16 "
        "share, clipped share, fp16 overflow skips (results/stability_map.csv).",
    )
    p.add_argument("--runs-dir", type=Path, default=Path("results/runs"), help="runs folder (default: results/runs)")
    p.add_argument(
        "--out", type=Path, default=Path("results/stability_map.csv"), help="output CSV (default: %(default)s)"
    )

    p = _stage_parser(
        sub,
        "map-figure",
        "draw the learning-rate sensitivity of a sweep",
        "Final codebook-0 loss against peak learning rate, one panel per depth x precision, one line "
        "per arm (diverged runs at the loss at initialisation); below, the largest attention logit "
        "against the rate with float16's limit. PNG (300 dpi), PDF and SVG.",
    )
    p.add_argument(
        "--map", type=Path, default=Path("results/stability_map.csv"), help="stability map CSV (default: %(default)s)"
    )
    p.add_argument("--out", type=Path, default=Path("results/figures"), help="output folder (default: results/figures)")

    p = _stage_parser(
        sub,
        "map-claims",
        "judge the stability settings' promises on a sweep",
        "Each arm's LR sensitivity (Wortsman et al. 2023) with its seed spread, best and largest stable "
        "rate, and one verdict per promise: clipping, DeepNorm against Post-Norm at depth, PB-Relax in "
        "fp16 (rules: docs/stability.md).",
    )
    p.add_argument(
        "--map", type=Path, default=Path("results/stability_map.csv"), help="stability map CSV (default: %(default)s)"
    )
    p.add_argument(
        "--out-json", type=Path, default=Path("results/map_claims.json"), help="verdicts as JSON (default: %(default)s)"
    )
    p.add_argument(
        "--out-md", type=Path, default=Path("results/map_claims.md"), help="verdicts as markdown (default: %(default)s)"
    )

    p = _stage_parser(
        sub,
        "decide",
        "judge the decisive experiments by their pre-registered rules",
        "Every run folder of a sweep, its settings read from its summary.json: a table of runs "
        "(final, capped and lowest loss, late fall, spikes, trained, collapsed), of comparisons per "
        "cell and budget (gap, resolution from 2 SE and the A/A pair, catch-up guard, Fisher's exact "
        "test) and each promise's verdict (rules: docs/stability.md, 'Decisive experiments').",
    )
    p.add_argument("--runs-dir", type=Path, default=Path("results/runs"), help="runs folder (default: results/runs)")
    p.add_argument(
        "--codes",
        type=Path,
        default=Path("data/codes"),
        help="codes folder: its tokenizer.json gives the plateau (default: data/codes)",
    )
    p.add_argument(
        "--numerics",
        type=Path,
        default=None,
        help="benchmarks/attention_fp16.py's table (PB-Relax's arithmetic); without it that part is inconclusive",
    )
    p.add_argument(
        "--out", type=Path, default=Path("results/decisive"), help="output folder (default: results/decisive)"
    )
    p.add_argument(
        "--runs-table",
        type=Path,
        default=None,
        metavar="CSV",
        help="judge a published runs.csv (e.g. data/reference/decisive/runs.csv) instead of run folders "
        "(default: none, the run folders of --runs-dir)",
    )

    p = _stage_parser(
        sub,
        "preflight",
        "measure time, memory and disk of every arm before a run",
        "Build each arm's model at the preset's size on its device and precision, time a few "
        "micro-batches and optimizer steps on synthetic inputs, and project the time per update, per "
        "arm and for the whole figure, the memory (and the micro-batch that fits) and the disk.",
        threads=True,
    )
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

    p = _stage_parser(
        sub,
        "status",
        "where every arm and seed stands, while they train",
        "Read results/runs/ (only files training writes atomically) and print one line per arm and seed: "
        "step of total, last codebook-0 loss, updates per second, time left, the fp16 loss scale and "
        "overflow skips, and the status: waiting, running, stopped (no new metrics row or state for "
        "--stale-after minutes), completed, completed_with_nonfinite or diverged.",
    )
    p.add_argument("--runs-dir", type=Path, default=Path("results/runs"), help="runs folder (default: results/runs)")
    p.add_argument(
        "--stale-after",
        type=float,
        default=30.0,
        metavar="MINUTES",
        help="a seed without a new metrics row or state for this long is stopped (default: 30)",
    )

    p = _stage_parser(
        sub,
        "verify",
        "compare this installation's run with the shipped reference run",
        "Compare every arm's losses in bits (each codebook, train and valid, every metrics row) in "
        "--runs-dir with a known-good reference run of the same preset and of this CPU's vendor "
        "(data/reference/default_run/<vendor>/: the default; data/reference/smoke_run/<vendor>/: the smoke "
        "preset): 0 bits on every row for a pinned run on a vendor with a reference, measured tolerances "
        "otherwise; print per arm the difference, draw both runs' codebook-0 curves, exit 1 when an arm "
        "differs by more than allowed. --record writes a reference from --runs-dir instead.",
    )
    p.add_argument("--runs-dir", type=Path, default=Path("results/runs"), help="runs folder (default: results/runs)")
    p.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="a reference folder, or a folder of one per CPU vendor (default: data/reference/smoke_run for the "
        "smoke preset, else data/reference/default_run)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("results/figures/reference_check.png"),
        help="figure of both runs' curves (default: results/figures/reference_check.png)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="BITS",
        help="largest difference allowed (default: 0 bits for the exact check, else the reference's measured "
        "tolerance)",
    )
    p.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a reference of --runs-dir into DIR (tolerance: --tolerance) instead of comparing",
    )
    p.add_argument(
        "--until-step",
        type=int,
        default=None,
        metavar="STEP",
        help="with --record: --tolerance holds up to this step, --late-tolerance after it (docs/reference_run.md)",
    )
    p.add_argument(
        "--late-tolerance",
        type=float,
        default=None,
        metavar="BITS",
        help="with --record and --until-step: the median difference allowed after that step",
    )
    p.add_argument(
        "--native-tolerance",
        type=float,
        default=None,
        metavar="BITS",
        help="with --record and --until-step: the median difference allowed up to that step for a run "
        "on native kernels (its codes differ from a pinned reference's)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=Path("data"),
        help="data folder whose stages' outputs are hashed against the reference's (default: data)",
    )

    p = _stage_parser(
        sub,
        "validate",
        "check a configuration file",
        "Validate --config against the schema and rules; exit 0 if valid. With --out, also write "
        "a marker file (the same bytes for every valid config): DVC's first stage, so that an "
        "invalid config stops `dvc repro` before any stage deletes its outputs.",
    )
    p.add_argument("--out", type=Path, default=None, help="marker file to write when the config is valid")

    p = _stage_parser(
        sub,
        "dvc-yaml",
        "write dvc.yaml for a configuration",
        "Write the DVC pipeline for --config: the stages of the Snakemake rules (with a sweep, one "
        "training stage per point and the stability map), each stage's params from the settings its "
        "steps depend on and its deps from the modules it imports (acoustic_mlm.dvcgen).",
    )
    p.add_argument("--out", type=Path, default=Path("dvc.yaml"), help="the file to write (default: dvc.yaml)")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 2 unless --out is exactly the file generated for --config",
    )
    return parser


def dispatch(args: argparse.Namespace) -> int | None:
    cfg = C.load(args.config)
    threads = getattr(args, "threads", None)
    threads = threads if threads is not None else cfg.train.threads
    if args.command == "validate":
        print(f"{args.config}: valid ({len(cfg.runs)} runs: {', '.join(cfg.runs)})")
        if args.out is not None:
            from acoustic_mlm.utils import atomic_path

            with atomic_path(args.out) as tmp:  # constant content: a valid change reruns nothing downstream
                tmp.write_text("the configuration is valid\n")
    elif args.command == "fetch":
        from acoustic_mlm.data import fetch

        fetch.run(cfg, args.out, args.downloads)
    elif args.command == "prepare":
        from acoustic_mlm.data import prepare

        if args.plan:
            prepare.plan(cfg, args.raw, args.out)
        elif args.shard is not None:
            prepare.prepare_shard(cfg, args.raw, args.out, args.shard)
        elif args.merge:
            prepare.merge(cfg, args.out)
        else:
            prepare.run(cfg, args.raw, args.out)
    elif args.command == "tokenize":
        from acoustic_mlm.tokenizer import stage as tokenizer

        # the codes depend on the thread count: tokenize computes with tokenizer.threads, whatever --threads says
        if args.threads is not None and args.threads != cfg.tokenizer.threads:
            log.warning(
                "tokenize: %d threads, as tokenizer.threads says (--threads %d ignored: other thread counts "
                "give other codes)",
                cfg.tokenizer.threads,
                args.threads,
            )
        threads = cfg.tokenizer.threads
        if args.fit:
            tokenizer.fit(cfg, args.prepared, args.out, threads=threads)
        elif args.shard is not None:
            tokenizer.encode_shard(cfg, args.prepared, args.out, args.shard, threads=threads)
        elif args.merge:
            tokenizer.merge(cfg, args.prepared, args.out)
        else:
            tokenizer.run(cfg, args.prepared, args.out, threads=threads)
    elif args.command == "train":
        from acoustic_mlm.train import loop as train

        if (args.run is None) == (args.run_name is None):
            raise UserError("name the run once: amlm train RUN (or --run RUN)")
        args.run = args.run or args.run_name
        cfg = cfg.point(args.run)  # a sweep point: the file's settings with the point's values; unknown: refused
        out = args.out if args.out is not None else Path("results/runs") / args.run
        train.run(cfg, args.run, args.prepared, args.codes, out, threads=threads)
    elif args.command == "aggregate":
        from acoustic_mlm.report import aggregate

        aggregate.run(cfg, args.runs_dir, args.out, finals_path=args.finals)
    elif args.command == "figure":
        from acoustic_mlm.report import figure

        figure.run(cfg, args.curves, args.out, reference_path=args.reference)
    elif args.command == "stability":
        from acoustic_mlm.report import stability

        stability.run(cfg, args.curves, args.diagnostics, args.out)
    elif args.command == "claims":
        from acoustic_mlm.report import claims

        claims.run(
            cfg,
            args.curves,
            args.out_json,
            args.out_md,
            reference_path=args.reference,
            diagnostics_path=args.diagnostics,
        )
    elif args.command in ("map", "map-figure", "map-claims"):
        from acoustic_mlm.report import stability_map

        if args.command == "map":
            stability_map.run_table(cfg, args.runs_dir, args.out)
        elif args.command == "map-figure":
            stability_map.run_figure(cfg, args.map, args.out)
        else:
            stability_map.run_claims(cfg, args.map, args.out_json, args.out_md)
    elif args.command == "decide":
        from acoustic_mlm.report import decisive

        decisive.run(args.runs_dir, args.codes, args.out, args.numerics, args.runs_table)
    elif args.command == "preflight":
        from acoustic_mlm.preflight import run as preflight

        preflight.run(cfg, args.config, args.out, preflight.Options.from_namespace(args, threads))
    elif args.command == "status":
        from acoustic_mlm.report import status

        if not args.stale_after > 0:
            raise UserError(f"--stale-after must be a positive number of minutes, not {args.stale_after}")
        status.run(cfg, args.runs_dir, stale_after=60.0 * args.stale_after)
    elif args.command == "verify":
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
    elif args.command == "compare":
        from acoustic_mlm.report import figure

        figure.compare(cfg, args.curves, args.out, reference_path=args.reference)
    elif args.command == "dvc-yaml":
        from acoustic_mlm import dvcgen

        if args.check:
            dvcgen.check(cfg, args.config, args.out)
        else:
            print(f"{dvcgen.write(cfg, args.config, args.out)}: the DVC pipeline for {args.config}")


# Output options: (stage, option attribute) -> what the path must be able to become.
OUT_FOLDERS = {
    ("decide", "out"),
    ("fetch", "out"),
    ("fetch", "downloads"),
    ("prepare", "out"),
    ("tokenize", "out"),
    ("train", "out"),
    ("figure", "out"),
    ("stability", "out"),
    ("preflight", "out"),
}
OUT_FILES = {
    ("aggregate", "out"),
    ("claims", "out_json"),
    ("claims", "out_md"),
    ("compare", "out"),
    ("validate", "out"),
    ("dvc-yaml", "out"),
}


def check_outputs(args: argparse.Namespace) -> None:
    """Every output path can be written as what it will be (a folder or a file): not an existing
    file where a folder goes (or the reverse), and no file where a folder above it must be."""
    for (stage, attr), kind in [(k, "folder") for k in sorted(OUT_FOLDERS)] + [(k, "file") for k in sorted(OUT_FILES)]:
        path = getattr(args, attr, None) if args.command == stage else None
        if path is None:
            continue
        path, option = Path(path), "--" + attr.replace("_", "-")
        if kind == "folder" and path.exists() and not path.is_dir():
            raise UserError(
                f"{path}: {option} names an existing file, not a folder; name a folder (or remove the file)"
            )
        if kind == "file" and path.is_dir():
            raise UserError(f"{path}: {option} names an existing folder, not a file; name a file")
        for above in path.parents:
            if above.exists() or above.is_symlink():
                if not above.is_dir():
                    raise UserError(f"{path}: {option} lies under {above}, which is a file, not a folder")
                break


_NO_ACCESS = {errno.EACCES, errno.EPERM, errno.EROFS}


def access_refusal(exc: OSError) -> str | None:
    """One line for an error of access (permission denied, a read-only file system), naming the
    final path (never a temporary name); None for any other OSError, which keeps its traceback."""
    if exc.errno not in _NO_ACCESS:
        return None
    path = final_names(str(exc.filename)) if exc.filename is not None else "a file or folder"
    path = re.sub(r"(^|/)\.([^/]+?)\.(tmp|old)-\d+-[^/]*", r"\1\2", path)  # temporary names not yet registered
    cause = "a read-only file system" if exc.errno == errno.EROFS else "permission denied"
    return f"{path}: {cause}; give this user access to it (or its folder), or name another path"


def _terminate(signum, _frame):
    """SIGTERM ends the stage as Ctrl-C does: every `finally` runs, so temporary outputs are removed."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(getattr(args, "verbose", False))
    signal.signal(signal.SIGTERM, _terminate)
    try:
        mismatch = kernels.check_config_read(getattr(args, "config", None))
        if mismatch:  # the kernels were pinned for another file than the one argparse read
            raise UserError(mismatch)
        check_outputs(args)
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
