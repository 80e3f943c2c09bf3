"""Precompiled headers for NVRTC: made once per prologue on the machine, used by any process.

A compile of a CUB or CCCL kernel spends most of its time parsing headers. NVRTC can save
the state after a source's include prologue (the directives before its first declaration)
as a precompiled header (PCH) and start a later compile from it: ~0.55 s instead of ~1.7 s
for a CUB + cooperative groups + fp16 prologue on the dev machine.

Where: in the cache directory's pch/ (pch_store.py; counted against KJIT_CACHE_SIZE and
LRU-evicted with the entries: kjit/cache/pchdir.py), so that the next process, the next run
of an edited script, starts from it. NVRTC takes a PCH only in a process whose PCH heap
starts where the writer's did: _pchheap.c pins the heap at one address in every process.
Where the cache is off or untrusted, or the pin is unavailable, each process keeps its own,
in a private directory removed at exit (pch_files.py). One process builds a given PCH at a
time (a claim in pch/); the others wait for it, up to BUILD_WAIT_S, and start from it.

When: a compile of a prologue that has a PCH starts from it. One without builds it where it
pays: the second compile of the prologue (in this process, or in any process since: a mark
in pch/ remembers the first), or the first, where kjit.compile_many says more of them follow
in this worker (`expect_repeats`). It is built by that compile itself (`--create-pch` on the
whole source: one compile, no separate build; the binary is the one a plain compile gives),
or, where the source includes more after its prologue or that compile's log holds more than
NVRTC's note, by an observed compile of the prologue alone. The PCH's files are the files its
build read, observed as keys are; each compile that uses it (`--use-pch`) adds those files
to its own observation (observe.add), and its key is the key a compile without the PCH gets.

Never stale: NVRTC does not notice a header edited after its PCH was built (tested), so
before each use, in every process, the PCH's Snapshot is checked (stats, a re-read where a
stat changed, absent paths probed where their directory changed) and a PCH whose files
changed is dropped and built again. A PCH that cannot be built (an error, diagnostics the
later compiles would not repeat, the heap too small twice) or that NVRTC refuses is counted
and the compile runs without it; never an error.

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
import os
import threading
import time
from typing import Any, Iterator, Sequence

from . import pch_files, pch_store
from .prologue import past_prologue, prologue

ENV = "KJIT_PCH"
HEAP_MIN = 512 << 20     # CCCL needs ~336 MB; NVRTC's default (256 MB) only warns when short
BUILD_WAIT_S = 60.0       # the longest a compile waits for another process's build of its PCH
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
           "damaged": 0, "no_space": 0, "loaded": 0, "unpinned": 0, "waited": 0}
_seen: dict[str, int] = {}          # compiles per prologue key in this process
_entries: dict[str, "_Pch"] = {}
_bad: set[str] = set()              # prologues whose PCH could not be built or was refused
_whole: set[str] = set()            # prologues whose PCH is built by a compile of them alone
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
    one for want of room in the temporary directory (no_space); PCHs another process
    made, taken from the cache directory (loaded); stored PCHs this process could not use
    as its heap is not at the pinned address (unpinned); compiles that waited for another
    process's build of their PCH, or ran plain while it was being built (waited)."""
    with _lock:
        return dict(_counts)


def note() -> str | None:
    """How this thread's last NVRTC compile used a PCH ("created", "used") or None; cleared."""
    out, _tls.note = getattr(_tls, "note", None), None
    return out


