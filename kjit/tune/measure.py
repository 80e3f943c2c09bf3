"""The tuner's measure step: compile candidates in the background, time each as soon as it
has compiled, keep every record in the cache.

Compiles run in kjit.compile_many's worker processes (one core left to the timing thread)
from a thread of this process; `measure(batch)` takes candidates in the order they finish
compiling, checks them against the device's limits, and times them with CUDA events (or
the user's timer), with early stopping against the best median so far. With the screen on
(the default), each is first timed briefly as it compiles; once the batch is screened, those
within the screen's margin of the best are timed again in full and the rest keep their
screen's record. Results do not depend on the order: each candidate is timed on its own,
after its own warm-up.
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from typing import Any, Sequence

from ..errors import ArgumentError, DriverError, KjitError
from ..progress import Bar
from .candidates import Candidate, compile_candidates, limit_problem
from .store import Transient, get_or_measure


class Measurer:
    """measure(batch) for one tuning (one key on one device); `records` and `measured` fill
    in as it goes."""

    def __init__(self, tuner: Any, named: dict, stream: Any, rkeys: dict[int, dict],
                 records: dict[int, dict]):
        self.tuner, self.named, self.rkeys, self.records = tuner, named, rkeys, records
        self.measured = 0
        names = tuner.arg_names
        self.ordered = list(named.values()) if names is None else [named[n] for n in names]
        if stream is None:   # timed where PyTorch's own work on these tensors runs
            stream = _torch_stream(self.ordered)
        self.stream = stream
        self.protected: Any = None
        self.ready: "queue.Queue[tuple[Candidate | None, BaseException | None]]" = queue.Queue()
        # the arch of this thread's device, resolved here: the compile thread has no current
        # context, and would take device 0's
        self.arch = tuner.arch
        if self.arch is None:
            from ..arch import device_arch
            found = device_arch()
            self.arch = found.name if found is not None else None
        self.threads: list[threading.Thread] = []
        self.screened: dict[int, tuple[Candidate, dict]] = {}   # screened, not yet stored
        self.last_timed: float | None = None   # when the last timing ended (perf_counter)

    # --- compiling, in the background -----------------------------------------------------
    def _start(self, batch: Sequence[Candidate]) -> set[int]:
        """Compile the batch's candidates that need it on a thread of this process; those
        that do not are ready now. Returns the indices to wait for."""
        waiting = set()
        todo = []
        for c in batch:
            if c.index in self.records or c.index in waiting:
                continue
            waiting.add(c.index)
            if c.compile_item() is not None and c.object is None and c.error is None:
                todo.append(c)
            else:
                self.ready.put((c, None))
        if todo:
            t = threading.Thread(target=self._compile, args=(todo,), daemon=True,
                                 name="kjit-tune-compile")
            t.start()
            self.threads.append(t)
        return waiting

    def _compile(self, todo: list[Candidate]) -> None:
        def done(i: int, r: Any) -> None:
            c = todo[i]
            if isinstance(r, BaseException):
                c.error = r
            else:
                c.object = r
            self.ready.put((c, None))
        try:
            compile_candidates([c.compile_item() for c in todo], self.arch, on_result=done,
                               jobs=_jobs())
        except BaseException as exc:   # bad arguments, or on_result's own failure: the caller's
            self.ready.put((None, exc))
            return
        for c in todo:   # never left waiting for a candidate compile_many did not report
            if c.object is None and c.error is None:
                c.error = KjitError("kjit.compile_many returned no result for this candidate")
                self.ready.put((c, None))

    # --- the step -------------------------------------------------------------------------
    def measure(self, batch: Sequence[Candidate]) -> list[dict | None]:
        """The records of `batch`, in its order: stored ones as they are, the others timed as
        each finishes compiling, and stored."""
        batch = list(batch)
        for c in batch:
            if not isinstance(c, Candidate):
                raise ArgumentError(f"a search strategy called measure() with a "
                                    f"{type(c).__name__}: give it some of the candidates it got")
        waiting = self._start(batch)
        # with its position: candidates are few, and each takes a while to time
        with Bar(len(waiting), f"tuning {self.tuner.label}", show=self.tuner.progress,
                 show_pos=True) as bar:
            while waiting:
                c, exc = self.ready.get()
                if exc is not None:
                    raise exc
                if c is None or c.index not in waiting:
                    continue
                waiting.discard(c.index)
                if self._screens():
                    self._screen(c)
                else:
                    self._one(c)
                bar.update(1)
        self._confirm()
        return [self.records.get(c.index) for c in batch]

    def _screens(self) -> bool:
        from .timing import SCREEN_REP_MS
        tuner = self.tuner
        return (tuner.screen is not None and tuner.timer is None
                and tuner.bench_args["rep_ms"] > SCREEN_REP_MS)

    def _protect(self) -> None:
        tuner = self.tuner
        if self.protected is None and tuner.timer is None and (tuner.restore or tuner.zero):
            from .timing import Protected
            from ..runtime import stream_handle as as_handle
            self.protected = Protected(self.named, tuner.restore, tuner.zero, as_handle(self.stream))

    def _screen(self, c: Candidate) -> None:
        """Time `c` briefly; a candidate that cannot run is recorded (and stored) at once."""
        self._protect()
        try:
            rec = self._time(c, screen=True)
        except Transient as t:   # not stored, but timed here, as _store counts it
            self.records[c.index] = t.record
            self.measured += 1
            return
        if rec.get("status") == "ok":
            self.screened[c.index] = (c, rec)
        else:
            self._store(c, lambda: rec)

    def _confirm(self) -> None:
        """Time in full the screened candidates within the screen's margin of the best (the
        closest first); store every screened one's record."""
        if not self.screened:
            return
        bar = self.best()
        margin = 1 + self.tuner.screen
        screened = sorted(self.screened.values(), key=lambda cr: cr[1]["ms"])
        self.screened = {}
        for c, rec in screened:
            if bar is not None and not rec.get("stopped") and rec["ms"] <= bar * margin:
                self._one(c)
            else:
                self._store(c, lambda rec=rec: rec)

    def _one(self, c: Candidate) -> None:
        """Time `c` in full (unless a record was stored meanwhile) and store its record."""
        self._protect()
        self._store(c, lambda: self._time(c))

    def _store(self, c: Candidate, measure: Any) -> None:
        try:
            rec, here = get_or_measure(self.rkeys[c.index], f"{self.tuner.label} [{c.config.label()}]",
                                       measure)
        except Transient as t:
            rec, here = t.record, True
        self.records[c.index] = rec
        self.measured += here

    def best(self) -> float | None:
        """The best median so far (stored records and screens count): the bar for early
        stopping and for the screen."""
        recs = [*self.records.values(), *(rec for _, rec in self.screened.values())]
        ok = [r["ms"] for r in recs if r.get("status") == "ok" and not r.get("stopped")]
        return min(ok) if ok else None

    def _time(self, c: Candidate, screen: bool = False) -> dict[str, Any]:
        if c.error is not None:
            return {"status": "compile_error", "reason": _first_lines(c.error)}
        tuner = self.tuner
        if tuner.timer is not None:
            return {"status": "ok", "ms": float(tuner.timer(c))}
        from .timing import EarlyStop, bench
        from ..runtime import stream_handle as as_handle
        stream, protected = self.stream, self.protected
        try:
            grid, block, shared = c.geometry(self.named)
            problem = limit_problem(c.loaded(), block, shared)
            if problem:
                return {"status": "skipped", "reason": problem}
            launch = c.launcher(grid, block, shared, stream)
            handle = as_handle(stream)
            before = (lambda: protected.before_launch(handle)) if protected and protected.zero else None
            stop = EarlyStop(tuner.early_stop, self.best) if tuner.early_stop else None
            ordered = self.ordered
            args = dict(tuner.bench_args)
            if screen:
                from .timing import IDLE_S, SCREEN_MIN_REPS, SCREEN_REP_MS, SCREEN_WARMUP_MS
                busy = self.last_timed is not None and time.perf_counter() - self.last_timed < IDLE_S
                args = {"warmup_ms": min(args["warmup_ms"], SCREEN_WARMUP_MS) if busy else args["warmup_ms"],
                        "rep_ms": SCREEN_REP_MS, "min_reps": min(args["min_reps"], SCREEN_MIN_REPS)}
            try:
                res = bench(lambda: launch(*ordered), stream=stream, before=before, stop=stop, **args)
            finally:
                if protected:
                    protected.restore(handle)
                self.last_timed = time.perf_counter()
        except (DriverError, ArgumentError) as exc:   # not kept: may be this run's arguments
            raise Transient({"status": "error", "reason": _first_lines(exc)}) from None
        return {"status": "ok", **res, **({"screened": True} if screen else {})}

    def close(self) -> None:
        """Wait for the background compiles (a strategy may stop before using them all: their
        results land in the compile cache for next time)."""
        for t in self.threads:
            t.join()


def _jobs() -> int | None:
    """Compile workers while timing: every core but one, which the timing thread keeps
    (KJIT_COMPILE_JOBS, when set, as it says)."""
    from ..compiler import pool_size
    from ..settings import compile_jobs
    if compile_jobs() is not None:
        return None
    return max(1, pool_size() - 1)


def _torch_stream(args: Sequence[Any]) -> Any:
    """PyTorch's current stream for the device of the first tensor among args, or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return torch.cuda.current_stream(a.device).cuda_stream
    return None


def _first_lines(exc: BaseException, n: int = 6) -> str:
    """The reason kept for a failed candidate: the error's first line and its error lines."""
    lines = f"{type(exc).__name__}: {exc}".splitlines()
    errors = [ln.strip() for ln in lines[1:] if "error" in ln.lower()][:4]
    return "\n".join([lines[0], *errors] if errors else lines[:n])
