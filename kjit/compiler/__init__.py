"""Source to ObjectCode: NVRTC for CUDA, hiprtc for HIP.

The rest of kjit imports only from here (tests/test_faces.py). The names load on first use,
so that a caller needing one small part (the runtime reads the source's declarations) does
not import the whole compile path.
"""
from __future__ import annotations

from ..lazy import lazy_names

__getattr__ = lazy_names(__name__, {
    # compiling
    "compile": "cached", "compile_many": "many", "pool_size": "pool",
    "make_request": "request", "CompileRequest": "request", "CompileOptions": "options",
    # reading sources as compilers do
    "read_source": "source_text:read", "decode_source": "source_text:decode",
    "source_name": "include_path",
    # the declarations a source makes (what types a kernel's parameters)
    "KERNEL_RE": "declarations:KERNEL", "strip_comments": "declarations",
    "preprocess_declarations": "declarations:preprocess", "declared_aliases": "declarations:aliases",
    "declared_structs": "declarations:structs", "declared_kernels": "declarations:kernels",
    # what the installed compilers are and can do (kjit info, kjit build --arch)
    "supported_archs": "targets", "check_supported": "targets", "nvrtc_supported": "targets",
    "nvrtc_version": "nvrtc:version", "hiprtc_version": "hiprtc:version",
    "describe_observer": "keys.observe:describe", "describe_headers": "toolkit_headers:describe",
    "hip_builtin_headers": "hip_headers:builtin_headers",
})

__all__ = ["CompileOptions", "CompileRequest", "compile", "compile_many", "make_request"]
