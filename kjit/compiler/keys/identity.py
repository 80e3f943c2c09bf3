"""Which compiler produced a result, as precisely as it can be named (part of every cache key)."""
from __future__ import annotations

import functools

from ...locations import package_version


def compiler_version(backend: str) -> str:
    """The compiler and its API version, for a result's metadata ("nvrtc 13.0")."""
    if backend == "hip":
        from .. import hiprtc
        return "hiprtc " + hiprtc.version_string()
    from .. import nvrtc
    return "nvrtc " + ".".join(map(str, nvrtc.version()))


@functools.lru_cache(maxsize=None)
def compiler_identity(backend: str) -> str:
    """The compiler as precisely as we can name it: API version plus the wheel's full version,
    so a patch release (same major.minor, different code) misses too."""
    if backend == "hip":
        from .. import hiprtc
        return "hiprtc " + hiprtc.version_string()  # hip + comgr versions: comgr is the compiler
    if backend == "nvjitlink":
        from ...families import load_family_library
        load_family_library("nvjitlink")
        from cuda.bindings import nvjitlink
        text, dist = "nvjitlink " + ".".join(map(str, nvjitlink.version())), "nvidia-nvjitlink"
    else:
        from .. import facts  # not .nvrtc: a disk hit needs NVRTC's version, not its module
        text, dist = "nvrtc " + ".".join(map(str, facts.nvrtc()["version"])), "nvidia-cuda-nvrtc"
    found = package_version((dist, dist + "-cu13", dist + "-cu12"))
    return f"{text} ({found[0]} {found[1]})" if found else text
