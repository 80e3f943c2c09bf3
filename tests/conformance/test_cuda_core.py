"""Conformance with cuda.core's NVRTC program, linker and launch tests.

Upstream: NVIDIA/cuda-python,
- cuda_core/tests/test_program.py at commit 00babc90b690cc2c2788260642a72319290529d3:
  test_cpp_program_with_various_options, test_ptx_program_with_various_options,
  test_program_init_invalid_code_type, test_program_init_invalid_code_format,
  test_program_compile_valid_target_type, test_program_compile_invalid_target_type;
- cuda_core/tests/test_linker.py at commit 00ca3300bfbb7fff955a384dd4d396cfddd08158:
  test_linker_init, test_linker_init_invalid_arch, test_linker_link_cubin,
  test_linker_link_ptx_multiple, test_linker_link_invalid_target_type,
  test_linker_get_error_log, test_linker_get_info_log, test_linker_logs_cached_after_link,
  TestLinkerDispatch (LTO-IR needs nvJitLink);
- cuda_core/tests/test_launcher.py at commit 00452faf966f84e13c40d7da41553e37a98b6eae:
  test_launch_invalid_values, test_launch_config_invalid_values, test_launch_scalar_argument,
  test_cooperative_launch, test_launch_with_buffers_allocated_by_memory_resource,
  test_launch_config_cluster_grid_conversion.

Cases with no kjit counterpart (NVVM IR programs, Program/Linker handles, as_bytes, the
launch-config internals, ctypes scalars) are listed in tests/conformance/README.md. The
kernels here are kjit's own.
"""
from __future__ import annotations

import numpy as np
import pytest

import kjit
from kjit.errors import ArgumentError, InvalidOptionError, LinkError
from cupy_family import import_cupy

ARCH = "sm_90"
gpu = pytest.mark.gpu
rng = np.random.default_rng()
RDC = kjit.CompileOptions(relocatable=True)

EMPTY = 'extern "C" __global__ void do_nothing() {}'

# a kernel with C++ linkage calling two device functions defined in other programs
CALLER = r'''
extern __device__ int zero_source();
extern __device__ int combine(int a, int b);
__global__ void caller(int* out) { *out = combine(zero_source(), 41); }
'''
ZERO = "__device__ int zero_source() { return 1; }"
COMBINE = "__device__ int combine(int a, int b) { return a + b; }"
CALLER_MISSING = r'''
extern __device__ int not_defined_anywhere();
extern __device__ int combine(int a, int b);
__global__ void caller(int* out) { *out = combine(not_defined_anywhere(), 41); }
'''

WRITE_SCALAR = r'''
#include <cuda_fp16.h>
#include <cuda/std/complex>

template <typename T>
__global__ void write_scalar(T* out, T value) { out[0] = value; }
'''

TRIPLE = r'''
extern "C"
__global__ void triple(float* data, size_t count) {
    const size_t i = threadIdx.x + blockIdx.x * (size_t)blockDim.x;
    if (i < count) data[i] = data[i] * 3.0f;
}
'''

GRID_WIDE = r'''
#include <cooperative_groups.h>
extern "C" __global__ void grid_wide(int* hits) {
    namespace cg = cooperative_groups;
    cg::grid_group grid = cg::this_grid();
    atomicAdd(hits, 1);
    grid.sync();
    if (grid.thread_rank() == 0) hits[1] = hits[0];
}
'''

STAMP = r'''
extern "C" __global__ void stamp(float* out) { out[blockIdx.x] = 2.5f; }
'''


# --- CPU: programs ------------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    kjit.CompileOptions(),
    kjit.CompileOptions(debug=True),
    kjit.CompileOptions(relocatable=True, max_registers=32),
    kjit.CompileOptions(fast_math=True),
    kjit.CompileOptions(line_info=True),
    kjit.CompileOptions(defines=["MY_MACRO"]),
    kjit.CompileOptions(defines={"MY_MACRO": "99"}),
    kjit.CompileOptions(defines={"MY_MACRO": "99", "MY_OTHER_MACRO": "100"}),
    kjit.CompileOptions(std="c++17"),
    kjit.CompileOptions(extra=["--restrict", "--device-int128"]),
    kjit.CompileOptions(extra=["-ftz=true", "-prec-sqrt=false", "-prec-div=false"]),
    kjit.CompileOptions(extra=["--extra-device-vectorization"]),
    kjit.CompileOptions(extra=["--diag-suppress=1234", "--diag-error=1223"]),
], ids=lambda o: repr(o))
def test_cpp_program_with_various_options(options):
    """test_cpp_program_with_various_options: each option set compiles to PTX."""
    obj = kjit.compile(EMPTY, arch="compute_90", target="ptx", options=options)
    assert obj.kind == "ptx" and obj.entry_points == ("do_nothing",)


