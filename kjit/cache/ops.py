"""What `kjit cache` does, as functions: list, show, stats, clear, prune, verify, export, import."""
from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import diskcache

from . import entry as entry_mod
from . import inplace, listing, trust
from .core import current
from .layers import open_store
from .index import delete_rows
from .store import USAGE_PREFIXES, Unavailable, cache_dirs, parse_duration, parse_size
from ..errors import InvalidOptionError, KjitError

SORT_FIELDS = ("created", "last_used", "size", "hits", "name", "arch", "kind")


def path() -> Path:
    """The cache directory in use."""
    return current().path


def _store(c: Any = None) -> Any:
    """The store `kjit cache` acts on: the writable directory, else the read-only one."""
    c = c or current()
    # A store this process gave up on is opened afresh: its error says why.
    store = c.disk if c.disk is not None else open_store(cache_dirs())
    return store.managed() if hasattr(store, "managed") else store


def _open(store: Any) -> Any:
    try:
        store.tables()   # open both databases now: a failure is this error, not a traceback
    except Unavailable as exc:
        raise KjitError(f"the kjit cache at {store.path} cannot be opened: {exc}") from None
    return store


def _disk() -> Any:
    c = current()
    store = _open(_store(c))
    c.flush_hits()
    return store


def _writable(store: Any, what: str) -> Any:
    if store.read_only:
        raise KjitError(f"the kjit cache at {store.path} is read-only: `kjit cache {what}` cannot "
                        "change it")
    return store


