"""The state of the file system a compile key was derived from, and the cheap check that it
still holds (ccache's direct mode and git's index, applied to include resolution).

A Snapshot holds every header file the resolution read, with its stat data (size, mtime_ns,
ctime_ns, inode) and content hash, and, for every lookup that did not find a file, the
candidate path and the nearest existing directory above it with that directory's stat data.
check() stats the files and directories. A file is re-read only when its stat changed or it
is "racily clean" (changed within RACY_S of being hashed, where a coarse file-system clock could
hide a second write); the same content is still a match. A directory whose stat changed (or
is racy) has its recorded candidates probed again: a new file that would now be found (a
header that shadows a later one, a deleted header brought back) fails the check; an
unrelated new file does not.

It also holds the environment variables the compile read, each with its value or its
absence: check() fails when one differs (env_holds(), cheap enough for every in-process
repeat).

ctime is the field that cannot be set back: `os.utime` restores mtime after an in-place
rewrite, but the kernel sets ctime to now, so a same-size rewrite with its mtime put back
is still seen.
"""
from __future__ import annotations

import os
import stat as stat_mod
import time
from typing import Any

from ...hashing import sha256

RACY_S = 2.0
_RACY_NS = int(RACY_S * 1e9)


def file_sig(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def dir_sig(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def is_racy(st: os.stat_result, since_s: float) -> bool:
    """True if `st` changed too close to `since_s` (when it was read) to trust its stat."""
    return max(st.st_mtime_ns, st.st_ctime_ns) >= int(since_s * 1e9) - _RACY_NS


def read_hash(path: str) -> str:
    with open(path, "rb") as f:
        return sha256(f.read()).hexdigest()


def nearest_dir(path: str) -> tuple[str, os.stat_result | None]:
    """The nearest existing directory at or above dirname(path), with its stat."""
    d = os.path.dirname(path)
    while True:
        try:
            st = os.stat(d)
        except OSError:
            parent = os.path.dirname(d)
            if not parent or parent == d:
                return d, None
            d = parent
            continue
        return d, st


# os.environ's own dict (bytes -> bytes on POSIX): a lookup in it costs a dict probe, where
# os.environ.get runs three Python frames; updated by every os.environ assignment.
_ENVIRON = getattr(os.environ, "_data", None)
_ENV_BYTES = isinstance(_ENVIRON, dict) and all(isinstance(k, bytes) for k in list(_ENVIRON)[:1])


class Snapshot:
    """files: path -> [size, mtime_ns, ctime_ns, ino, sha256, racy]; dirs: directory ->
    [mtime_ns, ctime_ns, ino, racy, [absent candidate paths]]; cwd: the working directory
    when relative names decided a lookup (else None); env: variable -> value (None: unset)
    for each environment variable the compiler read."""

    __slots__ = ("files", "dirs", "cwd", "recorded_at", "updated", "env", "_env_probe")

    def __init__(self, files: dict | None = None, dirs: dict | None = None,
                 cwd: str | None = None, recorded_at: float | None = None,
                 env: dict | None = None):
        self.files: dict[str, list] = files if files is not None else {}
        self.dirs: dict[str, list] = dirs if dirs is not None else {}
        self.cwd = cwd
        self.recorded_at = time.time() if recorded_at is None else recorded_at
        self.updated = False  # check() refreshed stat data: worth saving again
        self.env: dict[str, str | None] = env if env is not None else {}
        self._env_probe: tuple | None = None

    def env_holds(self) -> bool:
        """True if every environment variable the compile read has the value it had."""
        probe = self._env_probe
        if probe is None:
            if not self.env:
                probe = self._env_probe = ((), ())
            elif _ENV_BYTES:
                enc = os.fsencode
                names = tuple(enc(n) for n in self.env)
                values = tuple(None if v is None else enc(v) for v in self.env.values())
                probe = self._env_probe = (names, values)
            else:
                return all(os.environ.get(n) == v for n, v in self.env.items())
        names, values = probe
        return not names or tuple(map(_ENVIRON.get, names)) == values

    # --- recording (by the include resolver) ------------------------------------------------
    def add_file(self, path: str, st: os.stat_result, sha: str) -> None:
        self.files[path] = [*file_sig(st), sha, is_racy(st, self.recorded_at)]

    def add_absent(self, candidate: str, dir_cache: dict[str, tuple[str, Any]],
                   known_new: bool = False) -> None:
        """`known_new`: the caller adds each path once, so its directory's list is not
        searched (linear, where a record lists many absent paths)."""
        parent = os.path.dirname(candidate)
        where = dir_cache.get(parent)
        if where is None:
            where = dir_cache[parent] = nearest_dir(candidate)
        d, st = where
        entry = self.dirs.get(d)
        if entry is None:
            if st is None:  # not even "/" could be read: nothing to watch; always re-probe
                entry = self.dirs[d] = [0, 0, 0, True, []]
            else:
                entry = self.dirs[d] = [*dir_sig(st), is_racy(st, self.recorded_at), []]
        if known_new or candidate not in entry[4]:
            entry[4].append(candidate)

    @property
    def empty(self) -> bool:
        """Nothing to check: no file, no lookup, no environment variable."""
        return not self.files and not self.dirs and not self.env

    def paths(self) -> tuple[list[str], list[str]]:
        """(files, directories) whose changes the check looks at."""
        return list(self.files), list(self.dirs)

    # --- checking ----------------------------------------------------------------------------
    def holds(self) -> bool:
        """check(), False also where it cannot be made: a file unreadable, or a snapshot read
        back from disk whose records are not of the shape check() reads."""
        try:
            return bool(self.check())
        except (OSError, TypeError, ValueError, IndexError, KeyError, AttributeError):
            return False

    def check(self) -> bool:
        """True if every recorded file has the same content and every recorded lookup would
        find the same thing. Updates stat data of files and directories found unchanged in
        content, so the next check is a stat again."""
        if self.cwd is not None and os.getcwd() != self.cwd:
            return False
        if self.env and not self.env_holds():
            return False
        now = time.time()
        stat = os.stat
        for path, rec in self.files.items():
            try:
                st = stat(path)
            except OSError:
                return False
            # field by field, no tuples: this line runs for each of ~600 headers on a hit
            if rec[5] or st.st_mtime_ns != rec[1] or st.st_size != rec[0] \
                    or st.st_ctime_ns != rec[2] or st.st_ino != rec[3]:
                if st.st_size != rec[0] or not stat_mod.S_ISREG(st.st_mode):
                    return False
                try:
                    sha = read_hash(path)
                except OSError:
                    return False
                if sha != rec[4]:
                    return False
                rec[:4] = file_sig(st)
                rec[5] = is_racy(st, now)
                self.updated = True
        for d, rec in list(self.dirs.items()):
            try:
                st = stat(d)
            except OSError:
                st = None
            if st is not None and not rec[3] and dir_sig(st) == tuple(rec[:3]):
                continue
            if not self._reprobe(d, rec, now):
                return False
        return True

    def _reprobe(self, d: str, rec: list, now: float) -> bool:
        """A directory changed: its candidates must still be absent; record them again under
        whatever directory now is nearest (a created subdirectory is watched from then on)."""
        candidates = rec[4]
        for cand in candidates:
            try:
                if stat_mod.S_ISREG(os.stat(cand).st_mode):
                    return False
            except OSError:
                pass
        del self.dirs[d]
        self.updated = True
        saved, self.recorded_at = self.recorded_at, now
        try:
            cache: dict[str, tuple[str, Any]] = {}
            for cand in candidates:
                self.add_absent(cand, cache)
        finally:
            self.recorded_at = saved
        return True

    # --- persistence -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Files grouped by directory (a third of the size: paths share long prefixes)."""
        grouped: dict[str, dict[str, list]] = {}
        for path, rec in self.files.items():
            d, base = os.path.split(path)
            grouped.setdefault(d, {})[base] = rec
        return {"files": grouped, "dirs": self.dirs, "cwd": self.cwd,
                "recorded_at": self.recorded_at, "env": self.env}

    @classmethod
    def from_json(cls, data: Any) -> "Snapshot | None":
        """A snapshot from its JSON, or None if it is not shaped like one. Values are not
        checked one by one: a wrong one can only fail check() (or raise there), never pass."""
        try:
            files = {}
            for d, group in data["files"].items():
                prefix = d if d.endswith(os.sep) else d + os.sep  # os.path.join, ~600 times
                for base, rec in group.items():
                    files[prefix + base] = rec
            dirs = data["dirs"]
            cwd = data["cwd"]
            env = data["env"]   # one without (an older kjit's) never checked the variables
            if not isinstance(dirs, dict) or (cwd is not None and not isinstance(cwd, str)) \
                    or not isinstance(env, dict) or not all(
                        isinstance(n, str) and (v is None or isinstance(v, str))
                        for n, v in env.items()):
                return None
            return cls(files, dirs, cwd, float(data["recorded_at"]), env)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


# --- from an observed compile ------------------------------------------------------------------
PROBED = "-"  # the hash recorded for a file the compiler found but never opened


def timestamp_granularity() -> float:
    """How far a file's ctime can lag the clock: Linux stamps files from the coarse clock, one
    scheduler tick behind (4 ms at HZ=250); never taken below 10 ms."""
    try:
        res = time.clock_getres(getattr(time, "CLOCK_REALTIME_COARSE", 5))
    except (OSError, AttributeError):
        res = 0.01
    return max(2 * res, 0.01)


def from_observation(obs: Any, started: float) -> "tuple[Snapshot, list[tuple[str, str]], list[str]] | None":
    """(Snapshot, [(path, sha256)] of the files read, [paths] found but not read) for what an
    observed compile that started at `started` (time.time()) saw; None when that cannot be
    known: a file changed between the compiler's read and now, or changed so close to the
    compile's start that the file system's timestamps could not show a second change (ccache's
    rule, on ctime: every write sets it, nothing sets it back, and a future mtime is no
    change), or a path looked for was found afterwards."""
    if not obs.complete or obs.unkeyable:
        return None
    snap = Snapshot(env=dict(obs.env))
    limit = int((started - timestamp_granularity()) * 1e9)
    read = []
    for path in sorted(obs.read):
        dev, ino, size, mtime, ctime = obs.read[path]
        known = obs.digests.get(path)
        try:
            st = os.stat(path)
            sha = known or read_hash(path)
            after = st if known else os.stat(path)
        except OSError:
            return None
        if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != (ino, size, mtime, ctime) \
                or file_sig(after) != file_sig(st) or ctime >= limit:
            return None
        snap.add_file(path, st, sha)
        read.append((path, sha))
    for path in sorted(obs.probed):
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not stat_mod.S_ISREG(st.st_mode):
            return None
        snap.files[path] = [*file_sig(st), PROBED, False]  # any change: look again
    cache: dict[str, tuple[str, Any]] = {}
    for path in obs.absent:
        try:
            if stat_mod.S_ISREG(os.stat(path).st_mode):
                return None
        except OSError:
            pass
        snap.add_absent(path, cache)
    if obs.cwd_dependent:
        snap.cwd = obs.cwd
    return snap, read, sorted(obs.probed)
