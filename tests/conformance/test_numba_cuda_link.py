"""Conformance with numba-cuda's tests that link CUDA C sources (`@cuda.jit(link=[...])`).

Upstream: NVIDIA/numba-cuda, commit b18b944b2f88a4e840424e49a1b0d29488263b40:
- numba_cuda/numba/cuda/tests/cudadrv/test_linker.py: TestLinker.test_linking_cu,
  test_linking_lazy_compile / test_linking_eager_compile (jitlink.ptx),
  test_linking_cu_log_warning, test_linking_cu_error, test_linking_unknown_filetype_error,
  test_linking_file_with_no_extension_error, test_linking_cu_cuda_include,
  test_try_to_link_nonexistent, test_set_registers_57 / _38, test_get_shared_mem_per_block,
  test_get_const_mem_size, test_get_local_mem_per_thread, test_get_max_threads_per_block,
  test_max_threads_exceeded, test_link_for_different_cc;
- cudadrv/test_nvjitlink.py: test_nvjitlink_add_file_guess_ext_linkable_code,
  test_nvjitlink_jit_with_linkable_code (each kind of linkable file, with and without LTO),
  test_nvjitlink_test_add_file_guess_ext_invalid_input;
- cudadrv/test_linkable_code.py: test_linkable_code_from_path_or_obj;
- tests/data/jitlink.cu, warn.cu, error.cu, cuda_include.cu.

numba-cuda compiles the Python kernel and links the user's CUDA C into it; with kjit both
sides are CUDA C: a kernel declaring the device function `extern "C"`, compiled relocatable
and linked with the user's file. The .cu files in tests/conformance/data are kjit's own.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kjit
from kjit.errors import CompileError, InvalidOptionError, KjitError

ARCH = "sm_90"
DATA = Path(__file__).parent / "data"
gpu = pytest.mark.gpu
RDC = kjit.CompileOptions(relocatable=True)

# the kernel a numba-cuda user writes in Python, here in CUDA C
CALLS_DOUBLED = r'''
extern "C" __device__ int doubled_into(int *out, int a);
extern "C" __global__ void apply_doubled(int *r, const int *x, int n)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) doubled_into(&r[i], x[i]);
}
'''
CALLS_ADD = r'''
extern "C" __device__ unsigned int add_unsigned(unsigned int a, unsigned int b);
extern "C" __global__ void add_one_two(unsigned int *result) { result[0] = add_unsigned(1, 2); }
'''
REGISTER_HUNGRY = r'''
extern "C" __global__ void busy(double *x, int a, double b, double c, double d)
{
  double s[12];
  for (int k = 0; k < 12; ++k) s[k] = 1.0 + k;
  for (int i = 0; i < a; ++i)
    for (int k = 0; k < 12; ++k) s[k] = s[k] * b + c / (d + s[(k + 5) % 12]);
  double t = 0;
  for (int k = 0; k < 12; ++k) t += s[k];
  x[blockIdx.x * blockDim.x + threadIdx.x] = t;
}
'''
RESOURCES = r'''
__constant__ double table[10];
extern "C" __global__ void uses_memory(float *out, const float *in)
{
  __shared__ float stage[100];
  float local[250];
  int i = threadIdx.x;
  stage[i] = in[i] + table[i % 10];
  for (int k = 0; k < 250; ++k) local[k] = in[(i + k) % blockDim.x];
  __syncthreads();
  out[i] = stage[blockDim.x - 1 - i] + local[(i * 7) % 250];
}
'''


def _device_source(name: str, **kwargs) -> kjit.ObjectCode:
    """Compile a data/ file as link= does: relocatable, named by its file."""
    path = DATA / name
    return kjit.compile(path.read_text(), name=path.name, options=RDC, **kwargs)


def _fatbin(cubin: kjit.ObjectCode) -> bytes:
    from cuda.bindings import nvfatbin
    handle = nvfatbin.create([], 0)
    nvfatbin.add_cubin(handle, cubin.code, len(cubin.code), cubin.arch[3:], "add_unsigned")
    out = bytearray(nvfatbin.size(handle))
    nvfatbin.get(handle, out)
    nvfatbin.destroy(handle)
    return bytes(out)


def _linkable(kind: str, arch: str):
    """add_unsigned.cu as each kind of file numba-cuda's link= accepts."""
    if kind == "ptx":
        return _device_source("add_unsigned.cu", arch="compute_" + arch[3:], target="ptx")
    if kind == "ltoir":
        return _device_source("add_unsigned.cu", arch=arch, target="ltoir")
    cubin = _device_source("add_unsigned.cu", arch=arch)
    return cubin if kind == "object" else _fatbin(cubin)


