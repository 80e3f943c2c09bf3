"""`kjit cache prune`: drop entries unused for a while, then the least recently used until the
cache fits a size, on a healthy disk through diskcache, on a full disk in place.

On a full disk diskcache cannot even open the cache.
SQLite in WAL mode needs new space to open a database (its `-shm` index) and to change
it (the `-wal` log), so on a full disk `kjit cache prune` would fail exactly when it is
needed. Here each database is opened with an exclusive lock (the WAL index then lives in
this process's memory) and a rollback journal in memory, so deleting rows rewrites pages
in place and needs no new space; diskcache's auto-vacuum then gives the freed pages back
to the filesystem. The victims' value files are deleted first: that frees space without
any write. diskcache switches the databases back to WAL when it next opens them.

The price of a journal in memory: a crash in the middle of the commit can leave a
database damaged; `kjit cache clear` resets one. kjit takes this path only when the disk
has no room for the safe one.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from . import listing
from .disk import USAGE_PREFIXES, StoreReads
from ..settings import parse_duration, parse_size
from .tables import _CHUNK, SCHEMA, Table, delete_rows, remove_value_file, sqlite3
from ..errors import InvalidOptionError, KjitError

LOW_SPACE = 1 << 20   # below this much free space, prune takes the in-place path
LOW_INODES = 8        # ... or below this many free inodes


def parse_age(text: str | float) -> float:
    """'90s', '30m', '12h', '7d', '2w' (or seconds) -> seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise InvalidOptionError(f"age {exc}") from None


def limits(max_size: str | int | None = None,
           older_than: str | float | None = None) -> tuple[int | None, float | None]:
    """(size limit in bytes, cutoff time) for prune; InvalidOptionError for bad values."""
    if max_size is None and older_than is None:
        raise InvalidOptionError("prune needs --max-size and/or --older-than")
    limit = None
    if max_size is not None:
        try:
            limit = parse_size(max_size)
        except ValueError as exc:
            raise InvalidOptionError(str(exc)) from None
    return limit, None if older_than is None else time.time() - parse_age(older_than)


def prune(store: Any, limit: int | None, cutoff: float | None,
          prepare: Callable[[], None]) -> dict[str, Any]:
    """Prune a writable store (kjit.cache.admin.prune); `prepare` opens its databases. A
    full disk takes the in-place path, before or after a failure that it explains."""
    import diskcache
    if disk_full(store.path):
        return _in_place(store, limit, cutoff)
    try:
        prepare()
        return _prune(store, limit, cutoff)
    except (KjitError, OSError, sqlite3.Error, diskcache.Timeout) as exc:
        if not (disk_full(store.path) or _out_of_space(exc)):
            if isinstance(exc, KjitError):
                raise
            raise KjitError(f"the kjit cache at {store.path} could not be pruned: {exc}") from None
        return _in_place(store, limit, cutoff)


def _prune(disk: Any, limit: int | None, cutoff: float | None) -> dict[str, Any]:
    entries, usage = disk.tables()
    keys = entries.keys()
    sizes = listing.code_sizes(disk, keys)[0]
    removed: list[str] = []
    pchs = _prune_pchs(disk.path, cutoff)
    if cutoff is not None:
        used = usage.numbers("used:")
        # an entry never used since it was made has no "used:" row: its creation time counts
        created = usage.json_numbers("meta:", "created") if len(used) < len(keys) else {}
        removed = [k for k in keys if (used.get(k) or created.get(k) or 0) < cutoff]
        if removed:  # deleted loudly (best effort elsewhere): a prune that could not delete
            delete_rows(disk.entries, keys=removed)   # must not report them as removed
            delete_rows(disk.usage, keys=[p + k for k in removed for p in USAGE_PREFIXES])
    if limit is not None:
        removed += disk.evict_lru(limit)
    disk.forget_orphans()
    return {"removed": len(removed), "bytes_freed": int(sum(sizes.get(k, 0) for k in removed)),
            "keys": removed, "entries_left": len(keys) - len(removed), "disk_bytes": disk.volume(),
            "sources_removed": prune_sources(disk.path, usage), "pch_removed": pchs}


