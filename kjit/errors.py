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
]


class KjitError(Exception):
    """Base class of every error kjit raises."""


class CompileError(KjitError):
    """A compiler (NVRTC or hiprtc) rejected the source.

    Carries the full log, the flags used, and excerpts of the source around every line
    the log points at.
    """

    def __init__(self, message: str, *, log: str = "", options: Sequence[str] = (),
                 source: str = "", name: str = "<source>", compiler: str = "NVRTC"):
        self.log = log
        self.options = tuple(options)
        self.source = source
        self.name = name
        self.compiler = compiler
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        from .compiler.diagnostics import render_compile_error
        return render_compile_error(self)


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


# Runtime and HIP names that are not the CamelCase of the driver name.
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
}
_HIP_OVERRIDES: Mapping[str, str] = {
    "CUDA_ERROR_INVALID_PTX": "hipErrorInvalidKernelFile",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "hipErrorInvalidKernelFile",
    "CUDA_ERROR_INVALID_HANDLE": "hipErrorInvalidHandle",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "hipErrorNoBinaryForGpu",
    "CUDA_ERROR_LAUNCH_FAILED": "hipErrorLaunchFailure",
}


def _camel(name: str, prefix: str) -> str:
    words = name.removeprefix("CUDA_ERROR_").lower().split("_")
    return prefix + "".join(w.capitalize() for w in words)


def runtime_name(cuda_name: str) -> str:
    """The CUDA runtime's name for a driver error name."""
    if cuda_name == "CUDA_SUCCESS":
        return "cudaSuccess"
    return _RUNTIME_OVERRIDES.get(cuda_name) or _camel(cuda_name, "cudaError")


def hip_name(cuda_name: str) -> str:
    """HIP's name for a driver error name."""
    if cuda_name == "CUDA_SUCCESS":
        return "hipSuccess"
    return _HIP_OVERRIDES.get(cuda_name) or _camel(cuda_name, "hipError")


class DriverError(KjitError):
    """A CUDA driver (or HIP runtime) call failed."""

    def __init__(self, code: int, cuda_name: str, *, call: str = "", description: str = "",
                 hint: str = ""):
        self.code = int(code)
        self.cuda_name = cuda_name
        self.runtime_name = runtime_name(cuda_name)
        self.hip_name = hip_name(cuda_name)
        self.call = call
        self.description = description
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"{self.call} failed: " if self.call else ""
        text = (f"{head}{self.cuda_name} ({self.code}; runtime: {self.runtime_name}, "
                f"HIP: {self.hip_name})")
        if self.description:
            text += f": {self.description}"
        if self.hint:
            text += f"\n{self.hint}"
        return text


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


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())
