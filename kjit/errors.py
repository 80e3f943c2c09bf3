"""The exception tree. Every error kjit raises is a KjitError.

DriverError carries one failure under the three names users search for: the CUDA driver
name (CUDA_ERROR_INVALID_VALUE), the runtime name (cudaErrorInvalidValue) and the HIP
name (hipErrorInvalidValue).
"""
from __future__ import annotations

from typing import Mapping, Sequence

__all__ = [
    "KjitError", "CompileError", "LinkError", "DriverError", "CudaUnavailableError",
    "KernelNotFoundError", "ArgumentError", "InvalidOptionError", "runtime_name", "hip_name",
    "HIP_ERROR_NAMES",
]


class KjitError(Exception):
    """Base class of every error kjit raises."""


class CompileError(KjitError):
    """A compiler (NVRTC or hiprtc) rejected the source.

    Carries the full log, the flags used, and excerpts of the source around every line
    the log points at. The compiler renders that text (`report`) when it raises the error
    (kjit.compiler.diagnostics.compile_error), so this module imports nothing of kjit.
    """

    def __init__(self, message: str, *, log: str = "", options: Sequence[str] = (),
                 source: str = "", name: str = "<source>", compiler: str = "NVRTC",
                 report: str = ""):
        self.log = log
        self.options = tuple(options)
        self.source = source
        self.name = name
        self.compiler = compiler
        self.message = message
        self.report = report
        super().__init__(message)

    def __str__(self) -> str:
        return self.report or self.message


class LinkError(KjitError):
    """A linker (driver cuLink or nvJitLink) failed; both logs and the failing input are kept."""

    def __init__(self, message: str, *, error_log: str = "", info_log: str = "",
                 input_name: str | None = None, backend: str = "", symbol: str | None = None,
                 inputs: Sequence[str] = ()):
        self.message = message
        self.error_log = error_log
        self.info_log = info_log
        self.input_name = input_name
        self.backend = backend
        self.symbol = symbol
        self.inputs = tuple(inputs)
        super().__init__(message)

    def __str__(self) -> str:
        parts = [self.message]
        if self.backend:
            parts[0] += f" [{self.backend}]"
        if self.input_name:
            parts.append(f"failing input: {self.input_name}")
        if self.symbol:
            parts.append(f"undefined symbol: {self.symbol}")
        if self.inputs:
            parts.append("inputs: " + ", ".join(self.inputs))
        if self.error_log.strip():
            parts.append("error log:\n" + _indent(self.error_log))
        if self.info_log.strip():
            parts.append("info log:\n" + _indent(self.info_log))
        return "\n".join(parts)


# Runtime names that are not the CamelCase of the driver name (checked against
# cuda.bindings.runtime.cudaError_t by tests/test_errors.py).
_RUNTIME_OVERRIDES: Mapping[str, str] = {
    "CUDA_ERROR_OUT_OF_MEMORY": "cudaErrorMemoryAllocation",
    "CUDA_ERROR_NOT_INITIALIZED": "cudaErrorInitializationError",
    "CUDA_ERROR_DEINITIALIZED": "cudaErrorCudartUnloading",
    "CUDA_ERROR_INVALID_CONTEXT": "cudaErrorDeviceUninitialized",
    "CUDA_ERROR_LAUNCH_FAILED": "cudaErrorLaunchFailure",
    "CUDA_ERROR_INVALID_HANDLE": "cudaErrorInvalidResourceHandle",
    "CUDA_ERROR_NOT_FOUND": "cudaErrorSymbolNotFound",
    "CUDA_ERROR_INVALID_IMAGE": "cudaErrorInvalidKernelImage",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "cudaErrorNoKernelImageForDevice",
    "CUDA_ERROR_INVALID_PTX": "cudaErrorInvalidPtx",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "cudaErrorUnsupportedPtxVersion",
    "CUDA_ERROR_INVALID_DEVICE": "cudaErrorInvalidDevice",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "cudaErrorIllegalAddress",
    "CUDA_ERROR_UNKNOWN": "cudaErrorUnknown",
    "CUDA_ERROR_DEVICE_UNAVAILABLE": "cudaErrorDevicesUnavailable",
    "CUDA_ERROR_MAP_FAILED": "cudaErrorMapBufferObjectFailed",
    "CUDA_ERROR_UNMAP_FAILED": "cudaErrorUnmapBufferObjectFailed",
    "CUDA_ERROR_ECC_UNCORRECTABLE": "cudaErrorECCUncorrectable",
    "CUDA_ERROR_CONTEXT_ALREADY_IN_USE": "cudaErrorDeviceAlreadyInUse",
    "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC": "cudaErrorUnsupportedDevSideSync",
    "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE": "cudaErrorSetOnActiveProcess",
}
# Driver errors the runtime has no code for: their runtime_name is None, not a made-up name.
_NO_RUNTIME_TWIN = frozenset({
    "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "CUDA_ERROR_MULTICAST_RESOURCE_FULL",
    "CUDA_ERROR_KEY_ROTATION",
})

