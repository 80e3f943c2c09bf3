"""diskcache's tables read and written safely: whole-table reads and bulk deletes by SQL, the
value files beside them, and the Disk class diskcache reads and writes rows through.

diskcache reads one row per call and decodes every key it meets. The `kjit cache` commands
need thousands of rows at once (20,000 entries must list in well under a second), and
must skip and count rows kjit did not write (a pickled key or value from another program)
instead of failing on them. Everything here reads the columns diskcache writes (key, raw,
mode, filename, value, size; its triggers keep the count and size totals) and decodes
only strings, bytes and numbers.

A row kjit did not write (pickled by another program, or planted) must cost a recompile,
never run code or touch a file outside the cache: pickles are refused both ways, and a value
file's name must have the shape diskcache gives it (two hex directories and a hex name), so
a row naming `../../x` is neither read nor deleted.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
try:
    # The C module sqlite3 wraps: its Python layer adds only date and time adapters (which kjit
    # never stores), and their `import datetime` is ~1.5 ms of a fresh process's ~20 ms disk
    # hit. Same functions, same exception classes.
    import _sqlite3 as sqlite3
except ImportError:  # another Python
    import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .entry import CorruptEntry

MODE_RAW, MODE_BINARY, MODE_TEXT = 1, 2, 3          # diskcache.core's value modes
READABLE = "raw = 1 AND typeof(key) = 'text' AND mode IN (1, 2, 3)"
_CHUNK = 500                                        # bound parameters per statement
SCHEMA = ("CREATE TABLE Cache (rowid INTEGER PRIMARY KEY, key BLOB, raw INTEGER, store_time REAL, "
          "expire_time REAL, access_time REAL, access_count INTEGER, tag BLOB, size INTEGER, "
          "mode INTEGER, filename TEXT, value BLOB)")
VALUE_FILE_RE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val")
WAL_PAGES = 100                                     # checkpoint on commit past this log size
WAL_ROOM = 64 << 20                                 # leave a log only with this much room


def leave_wal_at_close(con: Any, directory: str | os.PathLike[str] | None = None,
                       leave: bool = True) -> None:
    """Skip the checkpoint SQLite makes when a database's last connection closes (where
    Python has Connection.setconfig, 3.12+): a fresh process's exit then writes and syncs
    nothing. The write-ahead log stays for the next opener, which reads it as after a crash
    (kill -9 leaves the same), and a commit still checkpoints a log past WAL_PAGES pages, so
    reading it stays cheap (~0.2 ms). Not on a disk with less than WAL_ROOM free: a full
    disk's prune (inplace.py) needs the log merged. leave=False: a close on purpose merges it."""
    if leave and directory is not None:
        try:
            st = os.statvfs(directory)
            leave = st.f_bavail * st.f_frsize >= WAL_ROOM
        except OSError:
            leave = False
    if hasattr(con, "setconfig"):
        con.setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, leave)
        if leave:
            con.execute(f"PRAGMA wal_autocheckpoint = {WAL_PAGES}")


