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

Faults: NVRTC backs a PCH compile's heap with a sparse file in $TMPDIR and maps the PCH file
itself, so a full disk or a PCH file cut short would end the process with SIGBUS. Before
building a PCH (and before each use) the free space is checked (a PCH can grow to the heap's
size); where it is short the compile runs without one (counted: "no_space"). A PCH file that
is not the one written (its size, inode or times changed: truncated, replaced) is never
given to NVRTC: that compile runs without it (counted: "damaged") and the next builds it
again.

Fork: NVRTC holds a lock of its own during a compile that a forked child would never see
released, so a fork waits (FORK_WAIT_S at most) for the compiles in flight here to finish;
a child forked while one still ran refuses to compile with NVRTC, saying why.

`KJIT_PCH=0` (or off, false, no) turns PCHs off. stats() gives this process's counts; a compile that used a PCH
has `metadata["pch"]` ("created" where it built it, else "used").
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
SPACE_MARGIN = 64 << 20  # free space kept beyond what NVRTC's PCH heap and file can take
FORK_WAIT_S = 120.0      # the longest a fork waits for a compile in flight
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
    a header they were built from changed (stale) or to make room for another (evicted),
    whose file was no longer the one written (damaged: truncated or replaced; built again
    at the next compile), and compiles that ran without one because the temporary
    directory had too little room for it (no_space)."""
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
    from ..cache.key import canonical
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
        self.ident = _ident(path)

    def intact(self) -> bool:
        """The file is the one NVRTC wrote: NVRTC maps it, so one cut short ends the process
        (SIGBUS), and one replaced may be another compile's."""
        return self.ident is not None and _ident(self.path) == self.ident

    def holds(self) -> bool:
        """The files it was built from are unchanged (contents; a stat change is re-read)."""
        try:
            return self.snapshot.check()
        except (OSError, TypeError, ValueError):
            return False

    def observation(self) -> Any:
        """What a compile from this PCH read through it: the prologue compile's observation
        with the stat data the last check found (the contents are the same)."""
        from .observe import Observation
        from .snapshot import PROBED
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
        from . import observe
        observe.add(self.pch.observation())
        with _lock:
            _counts["used"] += 1
        _tls.note = "created" if self.created else "used"
        return log.replace(self._line, "", 1)


@contextlib.contextmanager
def attempt(source: str, name: str, flags: Sequence[str], headers: dict,
            anchored: tuple[str, ...]) -> Iterator[Use | None]:
    """Around one NVRTC compile: a Use where a PCH serves it (built now if this is where it
    pays), else None. A fork waits for the compiles inside (see _Gate)."""
    gate = _gate
    gate.enter()
    try:
        with _used(source, name, flags, headers, anchored) as use:
            yield use
    finally:
        gate.leave()


@contextlib.contextmanager
def _used(source: str, name: str, flags: Sequence[str], headers: dict,
          anchored: tuple[str, ...]) -> Iterator[Use | None]:
    try:
        use = _use(source, name, flags, headers, anchored)
    except Exception as exc:  # a PCH is only ever a shortcut: the compile goes on without one,
        with _lock:           # and later ones do not try again (bindings without the PCH calls)
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
    from . import observe
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
    from .snapshot import from_observation
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
    from . import observe
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


