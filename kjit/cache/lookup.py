"""The lookup: this process's memory layer, then the checked disk entry, then (under a per-key
lock) the shared tier if one is configured (kjit.cache.shared), then create and store.
Also `peek`, a lookup that never creates, and the listeners' events (kjit.cache.events)."""
from __future__ import annotations

import atexit
import sys
import threading
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Mapping

from . import events
from .entry import CorruptEntry, encode
from .disk import CacheWarning, DiskStore, Unavailable
from .key import key_hash, sha256
from .readonly import open_store
from ..locations import ENV_CACHE_DIR as ENV_DIR, cache_dir, cache_dirs
from ..objectcode import ObjectCode
from ..settings import cache_enabled, check_settings, env_raw, env_switch, env_text, memory_limit

ENV_ENABLE = "KJIT_CACHE"
ENV_SAVE_SOURCE = "KJIT_CACHE_SAVE_SOURCE"
ENV_REMOTE = "KJIT_REMOTE_CACHE"   # remote.ENV_URL, read here so a miss without it imports nothing
FLUSH_INTERVAL_S = 30.0


class MemoryLayer:
    """Recently used ObjectCodes by key, bounded in bytes (KJIT_CACHE_MEMORY_SIZE), LRU."""

    def __init__(self, limit: int | None = None):
        if limit is None:
            limit = memory_limit()
        self.limit = limit
        self._items: OrderedDict[str, ObjectCode] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()   # threads hitting one key at once must not count it twice

    def get(self, key: str) -> ObjectCode | None:
        with self._lock:
            obj = self._items.get(key)
            if obj is not None:
                self._items.move_to_end(key)
            return obj

    def put(self, key: str, obj: ObjectCode) -> None:
        with self._lock:
            self._drop(key)
            if len(obj.code) > self.limit:
                return
            self._items[key] = obj
            self._bytes += len(obj.code)
            while self._bytes > self.limit:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= len(dropped.code)

    def discard(self, key: str) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= len(old.code)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)


class Cache:
    """One cache directory as this process sees it: memory layer + disk store."""

    def __init__(self, path: Path, dirs: list[Path] | None = None):
        check_settings()  # a bad KJIT_CACHE_* is an error on a hit and on a miss alike
        # DiskStore, or readonly.Layered when a listed directory is read-only
        self.disk: DiskStore | None = open_store(dirs or [path])
        self.path = self.disk.path  # where new results go
        self.memory = MemoryLayer()
        self.pending_hits: dict[str, int] = {}  # hits not yet counted on disk
        # Hits reach the usage database at exit, before `kjit cache` reads it, and at most
        # every FLUSH_INTERVAL_S: a write on every disk hit would sit between a fresh
        # process and its first launch.
        self.next_flush = time.monotonic() + FLUSH_INTERVAL_S
        self.session = {"memory_hits": 0, "disk_hits": 0, "misses": 0, "corrupt": 0, "remote_hits": 0,
                        "unstorable": 0}
        self._warned: set[str] = set()

    def warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(message, CacheWarning, stacklevel=4)

    def unusable(self, exc: Exception, namespace: str, key: str, label: str) -> None:
        """The disk cannot be used: one warning, then memory-only for this directory."""
        self.disk = None
        self.warn_once("unavailable",
                       f"kjit cache directory {self.path} cannot be used ({exc}); caching in memory "
                       f"only for this process. Set {ENV_DIR} to a writable directory, or "
                       f"{ENV_ENABLE}=0 to silence this.")
        if events.active():
            events.emit(events.CacheEvent(events.UNAVAILABLE, namespace, key, label, detail=str(exc)))

    def flush_hits(self) -> None:
        self.next_flush = time.monotonic() + FLUSH_INTERVAL_S
        used = sys.modules.get(f"{__package__}.shared")   # loaded only by a local miss
        if self.disk is not None and used is not None:
            used.flush_counts(self.disk)  # the shared tier's counts, if it was used
        if self.pending_hits and self.disk is not None:
            counts, self.pending_hits = self.pending_hits, {}
            try:
                self.disk.record_hits(counts)
            except Exception:  # counters are best effort
                pass


_caches: dict[str, Cache] = {}


def current() -> Cache:
    """The Cache for the current $KJIT_CACHE_DIR (tests and users may change it at run time)."""
    env = env_raw(ENV_DIR) or ""
    c = _caches.get(env)
    if c is None:
        c = _caches[env] = Cache(cache_dir(), cache_dirs())
    return c


@atexit.register
def _flush_all() -> None:
    for c in list(_caches.values()):
        c.flush_hits()


