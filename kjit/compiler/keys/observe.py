"""What a compile read, seen by watching the compiler rather than imitating it.

NVRTC and hiprtc resolve every #include through libc: a stat / open of each candidate path,
ENOENT from the include directories that do not hold it. The C extension `_observe` points
those imports of the compiler libraries (their GOT entries) at wrappers that record, for the
thread that asked, every path and what it named. `recording()` runs a compile under that;
`Observation` is the result: the files the compiler opened (with the stat the compiler saw),
the files it only probed, and the paths it found absent (where a header appearing later
would be read instead). Macros naming headers, `-X` flags, digraphs, comments, symlinks and
`..` need no rules here: the paths are the compiler's own.

The environment variables the compiler reads are recorded the same way (its `getenv`
imports): NVRTC's finalizer reads FINALIZER_USE_LEGACY_ELF_BUILDER on each compile, and the
value changes the cubin. Each one read, with its value or its absence, is part of what the
compile read. Paths are the compiler's own, wherever they lie: a header under /dev/shm is a
file like any other, a path through /proc/self/cwd or /dev/fd is keyed as the file it names.
What cannot be keyed (a device, FIFO or socket; a /proc or /sys file the compiler read as
input) leaves the compile unkeyed: it is returned, never stored.

Without the extension (no C compiler at install time, another platform) or where patching
failed, `available()` is False, and compiles that could read a header are not cached
(compiler/cached.py says so once). `KJIT_OBSERVE=0` turns observation off.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

from ..options import PRELUDE

ENV = "KJIT_OBSERVE"

# Compiler libraries per backend (file-name prefixes). hiprtc compiles through comgr's clang,
# whose file calls are LLVM's.
LIBRARIES = {"cuda": ("libnvrtc",), "hip": ("libamdhip64", "libhiprtc", "libamd_comgr", "libLLVM")}
# Each group: one of these must have been hooked for the observation to be complete.
REQUIRED = {"cuda": (("libnvrtc",),), "hip": (("libamdhip64", "libhiprtc"), ("libLLVM",))}

# Names NVRTC stats in the directory of the source's name and never opens (tested: a file of
# that name there changes nothing): not dependencies.
NVRTC_INTERNAL = ("__nv_nvrtc_builtin_header.h", "__nv_name_map",
                  # kjit's pre-included prelude: NVRTC stats it beside the source first, but
                  # the in-memory header always wins (test_nvcc_prelude.py)
                  PRELUDE)

K_ABSENT, K_FILE, K_DIR, K_OTHER, K_ERROR, K_WRITE, K_SPECIAL, K_ENV = range(8)

# Where paths may name something other than a file on disk: resolved (os.path.realpath)
# before keying. /proc/self/cwd/a.h is the working directory's a.h, /dev/fd/3 the file open
# there, /dev/shm/a.h a tmpfs file; what still lies under /proc or /sys after that is kernel
# state, whose contents no stat describes.
_PSEUDO_ROOTS = ("/proc/", "/sys/", "/dev/")
_KERNEL_STATE = ("/proc/", "/sys/")
# Kernel state and devices compilers read for their own use (host CPU, memory, their own
# executable, random bytes for temporary names), never as a header: not inputs.
# Named exactly: any other file there (/proc/sys/kernel/ns_last_pid, /proc/self/environ)
# read by a compile is an input kjit cannot key.
_SYSTEM_READS = ("/proc/cpuinfo", "/proc/meminfo", "/proc/mounts", "/proc/self/maps",
                 "/proc/self/mountinfo", "/proc/self/status", "/proc/self/cgroup",
                 "/sys/devices/system/cpu/", "/sys/fs/cgroup/")
_SYSTEM_DEVICES = frozenset({"/dev/null", "/dev/urandom", "/dev/random"})

# Environment variables the compiler reads that do not change its output, shown by tests
# (test_observe_round4.py): keying them would make every working directory (PWD) or make
# invocation (MAKEFLAGS' jobserver descriptors) a separate cache entry. TMPDIR holds only
# the file behind a precompiled header's heap (test_pch_persist.py): keyed, every job with
# its own temporary directory (SLURM, CI) would miss every PCH and every binary made with one.
ENV_NOT_INPUTS = {"cuda": frozenset({"PWD", "MAKEFLAGS", "TMPDIR"}), "hip": frozenset()}
# Variables the compiler reads as its library loads, before any hook is in place: their
# values when the hooks were installed (right after the load) are keyed with each compile.
# LLVM_OVERRIDE_PRODUCER changes NVRTC's LTO-IR bytes.
LOAD_ENV = {"cuda": ("LLVM_OVERRIDE_PRODUCER",), "hip": ()}

_lock = threading.Lock()
_state: dict[str, Any] = {"module": None, "error": None, "installed": {}, "load_env": {}}


def _module() -> Any:
    if _state["module"] is None and _state["error"] is None:
        try:
            from . import _observe
            _state["module"] = _observe
        except ImportError as exc:
            _state["error"] = f"the compile observer (kjit.compiler.keys._observe) is not built: {exc}"
    return _state["module"]


def enabled() -> bool:
    from ...settings import switch_on
    return switch_on(ENV)


def install(backend: str) -> bool:
    """Hook the file calls of `backend`'s compiler libraries (which must be loaded by now);
    True if its compiles can be observed: every library that reads its includes is hooked."""
    if _state["installed"].get(backend):
        return True
    mod = _module()
    if mod is None:
        return False
    with _lock:
        if _state["installed"].get(backend):   # another thread hooked it meanwhile
            return True
        try:
            patched = mod.install(list(LIBRARIES[backend]))
        except OSError as exc:
            _state["error"] = f"could not hook the {backend} compiler library: {exc}"
            _state["installed"][backend] = False
            return False
    # the values the library read as it loaded (it is loaded by now, and read them then)
    _state["load_env"][backend] = {n: os.environ.get(n) for n in LOAD_ENV.get(backend, ())}
    hooked = {os.path.basename(p) for p, n in patched if n > 0}
    need = REQUIRED[backend]
    ok = all(any(h.startswith(alt) for h in hooked for alt in group) for group in need)
    if not ok:
        _state["error"] = (f"the {backend} compiler's file calls were not found to hook "
                           f"(hooked: {', '.join(sorted(hooked)) or 'none'})")
    _state["installed"][backend] = ok
    return ok


def available(backend: str = "cuda") -> bool:
    """True when compiles of `backend` can be observed in this process (the hooks may still
    have to be installed: that happens on the first compile, once the library is loaded)."""
    if not enabled() or _module() is None:
        return False
    return _state["installed"].get(backend, True)


def describe() -> dict[str, Any]:
    """For `kjit info`: how compiles are keyed in this process."""
    ok = available("cuda")
    return {"mode": "observed" if ok else "scanned",
            "reason": None if ok else (_state["error"] or f"{ENV}=0"),
            "hooked": {b: v for b, v in _state["installed"].items()}}


class Observation:
    """read: path -> (dev, ino, size, mtime_ns, ctime_ns) as the compiler opened it;
    probed: paths of regular files found but never opened; absent: paths looked for and not
    found; env: environment variable -> its value (None: unset) for each one the compiler read;
    cwd_dependent: a relative path or the working directory decided a lookup; unkeyable: why
    the compile cannot be keyed (it read a device, a FIFO, kernel state), else None;
    digests: path -> sha256 of files in `read` whose content is known at that stat already
    (a precompiled header's, checked before its use), so keying need not read them again."""

    __slots__ = ("read", "probed", "absent", "env", "cwd", "cwd_dependent", "complete",
                 "unkeyable", "digests")

    def __init__(self) -> None:
        self.read: dict[str, tuple[int, int, int, int, int]] = {}
        self.probed: dict[str, tuple[int, int, int, int, int]] = {}
        self.absent: list[str] = []
        self.env: dict[str, str | None] = {}
        self.cwd = os.getcwd()
        self.cwd_dependent = False
        self.complete = True
        self.unkeyable: str | None = None
        self.digests: dict[str, str] = {}


def _real(path: str) -> str:
    """What a path under /proc, /sys or /dev names (the working directory's file for
    /proc/self/cwd/..., the open file for /dev/fd/N); other paths as they are."""
    if not path.startswith(_PSEUDO_ROOTS):
        return path
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def _system_read(path: str) -> bool:
    return path in _SYSTEM_DEVICES or path.startswith(_SYSTEM_READS)


def classify(records: list | None, *, source_name: str = "", ignore: tuple[str, ...] = (),
             anchored: tuple[str, ...] = (), backend: str = "cuda") -> Observation:
    """Sort one compile's records. `ignore`: directories whose files are the compiler's own
    state, not inputs (a precompiled-header directory). `anchored`: absolute include
    directories: a file found below one of them does not depend on the working directory,
    even when that directory lies below it (a virtual environment inside the project)."""
    obs = Observation()
    if not records:  # out of memory, or not one call seen (NVRTC always stats the source's
        obs.complete = False  # name): this compile was not observed, nothing can be trusted
        return obs
    cwd = obs.cwd.rstrip("/") + "/"

    def absolute(path: str) -> str:
        if not path.startswith("/"):
            obs.cwd_dependent = True
            path = os.path.join(obs.cwd, path)
        return path

    # The compiler's own output: files it wrote (a --fdevice-time-trace file, wherever it
    # lies) and everything below directories it created (comgr's work directories). What it
    # reads back from there is what it wrote, not an input.
    written = {absolute(p) for op, kind, p, *_ in records if kind == K_WRITE and op != "m"}
    created = tuple(os.path.join(absolute(p), "") for op, kind, p, *_ in records
                    if op == "m" and kind == K_WRITE)
    scratch = created + tuple(os.path.join(d, "") for d in ignore)
    src_dir = os.path.dirname(os.path.join(obs.cwd, source_name)) + "/"
    anchors = tuple(os.path.join(d, "") for d in anchored if os.path.isabs(d))
    internal = {src_dir + n for n in NVRTC_INTERNAL + (os.path.basename(source_name),)}
    not_inputs = ENV_NOT_INPUTS.get(backend, frozenset())
    opened: dict[str, tuple] = {}
    probed: dict[str, tuple] = {}
    absent: dict[str, None] = {}
    env = obs.env
    for op, kind, path, dev, ino, size, mtime, ctime in records:
        if kind == K_ENV:
            name, _, value = path.partition("=")
            if name not in not_inputs:
                got = None if size < 0 else value
                if env.setdefault(name, got) != got:  # read twice, changed between
                    obs.complete = False
            continue
        if op == "R" or kind in (K_OTHER, K_WRITE) or (kind == K_DIR and op != "o"):
            continue  # a directory opened as a header candidate is a candidate: a file may replace it
        # NVRTC 12 names its probes relative ("kernel.cu", "__nv_name_map"), NVRTC 13
        # joined to the working directory: the same lookups, so a relative name makes the
        # compile depend on the working directory only once it is known to be an input
        relative = not path.startswith("/")
        path = os.path.join(obs.cwd, path) if relative else path
        if path in written or (scratch and path.startswith(scratch)):
            continue
        if kind == K_SPECIAL or path.startswith(_PSEUDO_ROOTS):
            real = _real(path)
            if kind == K_SPECIAL or (kind == K_FILE and real.startswith(_KERNEL_STATE)):
                if obs.unkeyable is None and not (_system_read(path) or _system_read(real)):
                    what = "a device, FIFO or socket" if kind == K_SPECIAL else "kernel state"
                    named = f"{path} ({real})" if real != path else path
                    obs.unkeyable = f"it read {named}, {what}, whose contents kjit cannot key"
                continue
            if real.startswith(_KERNEL_STATE):
                continue  # looked for under /proc or /sys and not there: nothing appears there
            path = real
        if op in "sl" and path in internal and path not in opened:
            continue
        if kind == K_FILE:
            sig = (dev, ino, size, mtime, ctime)
            if op == "o":
                if path in opened and opened[path] != sig:  # opened twice, changed between
                    obs.complete = False
                opened.setdefault(path, sig)
            else:
                probed.setdefault(path, sig)
        else:  # absent, a directory, or unreadable (EACCES): a header there later is read
            absent[path] = None
        if relative or (path.startswith(cwd) and not (anchors and path.startswith(anchors))):
            obs.cwd_dependent = True
    obs.read = opened
    obs.probed = {p: s for p, s in probed.items() if p not in opened and p not in absent}
    obs.absent = [p for p in absent if p not in opened and p not in probed]
    if any(p in opened or p in probed for p in absent):
        obs.complete = False  # found and not found during one compile: it changed meanwhile
    return obs


_tls = threading.local()


@contextlib.contextmanager
def collecting() -> Iterator[list]:
    """Collect the Observations of the compiles this thread runs inside the block (the list
    stays empty where compiles cannot be observed)."""
    sink: list = []
    prev = getattr(_tls, "sink", None)
    _tls.sink = sink
    try:
        yield sink
    finally:
        _tls.sink = prev


@contextlib.contextmanager
def recording(backend: str, source_name: str = "", ignore: tuple[str, ...] = (),
              anchored: tuple[str, ...] = ()) -> Iterator[None]:
    """Around the compiler's compile call (its library loaded by then): record this thread's
    file calls from it, for the enclosing collecting() block, if any. `ignore`: as classify's."""
    sink = getattr(_tls, "sink", None)
    mod = _module() if sink is not None and enabled() else None
    if mod is None or mod.recording() or not install(backend):
        yield
        return
    mod.start()
    try:
        yield
    finally:
        records = mod.stop()
        obs = classify(records, source_name=source_name, ignore=ignore, anchored=anchored,
                       backend=backend)
        for name, value in _state["load_env"].get(backend, {}).items():
            obs.env.setdefault(name, value)
        sink.append(obs)


def add(obs: Observation) -> None:
    """Count `obs` as read by the compile this thread recorded last, if it is collected: the
    files a precompiled header it started from was built from (compiler/pch.py). One
    Observation per compile call still."""
    sink = getattr(_tls, "sink", None)
    if sink:
        sink[-1] = merge([sink[-1], obs])


def mark() -> int:
    """How many Observations this thread's collecting() block holds now (for forget_since)."""
    sink = getattr(_tls, "sink", None)
    return len(sink) if sink is not None else 0


def forget_since(mark: int) -> None:
    """Drop the Observations recorded since `mark`: a compile whose result was thrown away."""
    sink = getattr(_tls, "sink", None)
    if sink is not None:
        del sink[mark:]


def merge(observations: list) -> Observation:
    """One Observation for several compiles of one request (hiprtc: one per target)."""
    if len(observations) == 1:
        return observations[0]
    out = Observation()
    absent: dict[str, None] = {}   # in order, without the quadratic list scan
    for o in observations:
        for p, sig in o.read.items():
            if out.read.setdefault(p, sig) != sig:
                out.complete = False
        for p, sig in o.probed.items():
            out.probed.setdefault(p, sig)
        absent.update(dict.fromkeys(o.absent))
        for name, value in o.env.items():
            if out.env.setdefault(name, value) != value:
                out.complete = False
        out.digests.update((p, d) for p, d in o.digests.items() if out.read.get(p) == o.read.get(p))
        out.cwd_dependent |= o.cwd_dependent
        out.complete &= o.complete
        out.unkeyable = out.unkeyable or o.unkeyable
    out.absent = list(absent)
    out.probed = {p: s for p, s in out.probed.items() if p not in out.read}
    if any(p in out.read or p in out.probed for p in out.absent):
        out.complete = False
    return out
