"""Install-independent names for the headers kjit adds to every compile, for cache keys.

The CUDA runtime headers, CCCL and kjit's own standard headers sit wherever an environment
installed them (a virtualenv, a `--target` directory, /usr/local/cuda). A key that named them
by absolute path would miss in a second environment, and a cluster whose nodes install kjit
under different paths would share nothing through the remote tier. So a header under one of
these roots is keyed by the root's role and its path below the root ("<cccl>/cub/cub.cuh"),
next to its content's hash, which is what decides the binary.

Paths reach a binary in two ways: line and debug information, which name every file for
profilers and debuggers, and `__FILE__` in an assertion's message (CCCL's always-on
_CCCL_VERIFY, `assert`). With line or debug information on (`paths_matter`) every path is
keyed as it is. An assertion message is not: a binary from another install prints that
install's path when an assertion fails, and behaves the same otherwise. Headers outside the
roots (the user's own) keep their absolute paths.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

# Flags that put source paths into the binary (line tables, DWARF).
_PATH_FLAGS = ("-lineinfo", "--generate-line-info", "-G", "--device-debug", "-g", "--debug")


@functools.lru_cache(maxsize=8)
def _prefixes(dirs: tuple[str, ...], cccl: str | None, std: str) -> tuple[tuple[str, str], ...]:
    labelled = [(d, "cudart") for d in dirs if d != cccl] + [(std, "kjit-std")]
    if cccl:
        labelled.append((cccl, "cccl"))
    # the longest prefix first: CCCL's directory sits inside the runtime headers' in the wheels
    # (as given and resolved: a search path may name a directory through a link)
    out = {os.path.join(form, ""): label for d, label in labelled
           for form in (os.path.abspath(d), os.path.realpath(d))}
    return tuple(sorted(out.items(), key=lambda item: -len(item[0])))


def prefixes() -> tuple[tuple[str, str], ...]:
    """(directory + separator, role) for each recognised root, the longest first."""
    from .. import stdheaders, toolkit_headers
    return _prefixes(toolkit_headers.dirs(), toolkit_headers.located().get("cccl"),
                     stdheaders.STDINC)


def key_path(path: str) -> str:
    """`path` as a key names it: "<role>/relative" below a recognised root, else unchanged."""
    for prefix, label in prefixes():
        if path.startswith(prefix):
            return f"<{label}>/{path[len(prefix):]}"
    return path


def namer(options: Any) -> Callable[[str], str]:
    """How keys name a file for these CompileOptions: below its root, unless line or debug
    information puts paths into the binary."""
    return str if paths_matter(options) else key_path


def paths_matter(options: Any) -> bool:
    """True when these CompileOptions put source paths into the binary (line or debug info)."""
    if getattr(options, "line_info", False) or getattr(options, "debug", False):
        return True
    for flag in getattr(options, "extra", ()):
        name = flag.split("=", 1)[0]
        if name in _PATH_FLAGS and not flag.endswith(("=false", "=0")):
            return True
    return False
