"""No import cycles between the project's files (issue 39).

Every ``import`` counts, at module level or inside a function (a lazy import still ties two files), except
a module's import of its own parent package: Python loads the parent first anyway, and the registries'
packages (``federated.algorithms``, ``pretrain.methods``, ...) are built on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fpsfl", "fractals", "pretrain", "federated", "analysis")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _target(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``module`` imports, anywhere in its file, its parent packages left out."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            target = _target(module, path.name == "__init__.py", node)
            for alias in node.names if target else ():
                if f"{target}.{alias.name}" in known:
                    out.add(f"{target}.{alias.name}")
                elif target in known:
                    out.add(target)
    return {t for t in out if t != module and not module.startswith(t + ".")}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_lazy_import_counts_and_the_parent_package_does_not(tmp_path):
    pkg = tmp_path / "fpsfl_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .x import X\n")
    (pkg / "x.py").write_text("from . import helper\nX = 1\ndef f():\n    from .y import g\n")
    (pkg / "y.py").write_text("from .x import X\n")
    known = {module_name(p, tmp_path): p for p in sorted(pkg.rglob("*.py"))}
    graph = {m: imports_of(m, p, known) for m, p in known.items()}
    assert graph["fpsfl_probe.x"] == {"fpsfl_probe.y"}
    assert cycles(graph) == [["fpsfl_probe.x", "fpsfl_probe.y"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package):
    known = project_modules()
    graph = {m: imports_of(m, p, known) for m, p in known.items()}
    found = [c for c in cycles(graph) if any(m.split(".")[0] == package for m in c)]
    assert found == [], f"import cycles between files: {found}"


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in project_modules().values()
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, f"modules over 400 lines (STYLE.md): {long}"


def test_no_recipe_or_bench_script_over_400_lines():
    """The rule above, for the Python files outside the packages: recipes/ and bench/."""
    files = [p for folder in ("recipes", "bench") for p in sorted((ROOT / folder).rglob("*.py"))]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 400}
    assert files and long == {}, long
