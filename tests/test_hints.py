"""Errors that name the real cause of a failed compile, and a warning for a compile that
produced no kernel. (CPU: NVRTC needs no GPU.)"""
from __future__ import annotations

import warnings

import pytest

import kjit
from kjit.errors import CompileError, CompileWarning

KERNEL = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'


def failure(src: str) -> str:
    with pytest.raises(CompileError) as info:
        kjit.compile(src, arch="sm_90", cache=False)
    return info.value.message


@pytest.mark.parametrize("header, says", [
    ("cublas_v2.h", "cuBLAS"), ("cublasLt.h", "cuBLAS"), ("cuda_profiler_api.h", "profiler"),
    ("omp.h", "OpenMP"), ("cufft.h", "cuFFT"), ("nccl.h", "NCCL"),
])
def test_host_library_headers_say_a_host_library_is_called_from_the_host(header, says):
    msg = failure(f"#include <{header}>\n" + KERNEL)
    assert says in msg and "called from the host" in msg and "versions" not in msg


@pytest.mark.parametrize("header", ["torch/extension.h", "ATen/ATen.h", "c10/cuda/CUDAStream.h"])
def test_pytorch_headers_point_at_the_pytorch_route(header):
    msg = failure(f"#include <{header}>\n" + KERNEL)
    assert "as_torch_op" in msg and "docs/pytorch.md" in msg


@pytest.mark.parametrize("header", ["complex", "functional", "numeric", "bit", "span", "optional"])
def test_standard_headers_kjit_lacks_point_at_cccl(header):
    msg = failure(f"#include <{header}>\n" + KERNEL)
    assert f"<cuda/std/{header}>" in msg


def test_cuda_h_is_a_host_api_not_a_version_mismatch():
    msg = failure("#include <cuda.h>\n" + KERNEL)
    assert "driver API" in msg and "host-only" in msg
    assert "versions may not match" not in msg and "install matching wheels" not in msg


def test_ccccl_error_directive_is_not_blamed_on_versions():
    msg = failure("#include <cub/cub.cuh>\n" + KERNEL)
    assert "not supported when compiling with NVRTC" in msg      # CCCL's own words, in the log
    assert "versions may not match" not in msg


def test_an_unresolved_extern_suggests_relocatable_code_and_a_link():
    msg = failure('extern __device__ float helper(float);\n'
                  'extern "C" __global__ void k(float* x) { x[0] = helper(x[0]); }\n')
    assert "_Z6helperf" in msg and "relocatable=True" in msg and "kjit.link" in msg


def test_the_extern_compiles_with_relocatable_code():
    src = ('extern __device__ float helper(float);\n'
           'extern "C" __global__ void k(float* x) { x[0] = helper(x[0]); }\n')
    obj = kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(relocatable=True), cache=False)
    assert obj.code


TEMPLATE = "template <typename T>\n__global__ void scale(T* x, T a) { x[threadIdx.x] *= a; }\n"


@pytest.mark.parametrize("target", ["cubin", "ptx"])
def test_a_template_with_no_name_expressions_warns_and_names_them(target):
    with pytest.warns(CompileWarning, match="name_expressions"):
        obj = kjit.compile(TEMPLATE, arch="sm_90", target=target, cache=False)
    assert obj.entry_points == ()


def test_no_warning_when_instantiated():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        obj = kjit.compile(TEMPLATE, arch="sm_90", name_expressions=["scale<float>"], cache=False)
        assert obj.lowered_name("scale<float>") in obj.entry_points
        kjit.compile(TEMPLATE + "template __global__ void scale<int>(int*, int);\n",
                     arch="sm_90", cache=False)


def test_a_host_library_header_found_on_the_path_gets_the_same_hint(tmp_path):
    """PyTorch's cu13 wheels put cublas_v2.h beside cuda_fp16.h: NVRTC opens it and fails
    inside it."""
    (tmp_path / "cublas_v2.h").write_text("cublasStatus_t cublasCreate(void** handle);\n")
    with pytest.raises(CompileError) as info:
        kjit.compile("#include <cublas_v2.h>\n" + KERNEL, arch="sm_90", cache=False,
                     options=kjit.CompileOptions(include_dirs=[tmp_path]))
    assert "cuBLAS" in info.value.message and "called from the host" in info.value.message


def test_a_time_trace_named_json_compiles_or_says_to_drop_the_suffix(tmp_path):
    """NVRTC 13 writes a trace named t.json to t.json.json and compiles; NVRTC 12 writes
    t.json, then its ptxas looks for t.json.json and the compile fails: kjit says what to
    name it instead. A name without .json gives t.json on both."""
    from kjit.compiler import nvrtc
    named = kjit.CompileOptions(extra=[f"--fdevice-time-trace={tmp_path / 'a.json'}"])
    if nvrtc.version()[0] >= 13:
        assert kjit.compile(KERNEL, arch="sm_90", cache=False, options=named).entry_points
    else:
        with pytest.raises(CompileError) as info:
            kjit.compile(KERNEL, arch="sm_90", cache=False, options=named)
        assert "name without .json" in info.value.message
    bare = kjit.CompileOptions(extra=[f"--fdevice-time-trace={tmp_path / 'b'}"])
    assert kjit.compile(KERNEL, arch="sm_90", cache=False, options=bare).entry_points
    assert (tmp_path / "b.json").is_file()
