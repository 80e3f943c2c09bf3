"""The package's layering (docs/architecture.md): every import, function-level ones included,
runs down the layers, no two modules import each other round a circle, and no module
outgrows one job."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kjit

ROOT = Path(kjit.__file__).resolve().parent   # the package under test: checkout or installed wheel

# Lowest first. A module belongs to the last (most specific) layer whose name prefixes it,
# so "hip" (the library loader and comgr binding the compiler uses) sits low while
# "hip.runtime" (the runtime twin of kjit.runtime) sits high.
LAYERS = ["lazy", "errors", "hashing", "progress", "settings", "locations", "families", "fileio", "driver", "arch", "formats", "objectcode", "jit_options",
          "cache", "hip", "compiler", "linker", "runtime", "hip.runtime", "build", "decorator",
          "tune", "cli"]

# Upward imports kept on purpose (docs/architecture.md says why): kjit.load is one public
# function for both vendors, so the CUDA loader hands AMD code to its HIP twin.
ALLOWED_UPWARD = {("kjit.runtime.module", "kjit.hip.runtime")}
# Modules are split by concept, not by line count: one concept may take 700 lines in one
# file where that reads better than three files; past that it is more than one concept.
MAX_LINES = 700


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


@pytest.mark.parametrize("path", sorted([*ROOT.rglob("*.py"), *ROOT.rglob("*.c"), *ROOT.rglob("*.h")]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outgrows_one_concept(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, (f"{path.name} has {lines} lines: more than one concept? split it "
                                f"where its concepts part, not at a line count")


# The C extension's files, lowest first: each may use what a lower one defines, never what a
# higher one does, and includes only its own header (a header states its file's interface).
# _pyint.h and _path.h are code of their own, in the header alone (inline int readers, and the
# marks of what is off a launch's path, that every file may use).
C_LAYERS = ["runtime/_pyint.h", "runtime/_path.h", "runtime/_gil.c", "runtime/_tables.c", "runtime/_foreign.c", "runtime/_libcuda.c", "runtime/_args.c", "runtime/_launch.c", "runtime/_xla.c"]


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


# --- KJIT_* variables: read through kjit.settings only --------------------------------------
SETTINGS = ROOT / "settings.py"


def _kjit_names() -> set[str]:
    """Names bound anywhere in kjit to a KJIT_* string, or to a collection holding one
    (ENV_ARCH = "KJIT_ARCH", ENV_VARS = (ENV_URL, ...)), as the reads refer to them."""
    names: set[str] = set()
    trees = [ast.parse(p.read_text()) for p in ROOT.rglob("*.py")]
    for _ in range(3):   # a collection of names bound to names
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if _names_kjit(node.value, names, {}):
                        for t in targets:
                            names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
                        names |= {n.attr for t in targets for n in ast.walk(t) if isinstance(n, ast.Attribute)}
                elif isinstance(node, ast.ImportFrom):   # from ..locations import ENV_CACHE_DIR as ENV_DIR
                    names |= {a.asname for a in node.names if a.asname and a.name in names}
    return names


def _names_kjit(node: ast.AST, names: set[str], loops: dict[str, ast.AST]) -> bool:
    """Whether `node` is, or may hold, a KJIT_* name."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.startswith("KJIT_")
    if isinstance(node, ast.Name):
        if node.id in loops:
            return _names_kjit(loops.pop(node.id), names, loops)
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_kjit(e, names, loops) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(k is not None and _names_kjit(k, names, loops) for k in node.keys)
    if isinstance(node, ast.JoinedStr):
        return any(_names_kjit(v, names, loops) for v in node.values)
    return False


def _is_environ(node: ast.AST, aliases: set[str]) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
        (isinstance(node, ast.Name) and node.id in aliases | {"environ"})


