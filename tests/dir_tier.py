"""A shared tier in a directory: a backend written outside kjit, as a user would write one
for S3, plugged in with KJIT_REMOTE_CACHE_BACKEND=dir_tier:DirectoryTier and
KJIT_REMOTE_CACHE=dir:///some/path. Processes on one machine share it the way nodes share a
server, so the tests can run "nodes" as processes with their own disk caches.

Layout under <path>/<prefix, quoted>/: e/<key> the values, lease/<key> the leases (a token),
each file's mtime its expiry (NEVER: none). Whole files appear by rename or link, so a reader
never sees half a value; put-if-absent and the lease steps run under one flock, so they are
atomic across processes. No notifications: waiters poll (the interface's default watch).
"""
from __future__ import annotations

import fcntl
import os
import secrets
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator
from urllib.parse import quote, urlsplit

from kjit.cache.backend import Lease, RemoteTier, TierError, ValueTooLarge

NEVER = float(1 << 32)   # an mtime past 2100: no expiry
SLACK = 64               # a signed value's header, over config.max_value


def _expiry(ttl_s: float) -> float:
    return time.time() + ttl_s if ttl_s > 0 else NEVER


def _left(mtime: float) -> float | None:
    return None if mtime >= NEVER else max(mtime - time.time(), 0.0)


class DirectoryTier(RemoteTier):
    def __init__(self, config: Any):
        parts = urlsplit(config.url)
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError("a directory tier's URL is dir:///absolute/path")
        self.url = config.url
        self.root = Path(parts.path) / quote(config.prefix, safe="")
        self.max_value = config.max_value

    # --- plumbing ----------------------------------------------------------------------------
    @contextmanager
    def _io(self):
        """The store's own errors (a missing or unwritable directory) are the tier's faults."""
        try:
            yield
        except OSError as exc:
            raise TierError(f"{type(exc).__name__}: {exc}") from None

    @contextmanager
    def _locked(self):
        with self._io():
            for sub in ("e", "lease", "tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _write_temp(self, data: bytes, expires: float) -> Path:
        tmp = self.root / "tmp" / secrets.token_hex(8)
        tmp.write_bytes(data)
        os.utime(tmp, (expires, expires))
        return tmp

    def _name(self, kind: str, key: str | bytes) -> Path:
        key = key.decode() if isinstance(key, bytes) else key
        if not key or not all(c.isalnum() or c == "-" for c in key):  # no "..", no "/"
            raise TierError(f"not a key this tier stores: {key!r}")
        return self.root / kind / key

    def _live(self, path: Path) -> os.stat_result | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return st if st.st_mtime > time.time() else None

    # --- what a compile uses ---------------------------------------------------------------
    def get(self, key: str, ttl_s: float) -> bytes | None:
        path = self._name("e", key)
        with self._io():
            st = self._live(path)
            if st is None:
                return None
            if st.st_size > self.max_value + SLACK:  # judged by its size, before reading it
                raise ValueTooLarge(f"a value of {st.st_size} bytes")
            with open(path, "rb") as f:
                data = f.read(self.max_value + SLACK + 1)
            if len(data) > self.max_value + SLACK:
                raise ValueTooLarge("a value that grew while it was read")
            try:
                os.utime(path, (time.time(), _expiry(ttl_s)))  # the TTL slides
            except FileNotFoundError:
                pass
            return data

    def put(self, key: str, value: bytes, ttl_s: float, *, overwrite: bool = True) -> bool:
        path = self._name("e", key)
        with self._locked():
            if not overwrite and self._live(path) is not None:
                return False
            os.replace(self._write_temp(value, _expiry(ttl_s)), path)
            return True

    def lease(self, key: str, ttl_s: float) -> Lease | None:
        path = self._name("lease", key)
        with self._locked():
            if self._live(path) is not None:
                return None
            token = secrets.token_hex(16)
            os.replace(self._write_temp(token.encode(), _expiry(ttl_s)), path)
            return DirectoryLease(self, path, token, ttl_s)

    def lease_ttl(self, key: str) -> float | None:
        with self._io():
            st = self._live(self._name("lease", key))
            return 0.0 if st is None else _left(st.st_mtime)

    def expire_lease(self, key: str, ttl_s: float) -> bool:
        path = self._name("lease", key)
        with self._locked():
            st = self._live(path)
            if st is None or st.st_mtime < NEVER:
                return False
            os.utime(path, (time.time(), _expiry(ttl_s)))
            return True

    # --- what `kjit cache ls/stats/clear --remote` use -------------------------------------
    def keys(self) -> Iterator[str]:
        with self._io():
            names = os.listdir(self.root / "e") if (self.root / "e").is_dir() else []
        return iter([n for n in names if len(n) == 64 and n.isalnum()])

    def peek(self, keys: list[str], size: int) -> list[tuple[bytes | None, float | None]]:
        out: list[tuple[bytes | None, float | None]] = []
        with self._io():
            for k in keys:
                path = self._name("e", k)
                st = self._live(path)
                if st is None:
                    out.append((None, None))
                    continue
                with open(path, "rb") as f:
                    out.append((f.read(size), _left(st.st_mtime)))
        return out

    def sizes(self, keys: list[str]) -> list[int]:
        with self._io():
            return [st.st_size if (st := self._live(self._name("e", k))) else 0 for k in keys]

    def delete(self, keys: Iterable[str | bytes]) -> int:
        removed = 0
        with self._locked():
            for k in keys:
                try:
                    self._name("e", k).unlink()
                    removed += 1
                except FileNotFoundError:
                    pass
                self._name("lease", k).unlink(missing_ok=True)
        return removed

    def clear(self) -> int:
        with self._io():
            names = os.listdir(self.root / "e") if (self.root / "e").is_dir() else []
        return self.delete(names)

    def stats(self) -> dict[str, Any]:
        with self._io():
            n = len(os.listdir(self.root / "e")) if (self.root / "e").is_dir() else 0
        return {"server": f"directory {self.root}", "values": n}


class DirectoryLease(Lease):
    def __init__(self, tier: DirectoryTier, path: Path, token: str, ttl_s: float):
        self.tier, self.path, self.token, self.ttl_s = tier, path, token, ttl_s

    def _ours(self) -> bool:
        try:
            return self.tier._live(self.path) is not None and self.path.read_text() == self.token
        except FileNotFoundError:
            return False

    def renew(self) -> bool:
        with self.tier._locked():
            if not self._ours():
                return False
            os.utime(self.path, (time.time(), _expiry(self.ttl_s)))
            return True

    def release(self) -> None:
        try:
            with self.tier._locked():
                if self._ours():
                    self.path.unlink()
        except TierError:  # it lapses anyway
            pass


# --- backends that go wrong, for the tests of what kjit does then ------------------------------
class ClientErrorTier(DirectoryTier):
    """Its client library raises its own errors, not TierError (as botocore's would)."""

    def get(self, key: str, ttl_s: float) -> bytes | None:
        raise RuntimeError("connection reset by peer")

    def lease(self, key: str, ttl_s: float) -> Lease | None:
        raise RuntimeError("connection reset by peer")


class NotATier:
    """Has a backend's reading half, but is not a RemoteTier."""

    def __init__(self, config: Any):
        pass

    def get(self, key: str, ttl_s: float) -> bytes | None:
        return None

    def put(self, key: str, value: bytes, ttl_s: float, *, overwrite: bool = True) -> bool:
        return True


class HalfTier(RemoteTier):
    """Implements get and put only."""

    def __init__(self, config: Any):
        self.url = config.url

    get = NotATier.get
    put = NotATier.put
