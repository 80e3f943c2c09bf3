"""The GPU side: contexts, modules, kernels, parameters, memory and streams.

The rest of kjit imports only from here (tests/test_faces.py); each name loads its module on
first use, so a compile that is never launched imports none of the runtime.
"""
from __future__ import annotations

from ..lazy import lazy_names

__getattr__ = lazy_names(__name__, {
    # loading and launching
    "load": "module", "Module": "module", "Kernel": "kernel", "LaunchConfig": "kernel",
    "cdiv": "kernel",
    # contexts, streams, memory
    "Device": "context", "Context": "context", "synchronize": "context",
    "Stream": "stream", "Event": "stream", "stream_handle": "stream:as_handle",
    "DeviceArray": "memory", "to_device": "memory", "empty": "memory", "zeros": "memory",
    "In": "memory", "Out": "memory", "InOut": "memory", "HostTransfer": "memory:_HostTransfer",
    "array_interface": "memory", "array_layout": "pointers",
    # arguments: what the HIP runtime shares with CUDA's
    "ptr": "params", "Packer": "params", "resolve_slots": "signature", "DTYPE_NAMES": "dtypes:NAMES",
    "demangle": "mangled", "function_name": "mangled",
    # libcuda's own entry points, for C callers that skip Python
    "libcuda_function": "libcuda:c_function", "current_context_fn": "libcuda",
    # the frameworks
    "as_torch_op": "torch_op", "as_jax_op": "jax_op",
    "torch_launch_entry": "torch_compile:launch_entry",
    "torch_visible_subscript": "torch_compile:visible_subscript",
})
