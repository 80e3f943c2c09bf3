"""Direct calls into libcuda for the two queries kjit makes around launches, where
cuda.bindings is wrong or slow:

- the device whose memory a foreign pointer is: cuda.bindings 13.3-13.5 read
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL back from the wrong field and answer 0 for memory on
  every device (NVIDIA/cuda-python#2928), so a PyTorch or CuPy array on device 1 looked like
  device 0's;
- the context current in this thread, asked on launches that leave the C fast path and on
  every `@kjit.kernel` launch: one C call instead of a bindings object.

Through kjit's C extension (kjit/runtime/_launch.c) when it is built, else ctypes. Nothing is
loaded before first use, and where no CUDA driver exists the answers are "unknown"."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

from .. import driver

# cuda.h values (stable ABI): CUpointer_attribute and CUmemorytype
_ATTR_MEMORY_TYPE, _ATTR_IS_MANAGED, _ATTR_DEVICE_ORDINAL = 2, 8, 9
_MEMORYTYPE_DEVICE = 2

_lock = threading.Lock()
_resolved: dict[str, Callable] = {}


def c_function(name: str) -> Callable[..., Any] | None:
    """A function of the compiled extension (kjit/runtime/_launch.c), None when not built:
    "pack" (the argument packer) or "launcher" (`k[grid, block]` as one C callable that
    packs and launches, handing anything unusual to the Python launcher it wraps)."""
    try:
        from . import _launch
    except ImportError:
        return None
    return getattr(_launch, name, None)


def extension() -> Any | None:
    """The C extension with its libcuda functions resolved, or None (not built, no driver)."""
    try:
        from . import _launch
        _launch.bind()
    except (ImportError, OSError):
        return None
    return _launch


def pointer_device(address: int) -> int | None:
    """The ordinal of the device whose memory `address` points into; None for host, managed
    and unknown memory (any device may read those, or kjit cannot tell) and without a driver."""
    if not address:
        return None
    fn = _resolved.get("pointer_device") or _resolve("pointer_device", _pointer_device_fn)
    ordinal = fn(address)
    return ordinal if ordinal >= 0 else None


def current_context() -> int:
    """The address of the context current in this thread, 0 for none."""
    fn = _resolved.get("current_context") or _resolve("current_context", _current_context_fn)
    return fn()


def current_context_fn() -> Callable[[], int]:
    """current_context itself, resolved: for launch paths that call it every time."""
    return _resolved.get("current_context") or _resolve("current_context", _current_context_fn)


def _resolve(name: str, make: Callable[[], Callable]) -> Callable:
    with _lock:
        if name not in _resolved:
            _resolved[name] = make()
    return _resolved[name]


def _libcuda() -> Any | None:
    try:
        return driver.libcuda_ctypes()
    except OSError:
        return None


def _pointer_device_fn() -> Callable[[int], int]:
    ext = extension()
    if ext is not None:
        return ext.pointer_device
    return ctypes_pointer_device() or (lambda address: -1)


def ctypes_pointer_device() -> Callable[[int], int] | None:
    """The same query as the C extension's pointer_device, through ctypes (the fallback
    where the extension is not built); None without libcuda."""
    lib = _libcuda()
    if lib is None:
        return None
    fn = lib.cuPointerGetAttributes
    fn.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p),
                   ctypes.c_ulonglong]
    fn.restype = ctypes.c_int
    attrs = (ctypes.c_int * 3)(_ATTR_MEMORY_TYPE, _ATTR_DEVICE_ORDINAL, _ATTR_IS_MANAGED)

    def query(address: int) -> int:
        # zeroed 8-byte cells: the driver writes 4 (enum, int) or fewer (bool) bytes
        mem_type, ordinal, managed = ctypes.c_uint64(0), ctypes.c_int64(0), ctypes.c_uint64(0)
        data = (ctypes.c_void_p * 3)(ctypes.addressof(mem_type), ctypes.addressof(ordinal),
                                     ctypes.addressof(managed))
        if fn(3, attrs, data, address) != 0:
            return -1
        if mem_type.value != _MEMORYTYPE_DEVICE or managed.value:
            return -1
        return ctypes.c_int32(ordinal.value & 0xFFFFFFFF).value
    return query


def _current_context_fn() -> Callable[[], int]:
    ext = extension()
    if ext is not None:
        return ext.current_context
    drv = driver.bindings()

    def current() -> int:
        try:
            err, ctx = drv.cuCtxGetCurrent()
        except Exception:   # no driver library: no context
            return 0
        return 0 if err else int(ctx)
    return current
