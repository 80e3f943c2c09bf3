"""The CUDA toolkit headers every CUDA compile can include without -I: CCCL (cub/, thrust/,
cuda/std, cuda/atomic, nv/target) and the CUDA runtime headers (cuda_fp16.h, cuda_bf16.h,
cuda_fp8.h, mma.h, cooperative_groups/, with crt/ from the nvidia-cuda-crt wheel), from
NVIDIA's wheels, found by cuda-pathfinder.

They are searched after everything the user gives (in-memory headers, -I directories), CCCL
first: the two directories overlap only in nv/, which the CCCL wheel installs identically in
both. The cache key hashes whatever a compile reads from them like any other header, so an
upgraded wheel changes the key without kjit knowing about versions.

Importing cuda.pathfinder costs ~60 ms, more than a whole fresh-process disk hit may, so its
answer is kept in the cache directory (toolkit-headers.json) under everything it depends on:
the interpreter's prefixes, the environment variables pathfinder reads and the installed
versions of the wheels involved (read from .dist-info names). A recorded directory that no
longer holds its anchor header is asked again.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
from typing import Any

from ..settings import cache_enabled
from ..hashing import sha256
from ..locations import installed, package_version  # noqa: F401  (installed: for kjit info and tests)
from .facts import NVRTC_WHEELS

RECORD_FILE = "toolkit-headers.json"
# (pathfinder's name, the header that proves the directory is right), in search order.
LIBS = (("cccl", "cuda/std/version"), ("cudart", "cuda_runtime.h"))
# Where the wheels put them, below a sys.path entry (as pathfinder's catalog has it): for
# wheels installed with `pip install --target` or on PYTHONPATH, which pathfinder's header
# search (site-packages only) does not look at.
WHEEL_DIRS = {"cccl": ("nvidia/cu13/include/cccl", "nvidia/cuda_cccl/include"),
              "cudart": ("nvidia/cu13/include", "nvidia/cuda_runtime/include"),
              "crt": ("nvidia/cuda_nvcc/include",)}   # CUDA 12's crt/ comes with its nvcc wheel
# The wheels that can provide each, newest naming first.
PROVIDERS = {"cccl": ("nvidia-cuda-cccl", "nvidia-cuda-cccl-cu13", "nvidia-cuda-cccl-cu12"),
             "cudart": ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12")}
# Wheels that add to a directory another wheel provides (mma.h includes crt/mma.h).
ALSO = {"cudart": ("nvidia-cuda-crt", "nvidia-cuda-nvcc-cu12")}
_ENV = ("CONDA_PREFIX", "CUDA_PATH", "CUDA_HOME", "PYTHONUSERBASE")
# The combinations the test suite has compiled the corpus (tests/corpus) with.
TESTED = ("NVRTC 13.5 (nvidia-cuda-nvrtc 13.5.37) with nvidia-cuda-cccl 13.3 (CCCL 3.5.0), "
          "nvidia-cuda-runtime 13.5.37 and nvidia-cuda-crt 13.5.37")


def _identity() -> str:
    import site
    wheels = [package_version(PROVIDERS[lib]) for lib, _ in LIBS]
    wheels.append(package_version(("cuda-pathfinder",)))
    wheels.append(package_version(("cuda-toolkit",)))
    text = json.dumps([sys.prefix, sys.base_prefix, bool(site.ENABLE_USER_SITE),
                       [os.environ.get(v) for v in _ENV], wheels])
    return sha256(text.encode()).hexdigest()[:32]


def _record_path():
    if not cache_enabled():
        return None
    try:
        from ..cache import trusted
        from ..locations import cache_dir
        d = cache_dir()
        return d / RECORD_FILE if trusted(d) else None  # nothing read from an untrusted one
    except Exception:
        return None


def _ask_pathfinder() -> dict[str, str | None]:
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:
        return {lib: None for lib, _ in LIBS}
    out: dict[str, str | None] = {}
    for lib, _ in LIBS:
        try:
            out[lib] = find_nvidia_header_directory(lib)
        except Exception:  # pathfinder raises for what it cannot describe: not found, to us
            out[lib] = None
    return out


def _valid(found: Any) -> bool:
    if not isinstance(found, dict):
        return False
    for lib, anchor in LIBS:
        d = found.get(lib)
        if d is not None and not (isinstance(d, str) and os.path.isfile(os.path.join(d, anchor))):
            return False
    return True


def _wheel_dirs(lib: str) -> tuple[str, ...]:
    """WHEEL_DIRS[lib], the CUDA 12 family's runtime headers first where cuda.bindings is of
    that family: an environment moved from kjit[cu13] to kjit[cu12] keeps the CUDA 13 runtime
    wheel, whose headers NVRTC 12 must not read. (CCCL comes from the one wheel either way.)"""
    from ..families import installed_family
    dirs = WHEEL_DIRS[lib]
    family = installed_family()
    if lib == "cudart" and family and family[0] == 12:
        return tuple(reversed(dirs))
    return dirs


def _on_sys_path(lib: str, anchor: str) -> str | None:
    """The first sys.path entry holding `lib`'s wheel directory (a few stats: not cached)."""
    dirs = _wheel_dirs(lib)
    for entry in sys.path:
        if not entry:
            continue
        for rel in dirs:
            d = os.path.join(entry, rel)
            if os.path.isfile(os.path.join(d, anchor)):
                return os.path.realpath(d)
    return None


