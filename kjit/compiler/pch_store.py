"""Precompiled headers kept across processes: in the cache directory's pch/ (its layout, LRU and
size accounting: kjit/cache/pchdir.py), each with the record that says when it may be used.

NVRTC 13 takes a PCH file in any process whose PCH heap starts at the address the writing
process's heap started at, and a heap at least as large; everything else about the process
may differ. _pchheap.c pins the heap at PIN_ADDR in every process (where that range is free).

A record (`<key>.json`: a CRC-32 line, then JSON, written whole and renamed into place, as
manifests are) names the PCH file and holds the Snapshot (compiler/keys/snapshot.py) of every file
the PCH's build read, each path it found absent and each environment variable NVRTC read,
the heap size it was made with and the file's identity (size, mtime, inode). The key is
everything NVRTC is given that the PCH depends on: the prologue's text, the program's name,
every flag, the in-memory headers, the working directory, and the NVRTC build (its version,
its wheel's, the libnvrtc file) and the pinned address. A record is used only from a trusted
cache directory (kjit/cache/trust.py: the user's own, writable by no one else), its PCH file
only where it is a regular file of this user's that still has the identity recorded (NVRTC
maps it: one cut short would end the process with SIGBUS), and only while its Snapshot check
passes (NVRTC does not notice a header edited since the PCH was made): in every process, at
every use.
"""
from __future__ import annotations

import binascii
import functools
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

FORMAT = 1
PIN_ADDR = 0x600000000000  # far from where Linux puts mappings (top down from 0x7f..) or brk
MAX_RECORD = 16 << 20

_state: dict[str, Any] = {}


# --- the heap's address -------------------------------------------------------------------------
def _module() -> Any:
    try:
        from . import _pchheap  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _pchheap


def pin(heap: int) -> bool:
    """Pin NVRTC's PCH heap (of `heap` bytes) at PIN_ADDR for this process's next heap mapping
    (libnvrtc loaded by then); False where it cannot be (no extension, no libnvrtc found)."""
    mod = _module()
    if mod is None:
        return False
    if "lib" not in _state:
        _state["lib"] = mod.pin(PIN_ADDR, heap)
    else:
        mod.set_size(heap)
    return bool(_state["lib"])


def placed() -> bool | None:
    """Whether NVRTC's heap is at PIN_ADDR: None before it is mapped (or without the pin)."""
    mod = _module()
    if mod is None or not _state.get("lib"):
        return None
    addr, err = mod.placed()
    if err == -1:
        return None
    return addr == PIN_ADDR


def _library() -> list:
    """The libnvrtc file the pin found (path, size, mtime): another build at the same path is
    another key. Remembered only once the pin has found it (asked earlier, it is not known)."""
    if "library" in _state:
        return _state["library"]
    path = _state.get("lib") or ""
    if path:
        _state["library"] = _file_identity(path)
        return _state["library"]
    return _file_identity(path)


def _file_identity(path: str) -> list:
    try:
        st = os.stat(path)
        return [os.path.realpath(path), st.st_size, st.st_mtime_ns]
    except OSError:
        return [path]


@functools.lru_cache(maxsize=None)
def _nvrtc() -> list:
    """NVRTC's version and its wheel's (identity.compiler_identity's parts: that module is
    not imported here, as it imports nvrtc, which imports pch)."""
    from ..locations import package_version
    from . import facts
    dist = "nvidia-cuda-nvrtc"
    return [list(facts.nvrtc()["version"]), package_version((dist, dist + "-cu13", dist + "-cu12"))]


def key(prologue: str, name: str, flags: Any, headers: dict) -> str:
    from ..cache import canonical
    from ..hashing import sha256
    return sha256(canonical([FORMAT, _nvrtc(), _library(), hex(PIN_ADDR),
                             prologue, name, list(flags), sorted(headers.items()),
                             os.getcwd()])).hexdigest()


# --- the directory --------------------------------------------------------------------------------
def directory() -> Path | None:
    """The writable cache directory's pch/ (made, mode 700), where the cache is on and the
    directory trusted; else None."""
    try:
        from ..cache import PCH_SUBDIR, current_cache, enabled_by_env, trusted, writable
        if not enabled_by_env():
            return None
        base = current_cache().path
        if not writable(base) or not trusted(base):
            return None
        d = base / PCH_SUBDIR
        if not d.is_dir():
            base.mkdir(parents=True, exist_ok=True, mode=0o700)
            d.mkdir(exist_ok=True, mode=0o700)
        return d if trusted(base) else None   # pch/ itself checked too (trust.SUBDIRS)
    except Exception:   # no home directory, a read-only file system: PCHs stay in the process
        return None