# --- CPU ----------------------------------------------------------------------------------

def test_cu_source_links_with_the_kernel_calling_it():
    """test_linking_cu: the user's .cu compiled relocatable and linked with the caller."""
    res = kjit.link([kjit.compile(CALLS_DOUBLED, arch=ARCH, options=RDC),
                     _device_source("doubling.cu", arch=ARCH)], arch=ARCH)
    assert "apply_doubled" in res.object.entry_points


def test_ptx_file_links_by_path(tmp_path):
    """test_linking_lazy_compile / _eager_compile: link=[".../jitlink.ptx"]."""
    path = _device_source("doubling.cu", arch="compute_90", target="ptx").save(tmp_path / "doubling.ptx")
    res = kjit.link([kjit.compile(CALLS_DOUBLED, arch="compute_90", target="ptx", options=RDC), path],
                    arch=ARCH)
    assert "apply_doubled" in res.object.entry_points


def test_warning_in_the_linked_source_reaches_the_log():
    """test_linking_cu_log_warning: NVRTC's warning about the unused variable."""
    obj = _device_source("unused_local.cu", arch=ARCH, cache=False)
    assert "never_read" in obj.log and "declared but never referenced" in obj.log


def test_error_in_the_linked_source_names_the_file_and_the_error():
    """test_linking_cu_error: NVRTC_ERROR_COMPILATION, the error, and "error.cu"."""
    with pytest.raises(CompileError) as err:
        _device_source("syntax_error.cu", arch=ARCH)
    text = str(err.value)
    assert "NVRTC_ERROR_COMPILATION" in text
    assert 'identifier "THIS" is undefined' in text
    assert "syntax_error.cu" in text


def test_source_including_toolkit_headers_compiles():
    """test_linking_cu_cuda_include: <cuda_device_runtime_api.h> is found."""
    assert _device_source("runtime_include.cu", arch=ARCH).kind == "object"


def test_files_that_are_not_linkable_are_refused_naming_them(tmp_path):
    """test_linking_unknown_filetype_error / _file_with_no_extension_error /
    test_try_to_link_nonexistent: a header, a file whose bytes are no code, a missing one."""
    header = tmp_path / "header.cuh"
    header.write_text("template <typename T> __device__ T twice(T x) { return 2 * x; }\n")
    plain = tmp_path / "data"
    plain.write_text("just some words\n")
    for path in (header, plain, tmp_path / "nonexistent.a"):
        with pytest.raises(InvalidOptionError, match=path.name):
            kjit.link([kjit.compile(CALLS_ADD, arch=ARCH, options=RDC), path], arch=ARCH)


@pytest.mark.parametrize("kind", ["ptx", "object", "fatbin", "ltoir"])
@pytest.mark.parametrize("lto", [False, True])
def test_each_kind_of_linkable_code(kind, lto):
    """test_nvjitlink_add_file_guess_ext_linkable_code / _jit_with_linkable_code: each kind,
    told apart by its bytes (numba-cuda guesses from the extension), with and without LTO."""
    caller = kjit.compile(CALLS_ADD, arch=ARCH, options=RDC, target="ltoir" if lto else "cubin")
    res = kjit.link([caller, _linkable(kind, ARCH)], arch=ARCH, lto=lto)
    assert res.object.kind == "cubin" and "add_one_two" in res.object.entry_points