def _prune_pchs(path: Path, cutoff: float | None, limit: int | None = None,
                volume: int = 0) -> int:
    """Remove the precompiled headers (kjit.cache.pchdir) unused since `cutoff`, then, where
    `limit` is given, the least recently used until they and `volume` (the entries' bytes)
    fit it; returns how many went. (Where the entries are pruned through DiskStore.evict_lru,
    that orders PCHs and entries together.)"""
    from . import pchdir
    found = pchdir.items(path)
    gone = [i for i in found if cutoff is not None and i.used < cutoff]
    left = [i for i in found if i not in gone]
    if limit is not None:
        total = volume + sum(i.bytes for i in left)
        for i in left:
            if total <= limit:
                break
            gone.append(i)
            total -= i.bytes
    for i in gone:
        pchdir.remove(i)
    return sum(1 for i in gone if any(p.suffix == ".pch" for p in i.paths))


def prune_sources(path: Path, usage: Any) -> int:
    """Remove the kept sources (kjit.cache.sources) that no entry's metadata names."""
    from . import sources
    if not (path / sources.SUBDIR).is_dir():
        return 0
    import json
    metas = []
    for _, text in usage.texts("meta:"):
        try:
            metas.append(json.loads(text))
        except ValueError:
            continue
    return sources.prune(path, sources.named_by(m for m in metas if isinstance(m, dict)))


def _in_place(store: Any, limit: int | None, cutoff: float | None) -> dict[str, Any]:
    store.close()   # diskcache's connections would hold locks the exclusive ones wait for
    _free_inodes(store.path)
    try:
        return prune_in_place(store.path, limit, cutoff)
    except (OSError, sqlite3.Error) as exc:
        what = "has no free inodes" if _no_inodes(store.path) else "is on a full disk"
        raise KjitError(f"the kjit cache at {store.path} {what} and could not be pruned in "
                        f"place ({exc}); free some space there, or `kjit cache clear` removes "
                        "it whole") from None


