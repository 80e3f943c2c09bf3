"""Where things are: the cache directory and the versions of installed wheels.

Low in the layers (it reads its variable through kjit.settings only): the cache (where
entries live) and the compiler (where it remembers NVRTC's facts, which wheel it is) both
need these, and neither may import the other for them.
"""
from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

from .settings import env_raw

ENV_CACHE_DIR = "KJIT_CACHE_DIR"


def _listed() -> list[str]:
    """The directories $KJIT_CACHE_DIR lists, os.pathsep-separated (spaces in names kept)."""
    return [p for p in (env_raw(ENV_CACHE_DIR) or "").split(os.pathsep) if p.strip()]


def cache_dirs() -> list[Path]:
    """Every directory $KJIT_CACHE_DIR lists (os.pathsep-separated: a read-only cache and
    a writable one for new results), else the one default directory."""
    parts = _listed()
    return [Path(p).expanduser() for p in parts] if len(parts) > 1 else [cache_dir()]


def cache_dir() -> Path:
    """$KJIT_CACHE_DIR (the first directory it lists), else the per-user cache directory
    (XDG on Linux)."""
    parts = _listed()
    if parts:
        return Path(parts[0]).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "kjit" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "kjit"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kjit"


@functools.lru_cache(maxsize=None)
def installed() -> dict[str, str]:
    """Installed distributions -> version, from the .dist-info names on sys.path (the first
    one wins, as for imports), each entry listed once. importlib.metadata would cost ~20 ms
    of a fresh process's ~20 ms disk hit."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry)) if entry else ()
        except OSError:  # not a directory (a zip on sys.path), or gone
            continue
        for name in names:
            if name.endswith(".dist-info") and "-" in name:
                dist, _, version = name[:-len(".dist-info")].partition("-")
                found.setdefault(_normalise(dist), version)
    return found


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def package_version(dists: tuple[str, ...]) -> tuple[str, str] | None:
    """(distribution, version) of the first of `dists` that is installed."""
    have = installed()
    for d in dists:
        if _normalise(d) in have:
            return d, have[_normalise(d)]
    return None


