"""The client side of the layers: the artifact format loads no SQL and no HTTP, the SDK
and what runs inside jobs never load the store, and the CLI's modules import each
other without cycles (every import counts, also one inside a function)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import aicluster

SRC = Path(aicluster.__file__).parent


def imported_modules(path: Path, module: str) -> set[str]:
    """Every `aicluster.*` module the file imports, `from M import name` counting M.name
    when that is a module of its own."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("aicluster.") and _exists(m)}


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (SRC / rel).with_suffix(".py").is_file() or (SRC / rel / "__init__.py").is_file()


def import_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports."""
    root = SRC / Path(*package.split(".")[1:])
    graph = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        parts = ["aicluster", *rel.parts]
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[module] = {m for m in imported_modules(path, module) if m.startswith(package + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("package", ["aicluster.cli", "aicluster.client", "aicluster.artifacts"])
def test_no_import_cycles(package):
    graph = import_graph(package)
    assert graph, package
    assert find_cycle(graph) is None


def test_client_imports_no_cli_and_no_store():
    for path in sorted((SRC / "client").glob("*.py")):
        module = "aicluster.client" + ("" if path.stem == "__init__" else f".{path.stem}")
        found = imported_modules(path, module)
        layers = {m.split(".")[1] for m in found}
        assert not layers & {"cli", "store"}, path


def _loaded(module: str, names: tuple[str, ...]) -> list[str]:
    """Those of `names` (packages, with their submodules) that importing `module` loads."""
    code = (
        f"import sys, {module}; names = {names!r}; print(sorted(m for m in sys.modules "
        "if any(m == n or m.startswith(n + '.') for n in names)))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return ast.literal_eval(run.stdout.strip())


def test_artifact_format_loads_no_sql_and_no_http():
    assert _loaded("aicluster.artifacts", ("sqlalchemy", "httpx", "aicluster.store")) == []


@pytest.mark.parametrize(
    "module",
    [
        "aicluster.client",
        "aicluster.client.artifacts",
        "aicluster.cli.main",
        # what a job's `checkpoint.save()` / `latest()` load
        "aicluster.runtime.checkpoint, aicluster.runtime.cache, aicluster.runtime.worker",
    ],
)
def test_client_side_never_loads_the_store(module):
    assert _loaded(module, ("sqlalchemy", "aicluster.store")) == []