def disk_full(path: Path) -> bool:
    """Whether the filesystem holding `path` has (almost) no room left for this user: no
    bytes, or no inodes (SQLite cannot then create its -wal and -shm files, with megabytes
    free)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < LOW_SPACE or _no_inodes(path)


def _no_inodes(path: Path) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_files > 0 and st.f_favail < LOW_INODES


def _out_of_space(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) says the disk or a quota is full."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, sqlite3.Error) and (getattr(exc, "sqlite_errorcode", None) == 13
                                               or "disk is full" in str(exc)):
            return True   # SQLITE_FULL
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _free_inodes(path: Path, want: int = 2) -> None:
    """Opening a database in WAL mode creates its -wal file for a moment, even in place: with
    no inode free, remove a few of the oldest header manifests (headers/, remembered keys
    that the next compile of their kernel works out again) to make room for it."""
    try:
        st = os.statvfs(path)
        if st.f_files == 0 or st.f_favail >= want:
            return
        found = [(p.stat().st_mtime, p) for p in (path / "headers").rglob("*.json") if p.is_file()]
    except OSError:
        return
    for _, p in sorted(found)[:2 * want]:
        try:
            p.unlink()
        except OSError:
            pass


class InPlaceStore(StoreReads):
    """Both databases of one cache directory, opened for deleting without new space."""

    def __init__(self, path: Path):
        self.path = path
        self._cons = [_exclusive(path / name / "cache.db") for name in ("entries", "usage")]
        self._tables = tuple(Table(c.execute, path / name)
                             for c, name in zip(self._cons, ("entries", "usage")))

    def tables(self) -> tuple[Table, Table]:
        return self._tables  # type: ignore[return-value]

    def volume(self) -> int:
        """As diskcache counts it: the database's pages plus the value files' bytes."""
        if not (self.path / "entries" / "cache.db").is_file():
            return 0
        con = self._cons[0]
        pages = con.execute("PRAGMA page_count").fetchone()[0] * con.execute("PRAGMA page_size").fetchone()[0]
        row = con.execute("SELECT value FROM Settings WHERE key = 'size'").fetchone()
        return int(pages + (row[0] if row and isinstance(row[0], int) else 0))

    def delete_many(self, keys: list[str]) -> None:
        """Value files first (room without a write), then the rows, one transaction each."""
        for con, names in ((self._cons[0], keys),
                           (self._cons[1], [p + k for k in keys for p in USAGE_PREFIXES])):
            rows = list(_rows(con, names))
            directory = str(self.path / ("entries" if con is self._cons[0] else "usage"))
            for _, filename in rows:
                remove_value_file(directory, filename)
            con.execute("BEGIN IMMEDIATE")
            try:
                for i in range(0, len(rows), _CHUNK):
                    con.execute("DELETE FROM Cache WHERE rowid IN (%s)"
                                % ",".join(str(int(r)) for r, _ in rows[i:i + _CHUNK]))
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def close(self) -> None:
        for con in self._cons:
            try:
                con.execute("PRAGMA journal_mode = WAL")  # as diskcache keeps it, if there is room now
            except sqlite3.Error:
                pass
            con.close()


def _exclusive(db: Path) -> sqlite3.Connection:
    if not db.is_file():  # nothing written there yet: an empty table answers
        con = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        con.execute(SCHEMA)
        con.execute("CREATE TABLE Settings (key TEXT NOT NULL UNIQUE, value)")
        return con
    con = sqlite3.connect(str(db), timeout=60, isolation_level=None, check_same_thread=False)
    try:
        # Before the first read: no shared-memory WAL index is made (it would need space).
        con.execute("PRAGMA locking_mode = EXCLUSIVE")
        con.execute("PRAGMA journal_mode = MEMORY")
    except sqlite3.Error:
        con.close()
        raise
    return con


def _rows(con: sqlite3.Connection, keys: list[str]) -> Iterator[tuple[int, str | None]]:
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i:i + _CHUNK]
        yield from con.execute("SELECT rowid, filename FROM Cache WHERE raw = 1 AND key IN (%s)"
                               % ",".join("?" * len(chunk)), chunk)


def prune_in_place(path: Path, limit: int | None, cutoff: float | None) -> dict:
    """prune's work and report, done in place (see the module's text)."""
    store = InPlaceStore(path)
    try:
        entries, usage = store.tables()
        keys = entries.keys()
        sizes = listing.code_sizes(store, keys)[0]
        used = usage.numbers("used:")
        removed: list[str] = []
        # PCHs first: unlinking them frees the most, with no write at all
        pchs = _prune_pchs(path, cutoff, limit, store.volume())
        if cutoff is not None:
            created = usage.json_numbers("meta:", "created") if len(used) < len(keys) else {}
            removed = [k for k in keys if (used.get(k) or created.get(k) or 0) < cutoff]
            store.delete_many(removed)
        if limit is not None:
            removed += _evict(store, limit, [k for k in keys if k not in set(removed)], used)
        return {"removed": len(removed), "bytes_freed": int(sum(sizes.get(k, 0) for k in removed)),
                "keys": removed, "entries_left": len(keys) - len(removed),
                "disk_bytes": store.volume(), "sources_removed": prune_sources(path, usage),
                "pch_removed": pchs}
    finally:
        store.close()


def _evict(store: InPlaceStore, limit: int, keys: list[str], used: dict[str, float]) -> list[str]:
    """Least recently used first until volume() <= limit (as DiskStore.evict_lru)."""
    stored = store.tables()[0].stored_sizes()
    order = sorted(keys, key=lambda k: used.get(k, 0.0))
    removed: list[str] = []
    while order and store.volume() > limit:
        volume, remaining = store.volume(), sum(stored.get(k) or 0 for k in order)
        scale = volume / max(remaining, 1)   # row and page overhead per stored byte
        batch, freed = [], 0.0
        while order and (freed < volume - limit or not batch):
            k = order.pop(0)
            batch.append(k)
            freed += (stored.get(k) or 0) * scale
        store.delete_many(batch)
        removed += batch
    return removed
