"""What `kjit cache` does, as functions: list, show, stats, clear, verify, export, import (prune:
kjit.cache.pruning), and on the shared tier ls, stats and clear --remote and push."""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import diskcache

from . import entry as entry_mod
from . import listing, remote, shared, trust
from .disk import Unavailable
from .lookup import current
from .readonly import open_store
from .remote import TierError
from .shared import COUNTERS, NO_VALUE
from ..errors import InvalidOptionError, KjitError
from ..locations import cache_dirs

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


def read_local(key: str) -> bytes | None:
    """The code of one entry on the local disk (None where absent or damaged): a lookup that
    neither creates nor counts, for listing records kept beside compiled code."""
    c = current()
    try:
        got = c.disk.get(key) if c.disk is not None else None
    except entry_mod.CorruptEntry:
        return None
    return got[0] if got else None


def delete(keys: list[str], what: str) -> int:
    """Remove these entries from the writable disk, this process's memory layer and the
    shared tier (where one is set and answers); `what` names the command, for the error a
    read-only cache gives."""
    _writable(_disk(), what).delete_many(keys)
    c = current()
    for h in keys:
        c.memory.discard(h)
    tier = shared.active()
    if tier is not None and tier.usable():
        try:
            tier.backend.delete(keys)
        except Exception:   # the local records are gone; a shared tier that fails is not fatal
            pass
    return len(keys)


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
            "session": dict(c.session), "remote": _remote_counts(disk), "sources": _sources(c.path),
            "pch": _pch(c.path)}


def _pch(path: Path) -> dict[str, int]:
    """The precompiled headers kept in the cache directory (kjit.cache.pchdir): counted in
    the size limit with the entries."""
    from . import pchdir
    files, size = pchdir.volume(path)
    return {"files": files, "bytes": size}


def pch_stored(keep: str, size: int) -> bool:
    """A PCH `keep` of `size` bytes was just filed in the writable cache directory
    (kjit.cache.pchdir): make the cache fit its size cap, the least recently used entries
    and PCHs first, this one last. False where it cannot stay (alone it takes more than half
    the cap): the caller removes it."""
    from ..settings import size_limit
    limit = size_limit()
    if size > limit // 2:
        return False
    store = current().disk
    if store is None:
        return True
    store = store.managed() if hasattr(store, "managed") else store
    if getattr(store, "read_only", False):
        return True
    try:
        store.evict_lru(limit, keep_pch=keep)
    except Exception:   # a busy or damaged database: the next store or prune evicts
        pass
    return True


def _sources(path: Path) -> dict[str, int]:
    """The kept sources (kjit.cache.sources): on disk, and this process's writes."""
    from . import sources
    files, size = sources.volume(path)
    return {"files": files, "bytes": size, **sources.counts}


def _remote_counts(disk: Any) -> dict[str, Any]:
    """The shared tier's counts as this cache directory saw them (kjit.cache.shared)."""
    config = remote.RemoteConfig.from_env()
    return dict(shared.saved_counts(disk), url=config.display_url if config else None)


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


def prune(*, max_size: str | int | None = None, older_than: str | float | None = None) -> dict[str, Any]:
    """Drop entries not used for `older_than`, then least-recently-used ones until the
    cache's disk bytes (as KJIT_CACHE_SIZE counts them) fit in `max_size`. Works on a full
    disk too (kjit.cache.pruning): that is when it is needed."""
    from . import pruning
    limit, cutoff = pruning.limits(max_size, older_than)
    c = current()
    store = _writable(_store(c), "prune")

    def prepare() -> None:
        _open(store)
        c.flush_hits()
    report = pruning.prune(store, limit, cutoff, prepare)
    for k in report["keys"]:
        c.memory.discard(k)
    return report


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


# --- the shared tier (kjit cache ls/stats/clear --remote, push) ---------------------------------
_HEAD = 4096  # bytes read per value for a listing: most headers fit


def _remote_tier() -> Any:
    config = remote.RemoteConfig.from_env()
    if config is not None and config.refusal:
        raise KjitError(config.refusal)
    tier = shared.active()
    if tier is None:
        raise KjitError(f"no remote cache is configured: set {remote.ENV_URL}=redis://host:port/db "
                        "(or call kjit.cache.configure_remote(url))")
    return tier


def _unusable(tier, exc: Exception) -> KjitError:
    return KjitError(f"the remote cache {tier.config.display_url} cannot be used: {exc}")


def _row(key: str, head: bytes | None, ttl: float | None) -> dict[str, Any] | None:
    """A listing row from a value's first bytes, or None when they are not a whole header."""
    if head is None:
        return None
    if head.startswith(NO_VALUE):
        return {"key": key, "note": "not shared: " + head[len(NO_VALUE):].decode(errors="replace").strip(),
                "ttl_s": ttl}
    signed = shared.is_signed(head)
    body = head[shared.SIG_HEADER:] if signed else head
    try:
        hlen, clen = entry_mod.declared_lengths(body)
    except entry_mod.CorruptEntry:
        return {"key": key, "error": "not a kjit cache entry", "signed": signed, "ttl_s": ttl}
    end = entry_mod.PREFIX_SIZE + hlen
    if len(body) < end:
        return None
    try:
        header = json.loads(body[entry_mod.PREFIX_SIZE:end])
    except (ValueError, RecursionError):
        return {"key": key, "error": "header is not JSON", "signed": signed, "ttl_s": ttl}
    if not isinstance(header, dict):
        return {"key": key, "error": "header is not a JSON object", "signed": signed, "ttl_s": ttl}
    meta = header.get("meta") if isinstance(header.get("meta"), dict) else {}
    kernels = meta.get("kernels")
    created = meta.get("created")
    return {"key": key, "kind": _text(header.get("kind")), "arch": _text(header.get("arch")),
            "size": clen, "name": _text(header.get("name")),
            "namespace": _text(meta.get("namespace")), "label": _text(meta.get("label")),
            "kernels": [n for n in kernels if isinstance(n, str)] if isinstance(kernels, list) else [],
            "symbols": _names(meta.get("symbols")),
            "created": created if _number(created) else None, "signed": signed, "ttl_s": ttl}


