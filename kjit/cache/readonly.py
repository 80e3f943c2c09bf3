"""Cache directories kjit cannot write, e.g. a cache baked into a container image.

Their entries are served like any others (read with SQLite's `immutable` mode, which
writes no lock or journal file). New results go to the first writable directory that
KJIT_CACHE_DIR lists (`KJIT_CACHE_DIR=/opt/baked:~/.cache/kjit`), or, with none, stay in
this process's memory; kjit says so once.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

from . import entry as entry_mod
from . import trust
from .disk import CacheWarning, DiskStore, StoreReads, Unavailable
from .tables import SCHEMA, Table, sqlite3
from ..locations import ENV_CACHE_DIR as ENV_DIR, cache_dirs
from ..objectcode import ObjectCode

_warned: set[str] = set()



def writable(path: Path) -> bool:
    """Whether kjit can write the cache at `path` (a directory not made yet counts as
    writable: making it is the first write, and its failure is reported then)."""
    if not path.exists():
        return True
    if not os.access(path, os.W_OK | os.X_OK):
        return False
    db = path / "entries" / "cache.db"
    return not db.exists() or os.access(db, os.W_OK)


def open_store(dirs: list[Path] | None = None) -> Any:
    """The store for these directories (default: those KJIT_CACHE_DIR lists): a DiskStore
    when the first writable one is all there is, else a Layered store."""
    dirs = dirs or cache_dirs()
    top = next((d for d in dirs if writable(d)), None)
    lower = [ReadOnlyStore(d) for d in dirs if d != top and d.is_dir() and not writable(d)]
    if not lower:
        return DiskStore(top or dirs[0])
    return Layered(DiskStore(top) if top else None, lower)


class ReadOnlyStore(StoreReads):
    """One cache directory read without writing anything."""

    read_only = True

    def __init__(self, path: Path):
        self.path = path
        self._tables: tuple[Table, Table] | None = None

    def tables(self) -> tuple[Table, Table]:
        if self._tables is None:
            try:
                trust.check_directory(self.path)
                self._tables = (self._table("entries"), self._table("usage"))
            except (OSError, sqlite3.Error) as exc:
                raise Unavailable(f"{self.path}: {exc.strerror if isinstance(exc, trust.Untrusted) else exc}") from exc
        return self._tables

    def _table(self, name: str) -> Table:
        table = Table.open(self.path / name, immutable=True)
        if table is None:  # no database there: an empty table answers every read
            con = sqlite3.connect(":memory:", check_same_thread=False)
            con.execute(SCHEMA)
            table = Table(con.execute, self.path / name)
        return table

    def get(self, key: str) -> tuple[ObjectCode, dict[str, Any]] | None:
        try:
            blob = self.get_blob(key)
        except sqlite3.Error as exc:
            raise Unavailable(str(exc)) from exc
        return None if blob is None else entry_mod.decode(blob, key)

    def volume(self) -> int:
        total = 0
        for name in ("entries", "usage"):
            with contextlib.suppress(OSError):
                total += (self.path / name / "cache.db").stat().st_size
        return total

    def close(self) -> None:
        self._tables = None


class Layered:
    """A writable DiskStore (or none) over read-only stores: a lookup tries each in turn,
    a new result goes to the writable one, or stays in memory with one warning."""

    def __init__(self, top: DiskStore | None, lower: list[ReadOnlyStore]):
        self.top, self.lower = top, lower
        self.path = top.path if top else lower[0].path
        self.read_only = top is None

    def managed(self) -> Any:
        """The store `kjit cache` commands act on: the writable one, else the first."""
        return self.top or self.lower[0]

    def get(self, key: str) -> tuple[ObjectCode, dict[str, Any]] | None:
        found = self.top.get(key) if self.top else None
        for store in self.lower:
            if found is not None:
                break
            try:
                found = store.get(key)
            except Unavailable:
                continue  # an unreadable lower layer is only a miss
        return found

    def put(self, key: str, obj: ObjectCode, meta: dict[str, Any]) -> None:
        if self.top is not None:
            self.top.put(key, obj, meta)
        elif str(self.path) not in _warned:
            _warned.add(str(self.path))
            warnings.warn(
                f"kjit cache directory {self.path} is read-only: its entries are used, and new "
                f"results are kept in memory for this process only. To keep them, list a "
                f"writable directory after it: {ENV_DIR}={self.path}{os.pathsep}/a/writable/dir",
                CacheWarning, stacklevel=5)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[float]:
        if self.top is None:
            yield 0.0
            return
        with self.top.lock(key) as waited:
            yield waited

    def delete(self, key: str) -> None:  # a corrupt entry below cannot be removed; the
        if self.top is not None:         # rebuilt one goes on top and is found first
            self.top.delete(key)

    def record_hits(self, counts: dict[str, int]) -> None:
        if self.top is not None:
            self.top.record_hits(counts)

    def record_miss(self) -> None:
        if self.top is not None:
            self.top.record_miss()

    def close(self) -> None:
        for store in [self.top, *self.lower]:
            if store is not None:
                store.close()