# --- the PCHs ----------------------------------------------------------------------------------
class _Pch:
    __slots__ = ("path", "snapshot", "obs", "users", "used", "retired", "ident", "store", "key")

    def __init__(self, path: str, snapshot: Any, obs: Any, store: Any = None, key: str = ""):
        self.path, self.snapshot, self.obs = path, snapshot, obs
        self.users = 0
        self.used = 0.0
        self.retired = False
        self.ident = pch_files.ident(path)
        self.store, self.key = store, key   # store: the cache's pch/ it is filed in, else None

    def intact(self) -> bool:
        """The file is the one NVRTC wrote (NVRTC maps it: one cut short ends the process)."""
        return self.ident is not None and pch_files.ident(self.path) == self.ident

    def holds(self) -> bool:
        """The files it was built from are unchanged (contents; a stat change is re-read)."""
        return self.snapshot.holds()

    def observation(self) -> Any:
        """What a compile from this PCH read through it: the prologue compile's observation
        with the stat data the last check found (the contents are the same)."""
        from .keys.observe import Observation
        from .keys.snapshot import PROBED
        out = Observation()
        files = self.snapshot.files
        for path in self.obs.read:
            size, mtime, ctime, ino, sha, racy = files[path]
            out.read[path] = (0, ino, size, mtime, ctime)
            if not racy:   # hashed at this stat by the check just made: keying reuses it
                out.digests[path] = sha
        for path in self.obs.probed:
            size, mtime, ctime, ino, sha, _racy = files[path]
            if sha == PROBED:
                out.probed[path] = (0, ino, size, mtime, ctime)
        out.absent = list(self.obs.absent)
        out.cwd, out.cwd_dependent = self.obs.cwd, self.obs.cwd_dependent
        return out


class Use:
    """One compile's use of a PCH: the flags to put first, the directory the observer
    ignores, and `finish` to read NVRTC's answer from the log. With `create` (a path), the
    compile builds the PCH there as it compiles (`--create-pch` on the whole source)."""

    def __init__(self, pch: _Pch | None, name: str, created: bool, create: str | None = None,
                 build: tuple = ()):
        self.pch, self.created, self.create, self.build = pch, created, create, build
        self._name, self._heap_short = name, False
        path = create or pch.path  # type: ignore[union-attr]
        self.flags = [f"--create-pch={path}" if create else f"--use-pch={path}"]
        self.ignore = (os.path.dirname(path),)
        self.started = time.time()
        word = "creating" if create else "using"
        self._line = f'"{name}": {word} precompiled header file "{path}"\n'

    def finish(self, log: str, prog: Any = None) -> str | None:
        """The log without NVRTC's note that it used the PCH, with the PCH's files added to
        the compile's observation; None where NVRTC did not use it (counted): compile again
        without (or see `again`), so the log holds no PCH warning. `prog`: the program."""
        if self.create:
            return self._created(log, prog)
        if self._line not in log:
            # a stored PCH refused where this process's heap is not at the pinned address is
            # no fault of the PCH's: it stays for the others
            elsewhere = self.pch.store is not None and pch_store.placed() is False
            with _lock:
                if elsewhere:
                    _counts["unpinned"] += 1
                    _state["unpinned"] = True
                else:
                    _counts["rejected"] += 1
                    if _counts["rejected"] >= 2 and not _counts["used"]:  # this NVRTC never takes one
                        _state["off"] = "NVRTC refused every precompiled header"
                for key, ent in list(_entries.items()):
                    if ent is self.pch:
                        if not elsewhere:
                            _bad.add(key)   # plain here; the next process builds it again
                        _retire(key, drop=not elsewhere)
            return None
        from .keys import observe
        observe.add(self.pch.observation())
        with _lock:
            _counts["used"] += 1
        _tls.note = "created" if self.created else "used"
        return log.replace(self._line, "", 1)

    def again(self) -> "Use | None":
        """After finish said None: the compile once more, building the PCH again where its
        heap was too small and could grow; else None (a plain compile)."""
        if not self.create or not self._heap_short:
            return None
        key, store, _, lines = self.build
        with _lock:
            if not _grow_heap():
                _counts["failed"] += 1
                _bad.add(key)
                return None
            path = _new_file(key, store)
            if path is None:
                return None
            return Use(None, self._name, True, create=path,
                       build=(key, store, _state["heap"], lines))

    def _created(self, log: str, prog: Any) -> str | None:
        """The compile that built the PCH as it compiled: its log without NVRTC's note; the
        PCH kept where that compile's observation keys it and NVRTC said nothing else (a
        header's warning would be missing from the logs of the compiles that use it)."""
        key, store, heap, lines = self.build
        path = self.create
        status = _create_status(prog)
        if status == "heap":
            self._heap_short = True
        if status is not None or self._line not in log:
            # not built: the prologue compiled alone decides why, counted there (_build); this
            # compile runs again plain, or, where the heap was short, building it (again())
            _remove(path)
            with _lock:
                _whole.add(key)
            return None
        log = log.replace(self._line, "", 1)
        obs = _last_observation()
        got = None
        if obs is not None and past_prologue(log, self._name, lines) \
                and pch_files.ident(path) is not None:
            from .keys.snapshot import from_observation
            got = from_observation(obs, self.started)
        with _lock:
            if got is None:
                if obs is not None and not past_prologue(log, self._name, lines):
                    _whole.add(key)   # the prologue alone decides (_build): its log is its own
                else:
                    _counts["failed"] += 1   # a header changed as it was read: next time
                _remove(path)
                return log
            if store is not None and not _pinned_here():
                _remove(path)   # made away from the pinned address: no other process could use it
                return log
            if store is not None:
                rec = pch_store.save(store, key, path, got[0], obs, heap)
                if rec is None:
                    _counts["failed"] += 1
                    return log
                ent = _Pch(str(rec.path), rec.snapshot, rec.obs, store, key)
            else:
                ent = _Pch(path, got[0], obs)
            ent.used = time.monotonic()
            _entries[key] = ent
            _counts["created"] += 1
            _counts["used"] += 1
        _tls.note = "created"
        return log


