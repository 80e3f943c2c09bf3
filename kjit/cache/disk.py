"""The on-disk store: diskcache (SQLite + files) holding only bytes, strings and numbers.
Read-only directories and layering over them: kjit.cache.readonly.

Layout under cache_dir():
  entries/  diskcache.Cache key -> entry bytes (kjit.cache.entry), LRU-evicted at the size limit
  usage/    diskcache.Cache "meta:K" -> JSON text, "hits:K" -> int, "used:K" -> float,
            "size:K" -> int (code bytes; absent for entries an older kjit wrote),
            "stat:hits" / "stat:misses" -> int (kept apart so listing never touches LRU order)
  locks/    one lock file per key being created (flock: released when a process dies)
  headers/  manifests: which key a source's headers gave, by their stat data
            (kjit.compiler.keys.manifest; removed with the entries)
  pch/      precompiled headers and their records (kjit.cache.pchdir, kjit.compiler.pch):
            counted against the size limit with the entries, LRU-evicted with them
  native/   the tensor reader built against the installed PyTorch (kjit.runtime.torch_facts),
            one small library per PyTorch build
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from . import entry as entry_mod
from . import trust
from ..settings import size_limit
from .tables import Table, delete_rows, leave_wal_at_close, safe_disk, sqlite3
from ..objectcode import ObjectCode

if TYPE_CHECKING:
    import diskcache

USAGE_PREFIXES = ("meta:", "hits:", "used:", "size:")  # one usage row of each per entry


class CacheWarning(UserWarning):
    """The cache could not be used as asked (read-only or full disk, corrupt entry); kjit went on."""


def _busy() -> type[Exception]:
    """diskcache's Timeout (a database busy past its timeout), for best-effort writes; asked
    only once diskcache is in use, so a disk hit never imports it."""
    from diskcache import Timeout
    return Timeout


class Unavailable(Exception):
    """The directory cannot hold a cache (read-only, not a directory, full)."""


class StoreReads:
    """What every store answers the same way, given tables() (entries, usage): reads for
    `kjit cache` that skip rows kjit cannot read instead of failing on them."""

    read_only = False

    def tables(self) -> tuple[Table, Table]:
        raise NotImplementedError

    def get_blob(self, key: str) -> bytes | None:
        """The stored bytes (unchecked); CorruptEntry for a value kjit did not write."""
        value = self.tables()[0].get(key)
        if value is not None and not isinstance(value, bytes):
            raise entry_mod.CorruptEntry(f"value is {type(value).__name__}, not bytes")
        return value

    def keys(self) -> list[str]:
        """Every entry's key; rows kjit cannot read are left out (see foreign_rows)."""
        return self.tables()[0].keys()

    def contains(self, key: str) -> bool:
        return self.tables()[0].contains(key)

    def meta(self, key: str) -> dict[str, Any] | None:
        """Entry metadata plus usage (hits, last_used), without touching LRU order."""
        usage = self.tables()[1]
        meta: dict[str, Any] | None = None
        with contextlib.suppress(entry_mod.CorruptEntry, ValueError, TypeError, RecursionError):
            meta = json.loads(usage.get("meta:" + key))
        if not isinstance(meta, dict):  # imported by an older kjit, or the usage db was lost
            try:
                blob = self.get_blob(key)
                if blob is None:
                    return None
                header, _ = entry_mod.decode_header(blob, key)
            except entry_mod.CorruptEntry:
                return None
            meta = header.get("meta") if isinstance(header.get("meta"), dict) else {}
        hits, used = usage.get_number("hits:" + key), usage.get_number("used:" + key)
        meta["key"] = key
        meta["hits"] = int(hits or 0)
        meta["last_used"] = used or meta.get("created")
        return meta

    def foreign_rows(self) -> int:
        """How many rows of either database kjit cannot read (pickled keys or values)."""
        entries, usage = self.tables()
        return entries.count_foreign() + usage.count_foreign()

    def totals(self) -> tuple[int, int]:
        usage = self.tables()[1]
        return int(usage.get_number("stat:hits") or 0), int(usage.get_number("stat:misses") or 0)

    @property
    def size_limit(self) -> int:
        return size_limit()


