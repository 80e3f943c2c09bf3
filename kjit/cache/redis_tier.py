"""The shared tier on Redis, through redis-py (hiredis parses replies where it is installed).

Keys under the configured prefix (default "kjit:<schema>:"):
  <prefix>e:<key>      the value: entry bytes, signed or not (kjit.cache.signing)
  <prefix>lease:<key>  the compile lease: a random token, SET NX PX; redis-py's Lock renews
                       and releases it only while the token is still ours
  <prefix>done:<key>   a pub/sub channel: a put publishes on it, waiters block on it
Every request has a connect and a read timeout and is never retried here: a failure goes
back to kjit.cache.shared at once, which backs off.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Iterator

import redis
from redis.backoff import NoBackoff
from redis.exceptions import LockError, OutOfMemoryError, RedisError, ResponseError
from redis.lock import Lock
from redis.retry import Retry

from .entry import CorruptEntry
from .remote import ENV_URL, Lease, RemoteTier, TierError, TierFull, Watch, redact

_BATCH = 500


def _error(exc: RedisError) -> TierError:
    if isinstance(exc, OutOfMemoryError):
        return TierFull(str(exc))
    return TierError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


class RedisLease(Lease):
    def __init__(self, lock: Lock):
        self.lock = lock

    def renew(self) -> bool:
        try:
            self.lock.reacquire()
            return True
        except LockError:
            return False

    def release(self) -> None:
        try:
            self.lock.release()
        except LockError:
            pass


class RedisWatch(Watch):
    def __init__(self, client: redis.Redis, channel: str, timeout_s: float):
        self.pubsub = client.pubsub()
        try:
            self.pubsub.subscribe(channel)
            # SUBSCRIBE travels on its own connection: wait for the server's confirmation, so
            # that a value published after this returns cannot be missed
            deadline = timeout_s
            while True:
                msg = self.pubsub.get_message(timeout=deadline)
                if msg is None:
                    raise TierError("no confirmation of SUBSCRIBE in time")
                if msg["type"] == "subscribe":
                    break
        except RedisError as exc:
            self.close()
            raise _error(exc) from None
        except TierError:
            self.close()
            raise

    def wait(self, timeout_s: float) -> bool:
        try:
            msg = self.pubsub.get_message(timeout=max(timeout_s, 0.0))
        except RedisError as exc:
            raise _error(exc) from None
        return msg is not None and msg["type"] == "message"

    def close(self) -> None:
        try:
            self.pubsub.close()
        except Exception:
            pass


class _PollingWatch(Watch):
    def __init__(self):
        self.delay = 0.02

    def wait(self, timeout_s: float) -> bool:
        time.sleep(max(min(self.delay, timeout_s), 0.0))
        self.delay = min(self.delay * 1.5, 0.5)
        return False

    def close(self) -> None:
        pass


class RedisTier(RemoteTier):
    def __init__(self, url: str, *, prefix: str, timeout_s: float):
        self.url = redact(url)
        self.prefix = prefix
        self.timeout_s = timeout_s
        try:
            self.client = redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0))
        except ValueError as exc:
            from ..errors import InvalidOptionError
            raise InvalidOptionError(f"{ENV_URL}={self.url!r} is not a usable Redis URL: {exc}") from None
        self._getex = True  # Redis < 6.2 lacks GETEX: then GET, and TTLs do not slide

    def _value(self, key: str) -> str:
        return f"{self.prefix}e:{key}"

    def _lease(self, key: str) -> str:
        return f"{self.prefix}lease:{key}"

    def get(self, key: str, ttl_s: float) -> bytes | None:
        name = self._value(key)
        try:
            if self._getex and ttl_s > 0:
                try:
                    return self.client.getex(name, px=int(ttl_s * 1000))
                except ResponseError as exc:
                    if "unknown command" not in str(exc).lower():
                        raise
                    self._getex = False
            return self.client.get(name)
        except ResponseError as exc:
            if str(exc).startswith("WRONGTYPE"):
                raise CorruptEntry(f"the key holds a Redis {self._type(name)}, not a value") from None
            raise _error(exc) from None
        except RedisError as exc:
            raise _error(exc) from None

    def _type(self, name: str) -> str:
        try:
            return self.client.type(name).decode()
        except RedisError:
            return "non-string"

    def put(self, key: str, value: bytes, ttl_s: float, *, overwrite: bool = True) -> bool:
        pipe = self.client.pipeline(transaction=False)  # one round trip for both
        pipe.set(self._value(key), value, px=int(ttl_s * 1000) if ttl_s > 0 else None, nx=not overwrite)
        pipe.publish(self._channel(key), b"1")
        try:
            done, _ = pipe.execute(raise_on_error=False)  # a refused PUBLISH (ACL) only slows waiters
        except RedisError as exc:
            raise _error(exc) from None
        if isinstance(done, Exception):
            raise _error(done)
        return bool(done)

    def watch(self, key: str) -> Watch:
        try:
            return RedisWatch(self.client, self._channel(key), self.timeout_s)
        except TierError as exc:
            if "permission" not in str(exc).lower():
                raise
            return _PollingWatch()  # an ACL without channels (&<prefix>*): poll instead

    def _channel(self, key: str) -> str:
        return f"{self.prefix}done:{key}"

    def lease(self, key: str, ttl_s: float) -> Lease | None:
        lock = Lock(self.client, self._lease(key), timeout=ttl_s, blocking=False, thread_local=False)
        try:
            return RedisLease(lock) if lock.acquire(blocking=False) else None
        except RedisError as exc:
            raise _error(exc) from None

    def stats(self) -> dict[str, Any]:
        try:
            info = self.client.info()
        except RedisError as exc:
            raise _error(exc) from None
        wanted = ("redis_version", "used_memory", "maxmemory", "maxmemory_policy", "evicted_keys",
                  "expired_keys", "keyspace_hits", "keyspace_misses", "connected_clients",
                  "uptime_in_seconds")
        return {k: info.get(k) for k in wanted}

    def keys(self) -> Iterator[str]:
        start = len(self.prefix) + 2
        try:
            for name in self.client.scan_iter(match=self.prefix + "e:*", count=1000):
                yield name.decode()[start:]
        except RedisError as exc:
            raise _error(exc) from None

    def _pipelined(self, keys: list[str], add) -> list:
        out: list = []
        try:
            for i in range(0, len(keys), _BATCH):
                pipe = self.client.pipeline(transaction=False)
                for k in keys[i:i + _BATCH]:
                    add(pipe, k)
                out += pipe.execute(raise_on_error=False)
        except RedisError as exc:
            raise _error(exc) from None
        return out

    def peek(self, keys: list[str], size: int) -> list[tuple[bytes | None, float | None]]:
        def add(pipe, k):
            pipe.getrange(self._value(k), 0, size - 1)
            pipe.pttl(self._value(k))
        flat = self._pipelined(keys, add)
        out = []
        for head, ttl in zip(flat[::2], flat[1::2]):
            head = head if isinstance(head, bytes) and head else None
            out.append((head, ttl / 1000 if isinstance(ttl, int) and ttl >= 0 else None))
        return out

    def sizes(self, keys: list[str]) -> list[int]:
        return [n if isinstance(n, int) else 0
                for n in self._pipelined(keys, lambda pipe, k: pipe.strlen(self._value(k)))]

    def delete(self, keys: Iterable[str]) -> int:
        keys = list(keys)

        def add(pipe, k):
            pipe.unlink(self._value(k))
            pipe.unlink(self._lease(k))
        flat = self._pipelined(keys, add)
        return sum(n for n in flat[::2] if isinstance(n, int))

    def close(self) -> None:
        self.client.close()