@functools.lru_cache(maxsize=None)
def located() -> dict[str, str | None]:
    """{"cccl": dir or None, "cudart": dir or None}: pathfinder's answer (remembered across
    processes), else the wheel's directory on sys.path."""
    # A wheel on sys.path first (site-packages, a --target directory, PYTHONPATH): what this
    # Python environment installed, as pathfinder itself prefers wheels; then pathfinder,
    # which also finds conda and a system toolkit (CUDA_HOME, /usr/local/cuda).
    wheels = {lib: _on_sys_path(lib, anchor) for lib, anchor in LIBS}
    if all(wheels.values()):
        return wheels
    found = _pathfinder_remembered()
    return {lib: wheels[lib] or found.get(lib) for lib, _ in LIBS}


def _pathfinder_remembered() -> dict[str, str | None]:
    ident, path = _identity(), _record_path()
    known: dict[str, Any] = {}
    if path is not None:
        from .facts import read_record   # the owner, mode and size checks of both files
        known = read_record(path)
        if not isinstance(known, dict):
            known = {}
        if _valid(known.get(ident)) and set(known[ident]) == {lib for lib, _ in LIBS}:
            return dict(known[ident])
    found = _ask_pathfinder()
    if path is not None:
        try:  # write-then-rename: a reader never sees half a file; keep a few identities
            keep = dict(list(known.items())[-15:])
            keep[ident] = found
            from ..fileio import replace_with
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            replace_with(path, json.dumps(keep, sort_keys=True).encode(), 0o644)
        except OSError:
            pass  # read-only cache: ask again next time
    return found


CRT_ANCHOR = "crt/mma.h"
# Where a CUDA toolkit keeps crt/ when no wheel provides it, after $CUDA_HOME / $CUDA_PATH.
SYSTEM_TOOLKITS = ("/usr/local/cuda",)


def _toolkit_includes() -> list[str]:
    """Include directories of CUDA toolkits: $CUDA_HOME, $CUDA_PATH, $CONDA_PREFIX, then
    /usr/local/cuda (plain and targets/<arch>-linux layouts)."""
    import platform
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX")]
    out = []
    for root in [r for r in roots if r] + list(SYSTEM_TOOLKITS):
        out.append(os.path.join(root, "include"))
        out.append(os.path.join(root, "targets", f"{platform.machine()}-linux", "include"))
    return out


@functools.lru_cache(maxsize=None)
def crt_dir(cudart: str | None) -> str | None:
    """The include directory holding crt/ when the runtime headers' own has none: wheels
    installed to different places (`pip install --target` beside a system site-packages)
    split what a toolkit keeps in one directory, and PyTorch's runtime-header wheels ship
    mma.h without the crt/ it includes. An nvidia-cuda-crt wheel on sys.path first, then a
    CUDA toolkit's include directory."""
    if cudart is None or os.path.isfile(os.path.join(cudart, CRT_ANCHOR)):
        return None
    # only a directory of the runtime headers' CUDA major: a CUDA 13 toolkit's include
    # directory beside CUDA 12 wheels would also answer cuda_fp6.h and the rest, for NVRTC 12
    major = cuda_major(cudart)
    wheels = [d for d in (_on_sys_path("cudart", CRT_ANCHOR), _on_sys_path("crt", CRT_ANCHOR)) if d]
    for d in wheels + [os.path.realpath(d) for d in _toolkit_includes()]:
        if os.path.isfile(os.path.join(d, CRT_ANCHOR)) and cuda_major(d) in (major, None):
            return d
    return None


