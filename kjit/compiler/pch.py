"""Precompiled headers for NVRTC, made and used inside one process where they pay.

A compile of a CUB or CCCL kernel spends most of its time parsing headers. NVRTC can save
the state after a source's include prologue (the directives before its first declaration)
as a precompiled header (PCH) and start a later compile from it: ~0.3 s instead of ~2 s on
the GPU machine's host. A PCH file is usable only by the NVRTC instance that wrote it, so
each process keeps its own, in a private directory removed at exit.

When: the second compile in this process of a source with the same prologue, flags,
in-memory headers, name and working directory builds one (the first compile may be the
only one), or the first, where kjit.compile_many says more of them will follow in this
worker (`expect_repeats`). The PCH is built by compiling the prologue alone
(`--create-pch`), observed, so the files it was built from are exactly the files that
compile read; each compile that uses it (`--use-pch`) adds those files to its own
observation (observe.add), and its key is the key a compile without the PCH gets.

Never stale: NVRTC does not notice a header edited after its PCH was built (tested), so
before each use the PCH's Snapshot is checked (stats, a re-read where a stat changed) and a
PCH whose files changed is dropped and built again. A PCH that cannot be built (no include,
an error, diagnostics the later compiles would not repeat, the heap too small twice) or
that NVRTC refuses is counted and the compile runs without it; never an error.

Faults (pch_files.py): a PCH is built or used only where the temporary directories have
room for it, and only while its file is the one NVRTC wrote (NVRTC maps it: SIGBUS
otherwise); else the compile runs without one, counted, and a damaged one is built again.
A fork waits for the compiles in flight (forkgate.py).

`KJIT_PCH=0` (off, false, no) turns PCHs off. stats() gives this process's counts; a
compile that used a PCH has `metadata["pch"]` ("created" where it built it, else "used").
"""
from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import os
import threading
import time
from typing import Any, Iterator, Sequence

from . import pch_files

ENV = "KJIT_PCH"
HEAP_MIN = 512 << 20     # CCCL needs ~336 MB; NVRTC's default (256 MB) only warns when short
MAX_KEPT = 2             # PCH files kept per process (a CUB prologue's is ~340 MB)
_DIR_PREFIX = "kjit-pch-"
# the user's own PCH flags; a time trace the prologue's compile would write too
_FLAG_PREFIXES = ("-pch", "--pch", "-use-pch", "--use-pch", "-use_pch", "--use_pch",
                  "-create-pch", "--create-pch", "-create_pch", "--create_pch",
                  "-fdevice-time-trace", "--fdevice-time-trace")

# compile_many's worker: more compiles of this prologue are coming to this process
expect_repeats: contextvars.ContextVar[bool] = contextvars.ContextVar("kjit_pch_repeats", default=False)

_lock = threading.Lock()
_counts = {"created": 0, "used": 0, "failed": 0, "rejected": 0, "stale": 0, "evicted": 0,
           "damaged": 0, "no_space": 0}
_seen: dict[str, int] = {}          # compiles per prologue key in this process
_entries: dict[str, "_Pch"] = {}
_bad: set[str] = set()              # prologues whose PCH could not be built or was refused
_evicted: set[str] = set()          # prologues whose PCH made room for another: not built again
_state: dict[str, Any] = {"dir": None, "serial": 0, "heap": 0}
_tls = threading.local()


def enabled() -> bool:
    from ..settings import switch_on
    return switch_on(ENV)


def stats() -> dict[str, int]:
    """This process's counts: PCHs created, compiles that used one, PCHs that could not be
    built (failed), that NVRTC refused (rejected, compiled again without), dropped because
    a header they were built from changed (stale), to make room for another (evicted), or
    as their file was cut short or replaced (damaged: built again), and compiles without
    one for want of room in the temporary directory (no_space)."""
    with _lock:
        return dict(_counts)


def note() -> str | None:
    """How this thread's last NVRTC compile used a PCH ("created", "used") or None; cleared."""
    out, _tls.note = getattr(_tls, "note", None), None
    return out


