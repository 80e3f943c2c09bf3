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
from pathlib import Path
from typing import Any

from ..settings import cache_enabled
from ..locations import cache_dir, package_version

FILE_NAME = "nvrtc-facts.json"


@functools.lru_cache(maxsize=None)
def loaded_nvrtc() -> Any:
    """cuda.bindings.nvrtc with libnvrtc loaded, or KjitError naming the install that brings
    it (a plain `pip install kjit` installs no CUDA family)."""
    from ..families import load_family_library
    load_family_library("nvrtc")
    from cuda.bindings import nvrtc
    try:
        _, major, minor = nvrtc.nvrtcVersion()   # the first call loads libnvrtc
    except Exception as exc:   # cuda.pathfinder's DynamicLibNotFoundError, an OSError
        from ..errors import KjitError
        from ..families import family_install_hint
        raise KjitError(f"NVRTC is not installed: {family_install_hint()} "
                        f"[{type(exc).__name__}: {str(exc).strip()}]") from None
    from ..families import other_family_loaded
    text = other_family_loaded("NVRTC", (major, minor))
    if text:
        import warnings
        from ..errors import CompileWarning
        warnings.warn(text, CompileWarning, stacklevel=3)
    return nvrtc


def _ask_nvrtc() -> dict[str, Any]:
    nvrtc = loaded_nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    err2, archs = nvrtc.nvrtcGetSupportedArchs()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or err2 != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        from ..errors import KjitError
        raise KjitError(f"NVRTC did not describe itself: {err!r} {err2!r}")
    return {"version": [int(major), int(minor)], "archs": [int(a) for a in archs]}


NVRTC_WHEELS = ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13", "nvidia-cuda-nvrtc-cu12")


def _wheel() -> str | None:
    found = package_version(NVRTC_WHEELS)
    return f"{found[0]} {found[1]}" if found else None


def _path() -> Path | None:
    if not cache_enabled():
        return None
    try:
        from ..cache import trusted
        d = cache_dir()
        return d / FILE_NAME if trusted(d) else None  # nothing read from an untrusted one
    except Exception:  # no home directory to put it in
        return None


MAX_BYTES = 1 << 20   # a few hundred bytes per NVRTC kjit has met
_refused: set[str] = set()


def read_record(path: Path, limit: int = MAX_BYTES) -> Any:
    """The JSON a file kjit keeps in its cache directory holds, {} when it is missing or
    unreadable. Read only if this user (or root) wrote it and no one else can write it
    (kjit.cache.trust), bounded, never through a link; a file that fails is ignored with
    one warning naming it and what to do, so no one can point another user's compiles at
    their own files through it."""
    from ..cache import Untrusted, read_private
    try:
        data = read_private(path, limit)
        return json.loads(data) if len(data) <= limit else {}
    except Untrusted as exc:
        if str(path) not in _refused:
            _refused.add(str(path))
            import warnings
            warnings.warn(f"kjit does not read {path}: {exc.strerror}; it finds the answer "
                          "itself instead", RuntimeWarning, stacklevel=3)
        return {}
    except (OSError, ValueError, RecursionError):
        return {}


def _valid(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("version"), list)
            and len(entry["version"]) == 2 and isinstance(entry.get("archs"), list)
            and bool(entry["archs"])
            and all(isinstance(n, int) for n in [*entry["version"], *entry["archs"]]))


@functools.lru_cache(maxsize=None)
def nvrtc() -> dict[str, Any]:
    """{"version": [major, minor], "archs": [75, 80, ...]} for the NVRTC cuda.bindings loads."""
    wheel, path = _wheel(), _path()
    known: dict[str, Any] = {}
    if wheel and path is not None:
        known = read_record(path)
        known = known if isinstance(known, dict) else {}  # the cache directory's file: checked
        if _valid(known.get(wheel)):
            return known[wheel]
    entry = _ask_nvrtc()
    if wheel and path is not None:
        try:  # write-then-rename through a new file: no half file, no planted link followed
            from ..fileio import replace_with
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            replace_with(path, json.dumps({**known, wheel: entry}, sort_keys=True).encode(), 0o644)
        except OSError:
            pass  # read-only cache: ask NVRTC again next time
    return entry
