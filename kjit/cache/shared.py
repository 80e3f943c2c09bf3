"""Between the cache and a shared tier: checked values, cluster-wide leases, and faults.

- A value is the disk entry's bytes (kjit.cache.entry), signed when a key is set: every node
  can write to a shared server, and a cubin read from it runs on every GPU. Signed, it is
  SIG_MAGIC (8) | HMAC-SHA256(secret, context + key + entry) (32) | entry; the cache key is
  inside the MAC, so a validly signed value cannot be replayed under another key. A value is
  used only if its signature (when a key is set) and its entry checksum hold; anything else
  is a counted miss, never an error or a wrong binary.
- After a local miss the first process in the cluster takes a lease and compiles; the others
  block on a subscription to the key until it publishes (checking the lease every
  RECHECK_S), and compile themselves if the lease lapses (its holder died) or after
  config.wait_s.
- A failing server costs one warning and at most one timeout; then the tier is skipped for a
  back-off that doubles while it keeps failing. Local entries are never touched.
"""
from __future__ import annotations

import hashlib
import hmac
import threading
import time
import warnings
from collections import Counter
from typing import NamedTuple

from . import entry
from .remote import (ENV_LEASE, ENV_URL, ENV_VARS, Lease, RemoteConfig, RemoteTier, TierError,
                     TierFull, ValueTooLarge, open_tier)
from .disk import CacheWarning
from ..objectcode import ObjectCode
from ..settings import env_raw, env_text

# A "no value" marker under a key tells waiters to stop waiting and compile themselves: the
# value is too large to share, or the lease holder's compile failed (an error is not cached;
# without the marker the waiters would take the lease and fail one after another).
NO_VALUE = b"KJITNONE"
FAILED_MARK_TTL_S = 60.0

RECHECK_S = 1.0        # a waiter checks the lease this often (at most lease_s / 2)
BACKOFF_MAX_S = 120.0
# A lease further from lapsing than this many of our lease terms (and this many seconds) was
# not taken by a kjit that shares our settings: waiting on it could take hours.
LEASE_PLAUSIBLE = 4
LEASE_PLAUSIBLE_MIN_S = 120.0

# What a process counts; `kjit cache stats` shows the totals (persisted by flush_counts).
COUNTERS = ("hits", "misses", "errors", "refused", "corrupt", "too_large", "skipped", "puts",
            "bad_leases")
_pending: Counter = Counter()


# --- signed values ------------------------------------------------------------------------------
SIG_MAGIC = b"KJITSIG1"
_CONTEXT = b"kjit-remote-value-v1\0"
_MAC_SIZE = 32
SIG_HEADER = len(SIG_MAGIC) + _MAC_SIZE   # what a signed value carries before its entry


class Refused(Exception):
    """A value without a valid signature where one is required; the message says which."""


def _mac(secret: bytes, key: str, blob: bytes | memoryview) -> bytes:
    h = hmac.new(secret, _CONTEXT, hashlib.sha256)
    h.update(key.encode() + b"\0")
    h.update(blob)
    return h.digest()


def sign(secret: bytes | None, key: str, blob: bytes) -> bytes:
    """The value to store for entry bytes `blob` under cache key `key`."""
    if secret is None:
        return blob
    return SIG_MAGIC + _mac(secret, key, blob) + blob


def is_signed(value: bytes) -> bool:
    return value[:len(SIG_MAGIC)] == SIG_MAGIC


def open_value(secret: bytes | None, key: str, value: bytes) -> bytes:
    """The entry bytes inside a stored value; Refused if `secret` is set and the value is not
    signed with it. Without a secret a signed value's MAC cannot be checked: its entry
    bytes are returned, still to be checksummed by kjit.cache.entry."""
    signed = is_signed(value)
    if secret is None:
        return value[SIG_HEADER:] if signed else value
    if not signed:
        raise Refused("value is not signed (written by a node without KJIT_REMOTE_CACHE_KEY?)")
    start = SIG_HEADER
    body = memoryview(value)[start:]
    if not hmac.compare_digest(value[len(SIG_MAGIC):start], _mac(secret, key, body)):
        raise Refused("signature does not match (another key, or the value was altered)")
    return bytes(body)