def test_linkable_code_kinds_are_sniffed_from_bytes():
    """test_linkable_code_from_path_or_obj: each kind recognised; bytes of a fatbin are a
    fatbin (numba-cuda refuses raw bytes: kjit reads their kind from them)."""
    for kind in ("ptx", "object", "fatbin", "ltoir"):
        code = _linkable(kind, ARCH)
        raw = code if isinstance(code, bytes) else code.code
        assert kjit.ObjectCode(raw).kind == kind


def test_link_for_another_compute_capability():
    """test_link_for_different_cc: the link targets the arch asked for, not the machine's."""
    for arch in ("sm_75", "sm_90"):
        res = kjit.link([kjit.compile(CALLS_ADD, arch="compute_75", target="ptx", options=RDC),
                         _linkable("ptx", "sm_75")], arch=arch)
        assert res.arch == arch and res.object.arch == arch


def test_linked_result_has_a_kind():
    """link= results are code objects; kjit.link(...).kind says which."""
    res = kjit.link([kjit.compile(CALLS_ADD, arch=ARCH, options=RDC), _linkable("ptx", ARCH)], arch=ARCH)
    assert res.kind == "cubin"


# --- GPU ----------------------------------------------------------------------------------

def _device_arch() -> str:
    return kjit.Device(0).arch


@gpu
def test_linked_cu_device_function_runs():
    """test_linking_cu: r[i] = bar(x[i]) gives x * 2; the kernel's `int n` is a Python int,
    typed from the declaration kept through the link."""
    arch = _device_arch()
    k = kjit.load(kjit.link([kjit.compile(CALLS_DOUBLED, arch=arch, options=RDC),
                             _device_source("doubling.cu", arch=arch)])).get_function("apply_doubled")
    x = np.arange(10, dtype=np.int32)
    r = kjit.zeros(10, np.int32)
    k[1, 32](r, kjit.to_device(x), 10)
    np.testing.assert_array_equal(r.get(), x * 2)


@gpu
@pytest.mark.parametrize("kind", ["ptx", "object", "fatbin", "ltoir"])
@pytest.mark.parametrize("lto", [False, True])
def test_each_kind_of_linkable_code_runs(kind, lto):
    """test_nvjitlink_jit_with_linkable_code: result[0] = add_from_numba(1, 2) == 3."""
    arch = _device_arch()
    caller = kjit.compile(CALLS_ADD, arch=arch, options=RDC, target="ltoir" if lto else "cubin")
    result = kjit.zeros(1, np.uint32)
    kjit.load(kjit.link([caller, _linkable(kind, arch)], lto=lto)).get_function("add_one_two")[1, 1](result)
    assert result.get()[0] == 3


@gpu
@pytest.mark.parametrize("limit", [57, 38])
def test_register_limit(limit):
    """test_set_registers_57 / _38 (and eager): max_registers caps registers per thread."""
    free = kjit.load(kjit.compile(REGISTER_HUNGRY)).get_function("busy")
    capped = kjit.load(kjit.compile(REGISTER_HUNGRY, options=kjit.CompileOptions(max_registers=limit)))
    assert capped.get_function("busy").attributes.num_regs <= limit
    assert free.attributes.num_regs > 0


@gpu
def test_memory_attributes():
    """test_get_shared_mem_per_block / test_get_const_mem_size / test_get_local_mem_per_thread
    / test_get_max_threads_per_block."""
    k = kjit.load(kjit.compile(RESOURCES)).get_function("uses_memory")
    attrs = k.attributes
    assert attrs.shared_size_bytes == 400
    assert attrs.const_size_bytes >= 80
    assert attrs.local_size_bytes >= 1000
    assert attrs.max_threads_per_block > 0


@gpu
def test_max_threads_exceeded_is_refused():
    """test_max_threads_exceeded: a block larger than the kernel allows fails with an error
    naming the launch, not silently."""
    k = kjit.load(kjit.compile(RESOURCES)).get_function("uses_memory")
    too_many = k.attributes.max_threads_per_block + 1
    data = kjit.zeros(too_many, np.float32)
    with pytest.raises(KjitError):
        k[1, too_many](data, data)
        kjit.synchronize()
