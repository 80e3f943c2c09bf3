"""HIP errors under their CUDA twins' names, and the error for "no HIP runtime or no AMD GPU"."""
from __future__ import annotations

import re
from typing import Mapping

from ...errors import CudaUnavailableError


class HipUnavailableError(CudaUnavailableError):
    """No HIP runtime or no AMD GPU: HIP compiles and bundles still work.

    A CudaUnavailableError, so code that handles "no GPU here" handles both backends.
    """



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

