"""The shared tier on Redis, through redis-py (hiredis parses replies where it is installed).

Keys under the configured prefix (default "kjit:<schema>:"):
  <prefix>e:<key>      the value: entry bytes, signed or not (kjit.cache.shared)
  <prefix>lease:<key>  the compile lease: a random token, SET NX PX; redis-py's Lock renews
                       and releases it only while the token is still ours
  <prefix>done:<key>   a pub/sub channel: a put publishes on it, waiters block on it
A request is never retried here, and every one is bounded at the socket, under whichever
parser redis-py uses (its own or hiredis): a deadline for the whole request (connect,
handshake, send, every byte of the reply), so a server that drips its reply cannot hold a
compile longer than the request's time; a cap on each string the reply announces, checked on
its length line before any of its bytes are read, and on the reply's total bytes, so a huge
value is refused, not read (GuardedSocket). A reply of a type the request cannot have, or
one redis-py cannot parse, is a TierError like a dead server: kjit.cache.shared backs off.
"""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import redis
from redis.backoff import NoBackoff
from redis.exceptions import LockError, OutOfMemoryError, RedisError, ResponseError
from redis.lock import Lock
from redis.retry import Retry

from .entry import CorruptEntry
from .backend import Lease, PollingWatch, RemoteTier, TierError, TierFull, ValueTooLarge, Watch
from .remote import ENV_TIMEOUT, ENV_URL, redact

_BATCH = 500
_SMALL = 64 << 10          # the longest string a request that is not a value read accepts
_SMALL_REPLY = 16 << 20    # ... and the most bytes of its whole reply
_SLACK = 64                # a value's signature header and RESP framing
_PIPELINE_BYTES = 64 << 20  # the most a pipelined request (a listing) may bring back


def _error(exc: RedisError) -> TierError:
    if isinstance(exc, OutOfMemoryError):
        return TierFull(str(exc))
    return TierError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


class RedisLease(Lease):
    def __init__(self, tier: "RedisTier", lock: Lock):
        self.tier = tier
        self.lock = lock

    def renew(self) -> bool:
        try:
            with self.tier._request():
                self.lock.reacquire()
            return True
        except LockError:
            return False

    def release(self) -> None:
        try:
            with self.tier._request():
                self.lock.release()
        except (LockError, TierError):  # it lapses anyway
            pass


class RedisWatch(Watch):
    def __init__(self, tier: "RedisTier", channel: str):
        self.tier = tier
        self.pubsub = tier.client.pubsub()
        try:
            with tier._request():
                self.pubsub.subscribe(channel)
                # SUBSCRIBE travels on its own connection: wait for the server's confirmation,
                # so that a value published after this returns cannot be missed
                while True:
                    msg = self.pubsub.get_message(timeout=max(tier.timeout_s, 0.0))
                    if not isinstance(msg, dict):
                        raise TierError("no confirmation of SUBSCRIBE in time")
                    if msg.get("type") == "subscribe":
                        break
        except TierError:
            self.close()
            raise

    def wait(self, timeout_s: float) -> bool:
        timeout_s = max(timeout_s, 0.0)
        with self.tier._request(timeout_s + self.tier.timeout_s):
            msg = self.pubsub.get_message(timeout=timeout_s)
        return isinstance(msg, dict) and msg.get("type") == "message"

    def close(self) -> None:
        try:
            self.pubsub.close()
        except Exception:
            pass


