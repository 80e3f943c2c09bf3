"""The package's layering (docs/architecture.md): every import, function-level ones included,
runs down the layers, no two modules import each other round a circle, and no module
outgrows one job."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "kjit"

# Lowest first. A module belongs to the last (most specific) layer whose name prefixes it,
# so "hip" (the library loader and comgr binding the compiler uses) sits low while
# "hip.runtime" (the runtime twin of kjit.runtime) sits high.
LAYERS = ["errors", "hashing", "locations", "fileio", "driver", "arch", "formats", "objectcode", "jit_options",
          "cache", "hip", "compiler", "linker", "runtime", "hip.runtime", "build", "decorator",
          "tune", "cli"]

# Upward imports kept on purpose (docs/architecture.md says why): kjit.load is one public
# function for both vendors, so the CUDA loader hands AMD code to its HIP twin.
ALLOWED_UPWARD = {("kjit.runtime.module", "kjit.hip.runtime")}
MAX_LINES = 450


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every kjit module `path` imports, at any depth of the file (lazy imports count)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "kjit"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "kjit":
                continue
            for alias in node.names:  # `from . import x` imports the submodule x
                sub = f"{mod}.{alias.name}"
                found.add(sub if (ROOT.parent / sub.replace(".", "/")).with_suffix(".py").exists()
                          or (ROOT.parent / sub.replace(".", "/")).is_dir() else mod)
    return found - {name}


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in ROOT.rglob("*.py")}


def _layer(module: str) -> int:
    best = -1
    for i, layer in enumerate(LAYERS):
        full = f"kjit.{layer}"
        if module == full or module.startswith(full + "."):
            best = i
    return best


def test_every_module_is_in_a_layer():
    # kjit/__init__ (the public names), __main__ and _version stand outside the layers.
    outside = {"kjit", "kjit.__main__", "kjit._version"}
    assert sorted(m for m in _graph() if _layer(m) < 0 and m not in outside) == []


def test_imports_run_down_the_layers():
    upward = sorted(
        f"{m} imports {t} ({LAYERS[_layer(t)]} is above {LAYERS[_layer(m)]})"
        for m, deps in _graph().items() for t in deps
        if _layer(m) >= 0 and _layer(t) > _layer(m) and (m, t) not in ALLOWED_UPWARD)
    assert upward == []


def test_no_import_circles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_over_450_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


# The C extension's files, lowest first: each may use what a lower one defines, never what a
# higher one does, and includes only its own header (a header states its file's interface).
C_LAYERS = ["runtime/_tables.c", "runtime/_foreign.c", "runtime/_launch.c"]


def test_the_c_files_call_down_only():
    import re
    defined = {}
    for c in C_LAYERS:
        text = (ROOT / c).read_text()
        defined[c] = set(re.findall(r"^\w[\w\s\*]*?\b(kjit_\w+)\s*\(", text, re.M))
    for i, c in enumerate(C_LAYERS):
        text = (ROOT / c).read_text()
        used = set(re.findall(r"\b(kjit_\w+)\s*\(", text))
        for higher in C_LAYERS[i + 1:]:
            assert not used & defined[higher], f"{c} calls {sorted(used & defined[higher])} of {higher}"
        own = Path(c).with_suffix(".h").name
        includes = set(re.findall(r'#include "([^"]+)"', text))
        allowed = {Path(lower).with_suffix(".h").name for lower in C_LAYERS[:i]} | {own}
        assert includes <= allowed, f"{c} includes {sorted(includes - allowed)}"
