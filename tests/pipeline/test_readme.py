"""The README is the front door: short, every link resolves, every command in it works.

Each command of the README's bash blocks runs here in a dry-run form that needs no network and
no hours: `snakemake ...` as `snakemake -n ...`, `dvc repro` as `dvc status`, `amlm <stage> ...`
as `amlm <stage> --help`, `pytest` as `pytest --collect-only`, `python benchmarks/<script>` as
`<script> --help`; `pip install` is what CI does before the tests, `cp` runs as written. `--use-conda`
needs conda's channels, which an offline machine lacks: its dry run drops the flag
(tests/pipeline/test_workflow.py checks every rule's env file).
"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import copy_repo, tool_env

MAX_LINES = 200


@pytest.fixture(scope="module")
def readme(root) -> str:
    return (root / "README.md").read_text()


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(markdown: str) -> set[str]:
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", markdown, re.M)}


def test_readme_is_short_with_the_quick_start_first(readme):
    lines = readme.splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; detail belongs in docs/"
    headings = re.findall(r"^## (.+)$", readme, re.M)
    assert headings[0] == "Quick start"
    block = re.search(r"## Quick start\n\n```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip()]
    assert len(commands) == 2 and "snakemake --cores all" in commands[0] and "pytest" in commands[1]
    for word in ("session", "helper", "was lent", "no GPU was"):
        assert word not in readme.lower(), f"README speaks of how the work was organised: {word!r}"


def test_every_link_resolves(root, readme):
    others = [*(root / "docs").glob("*.md"), *(root / "data" / "reference").rglob("README.md")]
    others.append(root / "benchmarks" / "README.md")
    pages = {"README.md": readme} | {str(p.relative_to(root)): p.read_text() for p in others}
    for page, text in pages.items():
        base = (root / page).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (base / path).resolve() if path else (root / page).resolve()
            assert dest.exists(), f"{page}: link to {target} does not resolve"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(dest.read_text()), f"{page}: no heading for #{anchor} in {path or page}"


def test_the_project_tree_names_every_subpackage_and_module_and_nothing_else(root, readme):
    tree = re.search(r"## Project tree\n\n```\n(.*?)```", readme, re.S).group(1)
    folder, listed = "", set()
    for line in tree.splitlines():
        entry = line.split("#")[0].strip()
        if not entry:
            continue
        names = [n.strip() for n in entry.split(",")]
        if line.startswith("  "):
            paths = [f"{folder}{n}" for n in names]
        else:
            paths = [n.rstrip("/") for n in names]
            folder = entry if entry.endswith("/") else folder
        for p in paths:
            assert (root / p).exists(), f"the README's project tree names {p}, which does not exist"
            listed.add(p.rstrip("/"))
    pkg = root / "src" / "acoustic_mlm"
    rooms = {
        f"src/acoustic_mlm/{p.name}"
        for p in pkg.iterdir()
        if p.is_dir() and (p / "__init__.py").is_file() or p.suffix == ".py" and not p.name.startswith("__")
    }
    assert rooms <= listed, f"the README's project tree misses {sorted(rooms - listed)}"


def _dry_run(command: str) -> list[str] | None:
    """The offline dry-run form of one README command (None: nothing to run)."""
    argv = shlex.split(command.split("#")[0])
    if not argv or argv[:2] == ["pip", "install"]:
        return None
    if argv[0] == "snakemake":
        return [sys.executable, "-m", "snakemake", "-n"] + [a for a in argv[1:] if a != "--use-conda"]
    if argv[:2] == ["dvc", "repro"]:
        return [sys.executable, "-m", "dvc", "status"] + argv[2:]
    if argv[0] == "amlm":
        return [str(Path(sys.executable).parent / "amlm"), argv[1], "--help"]
    if argv[0] == "pytest":
        return [sys.executable, "-m", "pytest", "--collect-only", "-q"] + argv[1:]
    if argv[0] in ("cp", "git"):
        return argv
    if argv[0] == "python" and argv[1].startswith("benchmarks/"):  # the script and its options parse
        return [sys.executable, argv[1], "--help"]
    raise AssertionError(
        f"README command without a dry-run form: {command!r}: add one to tests/pipeline/test_readme.py"
    )


def test_every_readme_command_runs_in_a_dry_run(root, readme, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    env = tool_env(pythonpath=None, git=True)
    for args in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):  # DVC needs a repo
        subprocess.run(args, cwd=repo, env=env, check=True, capture_output=True)
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    ran = 0
    for line in (line for block in blocks for line in block.splitlines() if line.strip()):
        for part in line.split("#")[0].split("&&"):
            argv = _dry_run(part.strip())
            if argv is None:
                continue
            proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
            assert proc.returncode in (0, 5 if "pytest" in argv else 0), (
                f"{part.strip()!r} as {' '.join(argv)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            )
            ran += 1
    assert ran >= 8