# --- the prologue ------------------------------------------------------------------------------
_SKIP = r"(?:\s+|//[^\n]*|/\*.*?\*/)+"                          # blanks and comments
_DIRECTIVE = r"(?:#|%:)(?:[^\n\\/]|\\.|\\\n|/\*.*?\*/|/(?![*]))*"  # to its line's end
_WORD = r"(?:#|%:)(?:\s|/\*.*?\*/)*(\w+)"


@functools.lru_cache(maxsize=None)
def _patterns() -> tuple:
    """Compiled on a process's first miss, not at import (a disk hit never imports this)."""
    import re
    return tuple(re.compile(p, re.S) for p in (_SKIP, _DIRECTIVE, _WORD))


def prologue(source: str) -> str | None:
    """The source up to the end of its last leading preprocessor directive (NVRTC's header
    stop is the first token after them), or None where it includes nothing or stops inside
    an #if (NVRTC would not build a PCH there)."""
    if "include" not in source:  # most small kernels: no scan (and no regex compiled)
        return None
    skip, directive, word_re = _patterns()
    pos, end, depth, includes = 0, 0, 0, False
    n = len(source)
    while pos < n:
        m = skip.match(source, pos)
        if m:
            pos = m.end()
            continue
        d = directive.match(source, pos)
        if d is None:  # each directive runs to its line's end: every # here starts a line
            break
        word = word_re.match(source, pos)
        kind = word.group(1) if word else ""
        if kind in ("if", "ifdef", "ifndef"):
            depth += 1
        elif kind == "endif":
            depth -= 1
        elif kind in ("include", "include_next"):
            includes = True
        pos = d.end()
        end = pos
    if not includes or depth != 0:
        return None
    return source[:end] + "\n"


def _key(prologue_text: str, name: str, flags: Sequence[str], headers: dict) -> str:
    from ..cache import canonical
    from ..hashing import sha256
    return sha256(canonical([prologue_text, name, list(flags), sorted(headers.items()),
                             os.getcwd()])).hexdigest()


# --- the PCHs ----------------------------------------------------------------------------------
class _Pch:
    __slots__ = ("path", "snapshot", "obs", "users", "used", "retired", "ident")

    def __init__(self, path: str, snapshot: Any, obs: Any):
        self.path, self.snapshot, self.obs = path, snapshot, obs
        self.users = 0
        self.used = 0.0
        self.retired = False
        self.ident = pch_files.ident(path)

    def intact(self) -> bool:
        """The file is the one NVRTC wrote (NVRTC maps it: one cut short ends the process)."""
        return self.ident is not None and pch_files.ident(self.path) == self.ident

    def holds(self) -> bool:
        """The files it was built from are unchanged (contents; a stat change is re-read)."""
        try:
            return self.snapshot.check()
        except (OSError, TypeError, ValueError):
            return False

    def observation(self) -> Any:
        """What a compile from this PCH read through it: the prologue compile's observation
        with the stat data the last check found (the contents are the same)."""
        from .keys.observe import Observation
        from .keys.snapshot import PROBED
        out = Observation()
        files = self.snapshot.files
        for path in self.obs.read:
            size, mtime, ctime, ino, _sha, _racy = files[path]
            out.read[path] = (0, ino, size, mtime, ctime)
        for path in self.obs.probed:
            size, mtime, ctime, ino, sha, _racy = files[path]
            if sha == PROBED:
                out.probed[path] = (0, ino, size, mtime, ctime)
        out.absent = list(self.obs.absent)
        out.cwd, out.cwd_dependent = self.obs.cwd, self.obs.cwd_dependent
        return out


class Use:
    """One compile's use of a PCH: the flags to put first, the directory the observer
    ignores, and `finish` to read NVRTC's answer from the log."""

    def __init__(self, pch: _Pch, name: str, created: bool):
        self.pch, self.created = pch, created
        self.flags = [f"--use-pch={pch.path}"]
        self.ignore = (os.path.dirname(pch.path),)
        self._line = f'"{name}": using precompiled header file "{pch.path}"\n'

    def finish(self, log: str) -> str | None:
        """The log without NVRTC's note that it used the PCH, with the PCH's files added to
        the compile's observation; None where NVRTC did not use it (counted): compile again
        without, so the log holds no PCH warning."""
        if self._line not in log:
            with _lock:
                _counts["rejected"] += 1
                if _counts["rejected"] >= 2 and not _counts["used"]:  # this NVRTC never takes one
                    _state["off"] = "NVRTC refused every precompiled header"
                for key, ent in list(_entries.items()):
                    if ent is self.pch:
                        _bad.add(key)
                        _retire(key)
            return None
        from .keys import observe
        observe.add(self.pch.observation())
        with _lock:
            _counts["used"] += 1
        _tls.note = "created" if self.created else "used"
        return log.replace(self._line, "", 1)