def test_program_compiles_to_each_target_and_keeps_its_name():
    """test_program_compile_valid_target_type: ptx, then PTX into a cubin; the name given
    is the object's name."""
    ptx = kjit.compile(EMPTY, arch="compute_90", target="ptx", name="42")
    assert ptx.kind == "ptx" and ptx.name == "42" and "do_nothing" in ptx.entry_points
    cubin = kjit.link([ptx], arch=ARCH)
    assert cubin.object.kind == "cubin" and "do_nothing" in cubin.object.entry_points
    ltoir = kjit.compile(EMPTY, arch=ARCH, target="ltoir")
    assert ltoir.kind == "ltoir"


@pytest.mark.parametrize("options", [
    kjit.LinkOptions(max_registers=32), kjit.LinkOptions(debug=True),
    kjit.LinkOptions(line_info=True), kjit.LinkOptions(optimization_level=3),
    kjit.LinkOptions(verbose=True)], ids=repr)
def test_ptx_program_with_various_options(options):
    """test_ptx_program_with_various_options: PTX to cubin under each linker option."""
    ptx = kjit.compile(EMPTY, arch="compute_90", target="ptx")
    res = kjit.link([ptx], arch=ARCH, options=options)
    assert res.object.kind == "cubin"


def test_bad_program_inputs_are_refused_before_compiling():
    """test_program_init_invalid_code_type / _code_format / test_program_compile_invalid_target_type."""
    with pytest.raises(InvalidOptionError, match="string"):
        kjit.compile(12345, arch=ARCH)
    with pytest.raises(InvalidOptionError, match="fortran"):
        kjit.compile("goto 100", arch=ARCH, backend="fortran")
    with pytest.raises(InvalidOptionError, match="invalid_target"):
        kjit.compile(EMPTY, arch=ARCH, target="invalid_target")


# --- CPU: the linker ----------------------------------------------------------------------

def _relocatable(kind: str):
    target, arch = ("ptx", "compute_90") if kind == "ptx" else ("ltoir", ARCH)
    return [kjit.compile(src, arch=arch, target=target, options=RDC, name=name)
            for src, name in ((CALLER, "caller.cu"), (ZERO, "zero.cu"), (COMBINE, "combine.cu"))]


@pytest.mark.parametrize("options", [
    None, kjit.LinkOptions(verbose=True), kjit.LinkOptions(max_registers=32),
    kjit.LinkOptions(optimization_level=3), kjit.LinkOptions(debug=True),
    kjit.LinkOptions(line_info=True)], ids=repr)
def test_linker_links_three_relocatable_ptx_programs(options):
    """test_linker_init / test_linker_link_cubin: three -rdc PTX programs into a cubin."""
    res = kjit.link(_relocatable("ptx"), arch=ARCH, options=options)
    assert res.object.kind == "cubin"
    assert "_Z6callerPi" in res.object.entry_points
    assert res.backend in ("driver", "nvjitlink")
    assert isinstance(res.info_log, str) and isinstance(res.error_log, str)


def test_linked_result_says_its_kind():
    """cuda.core's linker returns an ObjectCode; kjit.link returns a LinkResult, which
    answers what an ObjectCode answers (kind, code, arch)."""
    res = kjit.link(_relocatable("ptx"), arch=ARCH)
    assert res.kind == "cubin"
    assert res.code == res.object.code and res.arch == ARCH


def test_linker_links_ptx_given_as_bytes():
    """test_linker_link_ptx_multiple: ObjectCode.from_ptx(obj.code): the PTX bytes alone."""
    res = kjit.link([obj.code for obj in _relocatable("ptx")], arch=ARCH)
    assert "_Z6callerPi" in res.object.entry_points


