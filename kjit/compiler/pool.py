"""Compile worker processes: the pool behind kjit.compile_many and `kjit build`.

NVRTC serialises compiles inside one process (another thread gains nothing: measured), so
parallel compiles run in worker processes that speak JSON lines over pipes. A worker runs
`kjit.compile` itself, so its results go through the same keys, per-key locks and disk cache
as the parent's, and it imports the parent's kjit: it is started isolated (`python -I`: no
PYTHONPATH, no working directory, no user site, so no sitecustomize or module planted there
runs before kjit), with the parent's kjit directory first on `sys.path`, and refuses to
serve if it found another.

A worker that dies (a signal, an exit) fails the item it held, with its signal and status,
and no other: the batch goes on with a new worker. A fork of the parent leaves the pool's
workers to the parent: the child starts its own.

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


# The worker's first lines, run by `python -I` (isolated: PYTHONPATH, PYTHONSTARTUP, the
# working directory and the user's site directory are not on its path, so nothing planted
# there runs first): the parent's sys.path replaces the worker's before kjit is imported.
_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from kjit.compiler.worker import worker_main; "
         "worker_main(sys.argv[2], int(sys.argv[3]), sys.argv[4] == 'once')")
_ISOLATED = "-I"


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
    then this process's own absolute entries, then its relative ones ('' is the working
    directory) made absolute: a package in the working directory never comes before an
    installed one."""
    cwd = os.getcwd()
    path = [str(kjit_dir().parent)]
    relative = [os.path.join(cwd, p) for p in sys.path if not os.path.isabs(p or "")]
    for p in [p for p in sys.path if os.path.isabs(p or "")] + relative:
        if p not in path:
            path.append(p)
    return path


def _surroundings() -> tuple:
    return dict(os.environ), os.getcwd()


class WorkerDied(KjitError):
    """A compile worker ended (a signal, an exit) before it answered."""

    def __init__(self, message: str, pid: int, returncode: int | None, sent: bool = True):
        super().__init__(message)
        self.pid, self.returncode, self.sent = pid, returncode, sent

    @property
    def signal(self) -> str | None:
        """The signal's name (SIGKILL, SIGSEGV...) where a signal ended the worker."""
        return _signal_name(self.returncode)