def ls(*, kernel: str | None = None, arch: str | None = None, sort: str = "last_used",
       reverse: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
    """Entries' metadata; `kernel` matches a kernel name or name expression (substring),
    `arch` exactly. Sorted by `sort` (newest / largest / most-hit first unless reverse)."""
    if sort not in SORT_FIELDS:
        raise InvalidOptionError(f"sort={sort!r} is not one of {', '.join(SORT_FIELDS)}")
    if limit is not None and limit < 0:
        raise InvalidOptionError(f"limit={limit} must be 0 (no limit) or more")
    return listing.rows(_disk(), kernel=kernel, arch=arch, sort=sort, reverse=reverse, limit=limit)


def resolve_key(prefix: str) -> str:
    """A full key from a unique prefix (at least 4 hex digits), like git."""
    prefix = prefix.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{4,64}", prefix):
        raise InvalidOptionError(f"{prefix!r} is not a cache key: give at least 4 hex digits of one "
                                 "(see `kjit cache ls`)")
    matches = [k for k in _disk().keys() if k.startswith(prefix)]
    if not matches:
        raise InvalidOptionError(f"no cache entry has a key starting with {prefix!r}")
    if len(matches) > 1:
        raise InvalidOptionError(f"{prefix!r} matches {len(matches)} entries; give more digits")
    return matches[0]


def show(key: str) -> dict[str, Any]:
    """Everything about one entry: metadata, options, log, symbols, and the source if saved."""
    disk = _disk()
    k = resolve_key(key)
    try:
        blob = disk.get_blob(k)
        if blob is None:
            raise InvalidOptionError(f"cache entry {k} disappeared (evicted or cleared)")
        header, code = entry_mod.decode_header(blob, k)
    except entry_mod.CorruptEntry as exc:
        if disk.read_only:
            raise KjitError(f"cache entry {k} is corrupt ({exc}); the cache is read-only") from None
        disk.delete(k)
        raise KjitError(f"cache entry {k} is corrupt ({exc}); it has been dropped") from None
    info = disk.meta(k) or {}
    info.update({"key": k, "log": header.get("log", ""), "symbols": header.get("symbols", {}),
                 "metadata": header.get("metadata", {}), "size": len(code),
                 "source": header["meta"].get("source")})
    return info


def stats() -> dict[str, Any]:
    """entries, bytes, hits, misses, hit rate, the size limit, rows kjit cannot read, and
    this process's counts."""
    c = current()
    disk = _disk()
    keys = disk.keys()
    hits, misses = disk.totals()
    sizes, found = listing.code_sizes(disk, keys)
    if found and not disk.read_only:  # entries an older kjit wrote gain their "size:" rows
        disk.record_sizes(found)
    return {"path": str(c.path), "entries": len(keys), "bytes": sum(sizes.values()),
            "disk_bytes": disk.volume(), "size_limit": disk.size_limit, "hits": hits,
            "misses": misses, "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
            "unreadable": disk.foreign_rows(), "read_only": disk.read_only,
            "unstorable": int(disk.tables()[1].get_number("stat:unstorable") or 0),
            "session": dict(c.session), "remote": _remote_counts(disk)}


def _remote_counts(disk: Any) -> dict[str, Any]:
    """The shared tier's counts as this cache directory saw them (kjit.cache.shared)."""
    from .remote import RemoteConfig
    from .shared import saved_counts
    config = RemoteConfig.from_env()
    return dict(saved_counts(disk), url=config.display_url if config else None)


def clear() -> int:
    """Remove every entry (and this process's memory layer); returns how many."""
    return clear_report()["removed"] or 0


def clear_report() -> dict[str, Any]:
    """clear(), saying what it did. Works on a damaged cache too: when the databases cannot
    be opened or cleared, kjit's files in the directory are deleted instead (links inside
    it are removed, never followed); "reset" is then True."""
    c = current()
    c.memory.clear()
    c.pending_hits.clear()
    store = _writable(_store(c), "clear")
    if store.path.is_dir():
        try:
            trust.check_owner(store.path)
        except OSError as exc:  # someone else's directory: not ours to empty
            raise KjitError(f"the kjit cache at {store.path} cannot be cleared: {exc.strerror or exc}") from None
    try:
        _open(store)
        n, foreign = store.clear()
        return {"removed": n, "unreadable_removed": foreign, "reset": False}
    except (KjitError, OSError, sqlite3.Error, entry_mod.CorruptEntry, diskcache.Timeout) as exc:
        store.close()
        try:
            trust.remove_cache_files(store.path)
        except OSError as err:
            raise KjitError(f"the kjit cache at {store.path} is damaged ({exc}) and could not be "
                            f"removed: {err}") from None
        return {"removed": None, "unreadable_removed": None, "reset": True, "reason": str(exc)}


def parse_age(text: str | float) -> float:
    """'90s', '30m', '12h', '7d', '2w' (or seconds) -> seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise InvalidOptionError(f"age {exc}") from None


def prune_limits(max_size: str | int | None = None,
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


def prune(*, max_size: str | int | None = None, older_than: str | float | None = None) -> dict[str, Any]:
    """Drop entries not used for `older_than`, then least-recently-used ones until the
    cache's disk bytes (as KJIT_CACHE_SIZE counts them) fit in `max_size`. Works on a full
    disk too (kjit.cache.inplace): that is when it is needed."""
    limit, cutoff = prune_limits(max_size, older_than)
    c = current()
    store = _writable(_store(c), "prune")
    if inplace.disk_full(store.path):
        report = _prune_in_place(store, limit, cutoff)
    else:
        try:
            _open(store)
            c.flush_hits()
            report = _prune(store, limit, cutoff)
        except (KjitError, OSError, sqlite3.Error, diskcache.Timeout) as exc:
            if not inplace.disk_full(store.path):
                if isinstance(exc, KjitError):
                    raise
                raise KjitError(f"the kjit cache at {store.path} could not be pruned: {exc}") from None
            report = _prune_in_place(store, limit, cutoff)
    for k in report["keys"]:
        c.memory.discard(k)
    return report


def _prune(disk: Any, limit: int | None, cutoff: float | None) -> dict[str, Any]:
    entries, usage = disk.tables()
    keys = entries.keys()
    sizes = listing.code_sizes(disk, keys)[0]
    removed: list[str] = []
    if cutoff is not None:
        used = usage.numbers("used:")
        # an entry never used since it was made has no "used:" row: its creation time counts
        created = usage.json_numbers("meta:", "created") if len(used) < len(keys) else {}
        removed = [k for k in keys if (used.get(k) or created.get(k) or 0) < cutoff]
        _delete(disk, removed)
    if limit is not None:
        removed += disk.evict_lru(limit)
    disk.forget_orphans()
    return {"removed": len(removed), "bytes_freed": int(sum(sizes.get(k, 0) for k in removed)),
            "keys": removed, "entries_left": len(keys) - len(removed), "disk_bytes": disk.volume()}


def _delete(disk: Any, keys: list[str]) -> None:
    """delete_many that fails loudly (it is best effort elsewhere): a prune that could not
    delete must not report the entries as removed."""
    if keys:
        delete_rows(disk.entries, keys=keys)
        delete_rows(disk.usage, keys=[p + k for k in keys for p in USAGE_PREFIXES])


def _prune_in_place(store: Any, limit: int | None, cutoff: float | None) -> dict[str, Any]:
    store.close()   # diskcache's connections would hold locks the exclusive ones wait for
    try:
        return inplace.prune(store.path, limit, cutoff)
    except (OSError, sqlite3.Error) as exc:
        raise KjitError(f"the kjit cache at {store.path} is on a full disk and could not be "
                        f"pruned in place ({exc}); `kjit cache clear` removes it whole") from None


def verify() -> dict[str, Any]:
    """Check every entry's checksum and structure; drop the corrupt ones and the rows kjit
    cannot read (pickled keys or values written by another program)."""
    c = current()
    disk = _disk()
    entries, _ = disk.tables()
    ok, bad = 0, []
    for k in entries.keys():
        try:
            blob = disk.get_blob(k)
            if blob is None:
                continue
            entry_mod.decode(blob, k)
            ok += 1
        except (entry_mod.CorruptEntry, OSError) as exc:
            bad.append({"key": k, "error": str(exc)})
    foreign = disk.foreign_rows()
    if not disk.read_only:
        disk.delete_many([b["key"] for b in bad])
        foreign = disk.drop_foreign_rows()
        disk.forget_orphans()
    for b in bad:
        c.memory.discard(b["key"])
    return {"checked": ok + len(bad), "ok": ok, "corrupt": bad, "unreadable": foreign}


def export(file: str | Path, *, keys: list[str] | None = None) -> dict[str, Any]:
    """Write entries (all, or `keys`) to one zip file for another machine's `import_`."""
    from . import archive
    store = _disk()
    chosen = [resolve_key(k) for k in keys] if keys else store.keys()
    return archive.export(store, file, chosen)


def import_(file: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Add the entries of an `export` file, verifying each checksum; corrupt ones are skipped."""
    from . import archive
    return archive.import_(_writable(_disk(), "import"), file, overwrite=overwrite)