def new_path(d: Path, k: str) -> str:
    """A new name for NVRTC to write a PCH to (renamed by save)."""
    return str(d / f"{k}-{os.urandom(6).hex()}.pch.tmp")


# --- records ---------------------------------------------------------------------------------------
class Record:
    __slots__ = ("path", "snapshot", "obs", "heap", "ident", "file")

    def __init__(self, path: Path, snapshot: Any, obs: Any, heap: int, ident: list, file: Path):
        self.path, self.snapshot, self.obs, self.heap = path, snapshot, obs, heap
        self.ident, self.file = ident, file


class SavedObservation:
    """What a PCH's build read, as _Pch.observation needs it back (paths only: the stat data
    is the Snapshot's)."""
    __slots__ = ("read", "probed", "absent", "cwd", "cwd_dependent")

    def __init__(self, read: list, probed: list, absent: list, cwd: str, cwd_dependent: bool):
        self.read, self.probed, self.absent = read, probed, absent
        self.cwd, self.cwd_dependent = cwd, cwd_dependent


def _check_line(payload: bytes) -> bytes:
    return b"crc32:%08x" % binascii.crc32(payload)


def _ident(st: os.stat_result) -> list:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _owned_file(path: Path) -> os.stat_result | None:
    """The stat of `path` where it is a regular file (no link) of this user's (or root's) that
    no one else can write; else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or (st.st_mode & 0o022):
        return None
    if hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0):
        return None
    return st


def load(d: Path, k: str) -> Record | None:
    """The record filed under `k` with its PCH file, where both are intact and trusted; None
    where there is none (a damaged or untrusted one is removed where it is ours)."""
    from ..cache import read_private
    from .keys.snapshot import Snapshot
    rec_path = d / f"{k}.json"
    try:
        data = read_private(rec_path, MAX_RECORD)
    except OSError:
        return None
    try:
        digest, _, payload = data.partition(b"\n")
        if len(data) > MAX_RECORD or _check_line(payload) != digest:
            raise ValueError("damaged")
        rec = json.loads(payload)
        name = rec["file"]
        if not (isinstance(name, str) and name.startswith(k + "-") and name.endswith(".pch")
                and "/" not in name and rec["format"] == FORMAT):
            raise ValueError("not ours")
        snap = Snapshot.from_json(rec["snapshot"])
        o = rec["obs"]
        obs = SavedObservation(list(o["read"]), list(o["probed"]), list(o["absent"]),
                               str(o["cwd"]), bool(o["cwd_dependent"]))
        if snap is None or not all(p in snap.files for p in obs.read + obs.probed):
            raise ValueError("damaged")
        heap, ident = int(rec["heap"]), list(rec["ident"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        drop(d, k)
        return None
    file = d / name
    st = _owned_file(file)
    if st is None or _ident(st) != ident:
        drop(d, k)
        return None
    return Record(file, snap, obs, heap, ident, rec_path)


def save(d: Path, k: str, tmp: str, snapshot: Any, obs: Any, heap: int) -> Record | None:
    """File the PCH NVRTC wrote to `tmp` (new_path) under `k` with its Snapshot; returns its
    Record, another process's where one filed an intact one meanwhile (ours goes), or None
    where it cannot stay (the cache's size cap: kjit/cache/pchdir.stored)."""
    from ..cache import pch_stored
    from ..fileio import replace_with
    theirs = load(d, k)
    # filed meanwhile from the headers as they are: one from a header since edited is replaced
    if theirs is not None and theirs.snapshot.holds():
        _unlink(tmp)
        return theirs
    final = tmp[:-len(".tmp")]
    try:
        os.chmod(tmp, 0o600)
        os.rename(tmp, final)   # never rewritten in place: NVRTC maps it MAP_PRIVATE
        st = os.stat(final)
        payload = json.dumps({
            "format": FORMAT, "file": os.path.basename(final), "ident": _ident(st), "heap": heap,
            "snapshot": snapshot.to_json(),
            "obs": {"read": sorted(obs.read), "probed": sorted(obs.probed),
                    "absent": list(obs.absent), "cwd": obs.cwd,
                    "cwd_dependent": bool(obs.cwd_dependent)}}, separators=(",", ":")).encode()
        replace_with(d / f"{k}.json", _check_line(payload) + b"\n" + payload)
    except OSError:
        _unlink(tmp)
        _unlink(final)
        return None
    _unlink(d / f"{k}.seen")
    _sweep_key(d, k, keep=os.path.basename(final))
    if not pch_stored(k, st.st_size):
        drop(d, k)
        return None
    return Record(Path(final), snapshot, obs, heap, _ident(st), d / f"{k}.json")


def _sweep_key(d: Path, k: str, keep: str) -> None:
    """Remove this key's PCH files a record no longer names (a writer that lost a race, a
    record replaced), once old enough that no process is about to use one by its name."""
    import time
    from ..cache import PCH_ORPHAN_S
    try:
        for n in os.listdir(d):
            if n.startswith(k + "-") and n.endswith(".pch") and n != keep:
                if time.time() - os.lstat(d / n).st_mtime > PCH_ORPHAN_S:
                    _unlink(d / n)
    except OSError:
        pass


def file_of(d: Path, k: str) -> str | None:
    """The path of the PCH file the record under `k` names now, if any."""
    try:
        name = json.loads(read_record(d, k)).get("file")
    except Exception:
        return None
    return str(d / name) if isinstance(name, str) and "/" not in name else None


def read_record(d: Path, k: str) -> bytes:
    from ..cache import read_private
    return read_private(d / f"{k}.json", MAX_RECORD).partition(b"\n")[2]


def refresh(rec: Record, k: str) -> None:
    """The Snapshot's stat data changed (a header touched, same contents): saved, so the next
    process only stats again."""
    from ..fileio import replace_with
    try:
        data = json.loads(read_record(rec.path.parent, k))
        if data.get("file") != rec.path.name or data.get("ident") != rec.ident:
            return   # another process filed another PCH under the key: its Snapshot is its own
        data["snapshot"] = rec.snapshot.to_json()
        payload = json.dumps(data, separators=(",", ":")).encode()
        replace_with(rec.file, _check_line(payload) + b"\n" + payload)
    except (OSError, ValueError):
        pass


def touch(d: Path, k: str) -> None:
    """Mark a PCH used now (its record's mtime: the cache's LRU order)."""
    try:
        os.utime(d / f"{k}.json")
    except OSError:
        pass


def drop(d: Path, k: str) -> None:
    """Remove a record and the PCH it names (stale, damaged, refused), leaving the mark that
    its prologue was compiled, so that the next compile of it builds one again."""
    try:
        name = json.loads(read_record(d, k)).get("file")
        if isinstance(name, str) and name.startswith(k + "-") and "/" not in name:
            _unlink(d / name)
    except Exception:
        pass
    _unlink(d / f"{k}.json")
    mark_seen(d, k)


# --- one builder per prologue -----------------------------------------------------------------
CLAIM_MAX_S = 120.0   # a build claim older than this is its dead or stuck builder's: taken over


def claim(d: Path, k: str) -> bool:
    """Claim building this prologue's PCH (`<key>.building`, holding the builder's pid): True
    where this process builds it, False where a live process is building it now. Workers
    starting together then make one PCH, not one each (~300 MB apiece, written at once)."""
    path = d / f"{k}.building"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                         0o600)
        except FileExistsError:
            if _claimed(path):
                return False
            _unlink(path)   # its builder is gone: taken over
            continue
        except OSError:
            return True     # no mark can be made: build, as every process would without one
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def building(d: Path, k: str) -> bool:
    """Whether a live process is building this prologue's PCH now."""
    return _claimed(d / f"{k}.building")