def _names(value: Any) -> dict[str, str]:
    """A header's symbols (name expression -> lowered name), the text pairs of it only."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _text(value: Any) -> str | None:
    """A header field that should be text: anything else (a crafted header) reads as absent."""
    return value if isinstance(value, str) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def ls_remote(*, limit: int | None = None) -> list[dict[str, Any]]:
    """The shared tier's entries (unverified headers: the checks run when one is fetched),
    newest first: key, kind, arch, size, name, kernels, created, signed, seconds to live."""
    tier = _remote_tier()
    try:
        keys = sorted(tier.backend.keys())
        heads = tier.backend.peek(keys, _HEAD)
        rows = [_row(k, h, t) for k, (h, t) in zip(keys, heads)]
        longer = [i for i, r in enumerate(rows) if r is None and heads[i][0] is not None]
        if longer:  # headers past the first read (long logs): read those values' heads again
            again = tier.backend.peek([keys[i] for i in longer], 1 << 20)
            for i, (h, t) in zip(longer, again):
                rows[i] = _row(keys[i], h, t) or {"key": keys[i], "error": "header too long to list",
                                                  "signed": shared.is_signed(h or b""), "ttl_s": t}
    except TierError as exc:
        raise _unusable(tier, exc) from None
    out = [r for r in rows if r is not None]
    out.sort(key=lambda r: r.get("created") or 0, reverse=True)  # numbers only (_row)
    return out[:limit] if limit else out


def stats_remote() -> dict[str, Any]:
    """The shared tier: where, how configured, what it holds, the server's memory, and this
    process's counts."""
    tier = _remote_tier()
    cfg = tier.config
    try:
        server = tier.backend.stats()
        keys = list(tier.backend.keys())
        total = sum(tier.backend.sizes(keys))
    except TierError as exc:
        raise _unusable(tier, exc) from None
    return {"url": cfg.display_url, "prefix": cfg.prefix, "signed": cfg.secret is not None,
            "ttl_s": cfg.ttl_s, "max_value": cfg.max_value, "entries": len(keys), "bytes": total,
            "server": server, "session": {k: tier.counts.get(k, 0) for k in COUNTERS}}


def clear_remote() -> int:
    """Remove every value (and lease) under the tier's prefix; returns how many entries, as
    `ls --remote` counts them."""
    return clear_remote_report()["removed"]


def clear_remote_report() -> dict[str, int]:
    """clear_remote(), saying what went: "removed", the entries `ls --remote` lists, and
    "other", the rest of kjit's names (the cluster's records of what compiles read, names no
    kjit wrote)."""
    tier = _remote_tier()
    try:
        entries = sum(1 for _ in tier.backend.keys())
        values = tier.backend.clear()
    except TierError as exc:
        raise _unusable(tier, exc) from None
    return {"removed": entries, "other": max(0, values - entries)}


def push(*, keys: list[str] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Upload local entries (all, or `keys`) to the shared tier, e.g. after a `kjit build` in
    CI, so that a cluster starts warm. Each is checked first; corrupt and too-large ones are
    skipped; values already there are kept unless overwrite."""
    tier = _remote_tier()
    cfg = tier.config
    disk = _disk()
    chosen = [resolve_key(k) for k in keys] if keys else disk.keys()
    pushed, present, too_large, skipped, sent = 0, 0, 0, [], 0
    for k in chosen:
        blob = disk.get_blob(k)
        if blob is None:
            continue
        try:
            entry_mod.decode_header(blob, k)
        except entry_mod.CorruptEntry as exc:
            skipped.append({"key": k, "error": str(exc)})
            continue
        if len(blob) > cfg.max_value:
            too_large += 1
            continue
        try:
            stored = tier.backend.put(k, shared.sign(cfg.secret, k, blob), cfg.ttl_s, overwrite=overwrite)
        except TierError as exc:
            raise _unusable(tier, exc) from None
        if stored:
            pushed += 1
            sent += len(blob)
        else:
            present += 1
    return {"url": cfg.display_url, "pushed": pushed, "already_present": present,
            "too_large": too_large, "skipped": skipped, "bytes": sent, "signed": cfg.secret is not None}


def describe_remote() -> dict | None:
    """The shared tier: where, whether values are signed, whether it answers."""
    from . import registry
    try:
        config = remote.RemoteConfig.from_env()
        if config is None:
            return None
        out = {"url": config.display_url, "prefix": config.prefix, "signed": config.secret is not None,
               "backend": (config.backend or registry.choose(config.url, None)).spec}
        if config.refusal:  # no key and no KJIT_REMOTE_CACHE_UNSIGNED=1: not used
            return dict(out, off=True, error=config.refusal)
        tier = shared.active()
        server = tier.backend.stats()  # Redis says its version; another backend what it is
        out["server"] = server.get("redis_version") if out["backend"] == registry.REDIS else \
            str(server.get("server") or type(tier.backend).__name__)
        out["reachable"] = True
    except remote.TierError as exc:
        out.update(reachable=False, error=str(exc))
    except Exception as exc:  # misconfigured: say so, the rest of `kjit info` still prints
        return {"error": str(exc)}
    return out
