"""Timing one candidate with CUDA events, with the user's outputs protected.

Like triton.testing.do_bench: one launch estimates the time, then warm-up launches for
about `warmup_ms`, then timed repeats for about `rep_ms` (at least `min_reps`), each between
its own pair of events, and the median is kept. Early stopping (`stop`, an `EarlyStop`)
ends a candidate's repeats once it is clearly slower than the best so far; the screen
(`screen`, measure.py) times every candidate briefly first and in full only those near the
best. Buffers named in `reset_to_zero` are zeroed before every launch; those and the ones in
`restore_value` are put back after each candidate, all outside the timed region."""
from __future__ import annotations

import math
import statistics
import sys
from typing import Any, Callable, Mapping, Sequence

from .. import driver
from ..errors import ArgumentError

WARMUP_MS = 25.0
REP_MS = 100.0
MIN_REPS = 10
MAX_REPS = 1000
WINDOW_MS = 10.0    # GPU work queued ahead while early stopping reads finished repeats
EARLY_REPS = 3      # repeats finished before early stopping may stop a candidate
EARLY_MARGIN = 0.2  # ... when its fastest is over 1.2x the best median so far
# ... or at once, when its first launch alone took over twice that (and HOPELESS_SLACK_MS more:
# a first launch may pay for loading the kernel), as a poor configuration of a GEMM can
# be a hundred times slower than the best, and every repeat of it would cost as much
HOPELESS_SLACK_MS = 1.0
# The screen: every candidate is first timed briefly, and only those within SCREEN_MARGIN of
# the best are then timed in full (warmup_ms, rep_ms). The GPU stays busy from one candidate
# to the next, so a short warm-up serves unless it idled (waiting for a compile) a while.
SCREEN_MARGIN = 0.05
SCREEN_WARMUP_MS = 3.0
SCREEN_REP_MS = 10.0
SCREEN_MIN_REPS = 5
IDLE_S = 0.05       # after this long without a timed launch, a screen warms up in full


