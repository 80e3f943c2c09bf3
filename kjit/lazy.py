"""Package faces whose names load on first use: a module `__getattr__` built from a table of
name -> "module" (or "module:attribute"), so that importing a package's face imports none of
its modules until a name is asked for (a cache hit must not load the compiler)."""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping


def lazy_names(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`'s face: `table` maps each public name to the module
    (relative to `package`) that defines it, with ":attribute" where the name differs there.
    Each read asks the defining module (not a copy kept on the face), so a name replaced
    there (a test's monkeypatch, a reloaded module) is what every caller gets."""
    def __getattr__(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where.partition(":")
        full = f"{package}.{module}"
        return getattr(sys.modules.get(full) or importlib.import_module(full), attr or name)
    return __getattr__