# hipError_t (hip_runtime_api.h, ROCm 5-6). HIP reuses the CUDA numbers for the errors both
# have, except 911 and 912, which HIP gave to errors CUDA numbers differently.
HIP_ERROR_NAMES: Mapping[int, str] = {
    0: "hipSuccess", 1: "hipErrorInvalidValue", 2: "hipErrorOutOfMemory",
    3: "hipErrorNotInitialized", 4: "hipErrorDeinitialized", 5: "hipErrorProfilerDisabled",
    6: "hipErrorProfilerNotInitialized", 7: "hipErrorProfilerAlreadyStarted",
    8: "hipErrorProfilerAlreadyStopped", 9: "hipErrorInvalidConfiguration",
    12: "hipErrorInvalidPitchValue", 13: "hipErrorInvalidSymbol",
    17: "hipErrorInvalidDevicePointer", 21: "hipErrorInvalidMemcpyDirection",
    35: "hipErrorInsufficientDriver", 52: "hipErrorMissingConfiguration",
    53: "hipErrorPriorLaunchFailure", 98: "hipErrorInvalidDeviceFunction",
    100: "hipErrorNoDevice", 101: "hipErrorInvalidDevice", 200: "hipErrorInvalidImage",
    201: "hipErrorInvalidContext", 202: "hipErrorContextAlreadyCurrent",
    205: "hipErrorMapFailed", 206: "hipErrorUnmapFailed", 207: "hipErrorArrayIsMapped",
    208: "hipErrorAlreadyMapped", 209: "hipErrorNoBinaryForGpu",
    210: "hipErrorAlreadyAcquired", 211: "hipErrorNotMapped",
    212: "hipErrorNotMappedAsArray", 213: "hipErrorNotMappedAsPointer",
    214: "hipErrorECCNotCorrectable", 215: "hipErrorUnsupportedLimit",
    216: "hipErrorContextAlreadyInUse", 217: "hipErrorPeerAccessUnsupported",
    218: "hipErrorInvalidKernelFile", 219: "hipErrorInvalidGraphicsContext",
    300: "hipErrorInvalidSource", 301: "hipErrorFileNotFound",
    302: "hipErrorSharedObjectSymbolNotFound", 303: "hipErrorSharedObjectInitFailed",
    304: "hipErrorOperatingSystem", 400: "hipErrorInvalidHandle",
    401: "hipErrorIllegalState", 500: "hipErrorNotFound", 600: "hipErrorNotReady",
    700: "hipErrorIllegalAddress", 701: "hipErrorLaunchOutOfResources",
    702: "hipErrorLaunchTimeOut", 704: "hipErrorPeerAccessAlreadyEnabled",
    705: "hipErrorPeerAccessNotEnabled", 708: "hipErrorSetOnActiveProcess",
    709: "hipErrorContextIsDestroyed", 710: "hipErrorAssert",
    712: "hipErrorHostMemoryAlreadyRegistered", 713: "hipErrorHostMemoryNotRegistered",
    719: "hipErrorLaunchFailure", 720: "hipErrorCooperativeLaunchTooLarge",
    801: "hipErrorNotSupported", 900: "hipErrorStreamCaptureUnsupported",
    901: "hipErrorStreamCaptureInvalidated", 902: "hipErrorStreamCaptureMerge",
    903: "hipErrorStreamCaptureUnmatched", 904: "hipErrorStreamCaptureUnjoined",
    905: "hipErrorStreamCaptureIsolation", 906: "hipErrorStreamCaptureImplicit",
    907: "hipErrorCapturedEvent", 908: "hipErrorStreamCaptureWrongThread",
    910: "hipErrorGraphExecUpdateFailure", 911: "hipErrorInvalidChannelDescriptor",
    912: "hipErrorInvalidTexture", 999: "hipErrorUnknown",
}
_HIP_NAMES = frozenset(HIP_ERROR_NAMES.values())
# HIP names that are not the CamelCase of the driver name.
_HIP_OVERRIDES: Mapping[str, str] = {
    "CUDA_ERROR_INVALID_PTX": "hipErrorInvalidKernelFile",
    # HIP has no PTX; a too-new PTX is, to HIP, a kernel file it cannot use.
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "hipErrorInvalidKernelFile",
    "CUDA_ERROR_LAUNCH_FAILED": "hipErrorLaunchFailure",
    "CUDA_ERROR_ECC_UNCORRECTABLE": "hipErrorECCNotCorrectable",
    "CUDA_ERROR_LAUNCH_TIMEOUT": "hipErrorLaunchTimeOut",
    "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE": "hipErrorSetOnActiveProcess",
}


