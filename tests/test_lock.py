"""requirements/lock.txt (the CUDA route), requirements/lock-cpu.txt (the CPU route), pyproject.toml and
workflow/envs/amlm.yaml agree: every dependency is locked at one exact version that pyproject's specifier
allows, with hashes; the CPU lock is the same less the CUDA build; the jobs' conda env pins the same
versions, with CPU torch, and holds no engine."""

import re
import tomllib

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

CUDA_ONLY = re.compile(r"^(torch|torchaudio|triton|nvidia-[a-z0-9-]+)$")
ENGINES = {"snakemake", "dvc"}  # they run the jobs; nothing in a job imports them


def _blocks(path) -> dict[str, str]:
    """name -> its whole entry (the pin, its hashes and its `# via` lines)."""
    text = path.read_text()
    entries = re.split(r"(?m)^(?=[a-z0-9])", text)[1:]
    return {canonicalize_name(e.split("==")[0]): e for e in entries}


def _pins(path) -> dict[str, str]:
    return {name: re.match(r"[^=]+==([^\s\\]+)", block).group(1) for name, block in _blocks(path).items()}


def _project(root) -> list[Requirement]:
    return [Requirement(d) for d in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]]


def test_the_lock_pins_every_dependency_within_pyprojects_bounds_with_hashes(root):
    lock = root / "requirements" / "lock.txt"
    pins, blocks = _pins(lock), _blocks(lock)
    for req in _project(root):
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in the lock"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), f"{req} but the lock has {pins[name]}"
    assert pins["torch"] == "2.9.1" and pins["torchaudio"] == "2.9.1"  # PyPI's: the CUDA build
    assert any(CUDA_ONLY.match(n) and n.startswith("nvidia-") for n in pins)
    for name, block in blocks.items():
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
        assert hashes and len(hashes) == len(set(hashes)), name
    assert len(pins) == len(re.findall(r"(?m)^[a-z0-9][^\n]*==", lock.read_text()))  # one entry per name
    assert "/tmp" not in lock.read_text() and "file:" not in lock.read_text()  # nothing of the machine it ran on


def test_the_cpu_lock_is_the_lock_less_the_cuda_build(root):
    cuda, cpu = _blocks(root / "requirements" / "lock.txt"), _blocks(root / "requirements" / "lock-cpu.txt")
    assert cpu == {n: b for n, b in cuda.items() if not CUDA_ONLY.match(n)}
    assert "torch" not in cpu and not any(n.startswith("nvidia-") for n in cpu)
    assert "torch==2.9.1+cpu" in (root / "docs" / "install.md").read_text()


def test_the_job_env_pins_the_locks_versions_with_cpu_torch_and_no_engine(root):
    env = yaml.safe_load((root / "workflow" / "envs" / "amlm.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip[0] == "--extra-index-url https://download.pytorch.org/whl/cpu"
    pinned = dict(line.split("==") for line in pip[1:])
    lock = _pins(root / "requirements" / "lock.txt")
    project = {canonicalize_name(r.name): r for r in _project(root)}
    assert {canonicalize_name(n) for n in pinned} == set(project) - ENGINES
    for name, version in pinned.items():
        key = canonicalize_name(name)
        want = f"{lock[key]}+cpu" if key in ("torch", "torchaudio") else lock[key]
        assert version == want, f"{name}: the env has {version}, the lock {lock[key]}"
        assert project[key].specifier.contains(Version(version), prereleases=True), name
    assert "python=3.11" in env["dependencies"]
    # Snakemake copies env files before creating them: no relative local paths allowed.
    assert not any(p.startswith((".", "/", "-e")) for p in pip)