def test_lto_ir_links_with_nvjitlink():
    """TestLinkerDispatch: LTO-IR needs nvJitLink, chosen by itself and said why."""
    res = kjit.link(_relocatable("ltoir"), arch=ARCH)
    assert res.backend == "nvjitlink" and "LTO" in res.reason
    assert res.object.kind == "cubin" and "_Z6callerPi" in res.object.entry_points


def test_linker_init_invalid_arch():
    """test_linker_init_invalid_arch: arch '99' is refused before linking."""
    with pytest.raises(InvalidOptionError, match="99"):
        kjit.link(_relocatable("ptx"), arch="99")


def test_undefined_reference_names_the_symbol_and_the_input():
    """test_linker_get_error_log: Undefined reference to '_Z...' in the input named 'CBA'."""
    missing = kjit.compile(CALLER_MISSING, arch="compute_90", target="ptx", options=RDC, name="CBA")
    with pytest.raises(LinkError) as err:
        kjit.link([missing, *_relocatable("ptx")[2:]], arch=ARCH, backend="nvjitlink")
    assert "_Z20not_defined_anywherev" in str(err.value)
    assert "not_defined_anywhere" in (err.value.symbol or "")
    assert err.value.error_log


def test_link_logs_are_kept_with_the_result():
    """test_linker_get_info_log / test_linker_logs_cached_after_link: the logs are the
    result's, the same on a cache hit."""
    first = kjit.link(_relocatable("ptx"), arch=ARCH, backend="nvjitlink", options=kjit.LinkOptions(verbose=True))
    again = kjit.link(_relocatable("ptx"), arch=ARCH, backend="nvjitlink", options=kjit.LinkOptions(verbose=True))
    assert again.cache_hit and again.info_log == first.info_log
    assert again.error_log == first.error_log


# --- GPU: launching -----------------------------------------------------------------------

SCALARS = [
    (True, "bool", np.bool_),
    (2.718, "double", np.float64),
    (np.bool_(True), "bool", np.bool_),
    (np.int8(-42), "signed char", np.int8),
    (np.int16(-1234), "short", np.int16),
    (np.int32(-123456), "int", np.int32),
    (np.int64(-123456789), "long long", np.int64),
    (np.uint8(42), "unsigned char", np.uint8),
    (np.uint16(1234), "unsigned short", np.uint16),
    (np.uint32(123456), "unsigned int", np.uint32),
    (np.uint64(123456789), "unsigned long long", np.uint64),
    (np.float32(3.14), "float", np.float32),
    (np.float64(2.718), "double", np.float64),
    (np.float16(0.78), "__half", np.float16),
    (np.complex64(1 + 2j), "cuda::std::complex<float>", np.complex64),
    (np.complex128(-3 - 4j), "cuda::std::complex<double>", np.complex128),
    (5 - 7j, "cuda::std::complex<double>", np.complex128),
]


@gpu
@pytest.mark.parametrize("value,ctype,dtype", SCALARS, ids=lambda v: repr(v))
def test_launch_scalar_argument(value, ctype, dtype):
    """test_launch_scalar_argument: write_scalar<T>(T*, T) for each scalar type, the value
    read back exactly; the complex types take Python and numpy complex scalars."""
    name = f"write_scalar<{ctype}>"
    k = kjit.load(kjit.compile(WRITE_SCALAR, name_expressions=[name],
                               options=kjit.CompileOptions(std="c++17"))).get_function(name)
    out = kjit.zeros(1, dtype)
    k[1, 1](out, value)
    assert out.get()[0] == dtype(value)


@gpu
def test_launch_invalid_values():
    """test_launch_invalid_values / test_launch_config_invalid_values: a zero grid or block
    and a wrong launch form are refused before launching."""
    k = kjit.load(kjit.compile(EMPTY)).get_function("do_nothing")
    for grid, block in ((0, 1), ((0, 1), 1), (1, 0), (1, (0, 1))):
        with pytest.raises(ArgumentError):
            k[grid, block]()
        with pytest.raises(ArgumentError):
            k.launch(grid, block, cooperative=True)
    k[1, 1]()
    kjit.synchronize()


