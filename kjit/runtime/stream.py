"""Streams and events, turning foreign stream objects into driver handles, and the checks a
launch makes on its stream: that it belongs to the launch's context, and whether it is being
captured into a CUDA graph."""
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
            raise_async(err, "cuStreamSynchronize", context=self._ctx or None)

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


# the NULL (legacy) stream, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: whichever context is
# current when they are used is theirs
_DEFAULT_STREAMS = (0, 1, 2)


def check_stream_context(stream: Any, ctx: int, device: int, kernel: str) -> None:
    """Refuse, before a launch, a stream of another context than the one the launch runs in:
    the driver would fail the launch with an unrelated-looking error."""
    if int(stream) in _DEFAULT_STREAMS or capture_state(stream) is not None:
        # A capturing stream is asked nothing else: during a capture the driver refuses
        # stream queries other than cuStreamIsCapturing, and a refused call ends the capture.
        # A stream of another device then fails in cuLaunchKernel, which says so.
        return
    drv = driver.bindings()
    err, owner = drv.cuStreamGetCtx(stream)
    if err:
        driver.raise_for(err, "cuStreamGetCtx", f"the stream given to kernel {kernel!r} "
                         f"({int(stream):#x}) is not a usable CUDA stream")
    if int(owner) == ctx:
        return
    other = stream_device(stream, owner)
    if other == device:
        raise ArgumentError(
            f"kernel {kernel!r}: the stream belongs to another CUDA context of device {device} "
            "than the one current in this thread; pass a stream made in the current context")
    raise ArgumentError(
        f"kernel {kernel!r}: the stream is on device {other} but the launch runs on device "
        f"{device} (the current device). Pass a stream of device {device}, or make device "
        f"{other} current for the launch (kjit.Device({other}), torch.cuda.device({other}), "
        f"cupy.cuda.Device({other}))")


def stream_device(stream: Any, ctx: Any) -> int | None:
    """The ordinal of the device a stream (of context `ctx`) runs on."""
    drv = driver.bindings()
    try:   # CUDA 12.8+ drivers answer directly
        err, dev = drv.cuStreamGetDevice(stream)
        if not err:
            return int(dev)
    except Exception:   # older bindings or driver: ask the stream's context
        pass
    (err,) = drv.cuCtxPushCurrent(ctx)
    if err:
        return None
    try:
        err, dev = drv.cuCtxGetDevice()
        return None if err else int(dev)
    finally:
        drv.cuCtxPopCurrent()


def capture_state(stream: Any) -> str | None:
    """None when synchronous work may go with a launch on `stream`; else why not: the stream
    is being captured into a CUDA graph (or its capture failed), or the legacy stream is tied
    to a capture in progress."""
    drv = driver.bindings()
    err, status = drv.cuStreamIsCapturing(drv.CUstream(int(stream)))
    if err:   # the legacy stream while another stream captures: STREAM_CAPTURE_IMPLICIT
        name = getattr(err, "name", "")
        return (f"the legacy stream cannot be used while a capture is in progress ({name})"
                if name.startswith("CUDA_ERROR_STREAM_CAPTURE") else None)
    if status == drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE:
        return None
    if status == drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        return "the stream is being captured into a CUDA graph"
    return "the stream's graph capture was invalidated by an earlier call"
