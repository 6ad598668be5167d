"""benchmarks/README.md indexes the folder: every script is in it once, every script it names exists,
each has a command that runs it, and every document it names as quoting a script mentions it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
ROW = re.compile(r"^\| `([\w.-]+\.(?:py|sh))` \| (.+?) \| `(.+?)`.*? \| (.+) \|$")
DOC = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.(?:md|yaml))")


def _rows() -> list[tuple[str, str, str, str]]:
    lines = (BENCH / "README.md").read_text().splitlines()
    return [m.groups() for m in map(ROW.match, lines) if m]


def test_every_script_is_indexed_once_and_every_indexed_script_exists():
    named = [script for script, *_ in _rows()]
    scripts = sorted(p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh"))
    assert sorted(named) == scripts
    assert len(named) == len(set(named))


def test_each_row_has_a_question_and_a_command_that_runs_the_script():
    for script, question, command, _ in _rows():
        assert question.strip(), script
        stem = script.rsplit(".", 1)[0]
        runs_it = f"benchmarks/{script}" in command or f"gpu_check.sh --only {stem}" in command
        assert runs_it, f"{script}: {command}"


def test_every_document_named_as_quoting_a_script_mentions_it():
    for script, _, _, quoted in _rows():
        docs = DOC.findall(quoted)
        assert docs, f"{script}: no document named"
        for doc in docs:
            path = ROOT / doc
            assert path.is_file(), f"{script}: {doc} does not exist"
            assert script in path.read_text(), f"{script}: {doc} does not mention it"
