"""`amlm dvc-yaml`: its options and entry (the generator: `acoustic_mlm.dvcgen`, imported when it runs)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.cli_options import command, opt


@command(
    "dvc-yaml",
    opt("--out", default=Path("dvc.yaml"), help="the file to write (default: dvc.yaml)"),
    opt(
        "--check",
        action="store_true",
        help="write nothing; exit 2 unless --out is exactly the file generated for --config",
    ),
    files=("out",),
)
def dvc_yaml_command(args, cfg) -> None:
    """write dvc.yaml for a configuration

    Write the DVC pipeline for --config: the stages of the Snakemake rules (with a sweep, one training stage per
    point and the stability map), each stage's params from the settings its steps depend on and its deps from the
    modules it imports (acoustic_mlm.dvcgen).
    """
    from acoustic_mlm import dvcgen

    if args.check:
        dvcgen.check(cfg, args.config, args.out)
    else:
        print(f"{dvcgen.write(cfg, args.config, args.out)}: the DVC pipeline for {args.config}")
