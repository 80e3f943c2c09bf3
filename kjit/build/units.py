"""A build's compiles: one Unit per (source, arch, target), all sharing one SharedOptions,
run through kjit.compile_many.

compile_many asks the cache here first and compiles the misses in its worker processes
(kjit.compiler.pool), which import this process's kjit; a rebuild whose compiles all hit
the cache starts none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Unit:
    """One compile: a source for one architecture and target."""

    source: str
    name: str
    arch: str
    target: str


@dataclass(frozen=True)
class SharedOptions:
    """What every unit of a build compiles with: compile_many's arguments for all items."""

    options: Any
    name_expressions: tuple[str, ...]
    backend: str
    cache: bool


def compile_units(units: Sequence[Unit], shared: SharedOptions, jobs: int,
                  on_done: Callable[[], None] = lambda: None) -> list:
    """ObjectCode for each unit, in order; the first failing unit's error is raised."""
    from ..compiler import compile_many
    items = [{"source": u.source, "name": u.name, "arch": u.arch, "target": u.target}
             for u in units]
    return compile_many(items, options=shared.options, name_expressions=shared.name_expressions,
                        backend=shared.backend, cache=shared.cache, jobs=jobs,
                        errors="raise", progress=lambda done, total: on_done())
