"""`python -m acoustic_mlm` and the `amlm` script: the CPU kernels are pinned (acoustic_mlm.kernels)
before the command line is parsed, since torch and numpy choose theirs when they load."""

import sys


def main() -> int:
    from acoustic_mlm.kernels import pin_for_command

    pin_for_command(sys.argv[1:])
    from acoustic_mlm.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
