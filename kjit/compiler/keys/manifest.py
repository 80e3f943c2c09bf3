"""Manifests: a fresh process finds a compile's key without resolving its includes again.

ccache's direct mode: a manifest is filed under a hash of everything known before reading
any header (source, options, the search path, compiler, arch...; description.manifest_key) and
holds, for the last few header states seen, the full cache key and the Snapshot of the
headers it was derived from. A lookup returns the key of the first record whose Snapshot
check passes (stats, and a re-read only of files whose stat changed or was racily clean), so
a CUB kernel's ~535 headers cost ~535 stats instead of reading and scanning them. A record
that fails its check is skipped, never trusted: the caller resolves the includes and files a
new record. Manifests are JSON in `<cache dir>/headers/`, after a line with the CRC-32 of the
JSON, written whole and renamed into place: a reader never sees half of one, and a damaged
one (whose damage could otherwise point at another entry's key) is a miss. A CRC, not a
SHA-256: it is there for damage, not for an attacker (who could write both), and a fresh
process's hit checks ~100 KB of it (0.03 ms against 0.5-0.9 ms for CPython's own SHA-256).
"""
from __future__ import annotations

import binascii
import json
from pathlib import Path
from typing import Any

from ...fileio import replace_with
from .snapshot import Snapshot

DIR_NAME = "headers"
MAX_RECORDS = 4        # header states kept per manifest (ccache keeps a few too)
MAX_MANIFESTS = 4096   # manifests kept in the directory; older ones are removed
MAX_BYTES = 16 << 20   # a manifest is ~100 KB for 500 headers; anything far larger is not one


def _dirs() -> list[Path]:
    """The manifest directory of every cache directory KJIT_CACHE_DIR lists, in order (a
    read-only cache baked into an image can hold manifests too)."""
    try:
        from ...cache import trusted
        from ...locations import cache_dirs
        # a directory others could write, or another user's, could hold a planted manifest
        # naming another kernel's key: nothing in it is read
        return [d / DIR_NAME for d in cache_dirs() if trusted(d)]
    except Exception:  # no home directory to put a cache in
        return []


def _check_line(payload: bytes) -> bytes:
    """The manifest's first line (a manifest from before, with a sha256 line, is a miss)."""
    return b"crc32:%08x" % binascii.crc32(payload)


def _file(d: Path, prekey: str) -> Path:
    return d / prekey[:2] / f"{prekey}.json"


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        from ...cache import read_private
        data = read_private(path, MAX_BYTES)  # no link followed, nobody else's file
        digest, _, payload = data.partition(b"\n")
        if len(data) > MAX_BYTES or _check_line(payload) != digest:
            return []
        records = json.loads(payload)["records"]
        return [r for r in records if isinstance(r, dict) and isinstance(r.get("key"), str)]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return []


def lookup(prekey: str) -> tuple[str, Snapshot] | None:
    """(cache key, checked Snapshot) of the first record that still holds, else None."""
    for d in _dirs():
        records = _records(_file(d, prekey))
        for rec in records:
            snap = Snapshot.from_json(rec.get("snapshot"))
            if snap is None:
                continue
            try:
                ok = snap.check()
            except (TypeError, ValueError, IndexError, AttributeError):  # damaged values
                ok = False
            if ok:
                if snap.updated:  # stat data refreshed: save it, so the next process only stats
                    store(prekey, rec["key"], snap)
                return rec["key"], snap
    return None


def store(prekey: str, key: str, snapshot: Snapshot) -> None:
    """File `key` under `prekey` with the header state it was derived from, in the first
    listed cache directory that takes the write (best effort: without one, the next process
    resolves the includes again)."""
    rec = {"key": key, "snapshot": snapshot.to_json()}
    write(prekey, lambda old: [rec] + [r for r in old if r.get("key") != key][:MAX_RECORDS - 1])


def write(name: str, records: Any, sub: str = "") -> None:
    """Write `records(the records already there)` as file `name` (in subdirectory `sub` of
    the manifest directory), checked by its CRC line, in the first listed cache directory
    that takes the write."""
    for base in _dirs():
        d = base / sub if sub else base
        path = _file(d, name)
        try:
            base.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            payload = json.dumps({"records": records(_records(path))}, separators=(",", ":")).encode()
            replace_with(path, _check_line(payload) + b"\n" + payload)
        except OSError:
            continue  # read-only or full: the next listed directory
        import random
        if random.random() < 1 / 64:
            trim(d)
        return


def read(name: str, sub: str = "") -> list[dict[str, Any]]:
    """The records of file `name` (see write) in the first cache directory that has them."""
    for d in _dirs():
        records = _records(_file(d / sub if sub else d, name))
        if records:
            return records
    return []


def trim(d: Path, limit: int = MAX_MANIFESTS) -> int:
    """Remove the least recently written manifests in `d` beyond `limit`; returns how many."""
    if not d.is_dir() or d.is_symlink():
        return 0
    found = []
    for sub in d.iterdir():
        if sub.is_symlink() or not sub.is_dir():
            continue  # never follow a link out of the cache directory
        for f in sub.glob("*.json"):
            try:
                found.append((f.lstat().st_mtime, f))
            except OSError:
                pass
    found.sort(reverse=True)
    removed = 0
    for _, f in found[limit:]:
        try:
            f.unlink()
            removed += 1
        except OSError:
            pass
    return removed
