"""What the installed NVRTC is (its version and target architectures), remembered across
processes.

Loading libnvrtc costs 20-60 ms, and a process whose compiles all hit the disk cache needs
nothing else from it. So the facts are kept in the cache directory under the identity of the
NVRTC wheel (its full version from the .dist-info name; cuda.bindings loads that wheel's
library first). Without a wheel to name it, or with KJIT_CACHE=0, NVRTC itself is asked.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

FILE_NAME = "nvrtc-facts.json"


def _ask_nvrtc() -> dict[str, Any]:
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    err2, archs = nvrtc.nvrtcGetSupportedArchs()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or err2 != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        from ..errors import KjitError
        raise KjitError(f"NVRTC did not describe itself: {err!r} {err2!r}")
    return {"version": [int(major), int(minor)], "archs": [int(a) for a in archs]}


def _wheel() -> str | None:
    from ..cache.key import _wheel_version
    for name in ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13", "nvidia-cuda-nvrtc-cu12"):
        version = _wheel_version(name)
        if version:
            return f"{name} {version}"
    return None


def _path() -> Path | None:
    if os.environ.get("KJIT_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        from ..cache.store import cache_dir
        return cache_dir() / FILE_NAME
    except Exception:
        return None


@functools.lru_cache(maxsize=None)
def nvrtc() -> dict[str, Any]:
    """{"version": [major, minor], "archs": [75, 80, ...]} for the NVRTC cuda.bindings loads."""
    wheel, path = _wheel(), _path()
    known: dict[str, Any] = {}
    if wheel and path is not None:
        try:
            known = json.loads(path.read_text())
            entry = known.get(wheel)
            if isinstance(entry, dict) and len(entry.get("version", ())) == 2 and entry.get("archs"):
                return entry
        except (OSError, ValueError):
            known = {}
    entry = _ask_nvrtc()
    if wheel and path is not None:
        try:  # write-then-rename: a reader never sees half a file
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**known, wheel: entry}, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass  # read-only cache: ask NVRTC again next time
    return entry
