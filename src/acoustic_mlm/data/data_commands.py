"""`amlm fetch` and `amlm prepare`: their options and entries (the stages: `fetch.run`, `prepare`)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.config.cli_options import Steps, command, opt


@command(
    "fetch",
    opt("--out", default=Path("data/raw"), help="raw audio folder (default: data/raw)"),
    opt(
        "--downloads",
        default=Path("data/downloads"),
        help="where downloaded archives are kept (default: data/downloads)",
    ),
    folders=("out", "downloads"),
)
def fetch_command(args, cfg) -> None:
    """make or download the raw audio

    Write the corpus chosen by data.source into --out: synthetic (generated music, offline), tones (the tone
    corpus of the rounds, offline), folder (a local folder), url (a zip or tar(.gz) with its hash),
    fma_small/medium/large/full, librispeech-<subset>. Downloads are checksummed, resumable, kept in --downloads
    and extracted safely.
    """
    from acoustic_mlm.data import fetch

    fetch.run(cfg, args.out, args.downloads)


@command(
    "prepare",
    opt("--raw", default=Path("data/raw"), help="raw audio folder (default: data/raw)"),
    opt("--out", default=Path("data/prepared"), help="output folder (default: data/prepared)"),
    Steps(
        "--plan",
        "only write the shard plan, shards.csv",
        "decode",
        "only join the shards: manifest.csv, rejects.csv, prepare.json",
    ),
    folders=("out",),
)
def prepare_command(args, cfg) -> None:
    """decode, mix to mono, resample to 24 kHz, split

    Decode every audio file under --raw with soundfile, mix to mono, resample to 24 kHz, trim to whole EnCodec
    frames, in shards of data.shard_files files; split train/valid deterministically; write shard-<k>/audio.npy,
    manifest.csv and rejects.csv. Without a step option, all steps run in turn. FMA's members are read straight
    from the zip in data/downloads (nothing extracted); data.remove_archive removes it once the corpus is complete.
    """
    from acoustic_mlm.data import prepare

    if args.plan:
        prepare.plan(cfg, args.raw, args.out)
    elif args.shard is not None:
        prepare.prepare_shard(cfg, args.raw, args.out, args.shard)
    elif args.merge:
        prepare.merge(cfg, args.out)
        prepare.remove_archive(cfg, args.raw, args.out)  # data.remove_archive: once the manifest is written
    else:
        prepare.run(cfg, args.raw, args.out)
