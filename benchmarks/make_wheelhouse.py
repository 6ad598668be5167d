"""The wheelhouse that benchmarks/gpu_check.sh installs from on a GPU machine that has only PyTorch.

Which distributions: the package's runtime dependencies (pyproject.toml's `dependencies`) and everything
they require, at the versions installed in this environment, less what a PyTorch image brings or the
check does not use:

- torch and torchaudio: the image's own builds (torchaudio pins torch exactly, so only the image's pair
  loads);
- the compiled scientific stack, numpy, scipy, pandas and matplotlib: their wheels with what only they
  require take 86.4 MiB for CPython 3.11 (scipy 33.7, numpy 16.1, pandas 12.0, matplotlib with pillow,
  fonttools and the rest 24.5), over the 64 MiB a checkout may carry; gpu_check.sh's install step names
  any of them the image lacks and the steps that need it (`--include numpy` carries one anyway, within
  the size limit);
- dvc and tensorboard: `dvc repro` and the `tensorboard` logger are not part of the check.

What is reached only through those is not followed (pillow, fonttools, kiwisolver, contourpy come with
matplotlib).

They are written as `wheelhouse/requirements.txt` (name==version, one a line) and fetched into
`wheelhouse/` as wheels: `pip wheel --no-deps` for this interpreter (it builds the sdist-only ones,
encodec, into pure-Python wheels), or, with `--python-version`, `pip download --only-binary=:all:` for
another CPython on x86-64 Linux (sdist-only ones are still built here, and must come out pure Python).
The folder is refused above `--max-mib` (64 MiB by default). On the GPU machine:

    pip install --no-index --find-links wheelhouse --no-deps -r wheelhouse/requirements.txt

    python benchmarks/make_wheelhouse.py                        # for this Python (3.11 here)
    python benchmarks/make_wheelhouse.py --python-version 3.12  # for an image with Python 3.12
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
FROM_THE_IMAGE = ("torch", "torchaudio")  # a PyTorch image's own builds; never in the wheelhouse
SCIENTIFIC = ("numpy", "scipy", "pandas", "matplotlib")  # compiled, 80 MiB of wheels: expected in the image
NOT_IN_THE_CHECK = ("dvc", "tensorboard")  # dvc repro and the tensorboard logger: not run by the check
LINUX_X86_64 = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def roots(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The package's runtime dependencies that the wheelhouse carries (canonical names)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    skip = {canonicalize_name(n) for n in FROM_THE_IMAGE + NOT_IN_THE_CHECK}
    return [n for n in (canonicalize_name(Requirement(d).name) for d in deps) if n not in skip]


def closure(names: list[str], include: tuple[str, ...] = ()) -> dict[str, str]:
    """{distribution: installed version} for `names` and what they require (markers evaluated for this
    interpreter, no extras), not following torch, torchaudio or the scientific stack (less `include`)."""
    skip = {canonicalize_name(n) for n in FROM_THE_IMAGE + SCIENTIFIC} - {canonicalize_name(n) for n in include}
    found: dict[str, str] = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found or name in skip:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise SystemExit(f"make_wheelhouse: {name} is not installed here; install the package first") from None
        found[name] = dist.version
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return dict(sorted(found.items()))


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"], check=True)


def fetch(pins: dict[str, str], folder: Path, python_version: str | None) -> None:
    requirements = folder / "requirements.txt"
    if python_version is None:
        pip("wheel", "--no-deps", "-w", str(folder), "-r", str(requirements))
        return
    target = ["--python-version", python_version, "--implementation", "cp", "--only-binary=:all:"]
    target += [a for p in LINUX_X86_64 for a in ("--platform", p)]
    for name, version in pins.items():  # one by one: an sdist-only one is built here instead
        try:
            pip("download", "--no-deps", "-d", str(folder), *target, f"{name}=={version}")
        except subprocess.CalledProcessError:
            with tempfile.TemporaryDirectory() as tmp:
                pip("wheel", "--no-deps", "-w", tmp, f"{name}=={version}")
                (wheel,) = Path(tmp).glob("*.whl")
                if not wheel.name.endswith("-py3-none-any.whl"):
                    raise SystemExit(f"make_wheelhouse: {name} {version} has no wheel for {python_version}") from None
                wheel.replace(folder / wheel.name)


def size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.glob("*.whl")) / 2**20


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "wheelhouse", help="the folder (default: wheelhouse/)")
    p.add_argument("--python-version", help="another CPython's wheels, e.g. 3.12 (default: this interpreter's)")
    p.add_argument("--max-mib", type=float, default=64.0, help="refuse a wheelhouse larger than this")
    p.add_argument("--include", default="", help="comma-separated: carry these of " + ", ".join(SCIENTIFIC))
    p.add_argument("--list", action="store_true", help="print the pinned list and stop (nothing is fetched)")
    args = p.parse_args(argv)
    args.include = tuple(n for n in args.include.split(",") if n)
    unknown = [n for n in args.include if n not in SCIENTIFIC]
    if unknown:
        p.error(f"--include {','.join(unknown)}: only {', '.join(SCIENTIFIC)} are left to the image")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    pins = closure(roots(), args.include)
    lines = "".join(f"{n}=={v}\n" for n, v in pins.items())
    if args.list:
        print(lines, end="")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):  # a wheelhouse of other versions would be installed too
        old.unlink()
    tmp = args.out / f".requirements.txt.tmp-{os.getpid()}"
    tmp.write_text(lines)
    tmp.replace(args.out / "requirements.txt")
    fetch(pins, args.out, args.python_version)
    wheels = sorted(args.out.glob("*.whl"))
    mib = size_mib(args.out)
    print(f"make_wheelhouse: {len(wheels)} wheels for {len(pins)} distributions, {mib:.1f} MiB in {args.out}")
    if len(wheels) != len(pins):
        print(f"make_wheelhouse: {len(pins)} pinned but {len(wheels)} wheels in {args.out}", file=sys.stderr)
        return 1
    if mib > args.max_mib:
        print(f"make_wheelhouse: {mib:.1f} MiB is over --max-mib {args.max_mib:g}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