def _create_status(prog: Any) -> str | None:
    """None where NVRTC made the PCH (or cannot say), "heap" where its heap was too small
    (the size it needs noted), else "failed"."""
    if prog is None:
        return None
    from cuda.bindings import nvrtc
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    (status,) = nvrtc.nvrtcGetPCHCreateStatus(prog)
    if status == ok:
        return None
    if status == nvrtc.nvrtcResult.NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED:
        err, need = nvrtc.nvrtcGetPCHHeapSizeRequired(prog)
        _state["need"] = int(need) if err == ok else 0
        return "heap"
    return "failed"


def _last_observation() -> Any:
    """The Observation of the compile this thread recorded last (in the collecting() block
    around it: api's, or attempt's own where api collects none)."""
    from .keys import observe
    sink = getattr(observe._tls, "sink", None)
    return sink[-1] if sink else None


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
        own = None
        if use is not None and use.create:
            from .keys import observe
            if getattr(observe._tls, "sink", None) is None:   # nothing collects: we do
                own = observe.collecting()
                own.__enter__()
        try:
            yield use
        finally:
            if own is not None:
                own.__exit__(None, None, None)
            if use is not None and use.create and use.build[1] is not None:
                pch_store.release(use.build[1], use.build[0])   # filed or not: others go on
            if use is not None and use.pch is not None:
                with _lock:
                    use.pch.users -= 1
                    if use.pch.retired and use.pch.users == 0 and use.pch.store is None:
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
    store = _store()
    key = pch_store.key(text, name, flags, headers)   # all NVRTC is given, and which NVRTC
    for _ in range(2):   # a second time where another process began building it meanwhile
        if store is not None and key not in _entries and pch_store.await_build(store, key, BUILD_WAIT_S):
            with _lock:   # another process built it: this compile starts from it, not beside it
                _counts["waited"] += 1
        use = _use_here(source, name, flags, headers, anchored, text, store, key)
        if use is not _CLAIMED:
            return use
    return None


_CLAIMED = object()   # _use_here: another process claimed the build first


