"""Host-side timing of launch loops: batches short enough that the GPU queue never fills,
the median per-launch cost over batches, warm-ups excluded."""
from __future__ import annotations

import statistics
import time
from typing import Callable

PER_BATCH = 200
BATCHES = 60
WARMUP = 5


def per_launch_us(launch: Callable[[], None], sync: Callable[[], None],
                  per_batch: int = PER_BATCH, batches: int = BATCHES) -> float:
    """Median over batches of (time of `per_batch` launch() calls) / per_batch, in µs.
    Only the launch loop is timed; sync() runs between batches so the queue drains."""
    samples = []
    rng = range(per_batch)
    for b in range(-WARMUP, batches):
        t0 = time.perf_counter_ns()
        for _ in rng:
            launch()
        t1 = time.perf_counter_ns()
        sync()
        if b >= 0:
            samples.append((t1 - t0) / per_batch / 1e3)
    return statistics.median(samples)
