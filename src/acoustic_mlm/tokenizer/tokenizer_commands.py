"""`amlm tokenize`: its options and entry (the stage: `tokenizer.stage`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from acoustic_mlm.cli_options import Steps, command, opt
from acoustic_mlm.utils import log


@command(
    "tokenize",
    "prepared",
    opt("--out", default=Path("data/codes"), help="output folder (default: data/codes)"),
    opt("--threads", type=int, rule="tokenizer.threads", help=argparse.SUPPRESS),
    Steps(
        "--fit",
        "only fit (calibrated) or check (pretrained) the tokenizer: model/",
        "encode",
        "only summarise the shards' codes: tokenizer.json",
    ),
    folders=("out",),
)
def tokenize_command(args, cfg) -> None:
    """EnCodec 24 kHz codes, frame-aligned with the audio

    Encode the prepared audio with EnCodec 24 kHz at tokenizer.bandwidth (6 kbps: 8 codebooks of 1024 codes at 75
    Hz), pretrained or calibrated (own k-means RVQ), shard by shard in padded batches; write model/,
    shard-<k>/codes.npy and tokenizer.json. Without a step option, all steps run in turn.
    """
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