def _use_here(source: str, name: str, flags: Sequence[str], headers: dict,
              anchored: tuple[str, ...], text: str, store: Any, key: str) -> Any:
    with _lock:
        seen = _seen.get(key, 0)
        if len(_seen) > 4096:
            _seen.clear()
        _seen[key] = seen + 1
        ent = _entries.get(key)
        if ent is not None and not ent.intact():
            _retire(key)
            if ent.store is None or pch_store.file_of(ent.store, key) == ent.path:
                _counts["damaged"] += 1   # this compile runs without it; the next builds it again
                if ent.store is not None:
                    pch_store.drop(ent.store, key)
                return None
            ent = None   # another process filed a new one under its name: that one is loaded
        if ent is not None and not ent.holds():
            _counts["stale"] += 1
            _retire(key, drop=True)
            ent = None
        if ent is None and store is not None and key not in _bad:
            ent = _load(store, key)
            if ent is False:
                return None
        created = False
        if ent is None:
            if key in _bad or key in _evicted:
                return None
            if seen == 0 and not expect_repeats.get():
                if store is None or not pch_store.seen(store, key):
                    if store is not None:
                        pch_store.mark_seen(store, key)   # the next compile of it, anywhere, builds
                    return None
            if not _room(building=True, where=store):
                _counts["no_space"] += 1   # tried again at the next compile
                return None
            if store is not None and not pch_store.claim(store, key):
                return _CLAIMED   # another process builds it now: wait for it
            if key not in _whole and not _includes_later(source, text):
                path = _new_file(key, store)
                if path is None:
                    if store is not None:
                        pch_store.release(store, key)
                    return None
                heap = _heap()
                return Use(None, name, True, create=path, build=(key, store, heap, text.count("\n")))
            try:
                ent = _build(key, text, name, flags, headers, anchored, store)
            finally:
                if store is not None:
                    pch_store.release(store, key)
            if ent is None:
                return None
            created = True
        elif not _room(building=False, where=store):
            _counts["no_space"] += 1
            return None
        if ent.store is not None:
            pch_store.touch(ent.store, key)
        ent.users += 1
        ent.used = time.monotonic()
        return Use(ent, name, created)


def _includes_later(source: str, text: str) -> bool:
    """Whether the source may read a header after its prologue (an #include, __has_include):
    a PCH built by its compile would hold those files too, and the compiles using it would
    be keyed by them."""
    return "include" in source[len(text) - 1:]


def _store() -> Any:
    """The cache's pch/ where PCHs are shared across processes (the heap pinned), else None."""
    if _state.get("unpinned") or _state.get("nostore"):
        return None
    d = pch_store.directory()
    if d is None:
        return None
    if _state.get("pinned") is None:
        try:   # the private directories killed processes left (pch_files.make_dir sweeps too)
            import tempfile
            pch_files.sweep(tempfile.gettempdir(), _DIR_PREFIX)
        except Exception:
            pass
        from .facts import loaded_nvrtc
        try:
            loaded_nvrtc()
            _state["pinned"] = pch_store.pin(max(_state["heap"], HEAP_MIN))
        except Exception:
            _state["pinned"] = False
        if not _state["pinned"]:
            _state["nostore"] = True
            return None
    if pch_store.placed() is False:   # the range was taken: PCHs here serve this process only
        _state["unpinned"] = True
        return None
    return d


def _load(store: Any, key: str) -> Any:
    """Another process's PCH of this prologue, checked (under _lock): a _Pch, None where there
    is none usable (a stale or damaged one is dropped, counted), False where one is there
    but this process cannot use it now (its heap too small, and already mapped)."""
    rec = pch_store.load(store, key)
    if rec is None:
        return None
    try:
        ok = rec.snapshot.check()
    except (OSError, TypeError, ValueError, IndexError, AttributeError):
        ok = False
    if not ok:
        _counts["stale"] += 1
        pch_store.drop(store, key)
        return None
    if rec.snapshot.updated:
        pch_store.refresh(rec, key)
    if rec.heap > _heap():
        if pch_store.placed() is not None or not _set_heap(rec.heap):
            return False
    ent = _entries[key] = _Pch(str(rec.path), rec.snapshot, rec.obs, store, key)
    _counts["loaded"] += 1
    return ent


def _new_file(key: str, store: Any) -> str | None:
    """Where the next PCH file goes: the cache's pch/ (a new name per build), else this
    process's private directory, making room there first; None (counted) where neither is."""
    if store is not None:
        return pch_store.new_path(store, key)
    d = _private_dir()
    if d is None:
        _counts["failed"] += 1
        return None
    _evict()
    _state["serial"] += 1
    return os.path.join(d, f"{_state['serial']}.pch")


