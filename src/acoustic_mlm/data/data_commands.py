"""`amlm fetch` and `amlm prepare`: their options and entries (the stages: `fetch.run`, `prepare`)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.cli_options import Command, step_options


def _fetch_options(p) -> None:
    p.add_argument("--out", type=Path, default=Path("data/raw"), help="raw audio folder (default: data/raw)")
    p.add_argument(
        "--downloads",
        type=Path,
        default=Path("data/downloads"),
        help="where downloaded archives are kept (default: data/downloads)",
    )


def _fetch(args, cfg) -> None:
    from acoustic_mlm.data import fetch

    fetch.run(cfg, args.out, args.downloads)


FETCH = Command(
    "fetch",
    "make or download the raw audio",
    "Write the corpus chosen by data.source into --out: synthetic (generated music, offline), "
    "folder (a local folder), url (a zip or tar(.gz) with its hash), fma_small/medium/large, "
    "librispeech-<subset>. Downloads are checksummed, resumable, kept in --downloads and "
    "extracted safely.",
    _fetch_options,
    _fetch,
    folders=("out", "downloads"),
)


def _prepare_options(p) -> None:
    p.add_argument("--raw", type=Path, default=Path("data/raw"), help="raw audio folder (default: data/raw)")
    p.add_argument("--out", type=Path, default=Path("data/prepared"), help="output folder (default: data/prepared)")
    step_options(
        p,
        "--plan",
        "only write the shard plan, shards.csv",
        "decode",
        "only join the shards: manifest.csv, rejects.csv, prepare.json",
    )


def _prepare(args, cfg) -> None:
    from acoustic_mlm.data import prepare

    if args.plan:
        prepare.plan(cfg, args.raw, args.out)
    elif args.shard is not None:
        prepare.prepare_shard(cfg, args.raw, args.out, args.shard)
    elif args.merge:
        prepare.merge(cfg, args.out)
    else:
        prepare.run(cfg, args.raw, args.out)


PREPARE = Command(
    "prepare",
    "decode, mix to mono, resample to 24 kHz, split",
    "Decode every audio file under --raw with soundfile, mix to mono, resample to 24 kHz, trim to "
    "whole EnCodec frames, in shards of data.shard_files files; split train/valid "
    "deterministically; write shard-<k>/audio.npy, manifest.csv and rejects.csv. Without a step "
    "option, all steps run in turn.",
    _prepare_options,
    _prepare,
    folders=("out",),
)