def _prefix_range(prefix: str) -> tuple[str, str]:
    """[lo, hi) covering every key that starts with `prefix` (uses the key index)."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def checked_value_file(directory: str, filename: str) -> str:
    """The full path of a value file named by a row; CorruptEntry if the name is foreign."""
    if not isinstance(filename, str) or not VALUE_FILE_RE.fullmatch(filename):
        raise CorruptEntry(f"value file name {str(filename)[:40]!r} is not one kjit writes")
    return os.path.join(directory, filename)


def remove_value_file(directory: str, filename: str | None) -> None:
    """Delete a value file (and its emptied directories) if its name is one diskcache makes."""
    if not filename:
        return
    try:
        path = checked_value_file(directory, filename)
    except CorruptEntry:
        return
    with contextlib.suppress(OSError):
        os.remove(path)
    parent = os.path.dirname(path)
    for _ in range(2):  # the two hex directories, never the database directory itself
        with contextlib.suppress(OSError):
            os.rmdir(parent)
        parent = os.path.dirname(parent)


class Table:
    """The Cache table of one diskcache database, read through `sql` (an execute callable)."""

    transient = False   # a reader its user closes after one use

    def __init__(self, sql: Callable[..., sqlite3.Cursor], directory: str | os.PathLike[str],
                 own: sqlite3.Connection | None = None):
        self.sql = sql
        self.directory = str(directory)
        self._own = own   # the connection `open` made, closed by close()

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None

    @classmethod
    def of(cls, cache: Any) -> "Table":
        # diskcache's own connection (private but stable since 2016): the same transaction
        # and locking as its public calls.
        return cls(cache._sql, cache.directory)

    @classmethod
    def open(cls, directory: Path, *, immutable: bool = False) -> "Table | None":
        """A table on `directory`'s database through a plain SQLite connection, without
        diskcache; None if there is no database yet. `immutable`: for a cache on read-only
        storage (no lock or journal files are made); else a reader beside diskcache's writers."""
        db = directory / "cache.db"
        if not db.is_file():
            return None
        if immutable:
            from urllib.parse import quote
            # immutable mode ignores a write-ahead log; a log left at close (see
            # leave_wal_at_close) is read in read-only mode, which needs its -shm file
            wal = directory / "cache.db-wal"
            modes = (["mode=ro"] if wal.is_file() and wal.stat().st_size else []) + ["immutable=1"]
            for i, mode in enumerate(modes):
                con = sqlite3.connect(f"file:{quote(str(db))}?{mode}", uri=True,
                                      check_same_thread=False)
                try:
                    con.execute("SELECT 1 FROM Cache LIMIT 1").fetchall()
                    break
                except sqlite3.Error:
                    con.close()
                    if i == len(modes) - 1:
                        raise
        else:
            con = sqlite3.connect(str(db), timeout=60, isolation_level=None)
            leave_wal_at_close(con, directory)
        return cls(con.execute, directory, con)

    # --- keys and foreign rows -----------------------------------------------------------
    def keys(self) -> list[str]:
        """Every key kjit can read (string keys with bytes, text or number values)."""
        return [k for (k,) in self.sql(f"SELECT key FROM Cache WHERE {READABLE}")]

    def foreign_rowids(self) -> list[tuple[int, str | None]]:
        """(rowid, filename) of the rows kjit cannot read: pickled keys or values, keys that
        are not strings, unknown value modes."""
        return list(self.sql(f"SELECT rowid, filename FROM Cache WHERE NOT ({READABLE})"))

    def count_foreign(self) -> int:
        return int(self.sql(f"SELECT count(*) FROM Cache WHERE NOT ({READABLE})").fetchone()[0])

    # --- values ----------------------------------------------------------------------------
    def _value(self, mode: int, filename: str | None, value: Any) -> Any:
        if mode == MODE_RAW:
            return bytes(value) if isinstance(value, memoryview) else value
        path = checked_value_file(self.directory, filename or "")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise CorruptEntry(f"value file {filename} cannot be read: {exc.strerror or exc}") from None
        if mode == MODE_TEXT:
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                raise CorruptEntry(f"value file {filename} is not UTF-8 text") from None
        return data

    def get(self, key: str) -> Any:
        """The value stored under a string key, None if absent; CorruptEntry if it is a
        pickle or names a foreign value file."""
        row = self.sql("SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1",
                       (key,)).fetchone()
        if row is None:
            return None
        if row[0] not in (MODE_RAW, MODE_BINARY, MODE_TEXT):
            raise CorruptEntry("pickled value in the cache database" if row[0] == 4
                               else f"value of unknown mode {row[0]!r}")
        return self._value(*row)

    def get_number(self, key: str) -> float | None:
        """A numeric value, None if absent or not a number (a foreign row)."""
        row = self.sql("SELECT value FROM Cache WHERE key = ? AND raw = 1 AND mode = 1",
                       (key,)).fetchone()
        v = row[0] if row else None
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def contains(self, key: str) -> bool:
        return self.sql("SELECT 1 FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone() is not None

    def numbers(self, prefix: str) -> dict[str, float]:
        """{key without prefix: value} for numeric values under `prefix` ("used:", "hits:")."""
        lo, hi = _prefix_range(prefix)
        n = len(prefix)
        return {k[n:]: v for k, v in self.sql(
            "SELECT key, value FROM Cache WHERE key >= ? AND key < ? AND raw = 1 AND mode = 1 "
            "AND typeof(value) IN ('integer', 'real')", (lo, hi))}

    def texts(self, prefix: str) -> Iterator[tuple[str, str]]:
        """(key without prefix, text) for the text values under `prefix`; unreadable ones skipped."""
        lo, hi = _prefix_range(prefix)
        n = len(prefix)
        for k, mode, filename, value in self.sql(
                f"SELECT key, mode, filename, value FROM Cache WHERE key >= ? AND key < ? AND {READABLE}",
                (lo, hi)):
            try:
                v = self._value(mode, filename, value)
            except CorruptEntry:
                continue
            if isinstance(v, str):
                yield k[n:], v

    def json_numbers(self, prefix: str, field: str) -> dict[str, float]:
        """{key without prefix: JSON value[field]} for JSON texts under `prefix`, parsed by
        SQLite where it can (in C: 20,000 rows in milliseconds), by Python otherwise."""
        lo, hi = _prefix_range(prefix)
        n = len(prefix)
        out: dict[str, float] = {}
        try:
            rows = self.sql(
                "SELECT key, CASE WHEN json_valid(value) THEN json_extract(value, ?) END "
                f"FROM Cache WHERE key >= ? AND key < ? AND {READABLE} AND mode = 1",
                ("$." + field, lo, hi)).fetchall()
            in_files = self.sql(f"SELECT key FROM Cache WHERE key >= ? AND key < ? AND {READABLE} "
                                "AND mode = 3", (lo, hi)).fetchall()
        except sqlite3.OperationalError:  # an SQLite without JSON functions
            rows, in_files = [], [(prefix + k,) for k, _ in self.texts(prefix)]
        for k, v in rows:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k[n:]] = v
        for (k,) in in_files:
            try:
                v = json.loads(self.get(k) or "null")
            except (CorruptEntry, ValueError, RecursionError):
                continue
            if isinstance(v, dict) and isinstance(v.get(field), (int, float)):
                out[k[n:]] = v[field]
        return out

    def stored_sizes(self) -> dict[str, int]:
        """{key: bytes the value takes} for every readable key (inline or in its file)."""
        return dict(self.sql(
            "SELECT key, CASE WHEN filename IS NULL THEN length(value) ELSE size END "
            f"FROM Cache WHERE {READABLE}"))


