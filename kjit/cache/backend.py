"""What a shared-tier backend implements: the interface between kjit and a store it does not
know (Redis ships with kjit; an S3 bucket, a directory, a team's service can be added without
editing kjit, docs/cluster.md "Writing your own tier").

A backend stores opaque bytes by key and hands out compile leases. A key is a cache key (64
hex digits) or the name of a small record beside one (m-<64 hex digits>): letters, digits
and "-", safe as a file or object name.
It never interprets the bytes: kjit.cache.shared signs and checks them, counts faults and
backs off. So a backend's job is narrow, and its contract is in the signatures below:

- Every method may raise TierError when the store cannot answer (unreachable, too slow,
  refused the login, answered nonsense), TierFull when it refuses a write for lack of space,
  ValueTooLarge when a value is over the read limit. Nothing else: kjit treats any other
  exception from a plug-in backend as a TierError (kjit.cache.registry), but a backend that
  maps its client's errors itself gives users a better message.
- Every request is bounded: in time (config.timeout_s for the whole request, retries
  included), and in bytes (a value over config.max_value is refused before it is read).
  A compile is waiting on each one.
- The constructor (from_config) only checks its configuration: it must not contact the
  store, since a store down at start is a fault like any other (counted, backed off),
  not an error. ValueError there is reported as a bad KJIT_REMOTE_CACHE.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Iterable, Iterator


class TierError(Exception):
    """The tier could not answer: unreachable, too slow, refused the login."""


class TierFull(TierError):
    """The tier refused a write for lack of space (Redis: maxmemory with noeviction). Hits
    still work, so kjit keeps reading without a back-off."""


class ValueTooLarge(TierError):
    """The store offered a value over KJIT_REMOTE_CACHE_MAX_VALUE; it was refused unread."""


class Lease(ABC):
    """The right to compile one key for the cluster, lapsing unless renewed."""

    @abstractmethod
    def renew(self) -> bool:
        """Push the expiry out to the lease's term again; False if it already lapsed (someone
        else may hold it now: never take it back)."""

    @abstractmethod
    def release(self) -> None:
        """Give the lease up, only if it is still ours; never raises (it lapses anyway)."""


class Watch(ABC):
    """A subscription to one key's publications (see RemoteTier.watch)."""

    @abstractmethod
    def wait(self, timeout_s: float) -> bool:
        """Block until a value is published under the key (True) or timeout_s passes
        (False); False may also come early: the waiter looks at the key either way."""

    @abstractmethod
    def close(self) -> None:
        """End the subscription; never raises."""


class PollingWatch(Watch):
    """No notifications: wait a little longer each time, and look again."""

    def __init__(self) -> None:
        self.delay = 0.02

    def wait(self, timeout_s: float) -> bool:
        time.sleep(max(min(self.delay, timeout_s), 0.0))
        self.delay = min(self.delay * 1.5, 0.5)
        return False

    def close(self) -> None:
        pass


class RemoteTier(ABC):
    """A shared store of bytes by cache key, with compile leases. Subclass it, implement
    every abstract method, and name the class in KJIT_REMOTE_CACHE_BACKEND=module:Class (or
    register a URL scheme for it: kjit.cache.registry). Methods that are not abstract have a
    working default a backend may improve on."""

    url: str  # where the store is, for messages: without a password

    @classmethod
    def from_config(cls, config: Any) -> "RemoteTier":
        """The backend for `config`, a kjit.cache.remote.RemoteConfig (its url, prefix,
        timeout_s, max_value ...; typed Any here, where that module is not imported),
        called once per process and configuration. Checks only: no request to the store.
        The default calls cls(config)."""
        return cls(config)  # type: ignore[call-arg]

    # --- what a compile uses ---------------------------------------------------------------
    @abstractmethod
    def get(self, key: str, ttl_s: float) -> bytes | None:
        """The stored value, None if absent (or expired); refreshes its expiry to ttl_s from
        now (0: none), so entries in use stay. ValueTooLarge, unread, for a value over
        max_value plus 64 bytes (a signature's header); kjit.cache.entry.CorruptEntry if the
        store holds something other than a value under the key."""

    @abstractmethod
    def put(self, key: str, value: bytes, ttl_s: float, *, overwrite: bool = True) -> bool:
        """Store `value` (expiring ttl_s after its last use; 0: never) and wake the key's
        watchers. With overwrite=False, store only if no value is there, atomically across
        every client (two nodes publishing at once: one wins, the other gets False). True
        if stored."""

    @abstractmethod
    def lease(self, key: str, ttl_s: float) -> Lease | None:
        """Take the compile lease for `key` if nobody holds it, else None; atomic across every
        client: of all the nodes asking at once, exactly one gets it. It lapses ttl_s after
        it was taken or last renewed, so a dead holder frees it."""

    def watch(self, key: str) -> Watch:
        """Subscribe to publications under `key`, in place once this returns (a put after it
        must wake the waiter). The default polls: correct, with up to 0.5 s of extra wait."""
        return PollingWatch()

    def lease_ttl(self, key: str) -> float | None:
        """Seconds left on the lease for `key` (0 when none is held), None when it never
        lapses (a lease kjit did not take: kjit's always lapse). The default: 0, for a store
        where every lease lapses."""
        return 0.0

    def expire_lease(self, key: str, ttl_s: float) -> bool:
        """Give a lease without expiry one of ttl_s (never shorten a live lease's); False
        when the store cannot."""
        return False

    # --- what `kjit cache ls/stats/clear --remote` use --------------------------------------
    @abstractmethod
    def keys(self) -> Iterator[str]:
        """Every cache key with a value, in any order; names the backend did not write are
        skipped. May take many bounded requests."""

    @abstractmethod
    def peek(self, keys: list[str], size: int) -> list[tuple[bytes | None, float | None]]:
        """For each key, in order: the first `size` bytes of its value (None if absent) and
        the seconds it has left (None: no expiry, or unknown). Reads at most `size` bytes a
        value; never refreshes an expiry."""

    @abstractmethod
    def sizes(self, keys: list[str]) -> list[int]:
        """For each key, in order: its value's length in bytes, 0 if absent."""

    @abstractmethod
    def delete(self, keys: Iterable[str | bytes]) -> int:
        """Remove these keys' values and leases; how many values were removed."""

    @abstractmethod
    def clear(self) -> int:
        """Remove every value and lease this backend stores under its prefix (for every node);
        how many values."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """What the store says about itself, as JSON-able values: `kjit cache stats --remote`
        prints them. Redis gives redis_version, used_memory, maxmemory... Another backend
        should give "server" (what it is, e.g. "S3 bucket x") and whatever else it knows."""

    def close(self) -> None:
        """Drop connections (a test or a reconfiguration); never raises."""
