"""What a failed or empty NVRTC compile most likely means, in words that name the cause and
what to do: host-library and missing standard headers, host-only toolkit headers, an extern
function with no definition, a template kernel that nothing instantiated.
(Only a failed compile, or one that produced no kernel, asks: nothing is prepared at import.)"""
from __future__ import annotations

import os
import re

from . import stdheaders

# Headers of libraries called from the host: they declare host functions NVRTC cannot compile.
HOST_LIBRARIES = {
    "cuBLAS": ("cublas_v2.h", "cublas.h", "cublas_api.h", "cublasLt.h", "cublasXt.h"),
    "cuFFT": ("cufft.h", "cufftXt.h"), "cuRAND's host API": ("curand.h",),
    "cuSPARSE": ("cusparse.h", "cusparse_v2.h"), "cuSOLVER": ("cusolverDn.h", "cusolverSp.h"),
    "cuDNN": ("cudnn.h",), "NCCL": ("nccl.h",), "NVTX": ("nvToolsExt.h", "nvtx3/nvToolsExt.h"),
    "the CUDA profiler API": ("cuda_profiler_api.h", "cudaProfiler.h"),
    "OpenMP": ("omp.h",), "MPI": ("mpi.h",), "Thrust's host algorithms": ("thrust/host_vector.h",),
}
_HOST_LIBRARY = {h: lib for lib, names in HOST_LIBRARIES.items() for h in names}
# PyTorch's and pybind11's C++ extension headers: host code for a C++ compiler
_FRAMEWORK_PREFIXES = ("torch/", "ATen/", "c10/", "pybind11/", "caffe2/")
# Toolkit headers that are host APIs: found in the runtime headers' directory, but nothing in
# them compiles as device code.
HOST_TOOLKIT = {"cuda.h": "the CUDA driver API", "cudaGL.h": "CUDA-OpenGL interop",
                "cudaEGL.h": "CUDA-EGL interop", "cuda_gl_interop.h": "CUDA-OpenGL interop",
                "cudaVDPAU.h": "CUDA-VDPAU interop", "cuda_egl_interop.h": "CUDA-EGL interop",
                "cudaTypedefs.h": "the CUDA driver API's typedefs"}
_NOT_FOUND = re.compile(stdheaders._NOT_FOUND, re.M)
_ERROR_IN = re.compile(r"^(?P<file>[^\n(]+?)\((?P<line>\d+)\):\s*(?:error|catastrophic error)", re.M)
_ERROR_DIRECTIVE = re.compile(r'^(?P<file>[^\n(]+?)\((?P<line>\d+)\):\s*(?:catastrophic )?error: '
                              r'#error directive: "?(?P<text>[^\n"]*)', re.M)
_UNRESOLVED = re.compile(r"Unresolved extern (?:function|variable) '(?P<name>[^']+)'")
# NVRTC 12 writes a --fdevice-time-trace named x.json as given, then its ptxas looks for
# x.json.json (NVRTC 13 writes x.json.json): a name without .json works on both
_TRACE_JSON = re.compile(r"ptxas fatal\s*: File '(?P<name>[^'\n]*\.json)\.json' could not be opened")


def explain(log: str, std_headers: bool) -> str | None:
    """One sentence or two on why this log's compile failed, when kjit can tell; else None."""
    m = _NOT_FOUND.search(log)
    if m is not None:
        hint = _missing(m.group("name"), f"{m.group('file')}, line {m.group('line')}")
        if hint:
            return hint
    m = _ERROR_DIRECTIVE.search(log)
    if m is not None:
        return (f"{os.path.basename(m.group('file').strip())} (line {m.group('line')}) stopped the "
                f"compile with its own #error: {m.group('text').strip()}")
    host = host_toolkit_header(log)
    if host and host[0] in _HOST_LIBRARY:  # found (some wheels ship them), but host code
        return _missing(host[0], "included")
    if host:
        name, what = host
        return (f"<{name}> is {what}, a host-only header: device code cannot call it. Remove the "
                "#include (kernels need no driver API; pass pointers as T* and sizes as integers), "
                "or keep it out of device compiles with #ifndef __CUDACC_RTC__ ... #endif.")
    m = _TRACE_JSON.search(log)
    if m is not None:
        return (f"this NVRTC wrote the time trace to {m.group('name')} and then looked for it "
                f"at {m.group('name')}.json (NVRTC 12 adds .json only where ptxas reads it): "
                "give --fdevice-time-trace a name without .json, which NVRTC adds itself.")
    m = _UNRESOLVED.search(log)
    if m is not None:
        return (f"{m.group('name')} is declared but defined nowhere in this source. Define it here, "
                "or compile every piece with relocatable code (CompileOptions(relocatable=True), "
                "-rdc) and link them with kjit.link([a, b], arch=...).")
    return stdheaders.explain_missing(log, std_headers)


def _missing(name: str, where: str) -> str | None:
    lib = _HOST_LIBRARY.get(name)
    if lib is not None:
        return (f"<{name}> ({where}) is {lib}'s header, a library called from the host: a kernel "
                "cannot call it. Call it from Python (PyTorch, CuPy, nvmath-python) around your "
                "kernel's launches, and remove the #include.")
    if name.startswith(_FRAMEWORK_PREFIXES):
        return (f"<{name}> ({where}) belongs to PyTorch's C++ extension API, host code for a C++ "
                "compiler. With kjit, write the kernel alone and pass torch tensors to it; "
                "kernel.as_torch_op(...) makes it a PyTorch operator (docs/pytorch.md).")
    if (os.path.exists(os.path.join(_cccl_std(), name))
            and name not in stdheaders.provided() and name not in stdheaders.HOST_ONLY):
        return (f"<{name}> ({where}) is not in kjit's device-side standard headers; CCCL has a "
                f"device version: #include <cuda/std/{name}> and use cuda::std:: names.")
    return None


def _cccl_std() -> str:
    cccl = stdheaders.cccl_dir()
    return os.path.join(cccl, "cuda", "std") if cccl else "/nonexistent"


def host_toolkit_header(log: str) -> tuple[str, str] | None:
    """(name, what it is) when the first error sits in a host-only toolkit header."""
    for m in _ERROR_IN.finditer(log):
        base = os.path.basename(m.group("file").strip())
        if base in HOST_TOOLKIT:
            return base, HOST_TOOLKIT[base]
        if base in _HOST_LIBRARY:
            return base, _HOST_LIBRARY[base]
    return None


def is_error_directive(log: str) -> bool:
    """True when the compile stopped at a header's own #error: its author says why."""
    return "#error directive" in log


def uninstantiated_templates(source: str, name_expressions, has_kernels: bool) -> str | None:
    """A warning's text when the source declares template kernels, none was instantiated and
    no kernel came out; else None."""
    if has_kernels or name_expressions or "template" not in source or "__global__" not in source:
        return None
    if not re.search(r"template\s*<[^;{]*>\s*(?:__\w+__\s+|static\s+|inline\s+)*__global__", source):
        return None
    return ("the source compiled to no kernel: its __global__ templates are instantiated only "
            "by name. Pass name_expressions=['kernel<float>', ...] to kjit.compile (or "
            "@kjit.kernel(name='kernel<float>')) and look the kernel up by that expression.")
