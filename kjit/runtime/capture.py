"""A kjit graph capture in this thread: the stream launches given none go to, the refusal of
what a capture cannot record, asked before the driver is called (a refused call would end the
capture), and the relaxed mode that loads and releases run in so that no capture, in this
thread or another, is ended by them. The lowest piece of the runtime's stream handling:
memory, modules, contexts and streams ask it."""
from __future__ import annotations

import threading
from typing import Any

from .. import driver
from ..errors import ArgumentError
from .libcuda import c_function

_thread = threading.local()


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


class relaxed_capture:
    """Within this block the thread may make calls that a CUDA graph capture refuses and would
    be invalidated by: a module load (a kernel's first launch in a context), and the releases
    (cuMemFree, cuModuleUnload, cuGraphExecDestroy) of objects collected while this thread or,
    in PyTorch's global mode, any thread captures. They run at once, unrecorded; cuMemFree
    still waits for the work queued before the capture."""

    __slots__ = ("previous",)

    def __enter__(self) -> "relaxed_capture":
        drv = driver.bindings()
        err, prev = drv.cuThreadExchangeStreamCaptureMode(
            drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        self.previous = None if err else prev
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            driver.bindings().cuThreadExchangeStreamCaptureMode(self.previous)


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
