"""The on-disk store: diskcache (SQLite + files) holding only bytes, strings and numbers.

Layout under cache_dir():
  entries/  diskcache.Cache key -> entry bytes (kjit.cache.entry), LRU-evicted at the size limit
  usage/    diskcache.Cache "meta:K" -> JSON text, "hits:K" -> int, "used:K" -> float,
            "stat:hits" / "stat:misses" -> int (kept apart so listing never touches LRU order)
  locks/    one lock file per key being created (flock: released when a process dies)
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import diskcache

from . import entry as entry_mod
from ..objectcode import ObjectCode

ENV_DIR = "KJIT_CACHE_DIR"
ENV_SIZE = "KJIT_CACHE_SIZE"
DEFAULT_SIZE = 1 << 30

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
          "tib": 1 << 40}


class CacheWarning(UserWarning):
    """The cache could not be used as asked (read-only or full disk, corrupt entry); kjit went on."""


def cache_dir() -> Path:
    """$KJIT_CACHE_DIR, else the per-user cache directory (XDG on Linux)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "kjit" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "kjit"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kjit"


def parse_size(text: str | int) -> int:
    """'1G', '512MiB', '1048576' -> bytes; ValueError names the accepted forms."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"size {text!r} is not a size: use bytes or a number with K, M, G or T (e.g. 512M)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def size_limit() -> int:
    env = os.environ.get(ENV_SIZE)
    if not env:
        return DEFAULT_SIZE
    try:
        return parse_size(env)
    except ValueError as exc:
        from ..errors import InvalidOptionError
        raise InvalidOptionError(f"{ENV_SIZE}: {exc}") from None


class SafeDisk(diskcache.Disk):
    """diskcache's Disk that refuses to pickle or unpickle: a poisoned database row can
    cost a recompile, never run code."""

    def put(self, key):
        if type(key) is not str:
            raise TypeError("kjit cache keys are strings")
        return super().put(key)

    def get(self, key, raw):
        if not raw:
            raise entry_mod.CorruptEntry("pickled key in the cache database")
        return super().get(key, raw)

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if type(value) not in (bytes, str, int, float):
            raise TypeError("kjit cache values are bytes, str or numbers")
        return super().store(value, read, key)

    def fetch(self, mode, filename, value, read):
        if mode == diskcache.core.MODE_PICKLE:
            raise entry_mod.CorruptEntry("pickled value in the cache database")
        return super().fetch(mode, filename, value, read)


class Unavailable(Exception):
    """The directory cannot hold a cache (read-only, not a directory, full)."""


class DiskStore:
    """One cache directory. Opened lazily; every public method may raise Unavailable."""

    def __init__(self, path: Path):
        self.path = path
        self._entries: diskcache.Cache | None = None
        self._usage: diskcache.Cache | None = None

    # --- opening ----------------------------------------------------------------------
    def _open(self, name: str, size: int) -> diskcache.Cache:
        """One of the two databases; each opens on first use (a disk hit needs only entries)."""
        try:
            if not self.path.is_dir():
                self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(self.path, 0o700)  # mkdir's mode is masked by the umask
            # Eviction is ours (evict_lru): diskcache's culls ten entries at a time and its
            # access times miss the hits served from memory.
            return diskcache.Cache(str(self.path / name), size_limit=size, disk=SafeDisk,
                                   eviction_policy="none", statistics=False, timeout=60)
        except (OSError, sqlite3.Error) as exc:
            raise Unavailable(f"{self.path}: {exc}") from exc

    @property
    def entries(self) -> diskcache.Cache:
        if self._entries is None:
            self._entries = self._open("entries", size_limit())
        return self._entries

    @property
    def usage(self) -> diskcache.Cache:
        if self._usage is None:
            self._usage = self._open("usage", 1 << 62)
        return self._usage

    def close(self) -> None:
        for c in (self._entries, self._usage):
            if c is not None:
                c.close()
        self._entries = self._usage = None

    # --- entries ------------------------------------------------------------------------
    def get(self, key: str) -> tuple[ObjectCode, dict[str, Any]] | None:
        """The checked entry for key, None if absent; CorruptEntry if it fails a check
        (the caller drops it)."""
        try:
            blob = self.entries.get(key)
        except entry_mod.CorruptEntry:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise Unavailable(str(exc)) from exc
        if blob is None:
            return None
        return entry_mod.decode(blob, key)

    def put(self, key: str, obj: ObjectCode, meta: dict[str, Any]) -> None:
        self._store(key, entry_mod.encode(key, obj, meta), meta)

    def put_blob(self, key: str, blob: bytes) -> dict[str, Any]:
        """Store already-encoded bytes after checking them (import)."""
        header, _ = entry_mod.decode_header(blob, key)
        meta = header.get("meta") or {}
        self._store(key, blob, meta)
        return meta

    def _store(self, key: str, blob: bytes, meta: dict[str, Any]) -> None:
        try:
            self.entries.set(key, blob)
            self.usage.set("meta:" + key, json.dumps(meta, sort_keys=True, default=str))
            self.usage.set("used:" + key, time.time())
            self.evict_lru(self.size_limit, keep=key)
        except (OSError, sqlite3.Error) as exc:
            raise Unavailable(str(exc)) from exc

    def get_blob(self, key: str) -> bytes | None:
        return self.entries.get(key)

    def delete(self, key: str) -> None:
        with contextlib.suppress(OSError, sqlite3.Error):
            self.entries.delete(key)
        for prefix in ("meta:", "hits:", "used:"):
            with contextlib.suppress(OSError, sqlite3.Error):
                self.usage.delete(prefix + key)

    def keys(self) -> list[str]:
        return [k for k in self.entries.iterkeys() if isinstance(k, str)]

    def contains(self, key: str) -> bool:
        return key in self.entries

    def meta(self, key: str) -> dict[str, Any] | None:
        """Entry metadata plus usage (hits, last_used), without touching LRU order."""
        text = self.usage.get("meta:" + key)
        meta: dict[str, Any] | None = None
        if isinstance(text, str):
            with contextlib.suppress(ValueError):
                meta = json.loads(text)
        if meta is None:  # imported by an older kjit, or the usage db was lost: read the entry
            blob = self.entries.get(key)
            if blob is None:
                return None
            try:
                header, _ = entry_mod.decode_header(blob, key)
            except entry_mod.CorruptEntry:
                return None
            meta = header.get("meta") or {}
        meta["key"] = key
        meta["hits"] = int(self.usage.get("hits:" + key, 0) or 0)
        meta["last_used"] = self.usage.get("used:" + key) or meta.get("created")
        return meta

    # --- usage counters -------------------------------------------------------------------
    def record_hits(self, counts: dict[str, int]) -> None:
        now = time.time()
        with self.usage.transact():
            for key, n in counts.items():
                self.usage.incr("hits:" + key, n)
                self.usage.set("used:" + key, now)
            self.usage.incr("stat:hits", sum(counts.values()))

    def record_miss(self) -> None:
        self.usage.incr("stat:misses")

    def totals(self) -> tuple[int, int]:
        return int(self.usage.get("stat:hits", 0) or 0), int(self.usage.get("stat:misses", 0) or 0)

    def forget_orphans(self) -> None:
        """Drop usage rows whose entry was evicted."""
        live = set(self.keys())
        for k in list(self.usage.iterkeys()):
            if isinstance(k, str) and ":" in k and not k.startswith("stat:"):
                if k.split(":", 1)[1] not in live:
                    self.usage.delete(k)

    # --- maintenance ------------------------------------------------------------------------
    def clear(self) -> int:
        n = len(self.keys())
        self.entries.clear()
        self.usage.clear()
        for f in (self.path / "locks").glob("*.lock") if (self.path / "locks").is_dir() else ():
            with contextlib.suppress(OSError):
                f.unlink()
        return n

    def volume(self) -> int:
        """Bytes on disk: the SQLite file plus the value files."""
        return int(self.entries.volume())

    @property
    def size_limit(self) -> int:
        return size_limit()

    def evict_lru(self, limit: int, keep: str | None = None) -> list[str]:
        """Delete least-recently-used entries until volume() <= limit; `keep` (the entry just
        written) goes last. Cheap when under the limit: one SQL query."""
        if self.volume() <= limit:
            return []
        order = sorted(self.keys(), key=lambda k: (k == keep, self.usage.get("used:" + k) or 0.0))
        removed = []
        for k in order:
            if self.volume() <= limit:
                break
            self.delete(k)
            removed.append(k)
        return removed

    # --- cross-process lock per key ------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[float]:
        """Hold the creation lock for `key`; yields the seconds spent waiting for it."""
        self.entries   # opened (and the directory made) first: Unavailable if it cannot be
        t0 = time.perf_counter()
        try:
            import fcntl
        except ImportError:  # Windows: no cross-process de-duplication, still correct
            yield 0.0
            return
        try:
            (self.path / "locks").mkdir(mode=0o700, exist_ok=True)
            fd = os.open(self.path / "locks" / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            yield 0.0
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield time.perf_counter() - t0
        finally:
            os.close(fd)  # closing releases the flock
