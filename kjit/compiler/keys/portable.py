"""Manifests that travel between installs and nodes.

A local manifest (manifest.py) names files by absolute path with their stat data: another
virtual environment, or a node that installs kjit under another path, has none, and would
compile a kernel just to learn its key, even with the binary on the shared Redis tier. So an
observed compile also files what it read under install-independent names: each file read by
name, content hash and size, the files found but not read, the paths found absent. That
record is filed beside the manifests (headers/, with their checks) and, where one is set, on
the shared tier (signed like its values, under a name `kjit cache ls --remote` does not
list), under a key built like the manifest's, with kjit's directories named by role.

A role may have several directories (a runtime-header wheel without crt/ and a toolkit's
include directory are both "cudart"): a record names each by its place among the role's
directories in NVRTC's search order ("<cudart>", "<cudart.2>"), and its key lists them, so
a name stands for exactly one file, the one NVRTC would open. Another install maps each
name back to its own directory and checks it: every file read has the same size and
content, every file found is there, every path found absent is still absent. Then the
compile would read what the first one read, so the first one's key holds; the record
becomes a local manifest, and the key is looked up as usual. Anything that does not check
out (another file, a new header in front, a record of the wrong shape, one too large or too
slow to check) means compiling, never a guess.

NVRTC looks for its built-in names (its builtin header, its name map, kjit's pre-included
prelude) in the working directory as well as beside the source; the built-in always wins
(tests/test_portable_round4.py), so those probes are no input and a record is filed from
any working directory. Paths the working directory decided (relative names) are not
portable: such a compile files no record.
"""
from __future__ import annotations

import json
import os
import re
import stat as stat_mod
import time
from typing import Any, Callable

from ...cache import key_hash
from . import manifest, roots
from .snapshot import PROBED, Snapshot, file_sig

NAMESPACE = "compile-manifest"
SCHEMA = 2

# Bounds on checking a record (one read from a shared tier may come from anyone who can
# write to it): a heavy CCCL compile reads ~500 headers and finds a few dozen paths absent.
MAX_ENTRIES = 50_000          # files read + found + paths absent
MAX_RECORD_BYTES = 8 << 20    # the record's JSON
MAX_FILE_BYTES = 64 << 20     # one header read
MAX_READ_BYTES = 512 << 20    # every header read, together
CHECK_S = 5.0                 # the whole check; past it, compile instead
_KEY = re.compile(r"[0-9a-f]{64}")
# Paths whose options make NVRTC open a file by the name given (relative: the working
# directory decides which).
_PATH_FLAGS = ("--pre-include", "-include", "--pch-dir", "-pch-dir", "--use-pch", "-use-pch",
               "--create-pch", "-create-pch", "--fdevice-time-trace", "-fdevice-time-trace")


def record_key(desc: dict[str, Any], dirs: tuple[str, ...], memory: dict[str, str],
               options: Any) -> dict[str, Any]:
    """The record's key: the compile's description without headers, its search directories
    named as records name files, and its in-memory headers' hashes."""
    name = namer(options)
    return {**desc, "schema": SCHEMA, "search": [name(os.path.join(d, "")) for d in dirs],
            "memory": memory}


# --- names -------------------------------------------------------------------------------------
def _layout() -> tuple[tuple[str, str], ...]:
    """(directory, role) of kjit's roots in NVRTC's search order; a role's second directory
    is "<role>.2", and so on."""
    from .. import stdheaders, toolkit_headers
    cccl = toolkit_headers.located().get("cccl")
    seen: dict[str, int] = {}
    out = []
    for d in (*toolkit_headers.dirs(), stdheaders.STDINC):
        role = "kjit-std" if d == stdheaders.STDINC else "cccl" if d == cccl else "cudart"
        seen[role] = seen.get(role, 0) + 1
        out.append((d, role if seen[role] == 1 else f"{role}.{seen[role]}"))
    return tuple(out)


