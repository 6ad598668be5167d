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
    """The --config value of a command line (`--config F` or `--config=F`), else the default."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return DEFAULT_CONFIG


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


def pin(env: dict | None = None) -> list[str]:
    """Set AVX2_ENV in `env` (default os.environ); returns what it could not promise, as sentences."""
    env = os.environ if env is None else env
    problems = []
    if not cpu_has_avx2():
        problems.append(
            f"cpu_kernels: avx2 asked, but this CPU ({platform.machine()}) has no AVX2: "
            "its native kernels run, and its numbers will differ from an AVX2 machine's"
        )
        return problems
    loaded = [m for m in ("torch", "numpy") if m in sys.modules]
    if loaded:
        problems.append(
            f"cpu_kernels: avx2 asked after {' and '.join(loaded)} loaded in this process: "
            "its kernels are already chosen (run the stage as `amlm ...` or `python -m acoustic_mlm ...`)"
        )
    env.update(AVX2_ENV)
    return problems


def pin_for_command(argv: list[str]) -> None:
    """Before anything numerical loads: pin the kernels when the command's configuration asks for it."""
    if requested_mode(config_argument(argv)) == PINNED:
        for problem in pin():
            print(f"amlm: warning: {problem}", file=sys.stderr)


def report() -> dict:
    """The kernels this process runs with (after torch loaded): what a run's summary records."""
    import torch

    out = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    out.update({k: os.environ.get(k) for k in AVX2_ENV})
    out["pinned"] = out["torch_cpu_capability"] == "AVX2" and all(os.environ.get(k) == v for k, v in AVX2_ENV.items())
    return out
