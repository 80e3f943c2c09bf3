"""CuPy's own C reader of a device's current stream, for the C launcher.

CuPy's kernels read the stream they launch on through `get_stream_ptr(device)` of
`cupy_backends.cuda.stream`, a Cython function CuPy exports as a C function pointer in the
module's `__pyx_capi__` (a capsule named by its C signature). The C launcher calls it with no
Python frame, where `cupy.cuda.get_current_stream(device).ptr` would make a Stream object and
look its attribute up on every launch. It is handed over only after it has agreed with
CuPy's Python answer, with a stream made current for the check and put back after it.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Any

SIGNATURE = b"intptr_t (int)"   # the capsule's name: Cython names it by the C signature

_api = ctypes.pythonapi
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# any value no real stream handle has, made current only for the check
_PROBE = 0x6B6A69740


def stream_reader() -> Any:
    """The capsule of CuPy's `get_stream_ptr`, or None where this CuPy lacks it under that
    signature or its answers differ from `cupy.cuda.get_current_stream(device).ptr`."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        from cupy_backends.cuda import stream as backend
        capsule = backend.__pyx_capi__["get_stream_ptr"]
        if _api.PyCapsule_GetName(capsule) != SIGNATURE:
            return None
        read = ctypes.PYFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int)(_api.PyCapsule_GetPointer(capsule, SIGNATURE))
        device = cupy.cuda.runtime.getDevice()

        def agree() -> bool:
            return read(device) == int(cupy.cuda.get_current_stream(device).ptr)

        if not agree():
            return None
        with cupy.cuda.ExternalStream(_PROBE, device):
            if read(device) != _PROBE or not agree():
                return None
        return capsule if agree() else None
    except Exception:   # another CuPy, no device: the Python getter stays
        return None