def _build(key: str, text: str, name: str, flags: Sequence[str], headers: dict,
           anchored: tuple[str, ...], store: Any = None) -> _Pch | None:
    """Compile the prologue alone, observed, writing its PCH (under _lock)."""
    from .keys.snapshot import from_observation
    path = _new_file(key, store)
    if path is None:
        return None
    for _ in range(2):
        _heap()
        started = time.time()
        outcome = _compile_prologue(text, name, [f"--create-pch={path}"] + list(flags), headers,
                                    anchored, (os.path.dirname(path),))
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
    if store is not None and not _pinned_here():
        _remove(path)
        return None
    if store is not None:
        rec = pch_store.save(store, key, path, got[0], obs, _state["heap"])
        if rec is None:
            _counts["failed"] += 1
            return None
        ent = _entries[key] = _Pch(str(rec.path), rec.snapshot, rec.obs, store, key)
    else:
        ent = _entries[key] = _Pch(path, got[0], obs)
    _counts["created"] += 1
    return ent


def _pinned_here() -> bool:
    """Whether the PCH just made had NVRTC's heap at the pinned address (under _lock); where
    not, this process's PCHs stay out of the cache's pch/ from now on (counted)."""
    if pch_store.placed() is True:
        return True
    _counts["unpinned"] += 1
    _state["unpinned"] = True
    return False


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


def _room(building: bool, where: Any = None) -> bool:
    return pch_files.room(max(_state["heap"], HEAP_MIN),
                          str(where) if where is not None else _state["dir"], building)


def _heap() -> int:
    """The PCH heap's size, raised to HEAP_MIN before the first PCH (resizing it later
    invalidates every PCH this process made)."""
    if not _state["heap"]:
        from cuda.bindings import nvrtc
        err, size = nvrtc.nvrtcGetPCHHeapSize()
        size = int(size) if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else 0
        if size >= HEAP_MIN or not _set_heap(HEAP_MIN):
            _state["heap"] = size
            if _state.get("pinned"):
                pch_store.pin(size)
    return _state["heap"]


def _set_heap(size: int) -> bool:
    """The heap's size set to `size` (before its first mapping: another process's PCH needs
    a heap at least as large as the one it was made with), the pin moved with it."""
    from cuda.bindings import nvrtc
    if nvrtc.nvrtcSetPCHHeapSize(size)[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return False
    _state["heap"] = size
    if _state.get("pinned"):
        pch_store.pin(size)
    return True


def _grow_heap() -> bool:
    """Resize the heap to what NVRTC said it needs, where no compile is using a PCH: the
    PCHs made so far become unusable, so they go."""
    need = _state.get("need", 0)
    if need <= _state["heap"] or any(e.users for e in _entries.values()):
        return False
    if not _set_heap(-(-int(need * 1.25) // (64 << 20)) * (64 << 20)):
        return False
    for key in list(_entries):
        _retire(key)
    return True


def _retire(key: str, drop: bool = False) -> None:
    """Forget a PCH in this process; its file goes where it is this process's own, and a
    stored one's with its record where `drop` (stale, damaged, refused)."""
    ent = _entries.pop(key, None)
    if ent is not None:
        ent.retired = True
        if ent.store is not None:
            if drop and pch_store.file_of(ent.store, key) == ent.path:   # not another's since
                pch_store.drop(ent.store, key)
        elif ent.users == 0:
            _remove(ent.path)


def _evict() -> None:
    """Keep at most MAX_KEPT - 1 PCHs before a new one (the least recently used go). A
    prologue whose PCH went is not given another: prologues taking turns would otherwise
    each pay for a new PCH at every turn."""
    own = {k: e for k, e in _entries.items() if e.store is None}   # the cache's are the cache's
    idle = sorted((e.used, k) for k, e in own.items() if e.users == 0)
    for _, key in idle[:max(0, len(own) - MAX_KEPT + 1)]:
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


def files() -> list[str]:
    """The files of the PCHs this process knows (its own, and the cache's it used)."""
    with _lock:
        return [e.path for e in _entries.values()]


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