def _prefixes(layout: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """(directory + separator, role), as given and resolved, the longest first (CCCL's
    directory sits inside the runtime headers' in the wheels)."""
    out = {os.path.join(form, ""): role for d, role in layout
           for form in (os.path.abspath(d), os.path.realpath(d))}
    return sorted(out.items(), key=lambda item: -len(item[0]))


def namer(options: Any) -> Callable[[str], str]:
    """How records name a path for these CompileOptions: "<role>/relative" below one of
    kjit's roots, unless line or debug information puts paths into the binary."""
    if roots.paths_matter(options):
        return str
    prefixes = _prefixes(_layout())

    def name(path: str) -> str:
        for prefix, role in prefixes:
            if path.startswith(prefix):
                return f"<{role}>/{path[len(prefix):]}"
        return path
    return name


def _resolver() -> Callable[[Any], str]:
    """A record's name -> the one local path it stands for; ValueError for anything else."""
    dirs = {role: d for d, role in _layout()}

    def path(name: Any) -> str:
        if not isinstance(name, str) or "\0" in name:
            raise ValueError("not a path")
        if name.startswith("/"):
            return name
        role, sep, rel = name[1:].partition(">/")
        if not name.startswith("<") or not sep or role not in dirs:
            raise ValueError(f"no directory here for {name[:80]!r}")
        return os.path.join(dirs[role], rel)
    return path


# --- filing ------------------------------------------------------------------------------------
def find(rk: dict[str, Any], options: Any) -> tuple[str, Snapshot] | None:
    """(compile key, local Snapshot) from a record that checks out here; else None."""
    h = key_hash(NAMESPACE, rk)
    for source in (_local, _remote):
        rec = source(h)
        if rec is not None:
            got = check(rec)
            if got is not None:
                return got
    return None


def claim(rk: dict[str, Any], options: Any) -> tuple[tuple[str, Snapshot] | None, Any]:
    """Where a shared tier is configured and no record holds here yet, so that nodes starting
    one new kernel together compile it once: (None, lease) when this node is to compile it
    first (it files the record once the binary is in the tier, then lets the lease go), or
    (found, None) when another node held the lease and filed the record meanwhile;
    (None, None) where there is no usable tier or the wait ran out (KJIT_REMOTE_CACHE_WAIT)."""
    tier = _tier()
    if tier is None or not tier.usable():
        return None, None
    from ...cache import LEASE_RECHECK_S as RECHECK_S, HeldLease
    lease_key, cfg = _REMOTE + key_hash(NAMESPACE, rk), tier.config
    deadline = time.monotonic() + cfg.wait_s
    try:
        while True:
            lease = tier.backend.lease(lease_key, cfg.lease_s)
            if lease is not None:
                found = find(rk, options)   # filed between our look and our lease?
                if found is None:
                    return None, HeldLease(lease, cfg.lease_s)
                lease.release()
                return found, None
            now = time.monotonic()
            if now >= deadline:
                return None, None
            time.sleep(min(RECHECK_S, cfg.lease_s / 2, deadline - now))
            found = find(rk, options)
            if found is not None:
                return found, None
    except Exception:   # the tier's faults: compile here, as without one
        return None, None


def publish(rk: dict[str, Any], k: str, snap: Snapshot, read: list, probed: list,
            options: Any) -> None:
    """File what an observed compile read (paths as in `snap`) under `rk`, for other installs."""
    skip: set[str] = set()
    if snap.cwd is not None:  # the working directory was looked at: portable only if for built-ins
        skip = _builtin_probes(rk, snap, options)
        if skip is None:
            return
    name = namer(options)
    absent = sorted({p for entry in snap.dirs.values() for p in entry[4]} - skip)
    rec = {"key": k, "read": [[name(p), sha, snap.files[p][0]] for p, sha in read],
           "probed": [name(p) for p in probed if p not in skip], "absent": [name(p) for p in absent]}
    h = key_hash(NAMESPACE, rk)
    manifest.write(h, lambda old: [rec], sub=_SUBDIR)
    tier = _tier()
    if tier is not None:
        tier.put_signed(_REMOTE + h, json.dumps({"records": [rec]}, separators=(",", ":")).encode())


def _builtin_probes(rk: dict[str, Any], snap: Snapshot, options: Any) -> set[str] | None:
    """The paths of NVRTC's probes for its built-in names in the working directory, when
    they are all the working directory decided; else None (the compile is not portable)."""
    from .observe import NVRTC_INTERNAL
    cwd = os.path.join(snap.cwd, "")
    name = rk.get("name")
    # a relative source name, include directory or pre-include is looked up from the
    # working directory: its paths (joined to it by the observer) are not portable
    if not (isinstance(name, str) and os.path.isabs(name)):
        return None
    if not all(s.startswith(("/", "<")) for s in rk.get("search", ())):
        return None
    extra = list(getattr(options, "extra", ()))
    for i, flag in enumerate(extra):
        for f in _PATH_FLAGS:
            if flag == f and i + 1 < len(extra):
                value = extra[i + 1]
            elif flag.startswith(f + "="):
                value = flag[len(f) + 1:]
            else:
                continue
            if not os.path.isabs(value):
                return None
    builtins = {cwd + n for n in NVRTC_INTERNAL}
    anchors = tuple(p for p, _ in _prefixes(_layout())) + tuple(
        os.path.join(s, "") for s in rk.get("search", ()) if s.startswith("/"))
    paths = list(snap.files) + [p for entry in snap.dirs.values() for p in entry[4]]
    for p in paths:
        if p.startswith(cwd) and p not in builtins and not p.startswith(anchors):
            return None
    return builtins


_SUBDIR = "portable"  # beside the manifests, in headers/
# Not letters and digits alone: the tier's listing (`kjit cache ls --remote`) skips it.
_REMOTE = "m-"


def _local(h: str) -> dict[str, Any] | None:
    records = manifest.read(h, sub=_SUBDIR)
    return records[0] if records else None


def _tier() -> Any:
    from ...cache import shared_tier as tier   # None unless KJIT_REMOTE_CACHE is set
    return tier()


def _remote(h: str) -> dict[str, Any] | None:
    tier = _tier()
    payload = tier.get_signed(_REMOTE + h) if tier is not None else None
    if payload is None or len(payload) > MAX_RECORD_BYTES:
        return None
    try:
        rec = json.loads(payload)["records"][0]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


# --- checking ----------------------------------------------------------------------------------
def check(rec: Any) -> tuple[str, Snapshot] | None:
    """(key, Snapshot) if record `rec` holds here: its shape, its bounds and every file."""
    try:
        return _check(rec, time.monotonic() + CHECK_S)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, OSError, OverflowError):
        return None


