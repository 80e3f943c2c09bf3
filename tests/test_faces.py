"""Every package has a face: the rest of kjit imports a package only through its `__init__`
(kjit.cache, kjit.compiler, kjit.runtime, ...), never one of its modules, and no private name
(`_x`) crosses a package's edge. Inside a package, modules import each other freely; the
top-level modules (kjit.driver, kjit.arch, ...) are each their own face."""
from __future__ import annotations

import ast
from pathlib import Path

import kjit

ROOT = Path(kjit.__file__).resolve().parent
PACKAGES = {".".join(p.parent.relative_to(ROOT.parent).parts) for p in ROOT.rglob("__init__.py")}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _room(module: str) -> str:
    """The package below kjit a module lives in (kjit.hip.runtime.x -> kjit.hip), or the
    module itself for kjit's top-level modules."""
    parts = module.split(".")
    return ".".join(parts[:2]) if ".".join(parts[:2]) in PACKAGES else module


def _is_module(name: str) -> bool:
    path = ROOT.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or path.is_dir()


def _crossings():
    """(importer, line, what) for every import of another room's insides, or of a private name
    from another room."""
    for path in sorted(ROOT.rglob("*.py")):
        me = _module(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}   # local name -> kjit module it names (for `mod._x`)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                if mod.split(".")[0] != "kjit":
                    continue
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    target, name = (sub, None) if _is_module(sub) else (mod, alias.name)
                    if name is None:
                        bound[alias.asname or alias.name] = target
                    if _room(target) == _room(me):
                        continue
                    if target not in PACKAGES and _room(target) != target:
                        yield me, node.lineno, f"imports {target}, not its package's face"
                    elif name and name.startswith("_") and not name.startswith("__"):
                        yield me, node.lineno, f"imports the private {target}.{name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "kjit" and _room(alias.name) != _room(me) \
                            and alias.name not in PACKAGES and _room(alias.name) != alias.name:
                        yield me, node.lineno, f"imports {alias.name}, not its package's face"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and _room(bound[node.value.id]) != _room(me)
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                yield me, node.lineno, f"reads the private {bound[node.value.id]}.{node.attr}"


def test_packages_are_entered_by_their_faces():
    found = [f"{who}:{line}: {what}" for who, line, what in _crossings()]
    assert found == [], "\n".join(found)


def test_the_faces_names_resolve():
    # a face's table names modules and attributes by string: each must exist
    import importlib
    for package in sorted(PACKAGES):
        face = importlib.import_module(package)
        getter = getattr(face, "__getattr__", None)
        table = getattr(getter, "__closure__", None)
        names = [c.cell_contents for c in (table or ()) if isinstance(c.cell_contents, dict)]
        for name in (names[0] if names else {}):
            assert getattr(face, name) is not None, f"{package}.{name}"