def _cache_type() -> type:
    """diskcache.Cache whose connections (one per thread) leave the log at close."""
    global _Cache
    if _Cache is None:
        import diskcache

        class _Cache(diskcache.Cache):
            @property
            def _con(self) -> Any:
                before = getattr(self._local, "con", None)
                con = diskcache.Cache._con.fget(self)
                if con is not before:
                    leave_wal_at_close(con, self.directory)
                return con
    return _Cache


_Cache: Any = None


class DiskStore(StoreReads):
    """One cache directory. Opened lazily; every public method may raise Unavailable."""

    def __init__(self, path: Path):
        self.path = path
        self._entries: "diskcache.Cache | None" = None
        self._usage: "diskcache.Cache | None" = None
        self._reads = threading.local()   # this thread's plain SQLite reader of entries
        self._opening: threading.Thread | None = None   # prepare()'s helper thread

    # --- opening ----------------------------------------------------------------------
    def _directory(self) -> None:
        """Make the directory (private) if it is missing, and check that it can be trusted."""
        if self.path.exists() and not self.path.is_dir():
            raise Unavailable(f"{self.path} is not a directory")
        if not self.path.is_dir():
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.path, 0o700)  # mkdir's mode is masked by the umask
        trust.check_directory(self.path)

    def prepare(self) -> None:
        """Open both databases on a helper thread, for a miss about to compile (lock() calls
        it once it holds the key's lock): creating them
        (a new cache directory) or opening them costs tens of milliseconds that SQLite and
        NVRTC, both releasing the GIL, can spend side by side. The properties wait for it;
        a failure there is left for them to report."""
        if self._opening is not None or (self._entries is not None and self._usage is not None):
            return

        def open_both() -> None:
            try:
                for db in (self.entries, self.usage):
                    # diskcache connects per thread: this one's connection closes now, as
                    # close() (called from another thread) could not, and the WAL with it
                    db.close()
            except Exception:
                pass
        self._opening = threading.Thread(target=open_both, daemon=True, name="kjit-cache-open")
        self._opening.start()

    def _wait_opening(self) -> None:
        t = self._opening
        if t is not None and t is not threading.current_thread():
            t.join()
            self._opening = None

    def _open(self, name: str, size: int) -> "diskcache.Cache":
        """One of the two databases; each opens on first use (a disk hit needs only entries)."""
        try:
            self._directory()
            import diskcache
            # Eviction is ours (evict_lru): diskcache's culls ten entries at a time and its
            # access times miss the hits served from memory.
            return _cache_type()(str(self.path / name), size_limit=size, disk=safe_disk(),
                                 eviction_policy="none", statistics=False, timeout=60)
        except (OSError, sqlite3.Error) as exc:
            raise Unavailable(f"{self.path}: {exc.strerror if isinstance(exc, trust.Untrusted) else exc}") from exc

    @property
    def entries(self) -> "diskcache.Cache":
        self._wait_opening()
        if self._entries is None:
            self._entries = self._open("entries", size_limit())
        return self._entries

    @property
    def usage(self) -> "diskcache.Cache":
        self._wait_opening()
        if self._usage is None:
            self._usage = self._open("usage", 1 << 62)
        return self._usage

    def tables(self) -> tuple[Table, Table]:
        """SQL views of (entries, usage), for reading thousands of rows at once."""
        return Table.of(self.entries), Table.of(self.usage)

    def close(self) -> None:
        self._wait_opening()
        self._reads = threading.local()   # readers of a database that may be replaced next
        for c in (self._entries, self._usage):
            if c is not None:
                con = getattr(c._local, "con", None)
                if con is not None:   # closed on purpose (kjit cache, tests): log merged
                    leave_wal_at_close(con, leave=False)
                c.close()
        self._entries = self._usage = None

    # --- entries ------------------------------------------------------------------------
    def get(self, key: str) -> tuple[ObjectCode, dict[str, Any]] | None:
        """The checked entry for key, None if absent; CorruptEntry if it fails a check
        (the caller drops it)."""
        try:
            reader = None
            try:
                reader = self._reader()
                blob = reader.get(key) if reader is not None else None
            except sqlite3.OperationalError:
                # Another process is creating the database (no table yet) or holds it busy:
                # diskcache's connection sets it up and waits, as on a write.
                blob = Table.of(self.entries).get(key)
            finally:
                if reader is not None and reader.transient:
                    reader.close()
        except entry_mod.CorruptEntry:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise Unavailable(str(exc)) from exc
        if blob is None:
            return None
        if not isinstance(blob, bytes):
            raise entry_mod.CorruptEntry(f"value is {type(blob).__name__}, not bytes")
        return entry_mod.decode(blob, key)

    def _reader(self) -> Table | None:
        """The entries table for a lookup. Until this process writes, a plain SQLite
        connection reads it: a disk hit imports neither diskcache nor pickle (a tenth of a
        fresh process's own time). None while the database does not exist yet (a miss)."""
        if self._opening is not None and not self._opening.is_alive():
            self._wait_opening()   # opened: its connection reads, no second one opens and closes
        if self._opening is None and self._entries is not None:
            return Table.of(self._entries)
        table = getattr(self._reads, "table", None)
        if table is None:
            if not (self.path / "entries" / "cache.db").is_file():
                return None   # nothing written yet: a miss, and no directory to check
            trust.check_directory(self.path)
            table = Table.open(self.path / "entries")
            if self._opening is None:
                self._reads.table = table
            elif table is not None:
                # used once and closed (get): no reader may outlive the databases' setup, as
                # an open connection keeps their write-ahead log from being merged at close
                table.transient = True
        return table

    def put(self, key: str, obj: ObjectCode, meta: dict[str, Any]) -> None:
        self._store(key, entry_mod.encode(key, obj, meta), meta)

    def put_blob(self, key: str, blob: bytes) -> dict[str, Any]:
        """Store already-encoded bytes after checking them (import)."""
        header, _ = entry_mod.decode_header(blob, key)
        meta = header.get("meta")
        meta = meta if isinstance(meta, dict) else {}
        self._store(key, blob, meta)
        return meta

    def _store(self, key: str, blob: bytes, meta: dict[str, Any]) -> None:
        try:
            self.entries.set(key, blob)
            with self.usage.transact():  # one commit for the three usage rows
                self.usage.set("meta:" + key, json.dumps(meta, sort_keys=True, default=str))
                self.usage.set("used:" + key, time.time())
                self.usage.set("size:" + key, entry_mod.code_length(blob))  # for stats, no JSON
            self.evict_lru(self.size_limit, keep=key)
        except (OSError, sqlite3.Error) as exc:
            raise Unavailable(str(exc)) from exc

    def delete(self, key: str) -> None:
        self.delete_many([key])

    def delete_many(self, keys: list[str]) -> None:
        """Drop entries and their usage rows, in one transaction per database."""
        with contextlib.suppress(OSError, sqlite3.Error, _busy()):
            delete_rows(self.entries, keys=keys)
        with contextlib.suppress(OSError, sqlite3.Error, _busy()):
            delete_rows(self.usage, keys=[p + k for k in keys for p in USAGE_PREFIXES])

    def drop_foreign_rows(self) -> int:
        """Delete the rows kjit cannot read; returns how many."""
        entries, usage = self.tables()
        return delete_rows(self.entries, entries.foreign_rowids()) + \
            delete_rows(self.usage, usage.foreign_rowids())

    # --- usage counters -------------------------------------------------------------------
    def record_hits(self, counts: dict[str, int]) -> None:
        now = time.time()
        with self.usage.transact():
            for key, n in counts.items():
                self.usage.incr("hits:" + key, n)
                self.usage.set("used:" + key, now)
            self.usage.incr("stat:hits", sum(counts.values()))

    def record_sizes(self, sizes: dict[str, int]) -> None:
        """Write "size:K" rows (best effort: they only make `stats` fast)."""
        with contextlib.suppress(OSError, sqlite3.Error, _busy()):
            with self.usage.transact():
                for key, n in sizes.items():
                    self.usage.set("size:" + key, int(n))

    def record_miss(self) -> None:
        with contextlib.suppress(entry_mod.CorruptEntry):  # a foreign counter row: best effort
            self.usage.incr("stat:misses")

    def forget_orphans(self) -> None:
        """Drop usage rows whose entry was evicted."""
        live = set(self.keys())
        rows = [(rowid, filename) for rowid, key, filename in self.usage._sql(
            "SELECT rowid, key, filename FROM Cache WHERE raw = 1 AND typeof(key) = 'text' "
            "AND instr(key, ':') > 0 AND key NOT LIKE 'stat:%'")
            if key.split(":", 1)[1] not in live]
        delete_rows(self.usage, rows)

    # --- maintenance ------------------------------------------------------------------------
    def clear(self) -> tuple[int, int]:
        """Remove everything; returns (entries removed, foreign rows removed)."""
        n, foreign = len(self.keys()), self.foreign_rows()
        self.entries.clear()
        self.usage.clear()
        locks = self.path / "locks"
        if locks.is_dir() and not locks.is_symlink():
            for f in locks.glob("*.lock"):
                with contextlib.suppress(OSError):
                    f.unlink()  # unlink never follows a link
        from . import sources
        sources.clear(self.path)   # kept for debuggers: no entry left names them
        from . import pchdir
        pchdir.clear(self.path)    # precompiled headers (kjit.compiler.pch): no key names them
        headers = self.path / "headers"  # manifests (kjit.compiler.keys.manifest)
        if headers.is_dir() and not headers.is_symlink():
            for sub in headers.iterdir():
                if sub.is_symlink() or not sub.is_dir():
                    continue  # never follow a link out of the cache directory
                for f in sub.glob("*.json"):
                    with contextlib.suppress(OSError):
                        f.unlink()
        return n, foreign

    def volume(self) -> int:
        """Bytes on disk: the SQLite file plus the value files."""
        return int(self.entries.volume())

    def evict_lru(self, limit: int, keep: str | None = None,
                  keep_pch: str | None = None) -> list[str]:
        """Delete least-recently-used entries and precompiled headers (kjit.cache.pchdir)
        until volume() plus the PCHs' bytes <= limit; `keep` (the entry just written) and
        `keep_pch` (the PCH just filed) go last. Cheap when under the limit: one SQL query
        and a listing of pch/. Above it, entries go in batches whose stored bytes cover the
        excess, one transaction per batch; returns the entries' keys removed."""
        from . import pchdir
        pchs = pchdir.items(self.path)
        pch_bytes = sum(i.bytes for i in pchs)
        if self.volume() + pch_bytes <= limit:
            return []
        entries, usage = self.tables()
        used = usage.numbers("used:")
        sizes = entries.stored_sizes()
        order: list[tuple[bool, float, str, object]] = \
            [(k == keep, used.get(k, 0.0), k, None) for k in sizes] + \
            [(i.stem == keep_pch, i.used, i.stem, i) for i in pchs]
        order.sort(key=lambda t: (t[0], t[1]))
        removed: list[str] = []
        remaining = sum(v or 0 for v in sizes.values())
        pos = 0
        while pos < len(order):
            volume = self.volume()
            if volume + pch_bytes <= limit:
                break
            item = order[pos][3]
            if item is not None:   # a PCH: its files go at once
                pchdir.remove(item)  # type: ignore[arg-type]
                pch_bytes -= item.bytes  # type: ignore[attr-defined]
                pos += 1
                continue
            # An entry takes more than its bytes on disk (row and page overhead): scale by
            # what the whole cache takes per stored byte.
            scale = volume / max(remaining, 1)
            batch, freed = [], 0.0
            while pos < len(order) and order[pos][3] is None and \
                    (freed < volume + pch_bytes - limit or not batch):
                batch.append(order[pos][2])
                freed += (sizes[order[pos][2]] or 0) * scale
                remaining -= sizes[order[pos][2]] or 0
                pos += 1
            self.delete_many(batch)
            removed += batch
        return removed

    # --- cross-process lock per key ------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[float]:
        """Hold the creation lock for `key`; yields the seconds spent waiting for it."""
        try:   # the directory made and checked first: Unavailable if it cannot be
            self._directory()
        except OSError as exc:
            raise Unavailable(f"{self.path}: {exc.strerror if isinstance(exc, trust.Untrusted) else exc}") from exc
        t0 = time.perf_counter()
        try:
            import fcntl
        except ImportError:  # Windows: no cross-process de-duplication, still correct
            yield 0.0
            return
        try:
            (self.path / "locks").mkdir(mode=0o700, exist_ok=True)
            fd = trust.open_lock(self.path / "locks", f"{key}.lock")
        except OSError:
            yield 0.0
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.prepare()   # whoever holds the lock is about to create: the databases open meanwhile
            yield time.perf_counter() - t0
        finally:
            os.close(fd)  # closing releases the flock