def _ident(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def nvrtc_temp_dir() -> str:
    """Where NVRTC puts the file behind a PCH compile's heap: $TMPDIR, else /tmp (not
    Python's choice, which also reads TMP and TEMP)."""
    return os.environ.get("TMPDIR") or "/tmp"


def free_bytes(path: str) -> int:
    """Bytes this user may still write on `path`'s file system."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _room(building: bool) -> bool:
    """Whether NVRTC has room for a PCH compile: the heap's file (sparse, at most the heap's
    size) in its temporary directory, and, when building, the PCH (at most the heap's size)
    in ours; both with SPACE_MARGIN to spare. NVRTC does not check its writes: where they
    fail it maps pages past the end of the file and the process dies of SIGBUS."""
    heap = max(_state["heap"], HEAP_MIN)
    need: dict[int, list] = {}   # file system -> [bytes needed, a directory on it]
    places = [(nvrtc_temp_dir(), heap + SPACE_MARGIN)]
    if building:
        import tempfile
        places.append((_state["dir"] or tempfile.gettempdir(), heap))
    for path, n in places:
        try:
            dev = os.stat(path).st_dev
        except OSError:
            continue   # NVRTC cannot make its file there: the compile says so, no SIGBUS
        need.setdefault(dev, [0, path])[0] += n
    try:
        return all(free_bytes(path) >= n for n, path in need.values())
    except OSError:
        return False


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
        import tempfile
        try:
            base = tempfile.gettempdir()
            try:
                _sweep(base)
            except Exception:  # others' leftovers: never a reason to go without PCHs
                pass
            _state["dir"] = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=base)
            _state["pid"] = os.getpid()
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


class _Gate:
    """The NVRTC compiles in flight in this process, so that a fork can wait for them: NVRTC
    holds a lock of its own while it compiles, and a child forked then would wait for it
    forever at its first compile."""

    def __init__(self, refuse: str | None = None) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.active: dict[int, int] = {}   # thread -> compiles in flight
        self.forking = False
        self.refuse = refuse
        self.in_flight = 0

    def enter(self) -> None:
        if self.refuse:
            from ..errors import KjitError
            raise KjitError(self.refuse)
        me = threading.get_ident()
        with self.cond:
            while self.forking and me not in self.active:
                self.cond.wait()
            self.active[me] = self.active.get(me, 0) + 1

    def leave(self) -> None:
        me = threading.get_ident()
        with self.cond:
            n = self.active.pop(me) - 1
            if n:
                self.active[me] = n
            self.cond.notify_all()

    def before_fork(self) -> None:
        """Hold new compiles back and wait for those of other threads (FORK_WAIT_S at most;
        the forking thread's own cannot end before the fork)."""
        me = threading.get_ident()
        with self.cond:
            self.forking = True
            self.cond.wait_for(lambda: not any(t != me for t in self.active), FORK_WAIT_S)
            self.in_flight = sum(self.active.values())

    def after_fork_in_parent(self) -> None:
        with self.cond:
            self.forking = False
            self.cond.notify_all()


_gate = _Gate()


def _forget_in_child() -> None:
    """A forked child starts without PCHs: its parent's directory and files stay the
    parent's (the child's exit must not remove them), and a lock another thread held at the
    fork is never released in the child. Where an NVRTC compile was still running at the
    fork, NVRTC's own lock stays held in the child: it refuses to compile, saying why."""
    global _lock, _gate
    refuse = None
    if _gate.in_flight:
        refuse = (f"this process was forked (pid {os.getpid()}) while its parent was compiling "
                  "with NVRTC in another thread, and NVRTC's lock stays held in a forked child: "
                  "it cannot compile here. Fork before compiling starts or after it ends, "
                  "compile in the parent, or start processes with multiprocessing's 'spawn' or "
                  "'forkserver' method")
    _gate = _Gate(refuse)
    _lock = threading.Lock()
    _state.pop("off", None)
    _state["dir"] = None
    _entries.clear()
    _seen.clear()


os.register_at_fork(before=lambda: _gate.before_fork(),
                    after_in_parent=lambda: _gate.after_fork_in_parent(),
                    after_in_child=_forget_in_child)


_PID_LIMIT = 1 << 22   # Linux's largest pid (PID_MAX_LIMIT): a name above it has no process


def _sweep(base: str) -> None:
    """Remove PCH directories of this user's processes that are gone (killed before exit)."""
    import shutil
    uid = os.getuid()
    try:
        names = [n for n in os.listdir(base) if n.startswith(_DIR_PREFIX)]
    except OSError:
        return
    for n in names:
        pid = n[len(_DIR_PREFIX):].split("-", 1)[0]
        path = os.path.join(base, n)
        try:
            if not pid.isascii() or not pid.isdigit() or os.lstat(path).st_uid != uid:
                continue
            if 0 < int(pid) < _PID_LIMIT:
                os.kill(int(pid), 0)
                continue   # its process lives
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)   # its process is gone, or never was one