def enabled_by_env() -> bool:
    return cache_enabled()


def get_or_create(namespace: str, key: Mapping[str, Any], create: Callable[[], ObjectCode], *,
                  enabled: bool = True, label: str = "",
                  meta: Mapping[str, Any] | None = None) -> ObjectCode:
    """The cached ObjectCode for (namespace, key), else `create()` stored under it.

    key: a JSON-able description of everything that determines the result. The result's
    `cache_hit` is True (memory or disk), False (created now) or None (caching off:
    enabled=False or KJIT_CACHE=0). `meta` adds JSON metadata shown by `kjit cache show`
    (a "source" item is kept only with KJIT_CACHE_SAVE_SOURCE=1; its digest always).
    """
    if not enabled or not enabled_by_env():
        return bypass(namespace, create, label)
    return lookup_hashed(key_hash(namespace, key), namespace, create, label=label,
                         meta=dict(meta or {}, key=key))


def bypass(namespace: str, create: Callable[[], ObjectCode], label: str = "") -> ObjectCode:
    t0 = time.perf_counter()
    obj = create().with_(cache_hit=None)
    if events.active():
        dt = time.perf_counter() - t0
        events.emit(events.CacheEvent(events.BYPASS, namespace, "", label, dt, dt, size=len(obj.code)))
    return obj


class Made:
    """A create() for a result made before its key was known (an observed compile: the key
    comes from what it read); `made_s` is how long the making took, for the entry's
    metadata and events."""

    def __init__(self, obj: ObjectCode, made_s: float):
        self.obj, self.made_s = obj, made_s

    def __call__(self) -> ObjectCode:
        return self.obj


def creation_lock(name: str) -> Any:
    """The cross-process lock a PendingKey's result is made under, before its key is known
    (lookup_hashed; kjit.compiler's compile_key, which stores no result), so that processes
    making one result make it once (a nullcontext without a usable disk)."""
    import contextlib
    disk = current().disk
    if disk is None:
        return contextlib.nullcontext(0.0)
    return _SafeLock(disk, name)


class _SafeLock:
    """disk.lock(name), or nothing if the disk cannot lock (caching then degrades as usual)."""

    def __init__(self, disk: Any, name: str):
        self.cm = disk.lock(name)

    def __enter__(self) -> float:
        try:
            return self.cm.__enter__()
        except Unavailable:
            self.cm = None
            return 0.0

    def __exit__(self, *exc: Any) -> None:
        if self.cm is not None:
            self.cm.__exit__(*exc)


def unstorable(namespace: str, label: str = "") -> None:
    """Count a result returned but not stored, because what made it changed while it was made
    (`kjit cache stats`: "unstorable")."""
    c = current()
    c.session["unstorable"] += 1
    store = getattr(c.disk, "top", c.disk)  # readonly.Layered: its writable directory
    if store is None or getattr(store, "read_only", False):
        return
    try:
        with store.usage.transact():
            store.usage.incr(UNSTORABLE_STAT, 1)
    except Exception:  # counters are best effort
        pass


UNSTORABLE_STAT = "stat:unstorable"


class PendingKey:
    """A key that may be known only once its result is made: an observed compile's key names
    the files the compile read. Given one whose `key` is None, lookup_hashed holds the
    cross-process lock named `lock` while settle() looks for the key once more (another
    process may have made it known meanwhile) and, if it is still unknown, while create()
    makes the result and finish(result) gives its key (None: the result is returned, never
    stored, and counted as unstorable). The lookup then goes on under that key as any does,
    the result made standing in for create(): an entry already there wins. close(stored) is
    called last, with whether the lookup ended with a result."""

    key: str | None = None
    lock = ""

    def settle(self) -> str | None:
        return None

    def finish(self, obj: ObjectCode) -> str | None:
        raise NotImplementedError

    def close(self, stored: bool) -> None:
        pass


