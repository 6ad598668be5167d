"""Which CPU kernels a stage's numbers come from: `cpu_kernels: avx2` pins them, `native` does not.

torch, MKL, oneDNN and numpy each pick their vector kernels at run time from the CPU they find
(AVX2, AVX-512, ...). Different kernels sum in different orders, so the same stage on two CPUs
writes different bits: other tokenizer codes, then curves that part after a burst. Measured on the
default preset (docs/reproducibility.md): an AMD EPYC with AVX2 only and one with AVX-512 tokenized
to different codes; with the variables below set, an AMD EPYC with AVX-512 and this package's Intel
Xeon (AVX-512) both wrote the AVX2-only machine's synthetic audio, prepared audio and codes byte
for byte, and trained its `prenorm_clip1` curve to the same bits.

The variables are read once, when each library loads, so they must be in the process's
environment before torch or numpy is imported: `pin_for_command` runs first in `python -m
acoustic_mlm` and the `amlm` script (acoustic_mlm.__main__), before the command line is parsed, and
reads `cpu_kernels` from the configuration the command names. A process that imported torch
earlier (a test calling `cli.main` in-process) keeps the kernels it has; `report()` says which
ones a stage really used, and training writes that into every run's summary.

Standard library only: it runs before anything else is imported.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

MODES = ("avx2", "native")
PINNED = "avx2"
DEFAULT_CONFIG = "config/config.yaml"  # the config a command reads when it names none (as the CLI)
MAX_CONFIG_BYTES = 1 << 20  # larger files are the command's to refuse (config.load has its own limit)

# Each library's own switch, read when it loads. Not needed between Intel and AMD (measured):
# MKL_CBWR, MKL's conditional numerical reproducibility: MKL_ENABLE_INSTRUCTIONS=AVX2 already made
# both vendors' CPUs produce the same bits.
AVX2_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own kernels (ATen's DispatchStub: default, avx2, avx512)
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL's BLAS (torch's float32 matrix products on x86)
    "DNNL_MAX_CPU_ISA": "AVX2",  # oneDNN (torch's convolutions), older name
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN, newer name
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",  # numpy >= 2.4's AVX-512 dispatch groups
    "OPENBLAS_CORETYPE": "Haswell",  # the OpenBLAS inside numpy's and scipy's wheels: its AVX2 kernels
}


def cpu_has_avx2() -> bool:
    """True on an x86-64 CPU whose flags list avx2 (Linux /proc/cpuinfo; elsewhere: assumed by arch)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return "avx2" in line.split()
    except OSError:
        pass
    return True


def config_argument(argv: list[str]) -> str:
    """The --config value of a command line as argparse reads it: `--config F` or `--config=F` (the
    parsers take no abbreviations: allow_abbrev is off); repeated, the last wins; after `--`, nothing
    is an option. Without one, the default. The command line checks afterwards that argparse read the
    same file (`check_config_read`)."""
    found = DEFAULT_CONFIG
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        if name == "--config":
            if eq:
                found = value
            elif i + 1 < len(argv):
                found = argv[i + 1]
                i += 1
        i += 1
    return found


def requested_mode(config_path: str) -> str | None:
    """`cpu_kernels` of a configuration file, or None when it cannot be read here (the command
    itself then refuses the file with its own one-line error)."""
    try:
        # only a regular file of a sane size: opening a FIFO would block before the command could refuse it
        if not os.path.isfile(config_path) or os.path.getsize(config_path) > MAX_CONFIG_BYTES:
            return None
        import yaml  # pure Python here: loads no numerical library

        with open(config_path, encoding="utf-8") as f:
            document = yaml.safe_load(f)  # the raw file: read before torch and numpy load, so not config.load
    except Exception:  # noqa: BLE001 -- any unreadable file is the command's to report, not ours
        return None
    mode = document.get("cpu_kernels") if isinstance(document, dict) else None
    return mode if mode in MODES else None