class RedisTier(RemoteTier):
    def __init__(self, url: str, *, prefix: str, timeout_s: float, max_value: int = 64 << 20):
        self.url = redact(url)
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.max_value = max_value
        try:
            self.client = redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0))
        except (ValueError, TypeError) as exc:
            from ..errors import InvalidOptionError
            raise InvalidOptionError(f"{ENV_URL}={self.url!r} is not a usable Redis URL: {exc}") from None
        pool = self.client.connection_pool
        pool.connection_class = _guarded(pool.connection_class)
        self._getex = True  # Redis < 6.2 lacks GETEX: then GET, and TTLs do not slide

    @classmethod
    def from_config(cls, config: Any) -> "RedisTier":
        return cls(config.url, prefix=config.prefix, timeout_s=config.timeout_s, max_value=config.max_value)

    @contextmanager
    def _request(self, seconds: float | None = None, *, bulk_max: int = _SMALL,
                 reply_max: int = _SMALL_REPLY):
        """One bounded request: TierError (ValueTooLarge past the caps) for any failure,
        the server's or a reply nobody could parse."""
        req = None
        try:
            with request(seconds or self.timeout_s, bulk_max=bulk_max, reply_max=reply_max) as req:
                yield req
        except (TierError, CorruptEntry, LockError):
            raise
        except RedisError as exc:
            if req is not None and req.refused:
                self._drop()
                raise ValueTooLarge(req.refused) from None
            if req is not None and time.monotonic() >= req.deadline:
                raise TierError(f"TimeoutError: no whole reply within the request deadline of "
                                f"{seconds or self.timeout_s:g} s ({ENV_TIMEOUT})") from None
            raise _error(exc) from None
        except Exception as exc:  # redis-py choked on the reply: its connections are suspect
            self._drop()
            raise TierError(f"the server's reply was not understood ({type(exc).__name__}: "
                            f"{exc})") from None

    def _drop(self) -> None:
        try:
            self.client.connection_pool.disconnect()
        except Exception:
            pass

    def _value(self, key: str) -> str:
        return f"{self.prefix}e:{key}"

    def _lease(self, key: str) -> str:
        return f"{self.prefix}lease:{key}"

    def get(self, key: str, ttl_s: float) -> bytes | None:
        name = self._value(key)
        limit = self.max_value + _SLACK
        try:
            with self._request(bulk_max=limit, reply_max=limit + _SLACK):
                value = None
                if self._getex and ttl_s > 0:
                    try:
                        value = self.client.getex(name, px=int(ttl_s * 1000))
                    except ResponseError as exc:
                        if "unknown command" not in str(exc).lower():
                            raise
                        self._getex = False
                if not self._getex or ttl_s <= 0:
                    value = self.client.get(name)
        except TierError as exc:
            if str(exc).startswith("ResponseError: WRONGTYPE"):
                raise CorruptEntry(f"the key holds a Redis {self._type(name)}, not a value") from None
            raise
        if value is not None and not isinstance(value, bytes):
            raise TierError(f"the server answered GET with a {type(value).__name__}, not a value")
        return value

    def _type(self, name: str) -> str:
        try:
            with self._request():
                kind = self.client.type(name)
            return kind.decode() if isinstance(kind, bytes) else "non-string"
        except TierError:
            return "non-string"

    def put(self, key: str, value: bytes, ttl_s: float, *, overwrite: bool = True) -> bool:
        pipe = self.client.pipeline(transaction=False)  # one round trip for both
        pipe.set(self._value(key), value, px=int(ttl_s * 1000) if ttl_s > 0 else None, nx=not overwrite)
        pipe.publish(self._channel(key), b"1")
        try:
            with self._request():
                done, _ = pipe.execute(raise_on_error=False)  # a refused PUBLISH (ACL) only slows waiters
        except ValueError:  # not two replies
            raise TierError("the server answered SET and PUBLISH with something else") from None
        if isinstance(done, RedisError):
            raise _error(done)
        return bool(done)

    def watch(self, key: str) -> Watch:
        try:
            return RedisWatch(self, self._channel(key))
        except TierError as exc:
            if "permission" not in str(exc).lower():
                raise
            return PollingWatch()  # an ACL without channels (&<prefix>*): poll instead

    def _channel(self, key: str) -> str:
        return f"{self.prefix}done:{key}"

    def lease(self, key: str, ttl_s: float) -> Lease | None:
        lock = Lock(self.client, self._lease(key), timeout=ttl_s, blocking=False, thread_local=False)
        with self._request():
            return RedisLease(self, lock) if lock.acquire(blocking=False) else None

    def lease_ttl(self, key: str) -> float | None:
        with self._request():
            ms = self.client.pttl(self._lease(key))
        if not isinstance(ms, int) or isinstance(ms, bool):
            raise TierError(f"the server answered PTTL with a {type(ms).__name__}")
        return None if ms == -1 else max(ms, 0) / 1000

    def expire_lease(self, key: str, ttl_s: float) -> bool:
        try:
            with self._request():
                return bool(self.client.pexpire(self._lease(key), int(ttl_s * 1000), nx=True))
        except TierError as exc:
            if "ResponseError" in str(exc):  # Redis < 7 has no NX here
                return False
            raise

    def stats(self) -> dict[str, Any]:
        with self._request():
            info = self.client.info()
        if not isinstance(info, dict):
            raise TierError(f"the server answered INFO with a {type(info).__name__}")
        wanted = ("redis_version", "used_memory", "maxmemory", "maxmemory_policy", "evicted_keys",
                  "expired_keys", "keyspace_hits", "keyspace_misses", "connected_clients",
                  "uptime_in_seconds")
        return {k: info.get(k) for k in wanted}

    def _names(self, match: str) -> Iterator[bytes]:
        """The raw names matching `match`, one bounded SCAN at a time."""
        cursor: Any = 0
        while True:
            with self._request():
                reply = self.client.scan(cursor, match=match, count=1000)
            if not (isinstance(reply, (tuple, list)) and len(reply) == 2 and isinstance(reply[1], list)):
                raise TierError("the server answered SCAN with something else")
            cursor, batch = reply
            yield from (n for n in batch if isinstance(n, bytes))
            if cursor in (0, b"0", "0"):
                return

    def keys(self) -> Iterator[str]:
        start = len(self.prefix) + 2
        for name in self._names(self.prefix + "e:*"):
            key = name[start:]
            if key.isascii() and key.isalnum():  # a name no kjit wrote is skipped
                yield key.decode()

    def _pipelined(self, keys: list[str], add, bulk_max: int = _SMALL) -> list:
        out: list = []
        step = max(1, min(_BATCH, _PIPELINE_BYTES // (2 * bulk_max)))  # a bounded reply per request
        for i in range(0, len(keys), step):
            batch = keys[i:i + step]
            pipe = self.client.pipeline(transaction=False)
            for k in batch:
                add(pipe, k)
            with self._request(bulk_max=bulk_max, reply_max=_SMALL_REPLY + 2 * len(batch) * bulk_max):
                out += pipe.execute(raise_on_error=False)
        return out

    def peek(self, keys: list[str], size: int) -> list[tuple[bytes | None, float | None]]:
        def add(pipe, k):
            pipe.getrange(self._value(k), 0, size - 1)
            pipe.pttl(self._value(k))
        flat = self._pipelined(keys, add, bulk_max=size)
        out = []
        for head, ttl in zip(flat[::2], flat[1::2]):
            head = head if isinstance(head, bytes) and head else None
            ok = isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0
            out.append((head, ttl / 1000 if ok else None))
        return out

    def sizes(self, keys: list[str]) -> list[int]:
        return [n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
                for n in self._pipelined(keys, lambda pipe, k: pipe.strlen(self._value(k)))]

    def delete(self, keys: Iterable[str | bytes]) -> int:
        keys = list(keys)

        def name(kind: str, k: str | bytes) -> bytes:
            return (self.prefix + kind).encode() + (k if isinstance(k, bytes) else k.encode())

        def add(pipe, k):
            pipe.unlink(name("e:", k))
            pipe.unlink(name("lease:", k))
        flat = self._pipelined(keys, add)
        return sum(n for n in flat[::2] if isinstance(n, int))

    def clear(self) -> int:
        start = len(self.prefix) + 2  # every name under <prefix>e:, text or not
        return self.delete([n[start:] for n in self._names(self.prefix + "e:*")])

    def close(self) -> None:
        self.client.close()


def _guarded(base: type) -> type:
    """`base` (redis-py's TCP, TLS or Unix connection class) on a GuardedSocket."""
    class Guarded(base):
        def _connect(self):
            return GuardedSocket(super()._connect())
    Guarded.__name__ = Guarded.__qualname__ = "Guarded" + base.__name__
    return Guarded


# --- bounds on every request, at the socket ----------------------------------------------------
_local = threading.local()
_LINE_MAX = 64 << 10  # a RESP line (status, error, number, length) longer than this is garbage
_BULK_TYPES = b"$=!"  # bulk string, verbatim string, bulk error: a length line, then bytes


class Refused(OSError):
    """The reply broke a bound of its request (redis-py wraps this in a ConnectionError)."""


class Request:
    """One request's bounds, and why it was refused (None while it was not)."""
    __slots__ = ("deadline", "bulk_max", "bytes_left", "refused")

    def __init__(self, seconds: float, bulk_max: int, reply_max: int):
        self.deadline = time.monotonic() + seconds
        self.bulk_max = bulk_max
        self.bytes_left = reply_max
        self.refused: str | None = None

    def refuse(self, why: str) -> Refused:
        self.refused = why
        return Refused(why)


@contextmanager
def request(seconds: float, *, bulk_max: int, reply_max: int) -> Iterator[Request]:
    """Bound the Redis requests this thread makes inside the block."""
    outer = getattr(_local, "request", None)
    req = _local.request = Request(seconds, bulk_max, reply_max)
    try:
        yield req
    finally:
        _local.request = outer


def _current() -> Request | None:
    return getattr(_local, "request", None)


class GuardedSocket:
    """A connected socket whose reads and writes obey the current request's bounds. It also
    follows the RESP framing of what it reads (lines, and the length of each string), so
    that a string's announced length is judged before its bytes arrive."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._line = bytearray()   # the RESP line read so far
        self._skip = 0             # bytes of a string's body (and its CRLF) still to come

    def __getattr__(self, name: str):
        return getattr(self._sock, name)

    def _remaining(self, req: Request | None) -> float | None:
        if req is None:
            return None
        left = req.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the request ran past its deadline (KJIT_REMOTE_CACHE_TIMEOUT)")
        return left

    def _bounded(self, call, *args):
        req = _current()
        left = self._remaining(req)
        if left is None:
            return call(*args)
        before = self._sock.gettimeout()
        if before is None or before > left:
            self._sock.settimeout(left)
            try:
                return call(*args)
            finally:
                self._sock.settimeout(before)
        return call(*args)

    def recv(self, n: int, flags: int = 0) -> bytes:
        data = self._bounded(self._sock.recv, n, flags)
        if not flags & socket.MSG_PEEK:
            self._account(data)
        return data

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        n = self._bounded(self._sock.recv_into, buffer, nbytes, flags)
        if not flags & socket.MSG_PEEK:
            self._account(memoryview(buffer)[:n])
        return n

    def sendall(self, data, flags: int = 0) -> None:
        self._bounded(self._sock.sendall, data, flags)

    def _account(self, data) -> None:
        req = _current()
        if req is not None:
            req.bytes_left -= len(data)
            if req.bytes_left < 0:
                raise req.refuse("the reply is larger than the request allows")
        self._frame(data, req)

    def _frame(self, data, req: Request | None) -> None:
        """Follow RESP: a body is skipped by count; a line is read up to its CRLF and, for a
        string, its length is checked against the request's cap."""
        if self._skip >= len(data):  # inside a string's body: nothing to look at
            self._skip -= len(data)
            return
        data = bytes(data)
        i, end = 0, len(data)
        while i < end:
            if self._skip:
                step = min(self._skip, end - i)
                self._skip -= step
                i += step
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self._line += data[i:]
                if len(self._line) > _LINE_MAX:
                    raise req.refuse("a reply line is too long") if req else Refused("a reply line is too long")
                return
            self._line += data[i:j + 1]
            i = j + 1
            line, self._line = bytes(self._line), bytearray()
            if line[:1] and line[:1] in _BULK_TYPES:
                try:
                    length = int(line[1:].strip())
                except ValueError:
                    continue  # the parser reports the malformed line
                if req is not None and length > req.bulk_max:
                    raise req.refuse(f"the server announced a value of {length} bytes, over the "
                                     f"{req.bulk_max} this request accepts")
                if length >= 0:  # -1: a null string, no body
                    self._skip = length + 2
