"""What `kjit cache` does, as functions: list, show, stats, clear, prune, verify, export, import."""
from __future__ import annotations

import json
import re
import time
import zipfile
from pathlib import Path
from typing import Any

from . import entry as entry_mod
from .core import current
from .store import DiskStore, Unavailable, parse_size
from ..errors import InvalidOptionError, KjitError

EXPORT_FORMAT = "kjit-cache-export/1"
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
SORT_FIELDS = ("created", "last_used", "size", "hits", "name", "arch", "kind")


def path() -> Path:
    """The cache directory in use."""
    return current().path


def _disk() -> DiskStore:
    c = current()
    if c.disk is None:
        raise KjitError(f"the kjit cache at {c.path} is unavailable in this process")
    try:
        c.disk.entries, c.disk.usage   # open both now: a failure is this error, not a traceback
    except Unavailable as exc:
        raise KjitError(f"the kjit cache at {c.path} cannot be opened: {exc}") from None
    c.flush_hits()
    return c.disk


def ls(*, kernel: str | None = None, arch: str | None = None, sort: str = "last_used",
       reverse: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
    """Entries' metadata; `kernel` matches a kernel name or name expression (substring),
    `arch` exactly. Sorted by `sort` (newest / largest / most-hit first unless reverse)."""
    if sort not in SORT_FIELDS:
        raise InvalidOptionError(f"sort={sort!r} is not one of {', '.join(SORT_FIELDS)}")
    disk = _disk()
    rows = []
    for k in disk.keys():
        m = disk.meta(k)
        if m is None:
            continue
        if arch and m.get("arch") != arch:
            continue
        if kernel:
            names = list(m.get("kernels") or []) + list((m.get("symbols") or {}).keys()) + \
                list((m.get("symbols") or {}).values()) + [m.get("label") or ""]
            if not any(kernel in n for n in names):
                continue
        m.pop("source", None)
        rows.append(m)
    descending = sort in ("created", "last_used", "size", "hits")
    rows.sort(key=lambda r: (r.get(sort) or 0) if descending else str(r.get(sort) or ""),
              reverse=descending)
    if reverse:
        rows.reverse()
    return rows[:limit] if limit else rows


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
    blob = disk.get_blob(k)
    if blob is None:
        raise InvalidOptionError(f"cache entry {k} disappeared (evicted or cleared)")
    try:
        header, code = entry_mod.decode_header(blob, k)
    except entry_mod.CorruptEntry as exc:
        disk.delete(k)
        raise KjitError(f"cache entry {k} is corrupt ({exc}); it has been dropped") from None
    info = disk.meta(k) or {}
    info.update({"key": k, "log": header.get("log", ""), "symbols": header.get("symbols", {}),
                 "metadata": header.get("metadata", {}), "size": len(code),
                 "source": (header.get("meta") or {}).get("source")})
    return info


def stats() -> dict[str, Any]:
    """entries, bytes, hits, misses, hit rate, the size limit and this process's counts."""
    c = current()
    disk = _disk()
    keys = disk.keys()
    total = 0
    for k in keys:
        m = disk.meta(k)
        total += int((m or {}).get("size") or 0)
    hits, misses = disk.totals()
    return {"path": str(c.path), "entries": len(keys), "bytes": total, "disk_bytes": disk.volume(),
            "size_limit": disk.size_limit, "hits": hits, "misses": misses,
            "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
            "session": dict(c.session)}


def clear() -> int:
    """Remove every entry (and this process's memory layer); returns how many."""
    c = current()
    c.memory.clear()
    c.pending_hits.clear()
    return _disk().clear()


_DUR = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str | float) -> float:
    """'90s', '30m', '12h', '7d', '2w' (or seconds) -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(text).lower())
    if not m:
        raise InvalidOptionError(f"age {text!r} is not a duration: use e.g. 90s, 30m, 12h, 7d, 2w")
    return float(m.group(1)) * _DUR[m.group(2) or "s"]


def prune(*, max_size: str | int | None = None, older_than: str | float | None = None) -> dict[str, Any]:
    """Drop entries not used for `older_than`, then least-recently-used ones until the
    cache's disk bytes (as KJIT_CACHE_SIZE counts them) fit in `max_size`."""
    if max_size is None and older_than is None:
        raise InvalidOptionError("prune needs --max-size and/or --older-than")
    disk = _disk()
    c = current()
    removed: list[str] = []
    rows = [m for m in (disk.meta(k) for k in disk.keys()) if m is not None]
    if older_than is not None:
        cutoff = time.time() - parse_age(older_than)
        for m in rows:
            if (m.get("last_used") or 0) < cutoff:
                removed.append(m["key"])
    freed = 0
    sizes = {m["key"]: int(m.get("size") or 0) for m in rows}
    for k in removed:
        disk.delete(k)
        c.memory.discard(k)
        freed += sizes.get(k, 0)
    if max_size is not None:
        try:
            limit = parse_size(max_size)
        except ValueError as exc:
            raise InvalidOptionError(str(exc)) from None
        for k in disk.evict_lru(limit):
            removed.append(k)
            c.memory.discard(k)
            freed += sizes.get(k, 0)
    disk.forget_orphans()
    return {"removed": len(removed), "bytes_freed": freed, "keys": removed,
            "entries_left": len(rows) - len(removed), "disk_bytes": disk.volume()}


