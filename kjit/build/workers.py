"""A build's compiles: one item per (source, arch, target), through kjit.compile_many.

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
class BuildCompiler:
    """The options every compile of a build shares."""

    options: Any
    name_expressions: tuple[str, ...]
    backend: str
    cache: bool


def compile_units(units: Sequence[Unit], compiler: BuildCompiler, jobs: int,
                  on_done: Callable[[], None] = lambda: None) -> list:
    """ObjectCode for each unit, in order; the first failing unit's error is raised."""
    from ..compiler.many import compile_many
    items = [{"source": u.source, "name": u.name, "arch": u.arch, "target": u.target}
             for u in units]
    return compile_many(items, options=compiler.options, name_expressions=compiler.name_expressions,
                        backend=compiler.backend, cache=compiler.cache, jobs=jobs,
                        errors="raise", progress=lambda done, total: on_done())
