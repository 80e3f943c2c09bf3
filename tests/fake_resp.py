"""A misbehaving Redis for the hostile-server tests: a socket server on loopback that speaks
RESP (it parses the client's commands) and answers each with whatever the test scripts, from
wrong types to a reply dripped a byte at a time or a string of gigabytes."""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable

Reply = "bytes | Callable[[socket.socket], None]"


def bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


OK = b"+OK\r\n"
NIL = b"$-1\r\n"


def default_reply(cmd: list[bytes]) -> bytes:
    """What a healthy, empty Redis answers (enough for kjit's requests)."""
    name = cmd[0].upper() if cmd else b""
    if name == b"PING":
        return b"+PONG\r\n"
    if name == b"HELLO":
        return (b"%7\r\n+server\r\n+redis\r\n+version\r\n+7.0.0\r\n+proto\r\n:3\r\n+id\r\n:1\r\n"
                b"+mode\r\n+standalone\r\n+role\r\n+master\r\n+modules\r\n*0\r\n")
    if name in (b"GET", b"GETEX", b"GETRANGE"):
        return NIL
    if name in (b"PUBLISH", b"UNLINK", b"DEL", b"STRLEN"):
        return b":0\r\n"
    if name in (b"PTTL", b"TTL"):
        return b":-2\r\n"
    if name == b"SUBSCRIBE":
        return b"*3\r\n$9\r\nsubscribe\r\n" + bulk(cmd[1]) + b":1\r\n"
    if name == b"SCAN":
        return b"*2\r\n$1\r\n0\r\n*0\r\n"
    if name == b"INFO":
        return bulk(b"# Server\r\nredis_version:7.0.0\r\n")
    return OK  # SET, SELECT, CLIENT SETINFO, AUTH, ...


def drip(data: bytes, every_s: float) -> Callable[[socket.socket], None]:
    """A reply sent one byte every `every_s` seconds."""
    def send(conn: socket.socket) -> None:
        for i in range(len(data)):
            conn.sendall(data[i:i + 1])
            time.sleep(every_s)
    return send


def huge(length: int, most: int) -> Callable[[socket.socket], None]:
    """A bulk string announced as `length` bytes, of which at most `most` are sent."""
    def send(conn: socket.socket) -> None:
        conn.sendall(b"$%d\r\n" % length)
        chunk = b"\0" * (1 << 20)
        sent = 0
        while sent < most:
            conn.sendall(chunk)
            sent += len(chunk)
    return send


class FakeRedis:
    """`answer(cmd) -> bytes | sender | None` scripts replies (None: the default one).
    `sent` counts the bytes written to clients; `commands` lists what they asked."""

    def __init__(self, answer: Callable[[list[bytes]], object] = lambda cmd: None):
        self.answer = answer
        self.sent = 0
        self.commands: list[list[bytes]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        counted = _Counting(conn, self)
        try:
            while not self._stop.is_set():
                cmd, buf = _command(buf)
                if cmd is None:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                    continue
                self.commands.append(cmd)
                reply = self.answer(cmd)
                if reply is None:
                    reply = default_reply(cmd)
                if callable(reply):
                    reply(counted)
                else:
                    counted.sendall(reply)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass


class _Counting:
    def __init__(self, conn: socket.socket, server: FakeRedis):
        self.conn, self.server = conn, server

    def sendall(self, data: bytes) -> None:
        self.conn.sendall(data)
        self.server.sent += len(data)


def _command(buf: bytes) -> tuple[list[bytes] | None, bytes]:
    """One RESP array of bulk strings from the front of `buf`, or (None, buf) if incomplete."""
    if not buf.startswith(b"*") or b"\r\n" not in buf:
        return None, buf
    head, rest = buf.split(b"\r\n", 1)
    out = []
    for _ in range(int(head[1:])):
        if b"\r\n" not in rest:
            return None, buf
        line, body = rest.split(b"\r\n", 1)
        n = int(line[1:])
        if len(body) < n + 2:
            return None, buf
        out.append(body[:n])
        rest = body[n + 2:]
    return out, rest