def lookup_hashed(k: str | PendingKey, namespace: str, create: Callable[[], ObjectCode], *,
                  label: str = "",
                  meta: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
                  t0: float | None = None, check: Callable[[], None] | None = None) -> ObjectCode:
    """get_or_create with the key already hashed (kjit.compile memoises the hash), or a
    PendingKey whose result makes it. `check`, called after create() for a key known
    before, raises to keep the result from being stored (its inputs changed)."""
    if t0 is None:
        t0 = time.perf_counter()
    pending = None
    if isinstance(k, PendingKey):   # a PendingKey
        pending, k = k, k.key
        if k is None:
            try:
                with creation_lock(pending.lock):
                    k = pending.settle()
                    if k is None:   # made first: its key comes from the making
                        t1 = time.perf_counter()
                        obj = create()   # called here, not in a helper: the compile is one frame below
                        create, check = Made(obj, time.perf_counter() - t1), None
                        k = pending.finish(obj)
            except BaseException:
                pending.close(False)
                raise
            if k is None:   # what made it changed meanwhile
                pending.close(False)
                unstorable(namespace, label)
                return obj.with_(cache_hit=None)
    c = current()
    try:
        obj = c.memory.get(k)
        if obj is not None:
            c.session["memory_hits"] += 1
            c.pending_hits[k] = c.pending_hits.get(k, 0) + 1
            if events.active():
                events.emit(events.CacheEvent(events.MEMORY_HIT, namespace, k, label,
                                              time.perf_counter() - t0, size=len(obj.code)))
        else:
            with _Miss(c, k, namespace, label, t0) as miss:
                obj = miss.found   # on disk, or made by another process or node meanwhile
                if obj is None:
                    t1 = time.perf_counter()
                    obj = create()   # called here, not in a helper: the compile is one frame below
                    if check is not None:
                        check()
                    obj = miss.store(obj, getattr(create, "made_s", None) or time.perf_counter() - t1,
                                     meta)
    except BaseException:
        if pending is not None:
            pending.close(False)
        raise
    if pending is not None:
        pending.close(True)
    return obj


class _Miss:
    """A lookup that missed memory, as a block around create(): entering reads the checked
    disk entry, else takes the key's lock (another process may be creating it; a disk hit
    never loads the shared tier's modules), then asks the shared tier if one is configured
    (its value, or its lease to create under). `found` is then the result, or None: the
    caller creates, and store() keeps the result in memory, on disk and in the tier.
    Leaving gives up the lease (telling the cluster when create() failed) and the lock."""

    def __init__(self, c: Cache, k: str, namespace: str, label: str, t0: float):
        self.c, self.k, self.namespace, self.label, self.t0 = c, k, namespace, label, t0
        self.disk: Any = c.disk
        self.found: ObjectCode | None = None
        self.tier: Any = None
        self.lease: Any = None
        self.lock: Any = None
        self.waited = 0.0

    def __enter__(self) -> "_Miss":
        try:
            self._enter()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _enter(self) -> None:
        c, k, disk = self.c, self.k, self.disk
        if disk is not None:
            try:
                found = _read(c, disk, k, self.namespace, self.label)
                if found is None:
                    lock = disk.lock(k)
                    self.waited = lock.__enter__()
                    self.lock = lock
                    found = _read(c, disk, k, self.namespace, self.label)
                if found is not None:
                    self.found = _hit(c, k, found, self.namespace, self.label, self.t0, self.waited)
                    return
            except Unavailable as exc:
                self._unlock(None)
                self.disk = None
                c.unusable(exc, self.namespace, k, self.label)
        self.tier = shared_tier()  # None unless KJIT_REMOTE_CACHE is set
        if self.tier is None:
            return
        claim = self.tier.claim(k, self.label or self.namespace)
        self.waited += claim.waited
        self.lease = claim.lease
        if claim.obj is not None:
            self._remote_hit(claim.obj, claim.meta)

    def _remote_hit(self, obj: ObjectCode, meta: Any) -> None:
        """The tier's value, checked: kept on the local disk too."""
        c = self.c
        if self.disk is not None:
            try:
                self.disk.put(self.k, obj, meta)
            except Unavailable as exc:
                c.unusable(exc, self.namespace, self.k, self.label)
        c.memory.put(self.k, obj)
        c.session["remote_hits"] += 1
        if events.active():
            events.emit(events.CacheEvent(events.REMOTE_HIT, self.namespace, self.k, self.label,
                                          time.perf_counter() - self.t0, wait_s=self.waited,
                                          size=len(obj.code)))
        self.found = obj

    def store(self, obj: ObjectCode, create_s: float, meta: Any) -> ObjectCode:
        c, k, namespace, label, disk = self.c, self.k, self.namespace, self.label, self.disk
        if not isinstance(obj, ObjectCode):
            raise TypeError(f"cache create() for {namespace!r} returned {type(obj).__name__}, not ObjectCode")
        c.session["misses"] += 1
        stored = obj.with_(cache_hit=True)
        c.memory.put(k, stored)
        if self.tier is not None or disk is not None:
            entry_meta = _entry_meta(obj, namespace, label, meta, create_s)
        if self.tier is not None:  # the same bytes to both tiers: the cluster first, it is waiting
            self.tier.publish(k, encode(k, stored, entry_meta))
        if disk is not None:
            try:
                disk.put(k, stored, entry_meta)
                disk.record_miss()
            except Unavailable as exc:
                c.unusable(exc, namespace, k, label)
        if events.active():
            events.emit(events.CacheEvent(events.MISS, namespace, k, label, time.perf_counter() - self.t0,
                                          create_s, self.waited, size=len(obj.code)))
        return obj.with_(cache_hit=False)

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if self.lease is not None:
            try:
                if kind is not None and issubclass(kind, Exception):
                    self.tier.abandon(self.k)  # the others stop waiting for us
            finally:
                self.lease.release()
                self.lease = None
        self._unlock((kind, exc, tb))

    def _unlock(self, exc_info: Any) -> None:
        if self.lock is not None:
            lock, self.lock = self.lock, None
            lock.__exit__(*(exc_info or (None, None, None)))


