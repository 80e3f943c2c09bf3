"""A real redis-server for the shared-tier tests: started on a free loopback port with its
own directory and no persistence, stopped (or killed) by the test. Tests that use it skip,
with the reason, where redis-server or redis-py is missing; CI installs both (.ci/run)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or ("/usr/bin/redis-server"
                                                if os.path.exists("/usr/bin/redis-server") else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, directory: Path, *args: str):
        self.directory = directory
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> "RedisServer":
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(5):  # another process may take the free port first: try another
            self.port = _free_port()
            log = open(self.directory / "redis.log", "ab")
            self.proc = subprocess.Popen(
                [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                 "--save", "", "--appendonly", "no", "--enable-debug-command", "local", *self.args],
                stdout=log, stderr=subprocess.STDOUT)
            log.close()
            if self._wait_ready():
                return self
            self.kill()
        raise RuntimeError(f"redis-server did not start: {(self.directory / 'redis.log').read_text()[-2000:]}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kw):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10, **kw)

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-conversation, as on a node failure."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def require_redis() -> None:
    """Skip without redis-server or redis-py; fail instead in CI (.ci/run), which installs both."""
    missing = None
    if REDIS_SERVER is None:
        missing = "redis-server is not installed (Debian: apt-get install redis-server)"
    else:
        try:
            import redis  # noqa: F401
        except ImportError:
            missing = "redis-py is not installed (pip install 'kjit[redis]')"
    if missing:
        if os.environ.get("KJIT_TESTS_REQUIRE_REDIS"):
            pytest.fail(missing)
        pytest.skip(missing)


@pytest.fixture
def redis_server(tmp_path):
    """A fresh redis-server for one test; stopped after it."""
    require_redis()
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def remote_env(redis_server, monkeypatch):
    """The shared tier on `redis_server` for this process and its children, with short
    timeouts so that fault tests stay quick, trusted unsigned (tests that sign set a key)."""
    from kjit.cache import remote as remote_mod
    quick = {remote_mod.ENV_TIMEOUT: "1s", remote_mod.ENV_BACKOFF: "1s", remote_mod.ENV_UNSIGNED: "1"}
    for name in remote_mod.ENV_VARS:
        if name in quick and os.environ.get(name):  # a test module's own (shorter) setting
            quick[name] = os.environ[name]
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(remote_mod.ENV_URL, redis_server.url)
    for name, value in quick.items():
        monkeypatch.setenv(name, value)
    yield redis_server
    from kjit.cache import shared
    tier = shared._active
    if tier is not None:
        tier.close()
