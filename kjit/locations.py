"""Where things are: the cache directory and the versions of installed wheels.

A leaf module: the cache (where entries live) and the compiler (where it remembers NVRTC's
facts, which wheel it is) both need these, and neither may import the other for them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_CACHE_DIR = "KJIT_CACHE_DIR"


def cache_dirs() -> list[Path]:
    """Every directory $KJIT_CACHE_DIR lists (os.pathsep-separated: a read-only cache and
    a writable one for new results), else the one default directory."""
    parts = [p for p in os.environ.get(ENV_CACHE_DIR, "").split(os.pathsep) if p.strip()]
    return [Path(p).expanduser() for p in parts] if len(parts) > 1 else [cache_dir()]


def cache_dir() -> Path:
    """$KJIT_CACHE_DIR (the first directory it lists), else the per-user cache directory
    (XDG on Linux)."""
    parts = [p for p in os.environ.get(ENV_CACHE_DIR, "").split(os.pathsep) if p.strip()]
    if parts:
        return Path(parts[0]).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "kjit" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "kjit"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kjit"


def wheel_version(dist: str) -> str | None:
    """The installed version of a wheel, read from its .dist-info directory name on sys.path
    (importing importlib.metadata costs ~20 ms, and glob's patterns ~1 ms, against a fresh
    process's ~20 ms disk hit)."""
    prefix, suffix = dist.replace("-", "_") + "-", ".dist-info"
    for entry in sys.path:
        if not entry:
            continue
        try:
            names = os.listdir(entry)
        except OSError:  # not a directory (a zip on sys.path), or gone
            continue
        found = sorted(n for n in names if n.startswith(prefix) and n.endswith(suffix))
        if found:
            return found[0][len(prefix):-len(suffix)]
    return None
