"""`amlm validate`: check a configuration file (the command line has read and validated it already)."""

from __future__ import annotations

from acoustic_mlm.config.cli_options import command, opt
from acoustic_mlm.utils import atomic_path


@command("validate", opt("--out", help="marker file to write when the config is valid"), files=("out",))
def validate_command(args, cfg) -> None:
    """check a configuration file

    Validate --config against the schema and rules; exit 0 if valid. With --out, also write a marker file (the same
    bytes for every valid config): DVC's first stage, so that an invalid config stops `dvc repro` before any stage
    deletes its outputs.
    """
    print(f"{args.config}: valid ({len(cfg.runs)} runs: {', '.join(cfg.runs)})")
    if args.out is not None:
        with atomic_path(args.out) as tmp:  # constant content: a valid change reruns nothing downstream
            tmp.write_text("the configuration is valid\n")
