"""The HIP runtime path through ctypes on libamdhip64: init, modules, kernels, globals,
memory and streams. The twin of the CUDA driver layer (kjit.driver, kjit.runtime).

NOT RUN ON AMD HARDWARE: no AMD GPU exists on the machines kjit is developed on. The tests
cover everything up to each hip* call (library loading, error mapping, the launch
configuration and the parameter buffer) and the clear error hipInit gives with no GPU.

Kernel arguments travel the way HIP documents for hipModuleLaunchKernel on AMD: one packed
buffer handed over through `extra` = {HIP_LAUNCH_PARAM_BUFFER_POINTER, &buf,
HIP_LAUNCH_PARAM_BUFFER_SIZE, &size, HIP_LAUNCH_PARAM_END}, with the AMD values 1, 2, 3.
The buffer is packed by kjit.runtime.params exactly as for CUDA.
"""
from __future__ import annotations

import ctypes
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import ArgumentError, CudaUnavailableError, DriverError, KernelNotFoundError, KjitError
from . import loader

# hip_runtime_api.h (HIP-Clang / AMD platform).
HIP_LAUNCH_PARAM_BUFFER_POINTER = 1
HIP_LAUNCH_PARAM_BUFFER_SIZE = 2
HIP_LAUNCH_PARAM_END = 3
hipMemcpyHostToDevice, hipMemcpyDeviceToHost, hipMemcpyDeviceToDevice = 1, 2, 3

# AMD limits hipModuleLaunchKernel enforces: 1024 work-items per block, and each grid
# dimension in work-items (blocks x threads) must fit in 32 bits (HSA dispatch packet).
MAX_BLOCK_THREADS = 1024
MAX_GRID_WORKITEMS = 2**32 - 1


class HipUnavailableError(CudaUnavailableError):
    """No HIP runtime or no AMD GPU: HIP compiles and bundles still work.

    A CudaUnavailableError, so code that handles "no GPU here" handles both backends.
    """


# --- errors ---------------------------------------------------------------------------
# hipError_t name -> the CUDA driver error it is the twin of. Most are the CamelCase of the
# driver name (hipErrorInvalidValue <-> CUDA_ERROR_INVALID_VALUE) and are derived; this
# table holds the others. Twins share their number: HIP reuses CUDA's codes.
_HIP_TO_CUDA_EXCEPTIONS: Mapping[str, str] = {
    "hipErrorInvalidKernelFile": "CUDA_ERROR_INVALID_PTX",
    "hipErrorECCNotCorrectable": "CUDA_ERROR_ECC_UNCORRECTABLE",
    "hipErrorSetOnActiveProcess": "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
    "hipErrorLaunchTimeOut": "CUDA_ERROR_LAUNCH_TIMEOUT",
    "hipErrorLaunchFailure": "CUDA_ERROR_LAUNCH_FAILED",
    "hipErrorMemoryAllocation": "CUDA_ERROR_OUT_OF_MEMORY",
    "hipErrorInitializationError": "CUDA_ERROR_NOT_INITIALIZED",
    "hipErrorInvalidResourceHandle": "CUDA_ERROR_INVALID_HANDLE",
    "hipErrorMapBufferObjectFailed": "CUDA_ERROR_MAP_FAILED",
}
# Runtime-API and HSA errors the driver has no twin for: the nearest driver error.
_NO_DRIVER_TWIN: Mapping[str, str] = {
    "hipErrorInvalidConfiguration": "CUDA_ERROR_INVALID_VALUE",
    "hipErrorInvalidPitchValue": "CUDA_ERROR_INVALID_VALUE",
    "hipErrorInvalidSymbol": "CUDA_ERROR_NOT_FOUND",
    "hipErrorInvalidDevicePointer": "CUDA_ERROR_INVALID_VALUE",
    "hipErrorInvalidMemcpyDirection": "CUDA_ERROR_INVALID_VALUE",
    "hipErrorInsufficientDriver": "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    "hipErrorMissingConfiguration": "CUDA_ERROR_INVALID_VALUE",
    "hipErrorPriorLaunchFailure": "CUDA_ERROR_LAUNCH_FAILED",
    "hipErrorInvalidDeviceFunction": "CUDA_ERROR_INVALID_HANDLE",
    "hipErrorRuntimeMemory": "CUDA_ERROR_UNKNOWN",   # an HSA runtime memory error
    "hipErrorRuntimeOther": "CUDA_ERROR_UNKNOWN",    # any other HSA runtime error
    "hipErrorTbd": "CUDA_ERROR_UNKNOWN",
}


