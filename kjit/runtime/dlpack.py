"""DLPack capsules for device arrays: export (DeviceArray.__dlpack__) and import (kernel
arguments from objects with __dlpack__), through the ABI's C structs in ctypes.

numpy's own DLPack support is for host memory only, so the device side is done here.
"""
from __future__ import annotations

import ctypes
from typing import Any


from ..errors import ArgumentError
from . import dtypes

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13   # pointers.py keeps the same numbers
_CODES = {"i": 0, "u": 1, "f": 2, "b": 6, "c": 5}
_BFLOAT = 4   # kDLBfloat: kjit's "bfloat16" (dtypes.EXTRA), which numpy has no code letter for
_DEVICE_NAMES = {1: "CPU", 3: "pinned host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI",
                 10: "ROCm", 11: "ROCm host", 12: "extension device", 14: "oneAPI", 15: "WebGPU",
                 16: "Hexagon"}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _Deleter)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Exported tensors stay alive (with the array they view) until the consumer calls the deleter.
_live: dict[int, tuple] = {}


@_Deleter
def _delete(managed: Any) -> None:
    _live.pop(ctypes.addressof(managed.contents), None)


def to_capsule(array: Any) -> Any:
    """A "dltensor" capsule viewing a DeviceArray (the array is kept alive by the capsule)."""
    kind = array.typestr[1]
    if kind not in _CODES or array.typestr[0] == ">":
        raise ArgumentError(f"dtype {dtypes.name(array.typestr)} has no DLPack code")
    ndim = array.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // array.itemsize for s in array.strides))
    managed = DLManagedTensor()
    managed.dl_tensor.data = array.ptr
    managed.dl_tensor.device = DLDevice(kDLCUDA, array.device)
    managed.dl_tensor.ndim = ndim
    managed.dl_tensor.dtype = DLDataType(_CODES[kind], array.itemsize * 8, 1)
    managed.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.byte_offset = 0
    managed.deleter = _delete
    _live[ctypes.addressof(managed)] = (managed, shape, strides, array)
    return _api.PyCapsule_New(ctypes.addressof(managed), b"dltensor", None)


def describe(obj: Any) -> tuple[int, str, int, tuple[int, ...], tuple[int, ...] | None,
                              int | None]:
    """(data pointer, typestr, itemsize, shape, strides in bytes or None, device id) of a CUDA
    __dlpack__ object; the device id is None for managed memory, which every device reads."""
    dev_type, dev_id = obj.__dlpack_device__()
    if int(dev_type) not in (kDLCUDA, kDLCUDAManaged):
        where = _DEVICE_NAMES.get(int(dev_type), f"DLPack device type {int(dev_type)}")
        raise ArgumentError(
            f"got a {type(obj).__name__} in {where} memory, but the kernel reads CUDA device "
            "memory; copy it to the GPU first (or kjit.to_device(numpy_array))")
    capsule = obj.__dlpack__()
    if not _api.PyCapsule_IsValid(capsule, b"dltensor"):
        raise ArgumentError(f"{type(obj).__name__}.__dlpack__() did not return a dltensor capsule")
    # Not renamed to "used_dltensor": the capsule's destructor then calls the producer's
    # deleter, and the producer object (held by the caller for the launch) owns the memory.
    managed = DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor"))
    t = managed.dl_tensor
    kind = {v: k for k, v in _CODES.items()}.get(t.dtype.code)
    bfloat16 = t.dtype.code == _BFLOAT and t.dtype.bits == 16
    if (kind is None and not bfloat16) or t.dtype.lanes != 1:
        raise ArgumentError(f"unsupported DLPack dtype code={t.dtype.code} lanes={t.dtype.lanes}")
    itemsize = t.dtype.bits // 8
    typestr = "bfloat16" if bfloat16 else \
        dtypes.resolve(f"{kind}{itemsize}" if kind != "b" else "bool")[0]
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = (tuple(t.strides[i] * itemsize for i in range(t.ndim))
               if t.strides else None)
    device = None if int(dev_type) == kDLCUDAManaged else int(dev_id)
    return int(t.data or 0) + int(t.byte_offset), typestr, itemsize, shape, strides, device
