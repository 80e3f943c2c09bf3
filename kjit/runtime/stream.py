"""Streams and events, and turning foreign stream objects into driver handles."""
from __future__ import annotations

from typing import Any

from .. import driver
from ..errors import ArgumentError


class Stream:
    """A CUDA stream (cuStreamCreate). `non_blocking=True` does not sync with the legacy stream."""

    def __init__(self, non_blocking: bool = False, priority: int = 0):
        ctx = driver.ensure_context()
        self._ctx, self._epoch = int(ctx), driver.context_epoch(ctx)
        drv = driver.bindings()
        flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else \
            drv.CUstream_flags.CU_STREAM_DEFAULT
        self.handle = driver.call(drv.cuStreamCreateWithPriority, flags, priority)
        self._owned = True

    @classmethod
    def wrap(cls, handle: int) -> "Stream":
        """A kjit.Stream for an existing handle (not destroyed by kjit)."""
        self = cls.__new__(cls)
        self.handle = driver.bindings().CUstream(int(handle))
        self._owned = False
        self._ctx, self._epoch = 0, 0
        return self

    @property
    def ptr(self) -> int:
        return int(self.handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, int(self.handle))

    def synchronize(self) -> None:
        (err,) = driver.bindings().cuStreamSynchronize(self.handle)
        if err:
            from .context import raise_async
            raise_async(err, "cuStreamSynchronize")

    def record(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def wait(self, event: "Event") -> None:
        driver.call(driver.bindings().cuStreamWaitEvent, self.handle, event.handle, 0)

    def close(self) -> None:
        if self._owned and self.handle is not None and driver.context_epoch(self._ctx) == self._epoch:
            drv = driver.bindings()
            drv.cuStreamDestroy(self.handle)
            self.handle = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"kjit.Stream({self.ptr:#x})"


class Event:
    """A CUDA event; `end.elapsed_time(start)` gives milliseconds between two recorded events."""

    def __init__(self, timing: bool = True):
        ctx = driver.ensure_context()
        self._ctx, self._epoch = int(ctx), driver.context_epoch(ctx)
        drv = driver.bindings()
        flags = drv.CUevent_flags.CU_EVENT_DEFAULT if timing else drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self.handle = driver.call(drv.cuEventCreate, flags)

    def record(self, stream: Any = None) -> "Event":
        driver.call(driver.bindings().cuEventRecord, self.handle, as_handle(stream))
        return self

    def synchronize(self) -> None:
        driver.call(driver.bindings().cuEventSynchronize, self.handle)

    def query(self) -> bool:
        (err,) = driver.bindings().cuEventQuery(self.handle)
        return not err

    def elapsed_time(self, start: "Event") -> float:
        """Milliseconds from `start` to this event."""
        self.synchronize()
        return float(driver.call(driver.bindings().cuEventElapsedTime, start.handle, self.handle))

    def __del__(self) -> None:
        try:
            if driver.context_epoch(self._ctx) == self._epoch:
                driver.bindings().cuEventDestroy(self.handle)
        except Exception:
            pass


def as_handle(stream: Any) -> Any:
    """A CUstream for kjit Streams, ints, and objects with __cuda_stream__, .cuda_stream or .ptr."""
    drv = driver.bindings()
    if stream is None or stream == 0:
        return drv.CUstream(0)
    if isinstance(stream, Stream):
        return stream.handle
    if isinstance(stream, drv.CUstream):
        return stream
    if isinstance(stream, int) and not isinstance(stream, bool):
        return drv.CUstream(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return drv.CUstream(int(value[1]))
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return drv.CUstream(value)
    raise ArgumentError(
        f"cannot use {type(stream).__name__} as a stream: pass a kjit.Stream, an int handle, or "
        "an object with __cuda_stream__, .cuda_stream or .ptr (CuPy, PyTorch, cuda.core)")
