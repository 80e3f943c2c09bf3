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

from .calls import (  # noqa: F401  (the names tests and users reach through kjit.hip.runtime)
    available, call, device_count, error_name, init, make_error, synchronize, _reset_for_tests, _library)
from .hip_errors import _NO_DRIVER_TWIN, HipUnavailableError, cuda_twin  # noqa: F401
from .launch import (  # noqa: F401
    HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END,
    MAX_BLOCK_THREADS, MAX_GRID_WORKITEMS, HipParams, LaunchConfig, stream_handle)
from .memory import HipBuffer
from .module import HipFunction, HipModule
from .streams import HipStream

__all__ = ["available", "call", "device_count", "error_name", "init", "make_error", "synchronize",
           "HipUnavailableError", "cuda_twin", "HipParams", "LaunchConfig", "stream_handle",
           "HipBuffer", "HipStream", "HipFunction", "HipModule"]
