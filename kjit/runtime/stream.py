"""Streams and events, turning foreign stream objects into driver handles, the stream a launch
given none runs on (the current stream of its arrays' framework), and the checks a launch
makes on its stream: that it belongs to the launch's context, and whether it is being
captured into a CUDA graph."""
from __future__ import annotations

import sys
from typing import Any

from .. import driver
from ..errors import ArgumentError
from . import cupy_capi, libcuda
from .capture import check_not_capturing, thread_stream


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
        check_not_capturing("Stream.synchronize()")
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


def stream_owner(stream: Any) -> int | None:
    """The address of the context a stream belongs to; None for the default streams (whichever
    context is current is theirs), for a stream being captured (asked nothing else then), and
    for a handle the driver does not know (the launch's own checks say so)."""
    if int(stream) in _DEFAULT_STREAMS or capture_state(stream) is not None:
        return None
    err, owner = driver.bindings().cuStreamGetCtx(stream)
    return None if err else int(owner)


def stream_device(stream: Any, ctx: Any) -> int | None:
    """The ordinal of the device a stream (of context `ctx`) runs on."""
    drv = driver.bindings()
    try:   # CUDA 12.8+ drivers answer directly
        err, dev = drv.cuStreamGetDevice(stream)
        if not err:
            return int(dev)
    except Exception:   # older bindings or driver: ask the stream's context
        pass
    return driver.context_device(ctx)


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


# --- the stream of a launch given none ----------------------------------------------
class _OperatorStream:
    """The stream of a kernel run as a PyTorch operator (`as_torch_op`): PyTorch's current
    stream, read per launch as for a launch given none, with tensors that require grad
    accepted (the operator runs below autograd, which records the operator)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "kjit.runtime.stream.OPERATOR_STREAM"


OPERATOR_STREAM = _OperatorStream()

# Array frameworks whose current stream a launch follows, by the top-level package of the
# array's type; the C launcher's FOREIGN_TORCH and FOREIGN_CUPY (kjit/runtime/_foreign.h),
# checked against these by tests/test_c_constants.py.
TORCH, CUPY = 1, 2
FRAMEWORKS = {"torch": TORCH, "cupy": CUPY}
_kind_by_type: dict[type, int] = {}


def framework_kind(value: Any) -> int:
    """TORCH for a PyTorch tensor, CUPY for a CuPy array, 0 for anything else."""
    t = type(value)
    kind = _kind_by_type.get(t)
    if kind is None:
        kind = FRAMEWORKS.get(t.__module__.partition(".")[0], 0)
        if kind == TORCH and not isinstance(value, sys.modules["torch"].Tensor):
            kind = 0
        elif kind == CUPY and not hasattr(t, "__cuda_array_interface__"):
            kind = 0
        _kind_by_type[t] = kind
    return kind


def stream_getter(kind: int) -> Any:
    """The framework's own reader of a device's current stream, as the C launcher calls it:
    each takes the device index; PyTorch's returns the raw handle (what Triton's launcher
    reads), CuPy's a Stream. None where the framework lacks it. Found once per framework: a
    launch given no stream asks it every time."""
    getter = _getters.get(kind)
    if getter is None:
        if kind == TORCH:
            getter = getattr(getattr(sys.modules.get("torch"), "_C", None), "_cuda_getCurrentRawStream", None)
        else:
            getter = getattr(getattr(sys.modules.get("cupy"), "cuda", None), "get_current_stream", None)
        if getter is not None:
            _getters[kind] = getter
    return getter


_getters: dict[int, Any] = {}


def current_stream(kind: int, device: int) -> int | None:
    """The handle of the framework's current stream on `device`, read as the C launcher reads
    it where kjit's extension is built; None if it cannot tell (a build without CUDA: the
    arguments' own checks then say what is wrong)."""
    read = c_stream_reader(kind)
    got = read(kind, device) if read is not None else None
    if got is not None:
        return got
    try:
        return int(stream_getter(kind)(device)) if kind == TORCH else int(stream_getter(kind)(device).ptr)
    except Exception:
        return None


def c_stream_reader(kind: int) -> Any:
    """The C extension's reader of the framework's current stream (`current_stream(kind,
    device)`), its getter registered there first, once, and for CuPy its own C reader where
    that agrees with CuPy's Python answer; None without the extension or the framework."""
    if kind not in _registered:
        register, getter = libcuda.c_function("register_stream"), stream_getter(kind)
        if register is None or getter is None:
            return None
        register(kind, getter)
        capsule = cupy_capi.stream_capsule() if kind == CUPY else None
        if capsule is not None:
            try:
                register(kind, getter, capsule)   # refused for another signature
            except TypeError:
                pass
            else:
                if not cupy_capi.agrees(lambda device: libcuda.c_function("current_stream")(kind, device)):
                    register(kind, getter, None)
        _registered.add(kind)
    return libcuda.c_function("current_stream")


_registered: set[int] = set()


def framework_stream(args: tuple, device: int, kernel: str) -> int:
    """The stream a launch given none runs on: the current stream of the framework whose
    arrays it receives (PyTorch: torch.cuda.current_stream(device), so also the capture stream
    inside torch.cuda.graph; CuPy: cupy.cuda.get_current_stream(device)), read for the launch's
    device whichever device is current; the legacy stream (0) when it receives none. Tensors of both frameworks whose current streams differ are refused:
    kjit cannot tell which work the launch must follow."""
    seen = 0
    for a in args:
        seen |= 1 << framework_kind(a)
    if not seen & ~1:
        return thread_stream()
    torch_s = current_stream(TORCH, device) if seen & (1 << TORCH) else None
    cupy_s = current_stream(CUPY, device) if seen & (1 << CUPY) else None
    if torch_s is not None and cupy_s is not None and torch_s != cupy_s:
        raise ArgumentError(
            f"kernel {kernel!r} receives PyTorch tensors and CuPy arrays, and their current "
            f"streams differ (PyTorch's {torch_s:#x}, CuPy's {cupy_s:#x}): kjit cannot tell which "
            "work the launch must follow. Name the stream: k[grid, block, stream](...), or make "
            "one current in both (cupy.cuda.ExternalStream(torch_stream.cuda_stream).use())")
    return torch_s if torch_s is not None else cupy_s if cupy_s is not None else 0


def capture_hint(err: Any, stream: Any) -> str | None:
    """What to do about a launch the driver refused because of a graph capture."""
    name = getattr(err, "name", "") or ""
    if not name.startswith("CUDA_ERROR_STREAM_CAPTURE"):
        try:
            name = driver.bindings().CUresult(int(err)).name
        except Exception:
            return None
        if not name.startswith("CUDA_ERROR_STREAM_CAPTURE"):
            return None
    if int(stream) in _DEFAULT_STREAMS:
        return ("the launch went to the legacy (default) stream while a CUDA graph is being "
                "captured, which the driver refuses (and the capture is now invalid). A launch "
                "given no stream follows the current stream of its PyTorch tensors or CuPy "
                "arrays; with only kjit arrays, name the capture stream: "
                "k[grid, block, torch.cuda.current_stream()](...)")
    return ("the stream's CUDA graph capture refused the launch (or was invalidated by an "
            "earlier call); see the capture's own error for the first cause")