class Claim(NamedTuple):
    """What the tier gave for a local miss: a checked value, or the lease to compile under,
    or neither (tier down, full, or the wait ran out: compile without publishing order)."""
    obj: ObjectCode | None = None
    meta: dict | None = None
    lease: "HeldLease | None" = None
    waited: float = 0.0


class HeldLease:
    """A lease kept alive by a thread while this process compiles (NVRTC drops the GIL), so
    a slow compile keeps it and a dead process loses it after config.lease_s."""

    def __init__(self, lease: Lease, ttl_s: float):
        self.lease = lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, args=(ttl_s / 3,), daemon=True,
                                        name="kjit-lease")
        self._thread.start()

    def _renew(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                if not self.lease.renew():
                    return
            except Exception:  # the server went away: the lease lapses by itself
                return

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.lease.release()
        except Exception:  # best effort: it lapses anyway
            pass


class SharedTier:
    def __init__(self, config: RemoteConfig, backend: RemoteTier):
        self.config = config
        self.backend = backend
        self.counts: Counter = Counter()   # this process
        self.down_until = 0.0
        self.backoff = config.backoff_s
        self._warned: set[str] = set()

    # --- bookkeeping -------------------------------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n
        _pending[name] += n

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(message, CacheWarning, stacklevel=5)

    def usable(self) -> bool:
        return time.monotonic() >= self.down_until

    def _fault(self, exc: Exception) -> None:
        """The server failed a request: skip it for a back-off, warn the first time."""
        self._count("errors")
        self.down_until = time.monotonic() + self.backoff
        self._warn_once("down", f"kjit remote cache {self.config.display_url} cannot be used ({exc}); "
                                f"using the local cache alone, trying it again after "
                                f"{self.backoff:g} s (longer while it keeps failing)")
        self.backoff = min(self.backoff * 2, max(BACKOFF_MAX_S, self.config.backoff_s))

    def _ok(self) -> None:
        self.backoff = self.config.backoff_s

    def close(self) -> None:
        try:
            self.backend.close()
        except Exception:
            pass

    # --- small records beside the values (lookup.peek, compiler/keys/portable) ----------------
    def fetch(self, k: str) -> tuple[ObjectCode, dict] | None:
        """The checked entry under k, or None, without a claim or lease; a server fault backs
        the tier off as for any request."""
        if not self.usable():
            return None
        try:
            got = self._fetch(k, "", set())
        except TierError as exc:
            self._fault(exc)
            return None
        return got if isinstance(got, tuple) else None

    def get_signed(self, k: str) -> bytes | None:
        """The signature-checked bytes under k (not an entry), or None."""
        if not self.usable():
            return None
        try:
            value = self.backend.get(k, self.config.ttl_s)
            self._ok()
            if value is not None and not isinstance(value, bytes):
                raise entry.CorruptEntry(f"the tier answered with a {type(value).__name__}")
            return None if value is None else open_value(self.config.secret, k, value)
        except ValueTooLarge:  # refused unread: this record, not the server, is at fault
            self._count("too_large")
        except TierError as exc:
            self._fault(exc)
        except entry.CorruptEntry as exc:  # a key of another Redis type, say: a miss
            self._count("corrupt")
            self._warn_once("corrupt", f"kjit remote cache {self.config.display_url}: the record "
                                       f"under {k[:18]}… was corrupt ({exc}); not used")
        except (Refused, TypeError, ValueError):
            self._count("refused")
        return None

    def put_signed(self, k: str, blob: bytes) -> None:
        """Store `blob` under k, signed as values are; best effort."""
        if not self.usable():
            return
        try:
            self.backend.put(k, sign(self.config.secret, k, blob), self.config.ttl_s)
            self._ok()
        except TierFull as exc:  # hits still work on a full server: no back-off
            self._full(exc)
        except TierError as exc:
            self._fault(exc)

    # --- reading -------------------------------------------------------------------------------
    def _fetch(self, k: str, label: str, seen: set[str]) -> tuple[ObjectCode, dict] | bytes | None:
        """The checked entry under k; NO_VALUE for a marker; None if absent or unusable
        (counted once per claim)."""
        try:
            value = self.backend.get(k, self.config.ttl_s)  # TierError: the caller's fault path
            self._ok()
            if value is None:
                return None
            if not isinstance(value, bytes):  # a tier other than kjit's own may say anything
                raise TierError(f"the tier answered with a {type(value).__name__}, not bytes")
            if value.startswith(NO_VALUE):
                return NO_VALUE
            return entry.decode(open_value(self.config.secret, k, value), k)
        except ValueTooLarge as exc:
            what, why = "too_large", f"{exc}; raise KJIT_REMOTE_CACHE_MAX_VALUE to use such values"
        except Refused as exc:
            what, why = "refused", str(exc)
        except entry.CorruptEntry as exc:
            what, why = "corrupt", str(exc)
        if what not in seen:
            seen.add(what)
            self._count(what)
            self._warn_once(what, f"kjit remote cache {self.config.display_url}: the value for "
                                  f"{k[:16]}… ({label}) was {what.replace('_', ' ')} ({why}); not used, compiling "
                                  f"instead (counted in `kjit cache stats`)")
        return None

    def claim(self, k: str, label: str = "") -> Claim:
        """After a local miss (local lock held): the value from the tier, perhaps after another
        node compiled it, or the lease to compile it under."""
        if not self.usable():
            self._count("skipped")
            return Claim()
        t0 = time.monotonic()
        seen: set[str] = set()
        watch = None
        recheck = min(RECHECK_S, self.config.lease_s / 2)
        lease_checked = False
        try:
            found = self._fetch(k, label, seen)
            deadline = t0 + self.config.wait_s
            while found is None:
                try:
                    lease = self.backend.lease(k, self.config.lease_s)
                except TierFull as exc:  # no room for a lease: compile without one
                    self._full(exc)
                    break
                if lease is not None:
                    # the holder may have published and let go between our read and our lease
                    found = self._fetch(k, label, seen)
                    if found is NO_VALUE:
                        found = None
                    if found is not None:
                        lease.release()
                        break
                    self._count("misses")
                    return Claim(lease=HeldLease(lease, self.config.lease_s),
                                 waited=time.monotonic() - t0)
                if not lease_checked:  # once per claim: one more round trip, on contention only
                    lease_checked = True
                    if self._broken_lease(k, label):
                        break
                if time.monotonic() >= deadline:
                    self._warn_once("wait", f"kjit remote cache: waited {self.config.wait_s:g} s for "
                                            f"another process to compile {label or k[:16]}; compiling "
                                            f"here (raise KJIT_REMOTE_CACHE_WAIT for longer compiles)")
                    break
                if watch is None:
                    watch = self.backend.watch(k)
                    found = self._fetch(k, label, seen)  # published before we subscribed?
                    if found is not None:
                        break
                watch.wait(min(recheck, deadline - time.monotonic()))
                found = self._fetch(k, label, seen)
            if found is NO_VALUE:  # not shared: compile here, without waiting for anyone
                found = None
        except TierError as exc:
            self._fault(exc)
            return Claim(waited=time.monotonic() - t0)
        finally:
            if watch is not None:
                watch.close()
        waited = time.monotonic() - t0
        if found is None:
            self._count("misses")
            return Claim(waited=waited)
        self._count("hits")
        return Claim(obj=found[0], meta=found[1], waited=waited)

    def _broken_lease(self, k: str, label: str) -> bool:
        """True when the lease another holds for k is not one to wait for: it never lapses
        (planted, or set by hand) and cannot be given an expiry, or it lapses implausibly
        late. One without expiry is given our lease term, then waited for as usual."""
        ttl = self.backend.lease_ttl(k)
        most = max(self.config.lease_s * LEASE_PLAUSIBLE, LEASE_PLAUSIBLE_MIN_S)
        if ttl is not None and ttl <= most:
            return False
        self._count("bad_leases")
        what = "never lapses" if ttl is None else f"lapses only in {ttl:.0f} s"
        if ttl is None and self.backend.expire_lease(k, self.config.lease_s):
            self._warn_once("lease", f"kjit remote cache {self.config.display_url}: the compile "
                                     f"lease for {label or k[:16]} {what} (not kjit's); it now "
                                     f"lapses after {self.config.lease_s:g} s ({ENV_LEASE})")
            return False
        self._warn_once("lease", f"kjit remote cache {self.config.display_url}: the compile lease "
                                 f"for {label or k[:16]} {what}, which no kjit node sets; "
                                 "compiling here without waiting for it")
        return True

    # --- writing -------------------------------------------------------------------------------
    def _full(self, exc: Exception) -> None:
        self._count("errors")
        self._warn_once("full", f"kjit remote cache {self.config.display_url} is full ({exc}); new "
                                "entries stay local, hits still work. Raise its maxmemory, or let "
                                "it drop old entries: CONFIG SET maxmemory-policy allkeys-lru "
                                "(docs/cluster.md, Sizing)")

    def publish(self, k: str, blob: bytes, *, overwrite: bool = True) -> bool | None:
        """Store checked entry bytes for the cluster: True stored, False already there
        (overwrite=False), None not stored (too large, tier down or full)."""
        if len(blob) > self.config.max_value:
            self._count("too_large")
            self._mark(k, b"too large to share", self.config.ttl_s)
            return None
        if not self.usable():
            self._count("skipped")
            return None
        try:
            stored = self.backend.put(k, sign(self.config.secret, k, blob), self.config.ttl_s,
                                      overwrite=overwrite)
        except TierFull as exc:
            self._full(exc)
            return None
        except TierError as exc:
            self._fault(exc)
            return None
        self._ok()
        if stored:
            self._count("puts")
        return stored


    def _mark(self, k: str, reason: bytes, ttl_s: float) -> None:
        if not self.usable():
            return
        try:
            self.backend.put(k, NO_VALUE + b" " + reason, ttl_s)
        except TierError:  # best effort: waiters fall back on the lease
            pass

    def abandon(self, k: str) -> None:
        """The lease holder's create() failed: tell the waiters to compile themselves."""
        self._mark(k, b"the compile failed on another node", FAILED_MARK_TTL_S)


_active: "SharedTier | None" = None   # the tier for _active_sig
_active_sig: tuple | None = None


def active() -> "SharedTier | None":
    """The SharedTier the environment configures, or None (cheap: a few dict lookups).
    InvalidOptionError names a malformed variable. A URL without a signing key and without
    KJIT_REMOTE_CACHE_UNSIGNED=1 leaves the tier off, with one warning per setting."""
    global _active, _active_sig
    if env_text(ENV_URL) is None:
        return None
    sig = tuple(env_raw(v) for v in ENV_VARS)
    if sig != _active_sig:
        config = RemoteConfig.from_env()
        if _active is not None:
            _active.close()
        _active = _active_sig = None   # never the closed one again, if opening the new fails
        refusal = config.refusal if config is not None else None
        _active = None if config is None or refusal else SharedTier(config, open_tier(config))
        _active_sig = sig
        if refusal:
            warnings.warn(refusal, CacheWarning, stacklevel=4)
    return _active


def flush_counts(store) -> None:
    """Add this process's unsaved counts to a local cache store's usage database (its
    writable directory's, for a layered store; none: they are dropped). Best effort."""
    if not _pending:
        return
    counts = dict(_pending)
    _pending.clear()
    store = getattr(store, "top", store)  # readonly.Layered: its writable directory
    if store is None or getattr(store, "read_only", False):
        return
    try:
        with store.usage.transact():
            for name, n in counts.items():
                store.usage.incr("stat:remote_" + name, n)
    except Exception:
        pass


def saved_counts(store) -> dict[str, int]:
    """The totals flush_counts saved in a store, by counter name."""
    usage = store.tables()[1]
    return {name: int(usage.get_number("stat:remote_" + name) or 0) for name in COUNTERS}
