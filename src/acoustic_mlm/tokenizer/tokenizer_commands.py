"""`amlm tokenize`: its options and entry (the stage: `tokenizer.stage`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from acoustic_mlm.config.cli_options import Steps, command, opt
from acoustic_mlm.utils import log


@command(
    "tokenize",
    "prepared",
    opt("--out", default=Path("data/codes"), help="output folder (default: data/codes)"),
    opt("--threads", type=int, rule="tokenizer.threads", help=argparse.SUPPRESS),
    opt(
        "--checkpoint-only",
        action="store_true",
        help="only bring and check the pretrained EnCodec checkpoint (tokenizer.checkpoint, else the official file "
        "into torch's hub folder) and record it in checkpoint.json: Snakemake's local rule, so compute nodes need "
        "no network",
    ),
    Steps(
        "--fit",
        "only fit (calibrated), check (pretrained) or record (pitch) the tokenizer: model/",
        "encode",
        "only summarise the shards' codes: tokenizer.json",
    ),
    folders=("out",),
)
def tokenize_command(args, cfg) -> None:
    """EnCodec 24 kHz codes, frame-aligned with the audio

    Encode the prepared audio with EnCodec 24 kHz at tokenizer.bandwidth (6 kbps: 8 codebooks of 1024 codes at 75
    Hz), pretrained or calibrated (own k-means RVQ), or read the tone corpus's codes from its pitch (pitch), shard by
    shard in padded batches; write model/, shard-<k>/codes.npy and tokenizer.json. Without a step option, all steps
    run in turn.
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
    if args.checkpoint_only:
        _checkpoint_only(cfg, args.out)
    elif args.fit:
        tokenizer.fit(cfg, args.prepared, args.out, threads=threads)
    elif args.shard is not None:
        tokenizer.encode_shard(cfg, args.prepared, args.out, args.shard, threads=threads)
    elif args.merge:
        tokenizer.merge(cfg, args.prepared, args.out)
    else:
        tokenizer.run(cfg, args.prepared, args.out, threads=threads)


def _checkpoint_only(cfg, out: Path) -> None:
    """The pretrained checkpoint in place and checked, recorded in out/checkpoint.json (path, sha256)."""
    from acoustic_mlm.errors import UserError
    from acoustic_mlm.tokenizer.codec import fetch_checkpoint
    from acoustic_mlm.utils import file_sha256, write_json

    tc = cfg.tokenizer
    if tc.mode != "pretrained":
        raise UserError(
            f"tokenize --checkpoint-only: tokenizer.mode is {tc.mode}; only pretrained mode has a checkpoint"
        )
    path = fetch_checkpoint(tc.checkpoint)
    write_json(Path(out) / "checkpoint.json", {"path": str(path), "sha256": file_sha256(path)})
    log.info("tokenize: EnCodec checkpoint %s in place and checked", path)
