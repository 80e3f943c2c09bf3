"""Debuggable compiles: a CUDA compile with line or debug information names, in its line
table, a real file that holds its source (kjit/cache/sources.py keeps it).

NVRTC names the main source by the program's name, made absolute against the current
directory ("kernel.cu" when no name= was given: a file that never existed), and an in-memory
header by its include name, the same way. The program is given a `#line 1 "<kept path>"`
first line instead of a new name: the line table then names the kept file, while the
program's name still decides where "quoted" includes are searched for (measured, NVRTC
13.0-13.5). In-memory headers (the user's, and kjit's nvcc prelude) get the same first line,
and are kept the same way. The kept path lies below
the cache directory's sources/ and is part of the request (CompileRequest.sources_dir) and
so of the cache key: a binary whose line table names a path is only found where that path
is the one a compile would name. Compiler messages name the user's names, as without.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..settings import switch_on
from .keys import roots
from ..cache import SOURCES_SUBDIR, keep_source, source_file, source_holds

ENV_SWITCH = "KJIT_DEBUG_SOURCES"
_warned: set[str] = set()


def sources_dir(source: str, name: str, backend: str, options: Any) -> str | None:
    """Where a request's sources are kept: None unless it is a CUDA compile whose options put
    source paths into the binary and KJIT_DEBUG_SOURCES is not off."""
    if backend != "cuda" or not roots.paths_matter(options) or not switch_on(ENV_SWITCH):
        return None
    from .include_path import for_options
    kept = [(source, name), *((t, n) for n, t in for_options(options, backend).headers.items())]
    where = _choose(kept)
    return None if "\n" in where or "\r" in where else where   # no #line could name it


def _choose(kept: list[tuple[str, str]]) -> str:
    """The absolute sources directory for a compile keeping these (text, name) files: a
    listed cache directory that holds every one already (a read-only cache baked with its
    sources: one holding the source but not, say, this kjit's prelude could never be given
    the rest), else the one new results go to."""
    import os
    from pathlib import Path
    from ..cache import writable
    from ..locations import cache_dirs
    dirs = [Path(os.path.abspath(d)) for d in cache_dirs()]
    if len(dirs) > 1:
        for d in dirs:
            sub = str(d / SOURCES_SUBDIR)
            if all(source_holds(source_file(sub, t, n), len(t.encode())) for t, n in kept):
                return sub
    top = next((d for d in dirs if writable(d)), dirs[0])
    return str(top / SOURCES_SUBDIR)


def files(req: Any) -> list[tuple[str, str]]:
    """(text, name) of everything a request keeps: its source and the in-memory headers its
    compile is given (the user's, and kjit's own nvcc prelude)."""
    from .include_path import for_options
    headers = for_options(req.options, req.backend).headers
    return [(req.source, req.name), *((t, n) for n, t in headers.items())]


class Plan:
    """What a request keeps, worked out once (hashing a large source on every repeat of a
    memoised call would cost more than the lookup): for kjit.compile's memo."""

    __slots__ = ("req", "paths")

    def __init__(self, req: Any):
        self.req = req
        self.paths = [(source_file(req.sources_dir, t, n), t, n) for t, n in files(req)]


def keep(req: Any, plan: Plan | None = None) -> None:
    """Make sure every file the request's binary names is there (never raises)."""
    if req.sources_dir is None:
        return
    for path, text, name in (plan or Plan(req)).paths:
        failed = keep_source(req.sources_dir, text, name, path)
        if failed is not None and req.sources_dir not in _warned:
            _warned.add(req.sources_dir)   # once per directory: every compile would fail alike
            import warnings
            from ..cache import CacheWarning
            warnings.warn(f"{req.name}: cannot keep its source in {req.sources_dir} for "
                          f"debuggers and profilers ({failed.strerror or failed}); the kernel "
                          "compiles and runs, but cuda-gdb and Nsight Compute will not show its "
                          "lines (docs/debugging.md)", CacheWarning, stacklevel=5)


def kept_paths(req: Any) -> list[str]:
    """The kept files a request's binary names (an entry's metadata lists them for prune)."""
    if req.sources_dir is None:
        return []
    return [source_file(req.sources_dir, t, n) for t, n in files(req)]


def _line(path: str) -> str:
    # a C string literal: backslash and quote escaped (a newline cannot be: sources_dir
    # refuses such a directory by keeping nothing)
    return '#line 1 "' + path.replace("\\", "\\\\").replace('"', '\\"') + '"\n'


def program(source: str, name: str, headers: Mapping[str, str], sources_dir: str
            ) -> tuple[str, dict[str, str], dict[str, str]]:
    """(source, in-memory headers, {kept path: name}) as NVRTC is to see them: the source
    and each in-memory header start with a #line naming its kept file."""
    shown: dict[str, str] = {}
    out = {}
    for n, t in headers.items():
        p = source_file(sources_dir, t, n)
        shown[p] = n
        out[n] = _line(p) + t
    p = source_file(sources_dir, source, name)
    shown[p] = name
    return _line(p) + source, out, shown


def unkept_log(log: str, shown: Mapping[str, str]) -> str:
    """A compiler log naming the user's names where it names kept files."""
    for path, name in shown.items():
        if path in log:
            log = log.replace(path, name)
    return log