def delete_rows(cache: Any, rows: Iterable[tuple[int, str | None]] | None = None, *,
                keys: Iterable[str] = ()) -> int:
    """Delete rows, given as (rowid, filename) or as string keys, in one transaction; then
    their value files (after the commit, as diskcache does)."""
    sql = cache._sql
    keys = list(keys)
    with cache.transact():
        rows = list(rows or ())
        for i in range(0, len(keys), _CHUNK):  # looked up inside the transaction
            chunk = keys[i:i + _CHUNK]
            rows += sql("SELECT rowid, filename FROM Cache WHERE raw = 1 AND key IN (%s)"
                        % ",".join("?" * len(chunk)), chunk).fetchall()
        for i in range(0, len(rows), _CHUNK):
            chunk = rows[i:i + _CHUNK]
            sql("DELETE FROM Cache WHERE rowid IN (%s)" % ",".join(str(int(r)) for r, _ in chunk))
    for _, filename in rows:
        remove_value_file(cache.directory, filename)
    return len(rows)


_safe_disk: Any = None


def safe_disk() -> type:
    """The diskcache Disk class kjit's databases use (made on first use: diskcache loads only
    when a process writes)."""
    global _safe_disk
    if _safe_disk is not None:
        return _safe_disk
    import diskcache

    class SafeDisk(diskcache.Disk):
        """diskcache's Disk that refuses to pickle or unpickle and reads or deletes only value
        files it could have written: a poisoned database row can cost a recompile, never run
        code or reach outside the cache directory."""

        def put(self, key):
            if type(key) is not str:
                raise TypeError("kjit cache keys are strings")
            return super().put(key)

        def get(self, key, raw):
            if not raw:
                raise CorruptEntry("pickled key in the cache database")
            return super().get(key, raw)

        def store(self, value, read, key=diskcache.core.UNKNOWN):
            if type(value) not in (bytes, str, int, float):
                raise TypeError("kjit cache values are bytes, str or numbers")
            return super().store(value, read, key)

        def fetch(self, mode, filename, value, read):
            if mode == diskcache.core.MODE_PICKLE:
                raise CorruptEntry("pickled value in the cache database")
            if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY, diskcache.core.MODE_TEXT):
                raise CorruptEntry(f"value of unknown mode {mode!r} in the cache database")
            if mode != diskcache.core.MODE_RAW:
                checked_value_file(self._directory, filename)
            return super().fetch(mode, filename, value, read)

        def remove(self, file_path):
            remove_value_file(self._directory, file_path)

    _safe_disk = SafeDisk
    return SafeDisk