# Variables a user may export that the pin does not set. NPY_ENABLE_CPU_FEATURES cannot stand beside
# the pin's NPY_DISABLE_CPU_FEATURES (numpy refuses to import with both): the pin refuses it. The others
# change which kernels, or which arithmetic, MKL uses (MKL_CBWR: measured to change the bits at
# COMPATIBLE, docs/reproducibility.md): a run with one set is recorded as not pinned, and says so.
CONFLICTING_ENV = ("NPY_ENABLE_CPU_FEATURES",)
UNPINNING_ENV = ("MKL_CBWR", "MKL_DEBUG_CPU_TYPE")
NPY = "NPY_DISABLE_CPU_FEATURES"


class PinError(Exception):
    """The pin cannot be applied in this environment: one line for the user, exit status 2."""


def pin(env: dict | None = None) -> list[str]:
    """Set AVX2_ENV in `env` (default os.environ); returns what it could not promise, as sentences.
    A variable the user exported that numpy cannot combine with the pin is a PinError."""
    env = os.environ if env is None else env
    problems = []
    if not cpu_has_avx2():
        problems.append(
            f"cpu_kernels: avx2 asked, but this CPU ({platform.machine()}) has no AVX2: "
            "its native kernels run, and its numbers will differ from an AVX2 machine's"
        )
        return problems
    for name in CONFLICTING_ENV:
        if env.get(name):
            raise PinError(
                f"{name} is set ({env[name]!r}): cpu_kernels: avx2 sets {NPY}, and numpy cannot load with "
                f"both; unset {name}, or set cpu_kernels: native in the configuration"
            )
    loaded = [m for m in ("torch", "numpy") if m in sys.modules]
    if loaded:
        problems.append(
            f"cpu_kernels: avx2 asked after {' and '.join(loaded)} loaded in this process: "
            "its kernels are already chosen (run the stage as `amlm ...` or `python -m acoustic_mlm ...`)"
        )
    wanted = dict(AVX2_ENV)
    own = env.get(NPY, "").split()
    if own:  # the user's own exclusions stay; beyond the pin's, the run is not pinned
        wanted[NPY] = " ".join(dict.fromkeys(AVX2_ENV[NPY].split() + own))
    for name in (*UNPINNING_ENV, *([NPY] if wanted[NPY] != AVX2_ENV[NPY] else [])):
        if env.get(name):
            problems.append(
                f"{name}={env[name]!r} is set: it changes the kernels or the arithmetic the pin fixes, so "
                "this run is recorded as not pinned (cpu_kernels.pinned: false); unset it to pin"
            )
    env.update(wanted)
    return problems


READ_CONFIG: str | None = None  # the configuration pin_for_command read in this process (None: it did not run)


def pin_for_command(argv: list[str]) -> None:
    """Before anything numerical loads: pin the kernels when the command's configuration asks for it.
    A refusal (PinError) is one line and exit status 2, as every refusal of the command line."""
    global READ_CONFIG
    READ_CONFIG = config_argument(argv)
    if requested_mode(READ_CONFIG) != PINNED:
        return
    try:
        problems = pin()
    except PinError as exc:
        command = next((a for a in argv if not a.startswith("-")), "")
        print(f"amlm{' ' + command if command else ''}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for problem in problems:
        print(f"amlm: warning: {problem}", file=sys.stderr)


def check_config_read(parsed: str | None) -> str | None:
    """A sentence when argparse's --config differs from the one the pin read before torch loaded (a
    form of the option the pin reads otherwise): the kernels would belong to another file. None if they agree."""
    if READ_CONFIG is None or parsed is None or os.path.normpath(str(parsed)) == os.path.normpath(READ_CONFIG):
        return None
    return (
        f"--config: the command line names {parsed}, but the CPU kernels were chosen for {READ_CONFIG} "
        "before it was parsed; write --config once, in full (--config FILE)"
    )


def report() -> dict:
    """The kernels this process runs with (after torch loaded): what a run's summary records."""
    import torch

    out = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    out.update({k: os.environ.get(k) for k in AVX2_ENV})
    unpinning = {k: os.environ[k] for k in UNPINNING_ENV if os.environ.get(k)}
    out.update(unpinning)  # recorded only when set: a summary without them had none
    out["pinned"] = (
        out["torch_cpu_capability"] == "AVX2"
        and all(os.environ.get(k) == v for k, v in AVX2_ENV.items())
        and not unpinning
    )
    return out
