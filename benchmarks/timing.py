"""Host-side timing of launch loops: batches short enough that the GPU queue never fills,
the median per-launch cost over batches, warm-ups excluded."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

PER_BATCH = 200
BATCHES = 60
WARMUP = 5


class Loop:
    """A loop of `stmt` as a program spells it: the names it uses are the function's locals,
    and "{args}" in it becomes the arguments written out (a0, a1, ...), so no lambda or
    `*args` of the benchmark's own is timed. Calling it with n runs n iterations and returns
    the nanoseconds they took."""

    def __init__(self, stmt: str, args: Sequence[Any] = (), **names: Any):
        arg_names = [f"a{i}" for i in range(len(args))]
        params = ", ".join(["_rng", "_ns", *names, *arg_names])
        src = (f"def batch({params}):\n    _t0 = _ns()\n    for _ in _rng:\n"
               f"        {stmt.format(args=', '.join(arg_names))}\n    return _ns() - _t0\n")
        scope: dict = {}
        exec(compile(src, f"<loop: {stmt}>", "exec"), scope)
        self._batch, self._values = scope["batch"], dict(names, **dict(zip(arg_names, args)))

    def __call__(self, n: int) -> int:
        return self._batch(range(n), time.perf_counter_ns, **self._values)


def per_launch_us(launch: Callable[[], None] | Loop, sync: Callable[[], None],
                  per_batch: int = PER_BATCH, batches: int = BATCHES) -> float:
    """Median over batches of (time of `per_batch` launches) / per_batch, in µs: a Loop's
    iterations, or launch() calls. Only the launches are timed; sync() runs between batches so
    the queue drains."""
    samples = []
    rng = range(per_batch)
    for b in range(-WARMUP, batches):
        if isinstance(launch, Loop):
            ns = launch(per_batch)
        else:
            t0 = time.perf_counter_ns()
            for _ in rng:
                launch()
            ns = time.perf_counter_ns() - t0
        sync()
        if b >= 0:
            samples.append(ns / per_batch / 1e3)
    return statistics.median(samples)
