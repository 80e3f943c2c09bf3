"""A small device array, and the In/Out/InOut wrappers that copy host arrays around a launch."""
from __future__ import annotations

import math
import operator
import sys
import weakref
from typing import Any, Sequence

from .. import driver
from ..errors import ArgumentError
from . import dtypes
from .capture import check_not_capturing, relaxed_capture


def _free(ptr: int, ctx: Any, epoch: int) -> None:
    """An array's release: whenever its last reference goes, which may be while a graph
    capture runs (this thread's, or PyTorch's global-mode one in any thread): relaxed, the
    cuMemFree leaves the capture running."""
    if driver.context_epoch(ctx) != epoch:   # its context was destroyed: the memory went with it
        return
    drv = driver.bindings()
    try:
        (err,) = drv.cuCtxPushCurrent(ctx)
        if err:   # never pop the caller's own context
            return
        try:
            with relaxed_capture():
                drv.cuMemFree(ptr)
        finally:
            drv.cuCtxPopCurrent()
    except Exception:  # interpreter shutdown: the driver may already be gone
        pass


def _legacy_stream_sync() -> None:
    """Wait for the legacy stream: cuMemsetD8 and pageable cuMemcpyHtoD may return before the
    device memory is written, and a kernel on a non-blocking stream would not wait for them."""
    driver.call(driver.bindings().cuStreamSynchronize, driver.bindings().CUstream(0))


def _order_after_legacy(stream: Any) -> None:
    """Make a DLPack consumer's stream (1: the legacy one) wait for the work kjit queued on the
    current context's legacy stream (its copies and zero fills), with an event: no host wait.
    Nothing is done while the stream is being captured: a capture records no such wait, and
    any call on the legacy stream would invalidate it."""
    from .stream import capture_state
    handle = int(stream)
    if handle in (0, 1) or capture_state(handle) is not None:
        return
    drv = driver.bindings()
    event = driver.call(drv.cuEventCreate, drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    try:
        driver.call(drv.cuEventRecord, event, drv.CUstream(0))
        driver.call(drv.cuStreamWaitEvent, drv.CUstream(handle), event, 0)
    finally:
        drv.cuEventDestroy(event)


class DeviceArray:
    """An n-dimensional array in device memory (C-contiguous unless made from a view).

    Exposes `__cuda_array_interface__` (v3) and `__dlpack__`, so CuPy, PyTorch and Numba
    can use it without a copy; kjit kernels accept it for pointer parameters. Its element
    type is kept as numpy's typestr ('<f4'): `dtype` makes the numpy dtype on first use, so
    a program that launches without numpy never imports it.
    """

    __slots__ = ("ptr", "shape", "typestr", "itemsize", "strides", "nbytes", "device",
                 "is_c_contiguous", "launch_key", "_dtype", "_base", "_finalizer", "_ctx",
                 "__weakref__")

    def __init__(self, shape: int | Sequence[int], dtype: Any = "float32", *, ptr: int | None = None,
                 strides: Sequence[int] | None = None, device: int | None = None, base: Any = None):
        try:
            self.shape = (operator.index(shape),)
        except TypeError:
            self.shape = tuple(operator.index(s) for s in shape)
        if any(s < 0 for s in self.shape):
            raise ArgumentError(f"negative dimension in shape {self.shape}")
        self.typestr, itemsize, self._dtype = dtypes.resolve(dtype)
        self.itemsize = itemsize
        contiguous = _c_strides(self.shape, itemsize)
        self.strides = tuple(strides) if strides is not None else contiguous
        self.nbytes = math.prod(self.shape) * itemsize
        # computed once: the launch fast path reads it on every pointer argument
        self.is_c_contiguous = self.strides == contiguous or self.nbytes <= itemsize
        self._base = base
        self._finalizer = None
        self.launch_key = None
        self._ctx = None   # where it was allocated; None: its device's primary context
        if ptr is None:
            check_not_capturing("allocating a device array")
            ctx = self._ctx = driver.ensure_context()
            self.device = driver.current_device() if device is None else device
            self.ptr = int(driver.call(driver.bindings().cuMemAlloc, max(self.nbytes, 1)))
            self._finalizer = weakref.finalize(self, _free, self.ptr, ctx, driver.context_epoch(ctx))
        else:
            self.ptr = int(ptr)
            self.device = driver.current_device() if device is None else device
        if self.is_c_contiguous:
            # one interned token for (dtype, device): the launch path checks an array with a
            # single identity test instead of three attribute comparisons
            self.launch_key = launch_key(self.typestr, self.device)

    # --- numpy-like -------------------------------------------------------------------
    @property
    def dtype(self) -> Any:
        """The numpy dtype (imports numpy on first use)."""
        if self._dtype is None:
            self._dtype = dtypes.numpy().dtype(self.typestr)
        return self._dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def __repr__(self) -> str:
        return (f"kjit.DeviceArray(shape={self.shape}, dtype={dtypes.name(self.typestr)}, "
                f"device={self.device})")

    # --- copies -----------------------------------------------------------------------
    def copy_from_host(self, host: Any, stream: Any = None) -> "DeviceArray":
        check_not_capturing("copy_from_host")
        np = dtypes.numpy()
        host = np.asarray(host)
        if host.dtype != self.dtype or host.size != self.size:
            raise ArgumentError(
                f"cannot copy a host array of {host.size} {host.dtype} into a device array of "
                f"{self.size} {self.dtype}")
        self._require_contiguous("copy_from_host")
        host = np.ascontiguousarray(host)
        if self.nbytes:
            with self._home():
                driver.call(driver.bindings().cuMemcpyHtoD, self.ptr, host.ctypes.data, self.nbytes)
                _legacy_stream_sync()
        return self

    def copy_to_host(self, out: Any = None, stream: Any = None) -> Any:
        """Into `out` (a C-contiguous numpy array of the same dtype and size) or a new one."""
        check_not_capturing("copy_to_host")
        self._require_contiguous("copy_to_host")
        if out is None:
            out = dtypes.numpy().empty(self.shape, self.dtype)
        elif out.dtype != self.dtype or out.size != self.size or not out.flags.c_contiguous:
            raise ArgumentError("out must be a C-contiguous host array of the same dtype and size")
        if self.nbytes:
            with self._home():
                driver.call(driver.bindings().cuMemcpyDtoH, out.ctypes.data, self.ptr, self.nbytes)
        return out

    def get(self) -> Any:
        """The array's contents as a new numpy array."""
        return self.copy_to_host()

    def fill_zero(self) -> "DeviceArray":
        check_not_capturing("fill_zero")
        if self.nbytes:
            with self._home():
                driver.call(driver.bindings().cuMemsetD8, self.ptr, 0, self.nbytes)
                _legacy_stream_sync()
        return self

    def to(self, device: int) -> "DeviceArray":
        """A copy of this array on device `device` (this array itself if it is there already),
        copied device to device (cuMemcpyPeer: over NVLink or PCIe, through the host where the
        devices have no peer access)."""
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise ArgumentError(f"device must be an ordinal (int >= 0), got {device!r}")
        if device == self.device:
            return self
        self._require_contiguous("to")
        with driver.context_pushed(driver.primary_context(device)):
            out = DeviceArray(self.shape, self.typestr, device=device)
        if self.nbytes:
            drv = driver.bindings()
            with self._home() as src_ctx:
                driver.call(drv.cuMemcpyPeer, out.ptr, out._ctx, self.ptr, src_ctx, self.nbytes)
        return out

    def _home(self) -> "driver.context_pushed":
        """Its context made current for a call: copies, waits and frees go to its device."""
        return driver.context_pushed(self._ctx if self._ctx is not None
                                     else driver.primary_context(self.device))

    def _require_contiguous(self, what: str) -> None:
        if not self.is_c_contiguous:
            raise ArgumentError(f"{what} needs a C-contiguous array; this one has strides {self.strides}")

    # --- interchange ------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, False),
                "version": 3, "strides": None if self.is_c_contiguous else self.strides,
                # kjit's copies and default launches use the legacy default stream
                "stream": 1}

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                    copy: Any = None) -> Any:
        from .dlpack import to_capsule
        if stream is not None and stream != -1:
            with self._home():
                _order_after_legacy(stream)
        return to_capsule(self)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)  # kDLCUDA


