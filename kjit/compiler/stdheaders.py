"""The standard headers device code uses (<cstdint>, <cmath>, <cstdio>, <algorithm>...), for NVRTC.

NVRTC ships none of them, so kernels written for nvcc stop at their first `#include <cstdint>`.
kjit's set lives in `stdinc/` next to this module (package data): small headers that map the
`std::` names onto CCCL's `cuda::std` (and onto NVRTC's own device functions where it has
them); docs/headers.md lists what each provides.

Why a directory (the last -I), not NVRTC's in-memory headers: NVRTC looks a name up among the
in-memory headers before any -I directory (measured with NVRTC 13.5: an in-memory "cstdint"
beats a cstdint file in an -I directory, for <> and "" alike), so in-memory copies would shadow
a user's own <cstdint> or a toolkit's. As the last directory they are found only when nothing
earlier has the name, and the include scan that keys the cache hashes them like any other file,
so a change to the set changes the key of the compiles that can read the changed header.

The set is built on CCCL, so it brings CCCL's directory (found as toolkit_headers.py finds
it) along, just before its own, when the toolkit's directories are turned off. Host-only
headers (<iostream>, <vector>, <string>...) are not faked: NVRTC fails to open them, and
`explain_missing` turns that into an error that says the header is host-only.
"""
from __future__ import annotations

import os
import re

MIN_CCCL = "CCCL 3.5 (nvidia-cuda-cccl 13.3); the CCCL 3.0 of CUDA 13.0 toolkits lacks parts of cuda/std"
STDINC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stdinc")


# Standard headers that exist only on the host: nvcc compiles them for the host half of a .cu
# file, but a device-only compile has no streams, allocating containers, threads or files.
HOST_ONLY = frozenset("""
iostream istream ostream sstream fstream iomanip ios iosfwd streambuf syncstream spanstream
print format string vector list forward_list deque map set unordered_map unordered_set queue
stack memory memory_resource scoped_allocator thread mutex shared_mutex condition_variable future
stop_token semaphore latch barrier exception stdexcept system_error regex filesystem locale
codecvt valarray any typeinfo typeindex execution stacktrace
cerrno errno.h csignal signal.h csetjmp setjmp.h clocale locale.h cwchar wchar.h cuchar uchar.h
cwctype wctype.h ctime time.h unistd.h pthread.h fcntl.h
""".split())

# NVRTC: `k.cu(3): catastrophic error: cannot open source file "iostream"`, or with no -I at all
# `... could not open source file "iostream" (no directories in search list)`.
_NOT_FOUND = (r'^(?P<file>.+?)\((?P<line>\d+)\): catastrophic error: '
              r'(?:cannot|could not) open source file "(?P<name>[^"]+)"')


def cccl_dir() -> str | None:
    """CCCL's include directory (the one holding cuda/std/), as the toolkit headers find it."""
    from .toolkit_headers import located
    return located().get("cccl")


def include_dirs() -> list[str]:
    """The directories the set adds, in search order: CCCL's (the set is built on it), then
    its own. include_path.py leaves out CCCL's when the toolkit's directories already have it."""
    cccl = cccl_dir()
    return [cccl, STDINC] if cccl else [STDINC]


def provided() -> frozenset[str]:
    """The headers kjit provides (docs/headers.md says what each maps to)."""
    return frozenset(name for name in os.listdir(STDINC) if not name.startswith("__"))


def explain_missing(log: str, std_headers: bool) -> str | None:
    """Why a header NVRTC could not open is missing, when kjit can tell; else None.
    (Only a failed compile asks, so nothing here is prepared at import.)"""
    m = re.search(_NOT_FOUND, log, re.M)
    if m is None:
        return _old_cccl(log) if std_headers else None
    name, where = m.group("name"), f"{m.group('file')}, line {m.group('line')}"
    if name in HOST_ONLY:
        return (f"<{name}> ({where}) is a host-only header: kjit compiles device code only "
                f"(NVRTC), which has no {_host_what(name)}. Remove the #include, or keep it out "
                "of device compiles with #ifndef __CUDACC_RTC__ ... #endif.")
    if name in provided() and not std_headers:
        return (f"<{name}> ({where}) is one of kjit's device-side standard headers, which are "
                "turned off (CompileOptions(std_headers=False) / --no-std-headers).")
    if name.startswith("cuda/std/") and os.path.dirname(m.group("file")) == STDINC:
        return _old_cccl(log, missing=True) or (
            "kjit's standard headers are built on CCCL (cuda/std/...), which was not found: "
            "pip install nvidia-cuda-cccl, or pass its include directory with -I.")
    return None


def _old_cccl(log: str, missing: bool = False) -> str | None:
    """An error inside the set (a cuda/std header or name it uses is absent) means the CCCL
    found is older than the set needs, e.g. the CCCL 3.0 of a CUDA 13.0 toolkit."""
    if not missing and not re.search(rf"^{re.escape(STDINC)}/[^(]+\(\d+\): (error|catastrophic)", log, re.M):
        return None
    from .toolkit_headers import cccl_version, located
    cccl = located().get("cccl")
    if cccl is None:
        return None
    found = f"CCCL {cccl_version(cccl) or '(version unknown)'} at {cccl}"
    return (f"kjit's standard headers need a newer CCCL than the one found ({found}): they are "
            f"tested with {MIN_CCCL}. pip install -U nvidia-cuda-cccl (a wheel on sys.path is "
            "preferred to a system toolkit's), pass a newer CCCL's include directory with -I, or "
            "turn the set off (CompileOptions(std_headers=False), --no-std-headers).")


def _host_what(name: str) -> str:
    if name in ("iostream", "istream", "ostream", "sstream", "fstream", "iomanip", "ios",
                "iosfwd", "streambuf", "syncstream", "spanstream", "print", "format"):
        return "streams or formatting (use printf from <cstdio>)"
    if name in ("thread", "mutex", "shared_mutex", "condition_variable", "future", "stop_token",
                "pthread.h"):
        return "host threads (use __syncthreads, cuda::barrier, cuda::atomic_ref)"
    if name in ("string", "vector", "list", "forward_list", "deque", "map", "set", "unordered_map",
                "unordered_set", "queue", "stack", "memory", "memory_resource", "scoped_allocator"):
        return "allocating containers or strings (use arrays, std::array, cuda::std::span)"
    return "C++ runtime or operating-system services"