@contextlib.contextmanager
def attempt(source: str, name: str, flags: Sequence[str], headers: dict,
            anchored: tuple[str, ...]) -> Iterator[Use | None]:
    """Around one NVRTC compile: a Use where a PCH serves it (built now if this is where it
    pays), else None. A fork waits for the compiles inside (forkgate.py)."""
    from .forkgate import compiling
    with compiling():
        try:
            use = _use(source, name, flags, headers, anchored)
        except Exception as exc:  # a PCH is only a shortcut: the compile goes on without one,
            with _lock:           # and later ones do not try (bindings without the PCH calls)
                _counts["failed"] += 1
                _state["off"] = f"{type(exc).__name__}: {exc}"
            use = None
        try:
            yield use
        finally:
            if use is not None:
                with _lock:
                    use.pch.users -= 1
                    if use.pch.retired and use.pch.users == 0:
                        _remove(use.pch.path)


def _use(source: str, name: str, flags: Sequence[str], headers: dict,
         anchored: tuple[str, ...]) -> Use | None:
    _tls.note = None
    if _state.get("off") or any(f.startswith(_FLAG_PREFIXES) for f in flags) or not enabled():
        return None
    text = prologue(source)
    if text is None:
        return None
    from .keys import observe
    if not observe.available("cuda"):  # its files could not be known: keys would be wrong
        return None
    with _lock:
        key = _key(text, name, flags, headers)
        seen = _seen.get(key, 0)
        if len(_seen) > 4096:
            _seen.clear()
        _seen[key] = seen + 1
        ent = _entries.get(key)
        if ent is not None and not ent.intact():
            _counts["damaged"] += 1   # this compile runs without it; the next builds it again
            _retire(key)
            return None
        if ent is not None and not ent.holds():
            _counts["stale"] += 1
            _retire(key)
            ent = None
        created = False
        if ent is None:
            if key in _bad or key in _evicted or (seen == 0 and not expect_repeats.get()):
                return None
            if not _room(building=True):
                _counts["no_space"] += 1   # tried again at the next compile
                return None
            ent = _build(key, text, name, flags, headers, anchored)
            if ent is None:
                return None
            created = True
        elif not _room(building=False):
            _counts["no_space"] += 1
            return None
        ent.users += 1
        ent.used = time.monotonic()
        return Use(ent, name, created)


def _build(key: str, text: str, name: str, flags: Sequence[str], headers: dict,
           anchored: tuple[str, ...]) -> _Pch | None:
    """Compile the prologue alone, observed, writing its PCH (under _lock)."""
    from .keys.snapshot import from_observation
    d = _private_dir()
    if d is None:
        _counts["failed"] += 1
        return None
    _evict()
    _state["serial"] += 1
    path = os.path.join(d, f"{_state['serial']}.pch")
    for _ in range(2):
        _heap()
        started = time.time()
        outcome = _compile_prologue(text, name, [f"--create-pch={path}"] + list(flags), headers,
                                    anchored, (d,))
        if outcome != "heap" or not _grow_heap():
            break
    if not isinstance(outcome, tuple):
        _counts["failed"] += 1
        _bad.add(key)
        _remove(path)
        return None
    obs = outcome[0]
    got = from_observation(obs, started)
    if got is None:  # a header changed while it was read: not kept, tried again next time
        _counts["failed"] += 1
        _remove(path)
        return None
    ent = _entries[key] = _Pch(path, got[0], obs)
    _counts["created"] += 1
    return ent


