"""Every repository path named in a comment or a doc exists: a preset's or a profile's comments, the
Snakemake files' comments, the docs, and the comments and docstrings of the package, the benchmarks
and the tests. A move that leaves a pointer behind (the launcher named at the package's root after it
moved into `train/`) fails here, naming the file and line.

What counts as a path: a token that starts with a top-level folder of the repository (`src/`,
`config/`, `docs/`, `tests/`, `benchmarks/`, `workflow/`, `profiles/`, `data/reference/`, `.ci/`),
and a markdown link to a relative file. Such a token may also name a module by its place in the
package (`config/load.py` is `src/acoustic_mlm/config/load.py`) or a name in a module
(`tests/helpers.copy_repo`). Not checked: files a text has its reader write (WRITTEN), what the pipeline
writes (`results/`, `data/raw/`, ...: it names no such prefix) and patterns or placeholders
(a token followed by `<`, `{`, `*` or `...`).
"""

import io
import re
import tokenize
from pathlib import Path

import pytest

PREFIXES = ("src", "config", "docs", "tests", "benchmarks", "workflow", "profiles", "data/reference", ".ci")
# A path token: one of the prefixes, then path characters. Not preceded by a path character, so
# `../shared/audio/src/x` or `acoustic_mlm.config/...` are not read as repository paths.
PATH = re.compile(r"(?<![\w./~$-])((?:" + "|".join(re.escape(p) for p in PREFIXES) + r")/[\w./+-]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PLACEHOLDER = ("<", "{", "*", "...", "[", "$")

# Files that a doc or a test writes itself before naming them, not files of the repository.
WRITTEN = {
    "config/x.yaml": "docs/refusals.md: the file name in an example error message",
    "config/smoke-fp16.yaml": "BENCHMARKS.md: config/smoke.yaml with one change, written in a copy",
    "config/smoke-recipe.yaml": "BENCHMARKS.md: config/smoke.yaml with the recipe switches, written in a copy",
    "config/sweep.yaml": "tests/pipeline/test_workflow.py: a sweep written under tmp_path",
}

# Broken paths in files another edit holds open, to fix there; tolerated here until then.
PENDING = {
    "BENCHMARKS.md: benchmarks/gpu_mfu.sh": "the script is benchmarks/gpu_mfu.py (bash benchmarks/gpu_check.sh --only "
    "gpu_mfu)",
}

DOCS = ("README.md", "BENCHMARKS.md", "docs/*.md", "data/reference/README.md", "data/README.md", "results/README.md")


def _comment_of_line(line: str) -> str:
    """The comment of one YAML (or Snakemake shell-free) line: from a `#` at the start or after a space."""
    m = re.search(r"(?:^|\s)#(.*)$", line)
    return m.group(1) if m else ""


def _hash_comments(text: str) -> list[tuple[int, str]]:
    return [(n, c) for n, line in enumerate(text.splitlines(), 1) if (c := _comment_of_line(line))]


def _python_comments_and_docstrings(text: str) -> list[tuple[int, str]]:
    """Comments and string tokens that stand alone as a statement (docstrings), with their first line."""
    out = []
    previous = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and previous in (
            tokenize.NEWLINE,
            tokenize.NL,
            tokenize.INDENT,
            tokenize.DEDENT,
        ):
            out.append((tok.start[0], tok.string))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    return out


def _sources(root: Path) -> list[tuple[Path, list[tuple[int, str]]]]:
    """(file, [(line, text to search)]) for every file whose comments or text name paths."""
    sources = []
    for pattern in (
        "config/*.yaml",
        "profiles/**/*.yaml",
        "Snakefile",
        "workflow/Snakefile",
        "workflow/rules/*.smk",
        "workflow/envs/*.yaml",
    ):
        for path in sorted(root.glob(pattern)):
            sources.append((path, _hash_comments(path.read_text())))
    for pattern in DOCS:
        for path in sorted(root.glob(pattern)):
            sources.append((path, list(enumerate(path.read_text().splitlines(), 1))))
    for folder in ("src", "benchmarks", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            sources.append((path, _python_comments_and_docstrings(path.read_text())))
    for path in sorted((root / "benchmarks").glob("*.sh")) + [root / ".ci" / "run"]:
        sources.append((path, _hash_comments(path.read_text())))
    return sources


def _exists(root: Path, token: str) -> bool:
    token = token.rstrip(".,:;")
    if token in WRITTEN:
        return True
    bases = (root, root / "src" / "acoustic_mlm")
    if any((base / token).exists() for base in bases):
        return True
    # A name in a module: tests/helpers.copy_repo is copy_repo, defined in tests/helpers.py.
    folder, _, name = token.rpartition("/")
    stem, _, attr = name.partition(".")
    defined = re.compile(rf"^(?:def|class) {re.escape(attr)}\b|^{re.escape(attr)}\s*[:=]", re.M)
    modules = [base / folder / f"{stem}.py" for base in bases]
    return bool(attr) and any(m.is_file() and defined.search(m.read_text()) for m in modules)


def _broken(root: Path, path: Path, lines: list[tuple[int, str]]) -> list[str]:
    broken = []
    for first, text in lines:
        for offset, line in enumerate(text.splitlines() or [""]):
            where = f"{path.relative_to(root)}:{first + offset}"
            for m in PATH.finditer(line):
                token, after = m.group(1), line[m.end() :]
                if after.startswith(PLACEHOLDER) or not _exists(root, token):
                    if not after.startswith(PLACEHOLDER):
                        broken.append(f"{where}: {token}")
            if path.suffix == ".md":
                for target in LINK.findall(line):
                    if target.startswith(("http://", "https://", "mailto:", "#")):
                        continue
                    file = target.partition("#")[0]
                    if any(c in file for c in "<{*") or (path.parent / file).exists():
                        continue
                    broken.append(f"{where}: link to {target}")
    return broken


def test_the_scan_reads_comments_docs_and_docstrings(root):
    """The sources the other test reads: every preset, both profiles, the Snakefile and its rules,
    the docs, every module of the package; and it finds a known path and refuses a moved one."""
    scanned = {p.relative_to(root).as_posix() for p, _ in _sources(root)}
    for name in (
        "config/config.yaml",
        "profiles/slurm/config.yaml",
        "Snakefile",
        "README.md",
        "docs/architecture.md",
        "src/acoustic_mlm/cli.py",
        "data/reference/README.md",
    ):
        assert name in scanned
    moved = [(1, "# checked against src/acoustic_mlm/config.schema.json before any work starts")]
    assert _broken(root, root / "config" / "x.yaml", moved) == ["config/x.yaml:1: src/acoustic_mlm/config.schema.json"]
    fine = [(3, '"""See src/acoustic_mlm/config/config.schema.json, config/load.py and results/x.csv."""')]
    assert _broken(root, root / "src" / "x.py", fine) == []
    assert _broken(root, root / "src" / "x.py", [(1, "# data/reference/<name>/metrics.csv")]) == []


@pytest.mark.parametrize("kind", ["presets and profiles", "Snakemake", "docs", "python"])
def test_every_path_named_in_a_comment_or_doc_exists(root, kind):
    def kind_of(path: Path) -> str:
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".md":
            return "docs"
        if path.suffix == ".py":
            return "python"
        if rel == "Snakefile" or rel.startswith("workflow/"):
            return "Snakemake"
        return "presets and profiles"

    broken = [b for path, lines in _sources(root) if kind_of(path) == kind for b in _broken(root, path, lines)]
    broken = [b for b in broken if re.sub(r":\d+:", ":", b, count=1) not in PENDING]
    assert not broken, "paths that do not exist in the repository:\n" + "\n".join(broken)