def cuda_twin(hip_error: str) -> str:
    """The CUDA driver name for a hipError_t name: hipErrorNoDevice -> CUDA_ERROR_NO_DEVICE."""
    if hip_error == "hipSuccess":
        return "CUDA_SUCCESS"
    found = _HIP_TO_CUDA_EXCEPTIONS.get(hip_error) or _NO_DRIVER_TWIN.get(hip_error)
    if found:
        return found
    words = re.findall(r"[A-Z][a-z0-9]*|[A-Z]+(?![a-z])", hip_error.removeprefix("hipError"))
    return "CUDA_ERROR_" + "_".join(w.upper() for w in words) if words else "CUDA_ERROR_UNKNOWN"


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


# --- the library and the checked call -------------------------------------------------
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


# --- launch configuration and parameters ---------------------------------------------
def _dim3(value: Any, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else None
    if dims is None or not 1 <= len(dims) <= 3 or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ArgumentError(f"{what} must be a positive int or a tuple of 1-3 positive ints, "
                            f"got {value!r}")
    return (*dims, 1, 1)[:3]  # type: ignore[return-value]


@dataclass(frozen=True)
class LaunchConfig:
    """Grid (in blocks), block (in threads), dynamic shared memory and stream of a launch,
    validated against the limits hipModuleLaunchKernel enforces on AMD GPUs."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0
    stream: int = 0  # hipStream_t; 0 is the null stream

    @classmethod
    def make(cls, grid: Any, block: Any, shared_mem: int = 0, stream: Any = None) -> "LaunchConfig":
        g, b = _dim3(grid, "grid"), _dim3(block, "block")
        threads = b[0] * b[1] * b[2]
        if threads > MAX_BLOCK_THREADS:
            raise ArgumentError(f"block {b} has {threads} threads; AMD GPUs allow at most "
                                f"{MAX_BLOCK_THREADS} per block")
        for axis, (gd, bd) in zip("xyz", zip(g, b)):
            if gd * bd > MAX_GRID_WORKITEMS:
                raise ArgumentError(
                    f"grid {axis}: {gd} blocks x {bd} threads = {gd * bd} work-items; HIP on AMD "
                    f"allows at most {MAX_GRID_WORKITEMS} per dimension")
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, int) or shared_mem < 0:
            raise ArgumentError(f"shared_mem must be a non-negative int (bytes), got {shared_mem!r}")
        return cls(g, b, shared_mem, stream_handle(stream))


def stream_handle(stream: Any) -> int:
    """The hipStream_t (as an int) of None (null stream), an int handle or a HipStream."""
    if stream is None:
        return 0
    if isinstance(stream, HipStream):
        return stream.handle
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return stream
    raise ArgumentError(f"stream must be None, a kjit HipStream or a hipStream_t int, got {stream!r}")


class HipParams:
    """A packed kernel-argument buffer and the `extra` array hipModuleLaunchKernel reads it
    through. Built once per kernel: refilling the buffer in place needs no new array.

    `buffer` is bytes (copied), or a bytearray / ctypes buffer (used in place, so the
    caller's packer can write into it between launches).
    """

    __slots__ = ("buffer", "size", "_size", "extra")

    def __init__(self, buffer: Any, size: int | None = None):
        if isinstance(buffer, (bytes, memoryview)):
            data = bytes(buffer)
            buffer = ctypes.create_string_buffer(data, max(len(data), 1))
            size = len(data) if size is None else size
        elif isinstance(buffer, bytearray):
            n = len(buffer)
            buffer = (ctypes.c_char * max(n, 1)).from_buffer(buffer if n else bytearray(1))
            size = n if size is None else size
        elif not isinstance(buffer, ctypes.Array):
            raise ArgumentError("kernel parameters must be packed bytes, a bytearray or a ctypes "
                                f"buffer, got {type(buffer).__name__}")
        capacity = ctypes.sizeof(buffer)
        size = capacity if size is None else int(size)
        if not 0 <= size <= capacity:
            raise ArgumentError(f"parameter size {size} exceeds the {capacity}-byte buffer")
        self.buffer = buffer
        self._size = ctypes.c_size_t(size)
        self.size = size
        self.extra = (ctypes.c_void_p * 5)(
            HIP_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer),
            HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(self._size),
            HIP_LAUNCH_PARAM_END)


# --- modules and functions -------------------------------------------------------------
def _loadable(code: Any) -> tuple[bytes, list[str], list[str]]:
    """(bytes hipModuleLoadData takes, kernel names, archs) of an ObjectCode or raw bytes."""
    from ..objectcode import ObjectCode
    obj = code if isinstance(code, ObjectCode) else ObjectCode(bytes(code))
    if obj.kind not in ("hsaco", "hipfb"):
        raise ArgumentError(
            f"a HIP module loads AMD code objects (hsaco) or offload bundles (hipfb), not "
            f"{obj.kind}; compile with backend='hip'")
    if obj.kind == "hipfb":
        from .bundle import read_bundle
        archs = [e.arch for e in read_bundle(obj.code) if e.kind == "hsaco"]
    else:
        archs = [obj.arch] if obj.arch else []
    return obj.code, list(obj.entry_points), archs


class HipModule:
    """A loaded AMD code object or offload bundle (hipModuleLoadData)."""

    def __init__(self, code: Any):
        from ..objectcode import ObjectCode
        self.object = code if isinstance(code, ObjectCode) else ObjectCode(bytes(code))
        self.code, self.kernel_names, self.archs = _loadable(self.object)
        self._image = ctypes.create_string_buffer(self.code, len(self.code))
        handle = ctypes.c_void_p()
        call("hipModuleLoadData", ctypes.byref(handle), ctypes.addressof(self._image),
             hint=f"the module holds code for: {', '.join(self.archs) or 'unknown targets'}; "
                  "compile for this GPU's gfx arch (rocminfo lists it)")
        self.handle = handle.value
        self._functions: dict[str, HipFunction] = {}

    def get_function(self, name: str) -> "HipFunction":
        """The kernel `name` (its lowered name for templates); KernelNotFoundError lists those there are."""
        fn = self._functions.get(name)
        if fn is not None:
            return fn
        symbol = self.object.lowered_name(name)   # "axpy<float>" -> its lowered name
        handle = ctypes.c_void_p()
        try:
            call("hipModuleGetFunction", ctypes.byref(handle), self.handle, symbol.encode())
        except DriverError as exc:
            if exc.hip_name in ("hipErrorNotFound", "hipErrorInvalidDeviceFunction"):
                raise KernelNotFoundError(name, self.kernel_names) from None
            raise
        fn = self._functions[name] = HipFunction(self, name, handle.value, symbol)
        return fn

    def code_object(self) -> bytes:
        """One AMD code object of this module (argument layouts are the same in each)."""
        if self.object.kind == "hipfb":
            from .bundle import read_bundle
            for entry in read_bundle(self.code):
                if entry.kind == "hsaco":
                    return entry.code
        return self.code

    def get_global(self, name: str) -> tuple[int, int]:
        """(device address, size in bytes) of a __device__ variable (hipModuleGetGlobal)."""
        ptr, size = ctypes.c_void_p(), ctypes.c_size_t()
        try:
            call("hipModuleGetGlobal", ctypes.byref(ptr), ctypes.byref(size), self.handle,
                 name.encode())
        except DriverError as exc:
            if exc.hip_name in ("hipErrorNotFound", "hipErrorInvalidSymbol"):
                raise KernelNotFoundError(name, (), what="global") from None
            raise
        return ptr.value or 0, size.value

    def unload(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, None
            call("hipModuleUnload", handle)

    def __enter__(self) -> "HipModule":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unload()


class HipFunction:
    """A kernel of a HipModule: `fn[grid, block](*args)` checks and packs arguments like a
    CUDA kjit.Kernel; launch() takes an already packed parameter buffer."""

    def __init__(self, module: HipModule, name: str, handle: int, symbol: str | None = None):
        self.module = module  # keeps the module loaded while the function lives
        self.name = name
        self.symbol = symbol or name
        self.handle = handle
        self._packer = None

    @property
    def params(self) -> tuple:
        """Parameter slots: layout from the code object's metadata (comgr), types from the code."""
        return tuple(self._packer_for().slots)

    def _packer_for(self):
        if self._packer is None:
            from ..runtime.params import Packer
            from ..runtime.signature import resolve_slots
            from .comgr import kernel_args
            info = kernel_args(self.module.code_object()).get(self.symbol)
            layout = [tuple(a) for a in info.args] if info is not None else None
            slots = resolve_slots(self.module.object, self.name, self.symbol, layout)
            self._packer = Packer(self.name, slots, device=0)
        return self._packer

    def pack(self, args: tuple) -> HipParams:
        """Arguments checked and converted exactly as for CUDA kernels, packed for HIP."""
        import struct
        packer = self._packer_for()
        values = packer.convert_all(args, [])
        buf = ctypes.create_string_buffer(max(packer.size, 1))
        try:
            packer.struct.pack_into(buf, 0, *values)
        except (struct.error, OverflowError):
            raise packer.diagnose(args) from None
        return HipParams(buf, size=packer.size)

    def __getitem__(self, config: Any):
        """`fn[grid, block]` / `fn[grid, block, stream, shared_mem]`, like a CUDA kjit.Kernel."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise ArgumentError("launch configuration is f[grid, block], f[grid, block, stream] "
                                "or f[grid, block, stream, shared_mem]")
        grid, block = config[0], config[1]
        stream = config[2] if len(config) > 2 else None
        shared = config[3] if len(config) > 3 else 0
        LaunchConfig.make(grid, block, shared, stream)   # validate before any launch

        def launch(*args: Any) -> None:
            self.launch(self.pack(args), grid, block, shared, stream)
        return launch

    def launch_args(self, params: HipParams, config: LaunchConfig) -> tuple:
        """The exact arguments of hipModuleLaunchKernel for this launch."""
        return (self.handle, *config.grid, *config.block, config.shared_mem, config.stream,
                None, params.extra)

    def launch(self, params: HipParams | bytes | bytearray | ctypes.Array, grid: Any, block: Any,
               shared_mem: int = 0, stream: Any = None) -> None:
        """Launch on `grid` blocks of `block` threads with the packed `params`."""
        if not isinstance(params, HipParams):
            params = HipParams(params)
        config = LaunchConfig.make(grid, block, shared_mem, stream)
        call("hipModuleLaunchKernel", *self.launch_args(params, config))

    def __repr__(self) -> str:
        return f"HipFunction({self.name!r})"


# --- memory and streams ----------------------------------------------------------------
class HipBuffer:
    """Device memory from hipMalloc; int(buf) is its address (for pointer parameters)."""

    def __init__(self, nbytes: int):
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise ArgumentError(f"nbytes must be a positive int, got {nbytes!r}")
        ptr = ctypes.c_void_p()
        call("hipMalloc", ctypes.byref(ptr), nbytes)
        self.ptr: int = ptr.value or 0
        self.nbytes = nbytes

    def __int__(self) -> int:
        return self.ptr

    def _host(self, host: Any, nbytes: int | None, writable: bool) -> tuple[int, int, Any]:
        view = memoryview(host)
        if writable and view.readonly:
            raise ArgumentError("the host buffer to copy into is read-only")
        if not view.c_contiguous:
            raise ArgumentError("host buffers must be C-contiguous")
        n = view.nbytes if nbytes is None else nbytes
        if n > min(view.nbytes, self.nbytes):
            raise ArgumentError(f"copy of {n} bytes exceeds the host ({view.nbytes}) or device "
                                f"({self.nbytes}) buffer")
        holder = (ctypes.c_char * view.nbytes).from_buffer(view) if not view.readonly else \
            ctypes.create_string_buffer(view.tobytes(), view.nbytes)
        return ctypes.addressof(holder), n, holder

    def copy_from_host(self, host: Any, nbytes: int | None = None, stream: Any = None) -> None:
        addr, n, _keep = self._host(host, nbytes, writable=False)
        if stream is None:
            call("hipMemcpy", self.ptr, addr, n, hipMemcpyHostToDevice)
        else:
            call("hipMemcpyAsync", self.ptr, addr, n, hipMemcpyHostToDevice, stream_handle(stream))
            call("hipStreamSynchronize", stream_handle(stream))  # the staging copy dies here

    def copy_to_host(self, host: Any, nbytes: int | None = None) -> None:
        addr, n, _keep = self._host(host, nbytes, writable=True)
        call("hipMemcpy", addr, self.ptr, n, hipMemcpyDeviceToHost)

    def free(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            call("hipFree", ptr)

    def __enter__(self) -> "HipBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()


class HipStream:
    """A HIP stream (hipStreamCreate); pass it as `stream=` to launches and copies."""

    def __init__(self) -> None:
        handle = ctypes.c_void_p()
        call("hipStreamCreate", ctypes.byref(handle))
        self.handle: int = handle.value or 0

    def synchronize(self) -> None:
        call("hipStreamSynchronize", self.handle)

    def close(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, 0
            call("hipStreamDestroy", handle)

    def __enter__(self) -> "HipStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _reset_for_tests() -> None:
    """Forget the library and init state (tests only)."""
    global _initialized, _unavailable, _lib
    _initialized, _unavailable, _lib = False, None, None
