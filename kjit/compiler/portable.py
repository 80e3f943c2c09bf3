"""Manifests that travel between installs and nodes.

A local manifest (manifest.py) names files by absolute path with their stat data: another
virtual environment, or a node that installs kjit under another path, has none, and would
compile a kernel just to learn its key, even with the binary on the shared Redis tier. So an
observed compile also files what it read under its install-independent names (roots.py):
each file read by name and content hash, the files found but not read, the paths found
absent. That record is filed beside the manifests (headers/, with their checks) and, where one
is set, on the shared tier (signed like its values, under a name `kjit cache ls --remote`
does not list), under a key built like the manifest's, with kjit's directories named by role.

Another install maps each name back to its own directories and checks it: every file read
has the same content, every file found is there, every path found absent is still absent.
Then the compile would read what the first one read, so the first one's key holds; the
record becomes a local manifest, and the key is looked up as usual. Anything that does not
check out (another file, a new header in front) means compiling, never a guess.
"""
from __future__ import annotations

import json
import os
import stat as stat_mod
from typing import Any

from ..cache import key_hash
from . import manifest, roots
from .snapshot import PROBED, Snapshot, file_sig, read_hash

NAMESPACE = "compile-manifest"
SCHEMA = 1


def record_key(desc: dict[str, Any], dirs: tuple[str, ...], memory: dict[str, str],
               options: Any) -> dict[str, Any]:
    """The record's key: the compile's description without headers, its search directories
    named as keys name files, and its in-memory headers' hashes."""
    name = roots.namer(options)
    return {**desc, "schema": SCHEMA, "search": [name(os.path.join(d, "")) for d in dirs],
            "memory": memory}


def find(rk: dict[str, Any], options: Any) -> tuple[str, Snapshot] | None:
    """(compile key, local Snapshot) from a record that checks out here; else None."""
    h = key_hash(NAMESPACE, rk)
    rec = _local(h) or _remote(h)
    if rec is None:
        return None
    try:
        return _check(rec, options)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def publish(rk: dict[str, Any], k: str, snap: Snapshot, read: list, probed: list,
            options: Any) -> None:
    """File what an observed compile read (paths as in `snap`) under `rk`, for other installs."""
    if snap.cwd is not None:  # the working directory decided a lookup: not portable
        return
    name = roots.namer(options)
    absent = sorted({p for entry in snap.dirs.values() for p in entry[4]})
    rec = {"key": k, "read": [[name(p), sha] for p, sha in read],
           "probed": [name(p) for p in probed], "absent": [name(p) for p in absent]}
    h = key_hash(NAMESPACE, rk)
    manifest.write(h, lambda old: [rec], sub=_SUBDIR)
    tier = _tier()
    if tier is not None:
        tier.put_signed(_REMOTE + h, json.dumps({"records": [rec]}, separators=(",", ":")).encode())


_SUBDIR = "portable"  # beside the manifests, in headers/
# Not letters and digits alone: the tier's listing (`kjit cache ls --remote`) skips it.
_REMOTE = "m-"


def _local(h: str) -> dict[str, Any] | None:
    records = manifest.read(h, sub=_SUBDIR)
    return records[0] if records else None


def _tier() -> Any:
    from ..cache.lookup import _tier as tier   # None unless KJIT_REMOTE_CACHE is set
    return tier()


def _remote(h: str) -> dict[str, Any] | None:
    tier = _tier()
    payload = tier.get_signed(_REMOTE + h) if tier is not None else None
    if payload is None:
        return None
    try:
        rec = json.loads(payload)["records"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return rec if isinstance(rec, dict) else None


def _candidates(name: str) -> list[str]:
    """The local paths a key name can stand for (a role may have several directories)."""
    if not name.startswith("<"):
        return [name]
    role, _, rel = name[1:].partition(">/")
    return [prefix + rel for prefix, label in roots.prefixes() if label == role]


def _check(rec: dict[str, Any], options: Any) -> tuple[str, Snapshot] | None:
    k = rec["key"]
    if not isinstance(k, str):
        return None
    snap = Snapshot()
    for name, sha in rec["read"]:
        for path in _candidates(name):
            try:
                st = os.stat(path)
                if stat_mod.S_ISREG(st.st_mode) and read_hash(path) == sha:
                    snap.add_file(path, st, sha)
                    break
            except OSError:
                continue
        else:
            return None
    for name in rec["probed"]:
        for path in _candidates(name):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat_mod.S_ISREG(st.st_mode):
                snap.files[path] = [*file_sig(st), PROBED, False]
                break
        else:
            return None
    dir_cache: dict[str, Any] = {}
    for name in rec["absent"]:
        for path in _candidates(name):
            if os.path.exists(path):  # a file now where the compile found none
                return None
            snap.add_absent(path, dir_cache)
    return k, snap