def verify() -> dict[str, Any]:
    """Check every entry's checksum and structure; drop the corrupt ones."""
    disk = _disk()
    c = current()
    ok, bad = 0, []
    for k in disk.keys():
        try:
            blob = disk.get_blob(k)
            if blob is None:
                continue
            entry_mod.decode(blob, k)
            ok += 1
        except (entry_mod.CorruptEntry, OSError) as exc:
            bad.append({"key": k, "error": str(exc)})
            disk.delete(k)
            c.memory.discard(k)
    disk.forget_orphans()
    return {"checked": ok + len(bad), "ok": ok, "corrupt": bad}


def export(file: str | Path, *, keys: list[str] | None = None) -> dict[str, Any]:
    """Write entries (all, or `keys`) to one zip file for another machine's `import_`."""
    disk = _disk()
    file = Path(file)
    chosen = [resolve_key(k) for k in keys] if keys else disk.keys()
    n, skipped = 0, []
    tmp = file.with_name(file.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for k in chosen:
            blob = disk.get_blob(k)
            try:
                entry_mod.decode_header(blob, k)  # never export a corrupt entry
            except entry_mod.CorruptEntry as exc:
                skipped.append({"key": k, "error": str(exc)})
                continue
            z.writestr(f"entries/{k}", blob)
            n += 1
        from .key import SCHEMA_VERSION
        z.writestr("manifest.json", json.dumps({"format": EXPORT_FORMAT, "schema": SCHEMA_VERSION,
                                                "entries": n, "created": time.time()}))
    tmp.replace(file)
    return {"file": str(file), "exported": n, "skipped": skipped, "bytes": file.stat().st_size}


def import_(file: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Add the entries of an `export` file, verifying each checksum; corrupt ones are skipped."""
    disk = _disk()
    file = Path(file)
    try:
        z = zipfile.ZipFile(file)
    except (OSError, zipfile.BadZipFile) as exc:
        raise InvalidOptionError(f"{file} is not a kjit cache export: {exc}") from None
    imported, present, rejected = 0, 0, []
    with z:
        try:
            manifest = json.loads(z.read("manifest.json"))
        except (KeyError, ValueError):
            raise InvalidOptionError(f"{file} is not a kjit cache export (no manifest.json)") from None
        if manifest.get("format") != EXPORT_FORMAT:
            raise InvalidOptionError(f"{file}: unknown export format {manifest.get('format')!r}")
        for info in z.infolist():
            if info.filename == "manifest.json":
                continue
            name = info.filename.removeprefix("entries/")
            if not _KEY_RE.match(name):
                rejected.append({"key": info.filename, "error": "not a cache key"})
                continue
            if not overwrite and disk.contains(name):
                present += 1
                continue
            try:
                blob = z.read(info)
                disk.put_blob(name, blob)
                imported += 1
            except (entry_mod.CorruptEntry, zipfile.BadZipFile, OSError) as exc:
                rejected.append({"key": name, "error": str(exc)})
            except Unavailable as exc:
                raise KjitError(f"cannot write to the kjit cache: {exc}") from None
    return {"file": str(file), "imported": imported, "already_present": present, "rejected": rejected}
