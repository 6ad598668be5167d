"""`amlm dvc-yaml`: its options and entry (the generator: `acoustic_mlm.dvcgen`, imported when it runs)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.config.cli_options import command, opt
from acoustic_mlm.errors import UserError

# What DVC reads in a params or vars entry other than a path: `file:key,key` names keys of the file,
# `${...}` is interpolated. A configuration path holding either would be read as something else.
DVC_SYNTAX = {":": "DVC reads 'file:keys' there", "${": "DVC interpolates '${...}' there"}


def check_dvc_path(path: str, config) -> None:
    """The configuration's path as dvc.yaml names it (in each stage's params and in vars) holds no
    character DVC reads as its own syntax; else one line naming it, before dvc.yaml is replaced."""
    for mark, why in DVC_SYNTAX.items():
        if mark in path:
            raise UserError(
                f"{config}: its path in dvc.yaml ({path}) holds {mark!r}, which DVC cannot take in a params "
                f"file's name ({why}): rename or copy the file to a name without it"
            )


@command(
    "dvc-yaml",
    opt("--out", default=Path("dvc.yaml"), help="the file to write (default: dvc.yaml)"),
    opt("--check", action="store_true", help="write nothing; exit 2 unless --out is exactly what --config generates"),
    files=("out",),
)
def dvc_yaml_command(args, cfg) -> None:
    """write dvc.yaml for a configuration

    Write the DVC pipeline for --config: the stages of the Snakemake rules (with a sweep, one training stage per
    point and the stability map), each stage's params from the settings its steps depend on and its deps from the
    modules it imports (acoustic_mlm.dvcgen).
    """
    from acoustic_mlm import dvcgen

    check_dvc_path(dvcgen.config_path_for(args.config, args.out), args.config)  # before dvc.yaml is touched
    if args.check:
        dvcgen.check(cfg, args.config, args.out)
    else:
        print(f"{dvcgen.write(cfg, args.config, args.out)}: the DVC pipeline for {args.config}")
