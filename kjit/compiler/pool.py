"""Compile worker processes: the pool behind kjit.compile_many and `kjit build`.

NVRTC serialises compiles inside one process (another thread gains nothing: measured), so
parallel compiles run in worker processes that speak JSON lines over pipes. A worker runs
`kjit.compile` itself, so its results go through the same keys, per-key locks and disk cache
as the parent's, and it imports the parent's kjit: it is started with the parent's kjit
directory first on `sys.path` (never the working directory first, as `python -c` would put
it) and refuses to serve if it found another.

Workers stay for KJIT_COMPILE_POOL_IDLE (a duration, default 30 s) after their last compile, so a
second batch does not pay for starting them again, and never outlive the parent: the end
of their input pipe ends them between compiles, and a thread that watches the parent's pid
ends them during one.
"""
from __future__ import annotations

import atexit
import base64
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import InvalidOptionError, KjitError
from ..settings import ENV_JOBS, ENV_POOL_IDLE as ENV_IDLE, compile_jobs, pool_idle  # noqa: F401  (ENV_JOBS: for callers)


# The worker's first lines: the parent's sys.path replaces the worker's before kjit is
# imported, so an older kjit in the working directory or on PYTHONPATH cannot win.
_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from kjit.compiler.worker import worker_main; "
         "worker_main(sys.argv[2], int(sys.argv[3]), sys.argv[4] == 'once')")


def compile_isolated(request: str) -> dict:
    """One compile request answered by a fresh worker process that then exits (for flags
    NVRTC would carry into its process's later compiles: options.leaks_state)."""
    worker = _Worker(isolated=True)
    try:
        return worker.ask(request)
    finally:
        worker.close()


def pool_size(jobs: int | None = None) -> int:
    """Worker count: `jobs`, else $KJIT_COMPILE_JOBS, else the cores this process may use."""
    if jobs is None:
        jobs = compile_jobs()
        if jobs is None:
            try:
                jobs = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):  # not Linux
                jobs = os.cpu_count() or 1
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InvalidOptionError(f"jobs={jobs!r}: give a whole number of compile workers, at least 1")
    return jobs


def idle_timeout() -> float:
    return max(pool_idle(), 0.5)


def kjit_dir() -> Path:
    """The kjit package this module belongs to."""
    return Path(__file__).resolve().parent.parent


def worker_path() -> list[str]:
    """The sys.path a worker starts with: the directory holding this process's kjit first,
    then this process's own path with relative entries made absolute."""
    cwd = os.getcwd()
    path = [str(kjit_dir().parent)]
    for p in sys.path:
        p = os.path.join(cwd, p) if not os.path.isabs(p or "") else p
        if p not in path:
            path.append(p)
    return path


def _surroundings() -> tuple:
    return dict(os.environ), os.getcwd()


class _Worker:
    """One worker process and the pipes to it."""

    def __init__(self, isolated: bool = False) -> None:
        self.err = tempfile.TemporaryFile()
        self.idle = idle_timeout()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, json.dumps(worker_path()), str(kjit_dir()),
             str(os.getpid()), "once" if isolated else "pool"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.err, env=dict(os.environ, **{ENV_IDLE: str(self.idle)}))
        self.greeted = False
        self.last_used = time.monotonic()
        self.started_in = _surroundings()

    def usable(self) -> bool:
        """Alive, not about to leave (a margin below its own idle timeout, so it never exits
        with a request on its way), and started in this process's present environment and
        directory (a changed KJIT_CACHE_DIR or relative -I must reach the compile)."""
        return (self.proc.poll() is None and time.monotonic() - self.last_used < self.idle - 0.4
                and self.started_in == _surroundings())

    def ask(self, request: str) -> dict:
        """Send one request line, return the reply; KjitError if the worker is gone."""
        try:
            if not self.greeted:
                hello = self._line()
                if hello.get("kjit") != str(kjit_dir()):
                    raise KjitError(f"a compile worker imported kjit from {hello.get('kjit')}, "
                                    f"not {kjit_dir()}: {hello.get('error', '')}".rstrip(": "))
                self.greeted = True
            self.proc.stdin.write(request.encode() + b"\n")
            self.proc.stdin.flush()
            return self._line()
        finally:
            self.last_used = time.monotonic()

    def _line(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            self.err.seek(0)
            text = self.err.read().decode("utf-8", "replace").strip()
            raise KjitError(f"a kjit compile worker exited (status {self.proc.returncode}): "
                            f"{text[-2000:] or 'no output'}")
        return json.loads(line)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


class Pool:
    """Worker processes kept between batches; `run` lends them to one batch at a time."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.started = 0   # workers ever started (tests and benchmarks read it)

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                w = self._idle.pop()
                if w.usable():
                    return w
                w.close()
            self.started += 1
        return _Worker()

    def _give(self, w: _Worker) -> None:
        with self._lock:
            self._idle.append(w)

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._idle if w.proc.poll() is None]

    def run(self, jobs: "queue.Queue[tuple[int, str] | None]", workers: int,
            on_reply: Callable[[int, dict | BaseException], None]) -> list[threading.Thread]:
        """Serve `jobs` (index, request line; None ends the batch) with up to `workers`
        workers; on_reply(index, reply or exception) from the serving threads. Returns the
        threads, to join."""
        def serve() -> None:
            w: _Worker | None = None
            try:
                while True:
                    job = jobs.get()
                    if job is None:
                        jobs.put(None)   # for the other threads
                        return
                    i, request = job
                    try:
                        if w is None:
                            w = self._take()
                        reply: dict | BaseException = w.ask(request)
                    except KjitError as exc:
                        reply, w = exc, None
                    except Exception as exc:  # never lose an item: it gets the error
                        reply, w = KjitError(f"compile worker: {type(exc).__name__}: {exc}"), None
                    on_reply(i, reply)
            finally:
                if w is not None:
                    self._give(w)

        threads = [threading.Thread(target=serve, daemon=True, name=f"kjit-compile-{n}")
                   for n in range(workers)]
        for t in threads:
            t.start()
        return threads

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.close()


_pool: Pool | None = None
_pool_lock = threading.Lock()


def shared_pool() -> Pool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = Pool()
            atexit.register(_pool.close)
        return _pool


def jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def request_line(req: Any, cache: bool) -> str:
    """A compile request (request.CompileRequest) as the JSON line a worker reads."""
    opts = {k: jsonable(v) for k, v in req.options.as_dict().items()}
    return json.dumps({"source": req.source, "name": req.name, "arch": req.arch,
                       "target": req.target, "options": opts,
                       "name_expressions": list(req.name_expressions),
                       "backend": req.backend, "cache": bool(cache)})


def from_reply(reply: dict, req: Any) -> Any:
    """A worker's reply as an ObjectCode, or the exception to raise for it."""
    from ..objectcode import ObjectCode
    if reply["ok"]:
        return ObjectCode(base64.b64decode(reply["code"]), kind=reply["kind"], arch=reply["arch"],
                          log=reply["log"], symbols=reply["symbols"], name=reply["name"],
                          metadata=reply["metadata"], cache_hit=reply["cache_hit"])
    if reply.get("error") == "CompileError":
        from .diagnostics import compile_error
        return compile_error(reply["message"], log=reply.get("log", ""),
                             options=reply.get("options", ()), source=req.source,
                             name=req.name, compiler=reply.get("compiler", "NVRTC"))
    from .. import errors as errors_mod
    cls = getattr(errors_mod, str(reply.get("error", "")), None)
    if cls in (InvalidOptionError, KjitError, errors_mod.CudaUnavailableError):
        return cls(reply["message"])
    return KjitError(reply["message"])
