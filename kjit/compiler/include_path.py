"""Where a compile looks for an #include, in order: the one place that order is decided.

NVRTC and hiprtc look in this order, and kjit's include resolution (keys/includes.py), which
keys the cache, follows the same SearchPath:
  1. in-memory headers by exact name: CompileOptions.headers, then the automatic ones
     (HIP: the names hiprtc's built-ins provide, hip_headers.py; CUDA: the nvcc prelude,
     pre-included, stdinc/__kjit_prelude.h);
  2. for "quoted" includes, the including file's directory (for the main source, its name's
     directory: `kjit compile dir/k.cu` finds dir/x.cuh, as nvcc does);
  3. CompileOptions.include_dirs, then -I / --include-path= flags in `extra`, in order;
  4. the automatic directories: CUDA toolkit and CCCL headers (toolkit_headers.py), then
     kjit's device-side standard headers (stdheaders.py: <cstdint>, <cmath>...), last so
     that a header of the same name anywhere earlier wins.
Automatic headers and toolkit directories come only with CompileOptions.toolkit_headers
(default True), the standard headers with CompileOptions.std_headers (default True; they
bring CCCL's directory along when the toolkit's is off). Anything searched after the
toolkit belongs at the end of `dirs` (built in `for_options`), so user and toolkit headers
keep precedence.
"""
# (no `from __future__ import annotations`: NamedTuples would then compile each field's
# annotation text, and a fresh process's first compile() costs ~1.5 ms of a ~20 ms disk hit)

import os
from typing import Mapping, NamedTuple, Sequence

_INCLUDE_PATH_FLAGS = ("--include-path=", "-I")


class SearchPath(NamedTuple):
    headers: Mapping[str, str]          # in-memory headers, the user's first
    dirs: tuple[str, ...]               # every include directory, in search order
    automatic_dirs: tuple[str, ...]     # the tail of `dirs` kjit adds (passed as -I last)
    relative: bool = False              # an -I in `extra` is relative to the current directory


def source_name(path: "str | os.PathLike[str]") -> str:
    """The name the compiler gets for a source file (`kjit compile`, `kjit build`): its path
    as given, normalised, so its "quoted" includes are found next to it, as nvcc finds them."""
    return os.path.normpath(os.fspath(path))


def extra_include_dirs(extra: Sequence[str]) -> list[str]:
    """The directories of -I / --include-path= flags given through `extra`."""
    out = []
    for flag in extra:
        for prefix in _INCLUDE_PATH_FLAGS:
            if flag.startswith(prefix) and len(flag) > len(prefix):
                out.append(os.path.abspath(flag[len(prefix):]))
                break
    return out


def automatic_headers(enabled: bool, backend: str, prelude: bool = False) -> Mapping[str, str]:
    if backend == "cuda":
        if not prelude:
            return {}
        from .options import PRELUDE, prelude_text
        return {PRELUDE: prelude_text()}
    if not enabled or backend != "hip":
        return {}
    from . import hip_headers, hiprtc
    return hip_headers.builtin_headers(hiprtc.version()[0])


def automatic_dirs(enabled: bool, backend: str) -> tuple[str, ...]:
    if not enabled or backend != "cuda":
        return ()
    from . import toolkit_headers
    return toolkit_headers.dirs()


def std_header_dirs(enabled: bool, backend: str, before: Sequence[str]) -> tuple[str, ...]:
    """The standard headers' directories not already in `before` (CCCL's may be)."""
    if not enabled or backend != "cuda":
        return ()
    from . import stdheaders
    return tuple(d for d in stdheaders.include_dirs() if d not in before)


def for_options(options, backend: str) -> SearchPath:
    """The search path of a compile with these CompileOptions on this backend."""
    enabled = getattr(options, "toolkit_headers", True)
    auto_headers = automatic_headers(enabled, backend, getattr(options, "nvcc_prelude", False))
    headers = dict(options.headers)
    for name, text in auto_headers.items():
        headers.setdefault(name, text)
    auto = automatic_dirs(enabled, backend)
    extra = extra_include_dirs(options.extra)
    relative = any(not os.path.isabs(f.split("=", 1)[-1] if f.startswith("--") else f[2:])
                   for f in options.extra if f.startswith(_INCLUDE_PATH_FLAGS))
    dirs = tuple(options.include_dirs) + tuple(extra) + auto
    std = std_header_dirs(getattr(options, "std_headers", True), backend, dirs)
    return SearchPath(headers, dirs + std, auto + std, relative)
