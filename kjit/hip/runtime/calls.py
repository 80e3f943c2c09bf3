"""libamdhip64 through ctypes: the library with its signatures, the checked call, hipInit."""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from ...errors import DriverError, KjitError
from .. import loader
from .hip_errors import HipUnavailableError, cuda_twin

_lock = threading.Lock()
_initialized = False
_unavailable: HipUnavailableError | None = None

_p, _i, _u, _sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
_SIGNATURES: dict[str, list] = {
    "hipInit": [_u],
    "hipGetDeviceCount": [ctypes.POINTER(_i)],
    "hipSetDevice": [_i],
    "hipGetDevice": [ctypes.POINTER(_i)],
    "hipDeviceSynchronize": [],
    "hipRuntimeGetVersion": [ctypes.POINTER(_i)],
    "hipDriverGetVersion": [ctypes.POINTER(_i)],
    "hipModuleLoadData": [ctypes.POINTER(_p), _p],
    "hipModuleUnload": [_p],
    "hipModuleGetFunction": [ctypes.POINTER(_p), _p, ctypes.c_char_p],
    "hipModuleGetGlobal": [ctypes.POINTER(_p), ctypes.POINTER(_sz), _p, ctypes.c_char_p],
    "hipModuleLaunchKernel": [_p, _u, _u, _u, _u, _u, _u, _u, _p, ctypes.POINTER(_p),
                              ctypes.POINTER(_p)],
    "hipMalloc": [ctypes.POINTER(_p), _sz],
    "hipFree": [_p],
    "hipMemcpy": [_p, _p, _sz, _i],
    "hipMemcpyAsync": [_p, _p, _sz, _i, _p],
    "hipMemset": [_p, _i, _sz],
    "hipStreamCreate": [ctypes.POINTER(_p)],
    "hipStreamDestroy": [_p],
    "hipStreamSynchronize": [_p],
}


_lib: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    """libamdhip64 with the signatures kjit uses declared; HipUnavailableError if absent."""
    global _lib
    if _lib is not None:
        return _lib
    lib = loader.load_first(loader.RUNTIME_NAMES, "hipModuleLaunchKernel")
    if lib is None:
        raise HipUnavailableError(
            f"no HIP runtime found (tried {', '.join(loader.RUNTIME_NAMES)}); install it: "
            f"{loader.INSTALL_HINT}. Running HIP kernels also needs an AMD GPU")
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, _i
    lib.hipGetErrorName.argtypes = lib.hipGetErrorString.argtypes = [_i]
    lib.hipGetErrorName.restype = lib.hipGetErrorString.restype = ctypes.c_char_p
    _lib = lib
    return lib


def call(name: str, *args: Any, hint: str = "") -> None:
    """Call hip<name>(*args) after init; a non-success hipError_t raises DriverError."""
    init()
    code = getattr(_library(), name)(*args)
    if code != 0:
        raise make_error(code, name, hint)


def init() -> None:
    """hipInit once per process; HipUnavailableError (remembered) with no runtime or no GPU."""
    global _initialized, _unavailable
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        if _unavailable is not None:
            raise _unavailable
        try:
            lib = _library()
        except HipUnavailableError as exc:
            _unavailable = exc
            raise
        code = lib.hipInit(0)
        count = ctypes.c_int(0)
        count_code = lib.hipGetDeviceCount(ctypes.byref(count)) if code == 0 else code
        if code != 0 or count_code != 0 or count.value == 0:
            failed = "hipInit" if code != 0 else "hipGetDeviceCount"
            reason = error_name(code or count_code) if (code or count_code) else "0 devices"
            _unavailable = HipUnavailableError(
                f"no AMD GPU: {failed} failed ({reason}). kjit can compile HIP to code objects "
                "and build offload bundles here, but loading and launching need a machine with "
                "an AMD GPU and the amdgpu kernel driver (check /dev/kfd and "
                "HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES)")
            raise _unavailable
        _initialized = True


def available() -> bool:
    """True if the HIP runtime loads and sees at least one AMD GPU. Never raises."""
    try:
        init()
        return True
    except KjitError:
        return False


def device_count() -> int:
    count = ctypes.c_int()
    call("hipGetDeviceCount", ctypes.byref(count))
    return count.value


def synchronize() -> None:
    """Wait for all work on the current device (hipDeviceSynchronize)."""
    call("hipDeviceSynchronize")



def error_name(code: int) -> str:
    """hipGetErrorName for a code (the library's own table)."""
    name = _library().hipGetErrorName(int(code))
    return name.decode() if name else f"hipError{int(code)}"


def make_error(code: int, call: str, hint: str = "") -> DriverError:
    """The DriverError for a failed hip* call, under its HIP name and its CUDA twin's."""
    lib = _library()
    hip = error_name(code)
    text = lib.hipGetErrorString(int(code))
    err = DriverError(int(code), cuda_twin(hip), call=call,
                      description=text.decode() if text and text.decode() != hip else "",
                      hint=hint, hip_name=hip)
    return err



def _reset_for_tests() -> None:
    """Forget the library and init state (tests only)."""
    global _initialized, _unavailable, _lib
    _initialized, _unavailable, _lib = False, None, None