@gpu
def test_cooperative_launch():
    """test_cooperative_launch: a grid too large to be resident is refused; one block runs."""
    k = kjit.load(kjit.compile(GRID_WIDE)).get_function("grid_wide")
    hits = kjit.zeros(2, np.int32)
    too_many = kjit.Device(0).attribute("max_grid_dim_x") // 128 + 1
    with pytest.raises(ArgumentError):
        k.launch(too_many, 128, hits, cooperative=True)
    k.launch(2, 64, hits, cooperative=True)
    np.testing.assert_array_equal(hits.get(), [128, 128])


@gpu
def test_size_t_count_from_numpy_uint64_and_python_int():
    """test_launch_with_buffers_allocated_by_memory_resource: (float*, size_t) with
    np.uint64(size); a Python int works the same."""
    n = 1024
    host = rng.random(n, dtype=np.float32)
    data = kjit.to_device(host)
    k = kjit.load(kjit.compile(TRIPLE)).get_function("triple")
    k[kjit.cdiv(n, 256), 256](data, np.uint64(n))
    k[kjit.cdiv(n, 256), 256](data, n)
    np.testing.assert_allclose(data.get(), host * 9, rtol=1e-6)


@gpu
def test_cupy_buffers_on_the_current_cupy_stream():
    """test_launch_with_buffers_allocated_by_memory_resource with CuPy arrays and a stream
    made current in CuPy."""
    cupy = import_cupy()
    n = 1024
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        data = cupy.random.random(n, dtype=cupy.float32)
        original = data.copy()
        kjit.load(kjit.compile(TRIPLE)).get_function("triple")[kjit.cdiv(n, 256), 256](data, n)
    stream.synchronize()
    assert cupy.allclose(data, original * 3)


@gpu
def test_thread_block_cluster_launch():
    """test_launch_config_cluster_grid_conversion: cluster=(2, 1, 1) on sm_90 and later; kjit's
    grid counts blocks (cuda.core's counts clusters)."""
    if int(kjit.Device(0).arch[3:5]) < 9:
        pytest.skip("thread-block clusters need sm_90")
    k = kjit.load(kjit.compile(STAMP)).get_function("stamp")
    out = kjit.zeros(8, np.float32)
    k.launch(8, 32, out, cluster=(2, 1, 1))
    np.testing.assert_array_equal(out.get(), np.full(8, 2.5, np.float32))
    with pytest.raises(ArgumentError):
        k.launch(7, 32, out, cluster=(2, 1, 1))   # not a multiple of the cluster


@gpu
def test_ptx_program_loads_and_its_cubin_too():
    """test_program_compile_valid_target_type: get_kernel from the PTX and from the cubin
    linked from it."""
    arch = kjit.Device(0).arch
    ptx = kjit.compile(STAMP, arch="compute_" + arch[3:], target="ptx")
    for code in (ptx, kjit.link([ptx])):
        out = kjit.zeros(2, np.float32)
        kjit.load(code).get_function("stamp")[2, 1](out)
        np.testing.assert_array_equal(out.get(), [2.5, 2.5])


@gpu
def test_lto_linked_kernel_runs():
    """test_linker / LTO: the three LTO-IR programs, linked with nvJitLink, run."""
    arch = kjit.Device(0).arch
    progs = [kjit.compile(src, arch=arch, target="ltoir", options=RDC)
             for src in (CALLER, ZERO, COMBINE)]
    out = kjit.zeros(1, np.int32)
    kjit.load(kjit.link(progs)).get_function("_Z6callerPi")[1, 1](out)
    assert out.get()[0] == 42


@gpu
def test_load_takes_a_cuda_core_object_code():
    """A cuda.core user hands kjit the ObjectCode cuda.core's Program made."""
    core = pytest.importorskip("cuda.core")
    arch = kjit.Device(0).arch
    program = core.Program(STAMP, "c++", core.ProgramOptions(arch=arch))
    obj = program.compile("cubin")
    out = kjit.zeros(3, np.float32)
    kjit.load(obj).get_function("stamp")[3, 1](out)
    np.testing.assert_array_equal(out.get(), [2.5, 2.5, 2.5])
