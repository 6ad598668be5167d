"""The package's structure: subpackages by stage in layers, imports that run one way (no cycles,
lazy imports included), one import style. docs/architecture.md draws the same layers."""

import ast

from acoustic_mlm.dvcgen import direct_imports

# Lowest first. A module may import from its own layer or a lower one, never a higher one; within a
# layer, the subpackages of a row do not import each other (preflight and report stand side by side).
LAYERS = (
    ("errors", "utils", "folder_lock", "devices", "encodec", "kernels", "declare"),
    ("model", "artifacts", "curves"),
    ("config",),
    ("data",),
    ("tokenizer",),
    ("train",),
    ("preflight", "report"),
    ("experiments",),
    ("dvcgen",),
    ("dvcgen_commands",),
    ("cli",),
    ("__main__",),
)
LAYER = {top: i for i, row in enumerate(LAYERS) for top in row}
FOUNDATION = 2  # layers below this one may import within their row (utils -> errors)


def _modules(pkg) -> list[str]:
    names = []
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg).with_suffix("").as_posix().removesuffix("__init__").rstrip("/")
        names.append(rel.replace("/", "."))
    return sorted(n for n in names if n)


def test_every_module_sits_in_a_layer(root):
    pkg = root / "src" / "acoustic_mlm"
    unplaced = sorted({m.split(".")[0] for m in _modules(pkg)} - set(LAYER))
    assert not unplaced, f"top-level modules or subpackages in no layer of LAYERS: {unplaced}"


def test_no_module_imports_from_a_higher_layer(root):
    pkg = root / "src" / "acoustic_mlm"
    wrong = []
    for mod in _modules(pkg):
        top = mod.split(".")[0]
        for dep in direct_imports(mod, pkg):
            dep_top = dep.split(".")[0]
            if LAYER[dep_top] > LAYER[top]:
                wrong.append(f"{mod} -> {dep} (layer {LAYER[top]} imports layer {LAYER[dep_top]})")
            elif dep_top != top and FOUNDATION <= LAYER[dep_top] == LAYER[top]:
                wrong.append(f"{mod} -> {dep} (side by side in one layer)")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_module_imports_one_that_imports_it_back(root):
    pkg = root / "src" / "acoustic_mlm"
    graph = {m: direct_imports(m, pkg) for m in _modules(pkg)}

    def reaches(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph[m]
        return seen

    cycles = sorted(m for m in _modules(pkg) if m in reaches(m))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_one_import_style(root):
    """Every import of the package's own modules is absolute (acoustic_mlm.x.y), so a module reads
    the same wherever it sits and a move is one search."""
    relative = []
    for path in sorted((root / "src" / "acoustic_mlm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                relative.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not relative, f"relative imports: {relative}"


def test_every_module_has_its_test_file_where_the_package_puts_it(root):
    """A newcomer finds the test of src/acoustic_mlm/<sub>/<module>.py at tests/<sub>/test_<module>.py
    (a top-level module's at tests/test_<module>.py); docs/testing.md says so."""
    pkg, tests = root / "src" / "acoustic_mlm", root / "tests"
    missing = []
    for path in sorted(pkg.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        rel = path.relative_to(pkg)
        expected = tests / rel.parent / f"test_{rel.name}"
        if not expected.is_file():
            missing.append(str(expected.relative_to(root)))
    assert not missing, f"modules without their test file: {missing}"
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), "two test files share a name (pytest's default import mode needs unique ones)"