_VERSION = re.compile(rb"#define\s+CUDART_VERSION\s+(\d+)")


def cuda_major(include_dir: str) -> int | None:
    """The CUDA major version of an include directory: its cuda_runtime_api.h's
    CUDART_VERSION, else the wheel directory's name (nvidia/cu13/include), else None."""
    try:
        with open(os.path.join(include_dir, "cuda_runtime_api.h"), "rb") as f:
            m = _VERSION.search(f.read(1 << 16))
        if m:
            return int(m.group(1)) // 1000
    except OSError:
        pass
    m2 = re.search(r"/nvidia/cu(\d+)/include$", include_dir)
    return int(m2.group(1)) if m2 else None


def dirs() -> tuple[str, ...]:
    """The directories to search after the user's, in order (only those found)."""
    found = located()
    out = [found[lib] for lib, _ in LIBS if found.get(lib)]
    crt = crt_dir(found.get("cudart"))
    return tuple(out + [crt] if crt else out)


def cccl_version(cccl_dir: str) -> str | None:
    """CCCL's own version (3.5.0) from cuda/std/__cccl/version.h."""
    try:
        with open(os.path.join(cccl_dir, "cuda", "std", "__cccl", "version.h")) as f:
            m = re.search(r"#\s*define\s+CCCL_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    if not m:
        return None
    v = int(m.group(1))
    return f"{v // 1000000}.{v // 1000 % 1000}.{v % 1000}"


def describe() -> dict[str, Any]:
    """What `kjit info` shows: each directory, what it is and the wheel that provides it."""
    found = located()
    out: dict[str, Any] = {"dirs": [], "tested": TESTED}
    for lib, _ in LIBS:
        d = found.get(lib)
        pkg = package_version(PROVIDERS[lib])
        item = {"name": lib, "dir": d, "package": pkg[0] if pkg else None,
                "version": pkg[1] if pkg else None,
                "also": {a: v[1] for a in ALSO.get(lib, ()) if (v := package_version((a,)))}}
        if lib == "cccl" and d:
            item["cccl_version"] = cccl_version(d)
        out["dirs"].append(item)
    pf = package_version(("cuda-pathfinder",))
    out["cuda_pathfinder"] = pf[1] if pf else None
    return out


_LOCATION = re.compile(r"^(?P<file>[^\n(]+?)\((?P<line>\d+)\):\s*(?:error|catastrophic error)", re.M)


def failure_note(log: str, nvrtc_version: str) -> str:
    """When NVRTC's log puts an error inside a toolkit header: the versions involved, so a
    mismatch can be told from a bug in the user's code. "" otherwise."""
    found = located()
    roots = {lib: os.path.join(d, "") for lib, d in found.items() if d}
    hit: tuple[str, str] | None = None
    for m in _LOCATION.finditer(log):
        f = os.path.normpath(m.group("file").strip())
        for lib, root in roots.items():
            if f.startswith(root) and (hit is None or lib == "cccl"):
                hit = (lib, f)
    if hit is None:
        return ""
    nvrtc_pkg = package_version(NVRTC_WHEELS)
    parts = [f"NVRTC {nvrtc_version}" + (f" ({nvrtc_pkg[0]} {nvrtc_pkg[1]})" if nvrtc_pkg else "")]
    for lib, _ in LIBS:
        pkg = package_version(PROVIDERS[lib])
        if not found.get(lib):
            continue
        label = "CCCL" if lib == "cccl" else "CUDA runtime headers"
        if lib == "cccl":
            v = cccl_version(found[lib])
            label += f" {v}" if v else ""
        wheels = [f"{pkg[0]} {pkg[1]}"] if pkg else []
        wheels += [f"{a} {v[1]}" for a in ALSO.get(lib, ()) if (v := package_version((a,)))]
        parts.append(label + (f" ({', '.join(wheels)})" if wheels else ""))
    return (f"the error is inside a toolkit header ({hit[1]}); versions in use: "
            f"{', '.join(parts)}. Tested together: {TESTED}. If your code is right, the "
            "versions may not match: install matching wheels, or pass your own headers with "
            "-I (they are searched first), or turn toolkit headers off "
            "(CompileOptions(toolkit_headers=False), --no-toolkit-headers)")
