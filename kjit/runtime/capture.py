"""A kjit graph capture in this thread: the stream launches given none go to, the refusal of
what a capture cannot record, asked before the driver is called (a refused call would end the
capture), and the frees that wait until no capture runs here. The lowest piece of the
runtime's stream handling: memory, contexts and streams ask it."""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable

from ..errors import ArgumentError
from .libcuda import c_function

_thread = threading.local()
# frees that came while a thread captured (an array collected meanwhile), by that thread:
# cuMemFree inside a capture would end it, so they wait for the capture to be over
_waiting: list[tuple[int, Callable[..., None], tuple]] = []
_waiting_lock = threading.Lock()


def thread_stream() -> int:
    """The stream of a launch given none and no framework array: the legacy stream (0), or
    the capture stream while this thread captures a kjit graph."""
    return getattr(_thread, "stream", 0)


def check_not_capturing(what: str) -> None:
    """Refuse, before calling the driver, what a graph capture in this thread cannot record:
    the driver would fail the call and end the capture."""
    graph = getattr(_thread, "capture", None)
    if graph is not None:
        raise ArgumentError(
            f"{what} cannot run while this thread captures {graph}: a capture records kernel "
            "launches, not allocations, host copies or waits, and such a call would end it. "
            "Make arrays and copies before the capture, synchronize after it")


def capturing_here() -> bool:
    """Whether this thread is capturing a CUDA graph: a kjit graph, or PyTorch's or CuPy's on
    their current stream (asked only of a framework already imported and in use)."""
    if getattr(_thread, "capture", None) is not None:
        return True
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
            return True
    except Exception:   # a torch without CUDA, or mid-import: no capture of its own
        pass
    cupy = sys.modules.get("cupy")
    try:   # the legacy stream never captures: only another current stream is asked
        stream = cupy.cuda.get_current_stream() if cupy is not None else None
        if stream is not None and stream.ptr and stream.is_capturing():
            return True
    except Exception:
        pass
    return False


def when_not_capturing(release: Callable[..., None], *args: Any) -> None:
    """release(*args) now, or, while this thread captures a graph, once that capture is over
    (after cuStreamEndCapture for a kjit graph, else at the next release or allocation outside
    one): a device array collected inside a capture must not end it with cuMemFree."""
    if capturing_here():
        with _waiting_lock:
            _waiting.append((threading.get_ident(), release, args))
        return
    release(*args)
    run_waiting()


def run_waiting() -> None:
    """The releases that waited for this thread's capture, now that it captures none (and
    those of threads that have ended). Another thread's wait for its own capture, which may
    still run: PyTorch's global mode would end it at a free from any thread."""
    if not _waiting or capturing_here():
        return
    me, alive = threading.get_ident(), {t.ident for t in threading.enumerate()}
    with _waiting_lock:
        due = [w for w in _waiting if w[0] == me or w[0] not in alive]
        _waiting[:] = [w for w in _waiting if w[0] != me and w[0] in alive]
    for _, release, args in due:
        release(*args)


class thread_capture:
    """Within this block launches given no stream and no framework array go to `handle` (the
    C launcher reads the same per-thread stream), and check_not_capturing refuses."""

    __slots__ = ("handle", "what", "saved")

    def __init__(self, handle: int, what: str):
        self.handle, self.what = int(handle), what

    def __enter__(self) -> "thread_capture":
        self.saved = (getattr(_thread, "stream", 0), getattr(_thread, "capture", None))
        self._set(self.handle, self.what)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._set(*self.saved)

    @staticmethod
    def _set(handle: int, what: Any) -> None:
        _thread.stream, _thread.capture = handle, what
        setter = c_function("set_thread_stream")
        if setter is not None:
            setter(handle)