def await_build(d: Path, k: str, wait_s: float) -> bool:
    """Wait, at most `wait_s`, while a live process builds this prologue's PCH; whether one
    was (compile_many's workers starting together then make one PCH between them)."""
    if not building(d, k):
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and building(d, k):
        time.sleep(0.02)
    return True


def release(d: Path, k: str) -> None:
    """End this process's claim (its PCH filed, or not built)."""
    path = d / f"{k}.building"
    if _claim_pid(path) == os.getpid():
        _unlink(path)


def _claim_pid(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        text = os.read(fd, 32)
    finally:
        os.close(fd)
    return int(text) if text.strip().isdigit() else None


def _claimed(path: Path) -> bool:
    """A claim whose builder still runs (on this machine) and is not older than CLAIM_MAX_S."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if time.time() - st.st_mtime > CLAIM_MAX_S:
        return False
    pid = _claim_pid(path)
    if pid is None:
        return True   # being written this instant
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass          # alive, another user's: not ours to judge
    return True


def seen(d: Path, k: str) -> bool:
    """Whether a process compiled this prologue before (without building its PCH)."""
    return os.path.lexists(d / f"{k}.seen")


def mark_seen(d: Path, k: str) -> None:
    try:
        os.close(os.open(d / f"{k}.seen", os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                         0o600))
    except OSError:
        pass


def _unlink(path: Any) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