def kjit_env_reads(text: str, label: str, names: set[str]) -> list[str]:
    """Every read of a KJIT_* variable in the module `text` through os.environ (or a name
    bound to it) or os.getenv: .get(), [...], `in`, getenv(); each as "label:line: code"."""
    tree = ast.parse(text, label)
    aliases: set[str] = set()
    loops: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_environ(node.value, set()):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.arguments):
            args = node.posonlyargs + node.args
            for arg, default in zip(args[len(args) - len(node.defaults):], node.defaults):
                if _is_environ(default, set()):
                    aliases.add(arg.arg)
            aliases |= {a.arg for a, d in zip(node.kwonlyargs, node.kw_defaults)
                        if d is not None and _is_environ(d, set())}
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            loops[node.target.id] = node.iter
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr in ("get", "setdefault")
                    and _is_environ(f.value, aliases)) or \
                    (isinstance(f, ast.Attribute) and f.attr == "getenv") or \
                    (isinstance(f, ast.Name) and f.id == "getenv"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and _is_environ(node.value, aliases):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) \
                and any(_is_environ(c, aliases) for c in node.comparators):
            key = node.left
        if key is not None and _names_kjit(key, names, dict(loops)):
            found.append(f"{label}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_kjit_variables_are_read_only_through_settings():
    """One reader: every KJIT_* variable is read, parsed and checked in kjit/settings.py,
    so each has one set of accepted values and one error (docs/environment.md)."""
    names = _kjit_names()
    reads = [r for p in sorted(ROOT.rglob("*.py")) if p != SETTINGS
             for r in kjit_env_reads(p.read_text(), str(p.relative_to(ROOT.parent)), names)]
    assert reads == [], "read a KJIT_* variable through kjit.settings instead:\n" + "\n".join(reads)
    import re
    c_reads = [f"{p.relative_to(ROOT.parent)}: {m}" for p in sorted(ROOT.rglob("*.[ch]"))
               for m in re.findall(r"getenv\s*\(\s*\"KJIT_\w*\"", p.read_text())]
    assert c_reads == []


@pytest.mark.parametrize("code, line", [
    ('import os\nif os.environ.get("KJIT_LAUNCH", "").lower() == "bindings": pass', 2),
    ('import os\nENV_A = "KJIT_ARCH"\nx = os.environ.get(ENV_A, "").strip()', 3),
    ('import os\nfrom kjit import arch as m\nx = os.environ.get(m.ENV_ARCH)', 3),
    ('import os\ndef mode(n, env=os.environ):\n    return env.get(ENV_MODE, "")', 3),
    ('import os\nenv = os.environ\nsig = tuple(env.get(v) for v in ENV_VARS)', 3),
    ('from os import environ, getenv\nx = environ["KJIT_CACHE"]\ny = getenv("KJIT_PCH")', 2),
    ('import os\nx = "KJIT_CACHE_DIR" in os.environ', 2),
])
def test_the_scan_finds_reads_of_kjit_variables(code, line):
    """The scan sees the ways kjit's modules have read their variables."""
    found = kjit_env_reads(code, "probe", {"ENV_A", "ENV_ARCH", "ENV_MODE", "ENV_VARS"})
    assert found and found[0].startswith(f"probe:{line}:"), found


def test_the_scan_knows_the_names_kjit_gives_its_variables():
    """Constants, collections of them, attributes and import aliases (lookup's ENV_DIR)."""
    assert {"ENV_ARCH", "ENV_VARS", "ENV_MODE", "ENV_DIR", "ENV_DEVRT"} <= _kjit_names()


def test_the_scan_leaves_other_variables_and_writes_alone():
    code = ('import os\nx = os.environ.get("CUDA_HOME")\nos.environ["KJIT_CACHE"] = "0"\n'
            'os.environ.pop("KJIT_CACHE", None)\nenv = dict(os.environ, KJIT_COMPILE_POOL_IDLE="1")\n'
            'for v in ("CUDA_HOME", "CUDA_PATH"):\n    os.environ.get(v)\n')
    assert kjit_env_reads(code, "probe", {"ENV_A"}) == []