def _compile_prologue(text: str, name: str, flags: list, headers: dict,
                      anchored: tuple[str, ...], ignore: tuple[str, ...]) -> Any:
    """(Observation,) where NVRTC wrote the PCH and said nothing else, "heap" where its heap
    was too small (the required size noted), else None."""
    from cuda.bindings import nvrtc
    from .keys import observe
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), len(headers),
                                         [h.encode() for h in headers.values()],
                                         [k.encode() for k in headers])
    if err != ok:
        return None
    try:
        with observe.collecting() as seen:
            with observe.recording("cuda", name, ignore=ignore, anchored=anchored):
                (result,) = nvrtc.nvrtcCompileProgram(prog, len(flags), [f.encode() for f in flags])
        (status,) = nvrtc.nvrtcGetPCHCreateStatus(prog)
        if status == nvrtc.nvrtcResult.NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED:
            err, need = nvrtc.nvrtcGetPCHHeapSizeRequired(prog)
            _state["need"] = int(need) if err == ok else 0
            return "heap"
        if result != ok or status != ok or len(seen) != 1 or not seen[0].complete:
            return None
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        # anything but NVRTC's note (a header's warning) would be missing from later logs
        words = bytes(log).rstrip(b"\0").decode("utf-8", "replace").strip()
        if words and not (words.startswith(f'"{name}": creating precompiled header file ')
                          and "\n" not in words):
            return None
        return (seen[0],)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _room(building: bool) -> bool:
    return pch_files.room(max(_state["heap"], HEAP_MIN), _state["dir"], building)


def _heap() -> int:
    """The PCH heap's size, raised to HEAP_MIN before the first PCH (resizing it later
    invalidates every PCH this process made)."""
    if not _state["heap"]:
        from cuda.bindings import nvrtc
        err, size = nvrtc.nvrtcGetPCHHeapSize()
        size = int(size) if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else 0
        if size < HEAP_MIN and nvrtc.nvrtcSetPCHHeapSize(HEAP_MIN)[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = HEAP_MIN
        _state["heap"] = size
    return _state["heap"]


def _grow_heap() -> bool:
    """Resize the heap to what NVRTC said it needs, where no compile is using a PCH: the
    PCHs made so far become unusable, so they go."""
    need = _state.get("need", 0)
    if need <= _state["heap"] or any(e.users for e in _entries.values()):
        return False
    from cuda.bindings import nvrtc
    size = -(-int(need * 1.25) // (64 << 20)) * (64 << 20)
    if nvrtc.nvrtcSetPCHHeapSize(size)[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return False
    for key in list(_entries):
        _retire(key)
    _state["heap"] = size
    return True


def _retire(key: str) -> None:
    ent = _entries.pop(key, None)
    if ent is not None:
        ent.retired = True
        if ent.users == 0:
            _remove(ent.path)


def _evict() -> None:
    """Keep at most MAX_KEPT - 1 PCHs before a new one (the least recently used go). A
    prologue whose PCH went is not given another: prologues taking turns would otherwise
    each pay for a new PCH at every turn."""
    idle = sorted((e.used, k) for k, e in _entries.items() if e.users == 0)
    for _, key in idle[:max(0, len(_entries) - MAX_KEPT + 1)]:
        _counts["evicted"] += 1
        _evicted.add(key)
        _retire(key)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --- the private directory ---------------------------------------------------------------------
def _private_dir() -> str | None:
    if _state["dir"] is None:
        try:
            _state["dir"], _state["pid"] = pch_files.make_dir(_DIR_PREFIX), os.getpid()
        except OSError:
            return None
        atexit.register(cleanup)
    return _state["dir"]


def directory() -> str | None:
    """This process's PCH directory, if it made one."""
    return _state["dir"]


def cleanup() -> None:
    """Remove this process's PCH directory (at exit; also before a worker's hard exit)."""
    d, _state["dir"] = _state["dir"], None
    _entries.clear()
    if d is not None and _state.get("pid") == os.getpid():
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def _forget_in_child() -> None:
    """A forked child starts without PCHs: its parent's directory and files stay the
    parent's (the child's exit must not remove them), and a lock another thread held at the
    fork is never released in the child."""
    global _lock
    _lock = threading.Lock()
    _state.pop("off", None)
    _state["dir"] = None
    _entries.clear()
    _seen.clear()


os.register_at_fork(after_in_child=_forget_in_child)