def array_interface(value: Any) -> dict | None:
    """value.__cuda_array_interface__, or None: none, or one its producer cannot give (PyTorch
    raises for bfloat16 and float8 tensors, whose dtypes the interface has no typestr for)."""
    try:
        return getattr(value, "__cuda_array_interface__", None)
    except Exception:
        return None


_LAUNCH_KEYS: dict[tuple, tuple] = {}


def launch_key(typestr: str, device: int) -> tuple:
    """One interned token per (element typestr, device); the typestr interned too, as the C
    packer's table of foreign dtypes holds it, so matching one is a pointer test."""
    key = (sys.intern(typestr), device)
    return _LAUNCH_KEYS.setdefault(key, key)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(strides))


def empty(shape: int | Sequence[int], dtype: Any = "float32") -> DeviceArray:
    """An uninitialised device array."""
    return DeviceArray(shape, dtype)


def zeros(shape: int | Sequence[int], dtype: Any = "float32") -> DeviceArray:
    """A device array of zeros."""
    return DeviceArray(shape, dtype).fill_zero()


def to_device(host: Any, dtype: Any = None) -> DeviceArray:
    """Copy a host array (anything numpy.asarray takes) to a new device array."""
    np = dtypes.numpy()
    arr = np.ascontiguousarray(np.asarray(host, dtype=dtype))
    return DeviceArray(arr.shape, arr.dtype).copy_from_host(arr)


class PendingCopies(list):
    """A launch's In/Out copies, (host transfer, device array) pairs to finish once it has
    run, and the stream it goes to: the copies back wait for that stream, and none are made
    while it is being captured into a graph."""

    __slots__ = ("stream",)

    def __init__(self, stream: Any = None):
        super().__init__()
        self.stream = stream


class _HostTransfer:
    """A host numpy array to copy in before a launch and/or out after it."""

    copy_in = False
    copy_out = False

    def __init__(self, array: Any):
        if not dtypes.is_numpy(array, "ndarray"):
            raise ArgumentError(f"{type(self).__name__} takes a numpy array, got {type(array).__name__}")
        if self.copy_out and not array.flags.c_contiguous:
            raise ArgumentError(f"{type(self).__name__} needs a C-contiguous array to copy back into")
        if self.copy_out and not array.flags.writeable:
            raise ArgumentError(f"{type(self).__name__}: the host array is read-only")
        self.array = array
        self.dtype = array.dtype

    def to_device(self) -> DeviceArray:
        dev = DeviceArray(self.array.shape, self.array.dtype)
        if self.copy_in:
            dev.copy_from_host(self.array)
        return dev

    def finish(self, dev: DeviceArray) -> None:
        if self.copy_out:
            dev.copy_to_host(self.array)


class In(_HostTransfer):
    """Copy this host array to the device before the launch (PyCUDA's drv.In)."""
    copy_in = True


class Out(_HostTransfer):
    """Copy the device buffer back into this host array after the launch."""
    copy_out = True


class InOut(_HostTransfer):
    """Copy in before and back out after the launch."""
    copy_in = True
    copy_out = True