def _camel(name: str, prefix: str) -> str:
    words = name.removeprefix("CUDA_ERROR_").lower().split("_")
    return prefix + "".join(w.capitalize() for w in words)


def runtime_name(cuda_name: str) -> str | None:
    """The CUDA runtime's name for a driver error name; None where the runtime has none."""
    if cuda_name == "CUDA_SUCCESS":
        return "cudaSuccess"
    if cuda_name in _NO_RUNTIME_TWIN:
        return None
    return _RUNTIME_OVERRIDES.get(cuda_name) or _camel(cuda_name, "cudaError")


def hip_name(cuda_name: str) -> str | None:
    """HIP's name for a driver error name; None where HIP has no such error."""
    if cuda_name == "CUDA_SUCCESS":
        return "hipSuccess"
    name = _HIP_OVERRIDES.get(cuda_name) or _camel(cuda_name, "hipError")
    return name if name in _HIP_NAMES else None


# Errors that leave the context unusable: the driver returns them from every later call in the
# process ("the process must be terminated and relaunched", CUDA driver API docs). What each means:
_STICKY: Mapping[str, str] = {
    "CUDA_ERROR_ASSERT": "A device-side assert fired: an assert() in a kernel failed (the driver "
                         "prints its file, line and condition on the process's output). Compile "
                         "with NDEBUG defined to leave asserts out",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "A kernel read or wrote memory it may not (out of bounds, freed, "
                                  "or another context's)",
    "CUDA_ERROR_MISALIGNED_ADDRESS": "A kernel accessed memory at an address not aligned for the "
                                     "access's size",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": "A kernel executed an illegal instruction",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE": "A kernel used an address in the wrong address space",
    "CUDA_ERROR_INVALID_PC": "A kernel's program counter left its code",
    "CUDA_ERROR_HARDWARE_STACK_ERROR": "A kernel overflowed its call stack (deep recursion?)",
    "CUDA_ERROR_LAUNCH_FAILED": "A kernel failed while running",
    "CUDA_ERROR_LAUNCH_TIMEOUT": "A kernel ran past the display watchdog's limit",
}


class DriverError(KjitError):
    """A CUDA driver (or HIP runtime) call failed."""

    def __init__(self, code: int, cuda_name: str, *, call: str = "", description: str = "",
                 hint: str = "", hip_name: str | None = None):
        self.code = int(code)
        self.cuda_name = cuda_name
        self.runtime_name = runtime_name(cuda_name)
        # HIP raises several errors that share one CUDA twin; the HIP runtime passes its own
        self.hip_name = hip_name or globals()["hip_name"](cuda_name)
        self.call = call
        self.description = description
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"{self.call} failed: " if self.call else ""
        twins = [f"runtime: {self.runtime_name}" if self.runtime_name else "",
                 f"HIP: {self.hip_name}" if self.hip_name else ""]
        text = f"{head}{self.cuda_name} ({'; '.join([str(self.code), *filter(None, twins)])})"
        if self.description:
            text += f": {self.description}"
        if self.hint:
            text += f"\n{self.hint}"
        if self.cuda_name in _STICKY:
            text += (f"\n{_STICKY[self.cuda_name]}. The CUDA context is now unusable: every later "
                     "CUDA call in this process fails with this error; restart the process.")
        return text

    @property
    def context_unusable(self) -> bool:
        """True for the errors after which every CUDA call in the process fails (device asserts,
        illegal addresses...): the process must be restarted."""
        return self.cuda_name in _STICKY


class CudaUnavailableError(KjitError):
    """No CUDA driver or no device: compile, link to cubin and build still work."""


class KernelNotFoundError(KjitError, KeyError):
    """A module has no kernel (or global) of the name asked for; lists the names it has."""

    def __init__(self, name: str, available: Sequence[str] = (), what: str = "kernel"):
        self.name = name
        self.available = tuple(available)
        self.what = what
        super().__init__(name)

    def __str__(self) -> str:
        have = ", ".join(self.available) if self.available else "(none)"
        return f"no {self.what} named {self.name!r} in this module; it has: {have}"


class InvalidOptionError(KjitError, ValueError):
    """An option, target or architecture is unknown or contradictory; raised before compiling."""


class ArgumentError(KjitError, TypeError):
    """A launch argument or an option is wrong; raised before anything is launched."""


class CompileWarning(UserWarning):
    """A compile succeeded but its result is probably not what was meant (no kernel came out)."""


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())