def shared_tier() -> Any:
    """The shared tier, if configured (else None); its modules (and urllib, the client) load
    on a miss that has one configured."""
    if env_text(ENV_REMOTE) is None:
        return None
    from . import shared
    return shared.active()


def _read(c: Cache, disk: DiskStore, k: str, namespace: str, label: str) -> ObjectCode | None:
    try:
        got = disk.get(k)
    except CorruptEntry as exc:
        disk.delete(k)
        c.session["corrupt"] += 1
        c.warn_once("corrupt:" + k,
                    f"kjit cache entry {k[:16]}… ({label or namespace}) was corrupt ({exc}); "
                    f"dropped it and will rebuild it")
        if events.active():
            events.emit(events.CacheEvent(events.CORRUPT, namespace, k, label, detail=str(exc)))
        return None
    return None if got is None else got[0]


def _hit(c: Cache, k: str, obj: ObjectCode, namespace: str, label: str, t0: float,
         waited: float) -> ObjectCode:
    c.memory.put(k, obj)
    c.session["disk_hits"] += 1
    c.pending_hits[k] = c.pending_hits.get(k, 0) + 1
    if time.monotonic() >= c.next_flush:
        c.flush_hits()
    if events.active():
        events.emit(events.CacheEvent(events.DISK_HIT, namespace, k, label, time.perf_counter() - t0,
                                      wait_s=waited, size=len(obj.code)))
    return obj


def _entry_meta(obj: ObjectCode, namespace: str, label: str, meta: Any, create_s: float) -> dict[str, Any]:
    extra = dict((meta() if callable(meta) else meta) or {})
    source = extra.pop("source", None)
    try:
        kernels = list(obj.entry_points)
    except Exception:
        kernels = []
    out: dict[str, Any] = {
        "namespace": namespace, "label": label or obj.name, "kind": obj.kind, "arch": obj.arch,
        "size": len(obj.code), "kernels": kernels, "symbols": dict(obj.symbols),
        "name": obj.name, "created": time.time(), "create_ms": round(create_s * 1e3, 3),
        "compiler": obj.metadata.get("compiler"), "options": obj.metadata.get("options"),
        "log_size": len(obj.log),
    }
    if source is not None:
        # a caller whose key describes the source passes its digest: hashed once per miss
        out["source_sha256"] = extra.pop("source_sha256", None) or sha256(source)
        if env_switch(ENV_SAVE_SOURCE):
            out["source"] = source
    out.update(extra)
    return out


def peek(h: str, namespace: str = "", label: str = "") -> ObjectCode | None:
    """A lookup that never creates: the entry stored under hashed key `h`, or None. Memory,
    the checked disk entry, then the signed shared tier (what is found below is copied up);
    for small records kept beside compiled code (tuning results). A hit counts as a use, so
    pruning keeps records still in use. A damaged entry is dropped (and made again by the
    caller), an unreachable server backs off as for any request."""
    if not enabled_by_env():
        return None
    c = current()
    obj = c.memory.get(h)
    if obj is None and c.disk is not None:
        try:
            obj = _read(c, c.disk, h, namespace, label)
        except Unavailable:
            obj = None
    if obj is not None:
        c.pending_hits[h] = c.pending_hits.get(h, 0) + 1
        c.memory.put(h, obj)
        return obj
    tier = shared_tier()
    got = tier.fetch(h) if tier is not None else None
    if got is None:
        return None
    obj, meta = got
    if c.disk is not None:
        try:
            c.disk.put(h, obj, meta)
        except Exception:
            pass
    c.memory.put(h, obj)
    return obj