def device_buffer(name: str, value: Any) -> tuple[int, int]:
    """(address, bytes) of a contiguous device array (a PyTorch tensor, or anything with
    __cuda_array_interface__)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cuda":
            raise ArgumentError(f"argument {name!r} is named in restore_value/reset_to_zero but "
                                f"is a tensor on {value.device}; pass it on the GPU")
        if not value.is_contiguous():
            raise ArgumentError(f"argument {name!r} (restore_value/reset_to_zero) must be "
                                "contiguous")
        return value.data_ptr(), value.numel() * value.element_size()
    from ..runtime import array_interface
    cai = array_interface(value)
    if cai is None:
        raise ArgumentError(f"argument {name!r} is named in restore_value/reset_to_zero but is a "
                            f"{type(value).__name__}, not a device array")
    from ..runtime import array_layout
    _typestr, _itemsize, nbytes, contiguous = array_layout(cai)
    if not contiguous:
        raise ArgumentError(f"argument {name!r} (restore_value/reset_to_zero) must be contiguous")
    return int(cai["data"][0]), nbytes


class Protected:
    """Saved copies of the buffers named in restore_value, and the ones to zero per launch."""

    def __init__(self, named: Mapping[str, Any], restore: Sequence[str], zero: Sequence[str],
                 stream: Any = None):
        for n in (*restore, *zero):
            if n not in named:
                raise ArgumentError(f"restore_value/reset_to_zero names {n!r}, which is not an "
                                    f"argument (arguments: {', '.join(named)})")
        self.zero = [device_buffer(n, named[n]) for n in zero]
        self.saved: list[tuple[int, int, Any]] = []
        drv = driver.bindings()
        # zeroed buffers are saved too, so the launch after tuning sees what the caller left
        for n in dict.fromkeys([*restore, *zero]):
            ptr, size = device_buffer(n, named[n])
            from ..runtime import empty
            copy = empty(max(size, 1), dtype="uint8")
            # on the stream the candidates run on: after the caller's work there, before theirs
            driver.call(drv.cuMemcpyDtoDAsync, copy.ptr, ptr, size, stream)
            self.saved.append((ptr, size, copy))

    def before_launch(self, stream: Any) -> None:
        drv = driver.bindings()
        for ptr, size in self.zero:
            driver.call(drv.cuMemsetD8Async, ptr, 0, size, stream)

    def restore(self, stream: Any) -> None:
        drv = driver.bindings()
        for ptr, size, copy in self.saved:
            driver.call(drv.cuMemcpyDtoDAsync, ptr, copy.ptr, size, stream)

    def __bool__(self) -> bool:
        return bool(self.zero or self.saved)


def bench(launch: Callable[[], None], *, stream: Any = None,
          before: Callable[[], None] | None = None, warmup_ms: float = WARMUP_MS,
          rep_ms: float = REP_MS, min_reps: int = MIN_REPS, max_reps: int = MAX_REPS,
          stop: Callable[[list[float]], bool] | None = None) -> dict[str, Any]:
    """{"ms": median, "reps": n, "min_ms", "max_ms"} of `launch` timed with CUDA events.

    stop: given the times of the repeats finished so far, whether to stop timing (early
    stopping: "stopped": True is added); its `hopeless(ms)`, where it has one, is asked
    after the first launch, and true ends the timing there. The repeats are then read while
    the next ones are queued, at least WINDOW_MS of work ahead, so the GPU never waits for the
    check (an idle GPU between a start event and its launch would lengthen that repeat).
    Without it every repeat is queued at once."""
    from ..runtime import Event
    start, end = Event(), Event()
    if before:
        before()
    start.record(stream)
    launch()
    end.record(stream)
    estimate = max(end.elapsed_time(start), 1e-3)
    hopeless = getattr(stop, "hopeless", None)
    if hopeless is not None and hopeless(estimate):
        return {"ms": estimate, "reps": 1, "min_ms": estimate, "max_ms": estimate, "stopped": True}
    for _ in range(max(1, int(warmup_ms / estimate))):
        if before:
            before()
        launch()
    reps = max(min_reps, min(max_reps, int(rep_ms / estimate)))
    pairs = [(Event(), Event()) for _ in range(reps)]
    window = reps if stop is None else max(2, math.ceil(WINDOW_MS / estimate))
    times: list[float] = []
    ran = reps
    for i, (s, e) in enumerate(pairs):
        if i >= window:   # read the oldest in flight; window - 1 repeats keep the GPU busy
            pairs[i - window][1].synchronize()
            times.append(pairs[i - window][1].elapsed_time(pairs[i - window][0]))
            if stop(times):   # type: ignore[misc]
                ran = i
                break
        if before:
            before()
        s.record(stream)
        launch()
        e.record(stream)
    pairs[ran - 1][1].synchronize()
    times = [e.elapsed_time(s) for s, e in pairs[:ran]]   # those in flight at a stop count too
    out = {"ms": statistics.median(times), "reps": ran, "min_ms": min(times), "max_ms": max(times)}
    if ran < reps:
        out["stopped"] = True
    return out


class EarlyStop:
    """The rule: stop once `after` repeats have finished and even the fastest of them is more
    than (1 + margin) times the best median so far (`best()`, None before any); or after the
    first launch (`hopeless`), when it alone took over twice that plus HOPELESS_SLACK_MS."""

    def __init__(self, margin: float, best: Callable[[], float | None], after: int = EARLY_REPS):
        self.margin, self.best, self.after = margin, best, after

    def __call__(self, times: list[float]) -> bool:
        b = self.best()
        return b is not None and len(times) >= self.after and min(times) > b * (1 + self.margin)

    def hopeless(self, first_ms: float) -> bool:
        b = self.best()
        return b is not None and first_ms > 2 * b * (1 + self.margin) + HOPELESS_SLACK_MS