def _shape(rec: Any) -> tuple[str, list, list, list]:
    k, read, probed, absent = rec["key"], rec["read"], rec["probed"], rec["absent"]
    if not (isinstance(k, str) and _KEY.fullmatch(k)):
        raise ValueError("not a key")
    if not all(isinstance(x, list) for x in (read, probed, absent)):
        raise ValueError("not lists")
    if len(read) + len(probed) + len(absent) > MAX_ENTRIES:
        raise ValueError("too many paths")
    total = 0
    for item in read:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[1], str)
                and type(item[2]) is int and 0 <= item[2] <= MAX_FILE_BYTES):
            raise ValueError("not a file read")
        total += item[2]
    if total > MAX_READ_BYTES:
        raise ValueError("too much to read")
    return k, read, probed, absent


def _hash(path: str, size: int, deadline: float) -> str | None:
    """The SHA-256 of `path` if it holds `size` bytes (read in pieces, within the deadline)."""
    import hashlib
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
            if n > size or time.monotonic() > deadline:
                return None
            h.update(chunk)
    return h.hexdigest() if n == size else None


def _check(rec: Any, deadline: float) -> tuple[str, Snapshot] | None:
    k, read, probed, absent = _shape(rec)
    path = _resolver()
    snap = Snapshot()
    for name, sha, size in read:
        p = path(name)
        st = os.stat(p)
        if not stat_mod.S_ISREG(st.st_mode) or st.st_size != size or time.monotonic() > deadline \
                or _hash(p, size, deadline) != sha:
            return None
        snap.add_file(p, st, sha)
    for name in probed:
        p = path(name)
        st = os.stat(p)
        if not stat_mod.S_ISREG(st.st_mode) or time.monotonic() > deadline:
            return None
        snap.files[p] = [*file_sig(st), PROBED, False]
    dir_cache: dict[str, tuple[str, Any]] = {}
    for p in dict.fromkeys(map(path, absent)):  # each once: added without a scan of its list
        try:
            if not stat_mod.S_ISDIR(os.stat(p).st_mode):
                return None  # something now where the compile found nothing
        except (FileNotFoundError, NotADirectoryError):
            pass
        if time.monotonic() > deadline:
            return None
        snap.add_absent(p, dir_cache, known_new=True)
    return k, snap
