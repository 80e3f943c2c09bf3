"""Bounds on every request to the shared server, enforced at the socket under whichever parser
redis-py uses (its own or hiredis):

- a deadline for the whole request (connect, handshake, send, every byte of the reply): a
  server that drips its reply cannot hold a compile longer than the request's time;
- a cap on each string the reply announces, checked on its length line before any of its
  bytes are read, and a cap on the reply's total bytes: a huge value is refused, not read.

kjit.cache.redis_tier opens each request with `request(...)`; the socket every connection
uses is a GuardedSocket, which reads the bounds of the request running in its thread.
"""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

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