def _signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    import signal
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class _Worker:
    """One worker process and the pipes to it."""

    def __init__(self, isolated: bool = False) -> None:
        self.err = tempfile.TemporaryFile()
        self.idle = idle_timeout()
        self.proc = subprocess.Popen(
            [sys.executable, _ISOLATED, "-c", _BOOT, json.dumps(worker_path()), str(kjit_dir()),
             str(os.getpid()), "once" if isolated else "pool"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.err, env=dict(os.environ, **{ENV_IDLE: str(self.idle)}))
        self.greeted = False
        self.last_used = time.monotonic()
        self.started_in = _surroundings()
        self.owner = os.getpid()

    def usable(self) -> bool:
        """Alive, not about to leave (a margin below its own idle timeout, so it never exits
        with a request on its way), and started in this process's present environment and
        directory (a changed KJIT_CACHE_DIR or relative -I must reach the compile)."""
        return (self.proc.poll() is None and time.monotonic() - self.last_used < self.idle - 0.4
                and self.started_in == _surroundings())

    def ask(self, request: str, item: str = "a compile") -> dict:
        """Send one request line, return the reply. WorkerDied if the worker ended before it
        answered (the request may or may not have reached it), KjitError if it is another
        kjit's."""
        try:
            if not self.greeted:
                hello = self._line("starting")
                if hello.get("kjit") != str(kjit_dir()):
                    self.close()
                    raise KjitError(f"a compile worker imported kjit from {hello.get('kjit')}, "
                                    f"not {kjit_dir()}: {hello.get('error', '')}".rstrip(": "))
                self.greeted = True
            try:
                self.proc.stdin.write(request.encode() + b"\n")
                self.proc.stdin.flush()
            except OSError:   # gone before it read the request: not the item's doing
                raise self._died(f"{item} was sent to it", sent=False) from None
            return self._line("compiling " + item)
        finally:
            self.last_used = time.monotonic()

    def _line(self, doing: str) -> dict:
        line = self.proc.stdout.readline()
        try:
            if line.endswith(b"\n"):
                return json.loads(line)
        except ValueError:
            pass
        raise self._died(doing)   # no line, or half of one: it ended while writing

    def _died(self, doing: str, sent: bool = True) -> WorkerDied:
        """The worker's end, in words: its signal or status and the last of its stderr."""
        self._stop()
        text = ""
        try:
            self.err.seek(0)
            text = self.err.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            pass
        self.err.close()
        code = self.proc.returncode
        sig = _signal_name(code)
        how = f"was killed by {sig} (status {code})" if sig else f"exited with status {code}"
        when = f"while {doing}" if sent else f"before {doing}"
        return WorkerDied(f"kjit compile worker {self.proc.pid} {how} {when}: "
                          f"{text[-2000:] or 'no output'}", self.proc.pid, code, sent)

    def release(self) -> None:
        """Tell it to end, without waiting for it."""
        if self.owner == os.getpid():
            self._end_input()

    def _end_input(self) -> None:
        """The end of its input: a worker ends when its requests do."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def _stop(self) -> None:
        self._end_input()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.owner != os.getpid():   # a forked child's copy: the parent's worker, left alone
            return
        self._stop()
        self.err.close()


_TRIES = 8   # workers an item is offered to when each is found dead before it is sent


class Pool:
    """Worker processes kept between batches; `run` lends them to one batch at a time."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.started = 0   # workers ever started (tests and benchmarks read it)
        self.owner = os.getpid()

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
        threads, to join. A worker that dies fails the item it held (WorkerDied, naming the
        item, the signal and status) and is replaced for the items after it; one found dead
        before it was sent an item is replaced and the item sent again."""
        def serve() -> None:
            w: _Worker | None = None
            try:
                while True:
                    job = jobs.get()
                    if job is None:
                        jobs.put(None)   # for the other threads
                        return
                    i, request = job
                    for _ in range(_TRIES):
                        try:
                            if w is None:
                                w = self._take()
                            reply: dict | BaseException = w.ask(request, f"item {i}")
                        except WorkerDied as exc:
                            reply, w = _held(exc, i, request), None
                            if not exc.sent:
                                continue   # the item never reached it: another worker gets it
                        except KjitError as exc:
                            reply, w = exc, None
                        except Exception as exc:  # never lose an item: it gets the error
                            reply, w = KjitError(f"compile worker: {type(exc).__name__}: {exc}"), None
                        break
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
        if self.owner != os.getpid():   # a forked child's copy of its parent's pool
            return
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:   # all told first, then awaited: they end together, not one by one
            w.release()
        for w in idle:
            w.close()


def _held(exc: WorkerDied, i: int, request: str) -> WorkerDied:
    """`exc` naming the item the worker held: its index and, where it has one, its name."""
    try:
        name = json.loads(request).get("name")
    except ValueError:
        name = None
    what = f"compile_many item {i}" + (f" ({name})" if name else "")
    return WorkerDied(f"{what}: {exc} (the batch's other items are compiled by other workers)",
                      exc.pid, exc.returncode, exc.sent)


_pool: Pool | None = None
_pool_lock = threading.Lock()


def shared_pool() -> Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.owner != os.getpid():
            _pool = Pool()
            atexit.register(_pool.close)
        return _pool


def _forget_in_child() -> None:
    """A forked child neither uses nor ends its parent's workers (their pipes are the
    parent's, and a pool lock another thread held at the fork stays held): it starts its own."""
    global _pool, _pool_lock
    _pool_lock = threading.Lock()
    _pool = None


os.register_at_fork(after_in_child=_forget_in_child)


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
