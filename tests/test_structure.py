"""The package's structure: modules import one way (no cycles, lazy imports included)."""

import ast
from pathlib import Path


def _direct_imports(pkg: Path, name: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse((pkg / f"{name}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith("acoustic_mlm")):
            mod = (node.module or "").removeprefix("acoustic_mlm").lstrip(".")
            found |= {mod.split(".")[0]} if mod else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("acoustic_mlm.")}
    return {f for f in found if (pkg / f"{f}.py").is_file() and f != name}


def test_no_module_imports_one_that_imports_it_back(root):
    pkg = root / "src" / "acoustic_mlm"
    modules = [p.stem for p in pkg.glob("*.py")]
    graph = {m: _direct_imports(pkg, m) for m in modules}

    def reaches(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph[m]
        return seen

    cycles = sorted(m for m in modules if m in reaches(m))
    assert not cycles, f"modules on an import cycle: {cycles}"
