"""What kjit reads of CuPy at C level: its reader of a device's current stream, and where its
array objects hold their fields.

CuPy's kernels read the stream they launch on through `get_stream_ptr(device)` of
`cupy_backends.cuda.stream`, a Cython function CuPy exports as a C function pointer in the
module's `__pyx_capi__` (a capsule named by its C signature). kjit's C extension reads CuPy's
current stream through it too (stream.py registers it), so a launch follows the stream a CuPy
kernel would (with CUPY_CUDA_PER_THREAD_DEFAULT_STREAM set, the per-thread stream even while
`Stream.null` is current), with no Python frame, where `cupy.cuda.get_current_stream(device).ptr`
makes a Stream object and looks its attribute up. It is kept only where it agrees with that
Python answer (`agrees`), with a stream made current for the check and put back after it.

A CuPy array (a Cython object) holds its `dtype`, `_c_contiguous` flag and `data` (a
MemoryPointer, which holds `ptr` and `device_id`) as fields at offsets fixed for its type,
which each of those getters returns. The offsets are not published, so they are observed:
each is the one place in the object where every probe holds what its getter answers. The
probes are arrays over memory that does not exist (contiguous and not, of several element
types, addresses and made-up devices), so finding them runs nothing on a GPU and disturbs no
capture. The C packer then reads the fields in place, only while the array's type still has
CuPy's own getters for them (a subclass's property is asked).
"""
from __future__ import annotations

import ctypes
import math
import sys
import types
from typing import Any, Callable, NamedTuple

# any value no real stream handle has, made current only for the check
_PROBE = 0x6B6A69740


class _ProbeStream:
    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, _PROBE)


def stream_capsule() -> Any:
    """CuPy's `get_stream_ptr`, as the capsule Cython exports it in (the C extension checks
    its signature), or None where this CuPy has none."""
    try:
        from cupy_backends.cuda import stream as backend
        return backend.__pyx_capi__.get("get_stream_ptr")
    except Exception:   # no CuPy, or one without Cython's C API table
        return None


def agrees(read: Callable[[int], Any]) -> bool:
    """Whether `read(device)` answers as `cupy.cuda.get_current_stream(device).ptr` for the
    current device, as it is and with another stream made current."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return False
    try:
        device = cupy.cuda.runtime.getDevice()

        def same() -> bool:
            return read(device) == int(cupy.cuda.get_current_stream(device).ptr)

        if not same():
            return False
        with cupy.cuda.Stream.from_external(_ProbeStream()):   # CuPy 14, as get_stream_ptr
            if read(device) != _PROBE or not same():
                return False
        return same()
    except Exception:   # another CuPy, no device
        return False


class ArrayLayout(NamedTuple):
    """The getters whose fields are read in place, and the fields' offsets."""
    dtype_getter: Any
    contiguous_getter: Any
    data_getter: Any
    pointer_type: type
    dtype: int          # offsets in the array object
    contiguous: int
    data: int
    ptr: int            # in the MemoryPointer
    device_id: int


def _word(obj: Any, offset: int) -> int:
    return ctypes.c_uint64.from_address(id(obj) + offset).value


def _int32(obj: Any, offset: int) -> int:
    return ctypes.c_int32.from_address(id(obj) + offset).value


def _only(offsets: list[int]) -> int:
    if len(offsets) != 1:
        raise LookupError(f"{len(offsets)} places fit")
    return offsets[0]


def _nowhere(cupy: Any, shape: tuple, dtype: Any, device: int, address: int) -> Any:
    """A CuPy array over memory that does not exist, of a device the machine need not have."""
    from cupy.cuda.memory import MemoryPointer, UnownedMemory
    nbytes = math.prod(shape) * cupy.dtype(dtype).itemsize
    return cupy.ndarray(shape, dtype, memptr=MemoryPointer(UnownedMemory(address, nbytes, None, device), 0))


def array_layout() -> ArrayLayout | None:
    """Where CuPy's arrays hold their fields, or None where it cannot be told for certain
    (another CuPy)."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        from cupy._core.core import _ndarray_base as base
        from cupy.cuda.memory import MemoryPointer
        getters = [base.__dict__[name] for name in ("dtype", "_c_contiguous", "data")]
        ptr_getter = MemoryPointer.__dict__["ptr"]
        if not all(type(g) is types.GetSetDescriptorType for g in (*getters, ptr_getter)):
            return None
        x = _nowhere(cupy, (4, 6), cupy.float32, 3, 0x7F0000000000)
        probes = [x, x.T, x[:, ::2], x[1:], x[1:, 2:], _nowhere(cupy, (5,), cupy.int64, 5, 0x7F0000100000),
                  _nowhere(cupy, (7,), cupy.float16, 6, 0x7F0000200000)[::3],
                  _nowhere(cupy, (3, 1), cupy.complex64, 3, 0x7F0000300000)]
        if len({bool(p._c_contiguous) for p in probes}) != 2 or len({p.data.ptr for p in probes}) < 4:
            return None
        size, words = base.__basicsize__, range(16, base.__basicsize__ - 7, 8)
        dtype = _only([o for o in words if all(_word(p, o) == id(p.dtype) for p in probes)])
        data = _only([o for o in words if all(_word(p, o) == id(p.data) for p in probes)])
        contiguous = _only([o for o in range(16, size - 3, 4)
                            if all(_int32(p, o) == int(p._c_contiguous) for p in probes)])
        if any(type(p.data) is not MemoryPointer for p in probes):
            return None
        pointers = [p.data for p in probes]   # on made-up devices 3, 5 and 6
        ptr = _only([o for o in range(16, MemoryPointer.__basicsize__ - 7, 8)
                     if all(_word(p, o) == p.ptr % 2**64 for p in pointers)])
        device_id = _only([o for o in range(16, MemoryPointer.__basicsize__ - 3, 4)
                           if all(_int32(p, o) == p.device_id for p in pointers)])
        return ArrayLayout(*getters, MemoryPointer, dtype, contiguous, data, ptr, device_id)
    except Exception:   # another CuPy, no device, or a field in no single place: CuPy's getters
        return None
