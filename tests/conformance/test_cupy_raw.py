"""Conformance with CuPy's RawKernel / RawModule tests.

Upstream: cupy/cupy, commit 00f8572fe65269fa6c3e535c9fc71b1f42404de1,
tests/cupy_tests/core_tests/test_raw.py. Each kjit test below names the upstream tests whose
behaviour it checks: TestRaw.test_basic, test_kernel_attributes, test_module,
test_compiler_flag, test_invalid_compiler_flag, test_load_cubin, test_load_ptx,
test_module_load_failure, test_get_function_failure, test_dynamical_parallelism,
test_dynamical_parallelism_compile_failure, test_cuFloatComplex, test_cuDoubleComplex,
test_const_memory, test_template_specialization, test_template_failure, test_raw_pointer,
test_context_switch_RawKernel / RawModule1-6, test_compile_kernel, test_compile_module;
TestRawGridSync; TestRawPicklable; TestRawJitify.test_jitify1-5.

The kernels are written for kjit in the style CuPy's users write them: `extern "C"` blocks
around several kernels, parameter lists continued with a line splice (`\\`), macros that
choose the element type, cuComplex.h types by pointer and by value. Cases with no kjit
counterpart are listed in tests/conformance/README.md.

CPU tests compile, link, pickle and save; the `gpu` tests launch and compare with numpy.
"""
from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kjit
from kjit.errors import ArgumentError, CompileError, KernelNotFoundError, KjitError
from cupy_family import import_cupy

ARCH = "sm_90"          # CPU tests compile for a fixed target; GPU tests for the device
gpu = pytest.mark.gpu
rng = np.random.default_rng()

# one kernel, declared on one line (RawKernel's usual input)
ADD = r'''
extern "C" __global__
void pair_add(const float* a, const float* b, float* out, unsigned int count) {
    unsigned int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) out[i] = a[i] + b[i];
}
'''

# several kernels in one extern "C" block, parameter lists continued with a line splice
BLOCK = r'''
extern "C" {

__global__ void pair_add(const float* a, const float* b, float* out, \
                         unsigned int count)
{
    unsigned int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) { out[i] = a[i] + b[i]; }
}

__global__ void pair_mul(const float* a, const float* b, float* out, \
                         unsigned int count)
{
    unsigned int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) { out[i] = a[i] * b[i]; }
}

}
'''

# the element type chosen by a macro given as a compiler option
BY_MACRO = r'''
#ifndef WIDTH
#define WIDTH 8
#endif
#if WIDTH == 8
#define ELEM double
#elif WIDTH == 4
#define ELEM float
#else
#error WIDTH must be 4 or 8
#endif

extern "C" {
__global__ void scaled_sum(const ELEM* a, const ELEM* b, ELEM* out, \
                           unsigned int count)
{
    unsigned int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) out[i] = a[i] + 2 * b[i];
}
}
'''

# a kernel launching another from the device (dynamic parallelism)
DEVICE_LAUNCH = r'''
extern "C" {
__global__ void fill_chunk(float* chunk, int count, float value)
{
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) chunk[i] = value;
}

__global__ void fill_all(float* data, int total, int chunk)
{
    int c = blockDim.x * blockIdx.x + threadIdx.x;
    if (c < total / chunk) fill_chunk<<<1, chunk>>>(data + c * chunk, chunk, 1.5f + c);
}
}
'''

COMPLEX = r'''
#include <cuComplex.h>

extern "C" {
__global__ void z_mul(const cuDoubleComplex* a, const cuDoubleComplex* b,
                      cuDoubleComplex* out, int count) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) out[i] = cuCmul(a[i], b[i]);
}
__global__ void z_shift(const cuDoubleComplex* a, cuDoubleComplex by,
                        cuDoubleComplex* out, int count) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) out[i] = cuCadd(a[i], by);
}
__global__ void z_norm(const cuDoubleComplex* a, double* out, int count) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) out[i] = cuCabs(a[i]);
}
__global__ void c_fma(const cuFloatComplex* a, const cuFloatComplex* b,
                      const cuFloatComplex* c, cuFloatComplex* out, int count) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) out[i] = cuCfmaf(a[i], b[i], c[i]);
}
__global__ void c_shift(const cuComplex* a, cuComplex by, cuComplex* out, int count) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) out[i] = cuCaddf(a[i], by);
}
__global__ void narrow(const cuDoubleComplex* a, cuComplex* out, int count) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < count) out[i] = cuComplexDoubleToFloat(a[i]);
}
}
'''

CONSTANT = r'''
extern "C" {
__constant__ float weights[64];

__global__ void weigh(float* x, int count) {
    int i = threadIdx.x + blockIdx.x * blockDim.x;
    if (i < count) x[i] *= weights[i];
}
}
'''

# a template and a C++-linkage kernel, fetched by name expression
TEMPLATE = r'''
#include <cuda/std/complex>

template <typename T>
__global__ void square_in_place(T* data, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) data[i] = data[i] * data[i];
}

__global__ void halve(double* data, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) data[i] = data[i] / 2;
}
'''
NAME_EXPRESSIONS = ["square_in_place<int>", "square_in_place<float>",
                    "square_in_place<cuda::std::complex<double>>", "halve"]

VOID_POINTER = r'''
extern "C" __global__ void affine(void* raw, int count) {
    double* data = static_cast<double*>(raw);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) data[i] = 4.0 * data[i] - 1.0;
}
'''

GRID_SYNC = r'''
#include <cooperative_groups.h>

extern "C" __global__
void two_phase(const float* a, const float* b, float* out, int count) {
    namespace cg = cooperative_groups;
    cg::grid_group grid = cg::this_grid();
    int stride = gridDim.x * blockDim.x;
    int t = blockDim.x * blockIdx.x + threadIdx.x;
    for (int i = t; i < count; i += stride) out[i] = a[i];
    grid.sync();
    for (int i = count - 1 - t; i >= 0; i -= stride) out[i] += b[i];
}
'''

# an unused variable: NVRTC warns, and the warning must reach the user
WARNS = r'''
extern "C" __global__
void combine(const float* a, const float* b, float* out, unsigned int count) {
    unsigned int i = blockDim.x * blockIdx.x + threadIdx.x;
    int never_used;
    if (i < count) out[i] = a[i] COMBINE b[i];
}
'''

# a std utility NVRTC alone has no header for (CuPy needs Jitify for it)
STD_TRAITS = r'''
#include <type_traits>

template <typename T,
          typename = typename std::enable_if<std::is_integral<T>::value>::type>
__global__ void bump(T* data, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) data[i] += 100;
}
'''


# --- CPU: compile, link, symbols, errors, pickle, files -----------------------------------

def test_extern_c_block_defines_every_kernel_by_its_plain_name():
    """TestRaw.test_module: several kernels in one `extern "C" {}` block, one module."""
    obj = kjit.compile(BLOCK, arch=ARCH)
    assert {"pair_add", "pair_mul"} <= set(obj.entry_points)


def test_macro_given_as_an_option_chooses_the_element_type():
    """TestRaw.test_compiler_flag: -DPRECISION=... as CompileOptions(defines=...)."""
    for width in ("4", "8"):
        obj = kjit.compile(BY_MACRO, arch=ARCH, options=kjit.CompileOptions(defines={"WIDTH": width}))
        assert "scaled_sum" in obj.entry_points


def test_error_directive_is_a_compile_error_carrying_its_text():
    """TestRaw.test_invalid_compiler_flag: the source's own #error stops the compile, and the
    message says what it said."""
    with pytest.raises(CompileError) as err:
        kjit.compile(BY_MACRO, arch=ARCH, options=kjit.CompileOptions(defines=["WIDTH=3"]))
    assert "WIDTH must be 4 or 8" in str(err.value)
    assert "WIDTH must be 4 or 8" in err.value.log


def test_device_side_launch_needs_relocatable_code():
    """TestRaw.test_dynamical_parallelism_compile_failure: without separate compilation a
    device-side launch does not compile; with it (`-dc`, CompileOptions(relocatable=True))
    it links with the device runtime into a loadable cubin."""
    with pytest.raises(CompileError):
        kjit.compile(DEVICE_LAUNCH, arch=ARCH)
    obj = kjit.compile(DEVICE_LAUNCH, arch=ARCH, options=kjit.CompileOptions(relocatable=True))
    assert obj.kind == "object"
    linked = kjit.link([obj], arch=ARCH)
    assert linked.object.kind == "cubin"
    assert linked.device_runtime   # libcudadevrt was linked in without being asked for
    assert {"fill_all", "fill_chunk"} <= set(linked.object.entry_points)


def test_compile_log_keeps_the_compilers_warnings():
    """TestRaw.test_compile_kernel / test_compile_module: the log holds NVRTC's warning."""
    obj = kjit.compile(WARNS, arch=ARCH, options=kjit.CompileOptions(defines={"COMBINE": "+"}),
                       cache=False)
    assert "warning" in obj.log and "never_used" in obj.log


def test_name_expressions_give_each_instantiation_its_symbol():
    """TestRaw.test_template_specialization: templates and a C++-linkage kernel by name."""
    obj = kjit.compile(TEMPLATE, arch=ARCH, name_expressions=NAME_EXPRESSIONS)
    for name in NAME_EXPRESSIONS:
        symbol = obj.lowered_name(name)
        assert symbol.startswith("_Z") and symbol in obj.entry_points, (name, symbol)
    assert len({obj.lowered_name(n) for n in NAME_EXPRESSIONS}) == len(NAME_EXPRESSIONS)


def test_name_expression_the_template_refuses_is_a_compile_error():
    """TestRawJitify.test_jitify3: an instantiation enable_if rules out fails to compile, and
    the error names the expression."""
    with pytest.raises(CompileError) as err:
        kjit.compile(STD_TRAITS, arch=ARCH, name_expressions=["bump<float>"])
    assert "bump" in str(err.value)


def test_std_headers_compile_without_jitify():
    """TestRawJitify.test_jitify2: <type_traits> compiles with NVRTC through kjit (CuPy needs
    Jitify for it, and fails with 'cannot open source file' without)."""
    obj = kjit.compile(STD_TRAITS, arch=ARCH, name_expressions=["bump<int>"])
    assert obj.lowered_name("bump<int>") in obj.entry_points


def test_cub_header_compiles():
    """TestRawJitify.test_jitify1: a CUB header prepended to an ordinary kernel."""
    obj = kjit.compile("#include <cub/block/block_reduce.cuh>\n" + ADD, arch=ARCH)
    assert "pair_add" in obj.entry_points


def test_broken_source_and_missing_header_are_compile_errors(tmp_path):
    """TestRawJitify.test_jitify4 (unterminated kernel) and test_jitify5 (an included header
    that includes one that does not exist): CompileError with the compiler's log."""
    with pytest.raises(CompileError) as err:
        kjit.compile("__global__ void unfinished() {\n", arch=ARCH)
    assert "expected" in err.value.log
    (tmp_path / "outer_header.h").write_text('#include "no_such_header_anywhere.h"\n')
    with pytest.raises(CompileError) as err:
        kjit.compile('#include "outer_header.h"\n' + ADD, arch=ARCH,
                     options=kjit.CompileOptions(include_dirs=[tmp_path]))
    assert "no_such_header_anywhere.h" in str(err.value)


def test_complex_kernels_compile_with_cucomplex_h():
    """TestRaw.test_cuFloatComplex / test_cuDoubleComplex, the compile half."""
    obj = kjit.compile(COMPLEX, arch=ARCH)
    assert {"z_mul", "z_shift", "z_norm", "c_fma", "c_shift", "narrow"} <= set(obj.entry_points)


def test_compiled_code_pickles_and_crosses_processes(tmp_path):
    """TestRawPicklable: CuPy pickles a RawModule / RawKernel and uses it in another process.
    kjit moves the compiled ObjectCode (bytes, symbols, declarations) that way."""
    obj = kjit.compile(TEMPLATE, arch=ARCH, name_expressions=NAME_EXPRESSIONS)
    back = pickle.loads(pickle.dumps(obj))
    assert back == obj
    assert back.kind == obj.kind and back.arch == obj.arch
    assert dict(back.symbols) == dict(obj.symbols)
    assert back.entry_points == obj.entry_points
    assert back.metadata == obj.metadata   # what the loader types parameters from
    path = tmp_path / "code.pkl"
    path.write_bytes(pickle.dumps(obj))
    script = textwrap.dedent(f'''
        import pickle, sys
        obj = pickle.loads(open({str(path)!r}, "rb").read())
        sys.stdout.write(obj.lowered_name("square_in_place<float>") + " " + obj.kind)
        ''')
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"{obj.lowered_name('square_in_place<float>')} cubin"


def test_link_result_pickles():
    """TestRawPicklable for linked code (a RawModule built with -dc): LinkResult round-trips."""
    obj = kjit.compile(DEVICE_LAUNCH, arch=ARCH, options=kjit.CompileOptions(relocatable=True))
    linked = kjit.link([obj], arch=ARCH)
    back = pickle.loads(pickle.dumps(linked))
    assert back.code == linked.code and back.backend == linked.backend
    assert back.object == linked.object


def test_cubin_and_ptx_files_round_trip(tmp_path):
    """TestRaw.test_load_cubin / test_load_ptx, the file half: code saved by one tool is read
    back with its kind sniffed from the bytes."""
    for target, suffix in (("cubin", ".cubin"), ("ptx", ".ptx")):
        arch = ARCH if target == "cubin" else "compute_90"
        obj = kjit.compile(ADD, arch=arch, target=target)
        path = obj.save(tmp_path / f"pair_add{suffix}")
        back = kjit.ObjectCode.from_file(path)
        assert back.kind == target and back.code == obj.code
        assert "pair_add" in back.entry_points


def test_missing_code_file_is_refused_naming_it(tmp_path):
    """TestRaw.test_module_load_failure: loading a file that does not exist."""
    missing = tmp_path / "this_does_not_exist.cubin"
    with pytest.raises(KjitError, match="this_does_not_exist.cubin"):
        kjit.load(missing)


# --- GPU: launch and compare --------------------------------------------------------------

def _operands(n: int, dtype=np.float32):
    a = np.arange(n, dtype=dtype)
    b = rng.standard_normal(n).astype(dtype)
    return a, b


@gpu
def test_raw_kernel_python_int_arrives_as_unsigned_int():
    """TestRaw.test_basic: a Python int for `unsigned int count`, arrays for pointers."""
    n = 100
    a, b = _operands(n)
    out = kjit.zeros(n, np.float32)
    k = kjit.load(kjit.compile(ADD)).get_function("pair_add")
    k[kjit.cdiv(n, 32), 32](kjit.to_device(a), kjit.to_device(b), out, n)
    np.testing.assert_array_equal(out.get(), a + b)


@gpu
def test_kernel_attributes_has_what_cupy_reports():
    """TestRaw.test_kernel_attributes: the ten attributes CuPy's RawKernel.attributes holds."""
    k = kjit.load(kjit.compile(ADD)).get_function("pair_add")
    attrs = k.attributes
    for name in ("binary_version", "cache_mode_ca", "const_size_bytes", "local_size_bytes",
                 "max_dynamic_shared_size_bytes", "max_threads_per_block", "num_regs",
                 "preferred_shared_memory_carveout", "ptx_version", "shared_size_bytes"):
        assert hasattr(attrs, name), name
    assert attrs.num_regs > 0
    assert attrs.max_threads_per_block > 0
    assert attrs.shared_size_bytes == 0


@gpu
def test_module_of_line_spliced_kernels_takes_python_ints():
    """TestRaw.test_module: `float* out, \\` then `unsigned int count)` on the next line, in an
    extern "C" block; the count is a Python int."""
    n = 100
    a, b = _operands(n)
    mod = kjit.load(kjit.compile(BLOCK))
    for name, expect in (("pair_add", a + b), ("pair_mul", a * b)):
        out = kjit.zeros(n, np.float32)
        mod.get_function(name)[kjit.cdiv(n, 32), 32](kjit.to_device(a), kjit.to_device(b), out, n)
        np.testing.assert_array_equal(out.get(), expect)


@gpu
@pytest.mark.parametrize("width,dtype", [("4", np.float32), ("8", np.float64)])
def test_macro_typed_parameters_take_their_arrays_and_ints(width, dtype):
    """TestRaw.test_compiler_flag: parameter types spelled with a macro (ELEM) defined by an
    option are the types the compiler saw: a float64 array is refused by the float kernel."""
    n = 100
    a, b = _operands(n, dtype)
    mod = kjit.load(kjit.compile(BY_MACRO, options=kjit.CompileOptions(defines={"WIDTH": width})))
    k = mod.get_function("scaled_sum")
    out = kjit.zeros(n, dtype)
    k[kjit.cdiv(n, 32), 32](kjit.to_device(a), kjit.to_device(b), out, n)
    np.testing.assert_allclose(out.get(), a + 2 * b, rtol=1e-6)
    other = np.float64 if dtype == np.float32 else np.float32
    with pytest.raises(ArgumentError):
        k[1, 32](kjit.zeros(n, other), kjit.zeros(n, other), kjit.zeros(n, other), n)


@gpu
@pytest.mark.parametrize("target", ["cubin", "ptx"])
def test_load_cubin_or_ptx_file_and_launch(tmp_path, target):
    """TestRaw.test_load_cubin / test_load_ptx: RawModule(path=...) as kjit.load(path)."""
    arch = kjit.Device(0).arch
    if target == "ptx":
        arch = "compute_" + arch[3:]
    path = kjit.compile(ADD, arch=arch, target=target).save(tmp_path / f"pair_add.{target}")
    k = kjit.load(path).get_function("pair_add")
    n = 64
    a, b = _operands(n)
    out = kjit.zeros(n, np.float32)
    k[2, 32](kjit.to_device(a), kjit.to_device(b), out, n)
    np.testing.assert_array_equal(out.get(), a + b)


@gpu
def test_load_takes_ptx_text():
    """RawModule(code=...) users hand PTX text to kjit.load: it is code, not a file name."""
    ptx = kjit.compile(ADD, target="ptx", arch="compute_" + kjit.Device(0).arch[3:])
    for text in (ptx.code.decode(), ptx.code):
        k = kjit.load(text).get_function("pair_add")
        n = 32
        a, b = _operands(n)
        out = kjit.zeros(n, np.float32)
        k[1, 32](kjit.to_device(a), kjit.to_device(b), out, n)
        np.testing.assert_array_equal(out.get(), a + b)


@gpu
def test_get_function_failure_names_the_missing_kernel_and_the_ones_there():
    """TestRaw.test_get_function_failure."""
    mod = kjit.load(kjit.compile(BLOCK))
    with pytest.raises(KernelNotFoundError) as err:
        mod.get_function("no_such_kernel")
    assert "no_such_kernel" in str(err.value) and "pair_add" in str(err.value)


@gpu
def test_dynamic_parallelism_runs():
    """TestRaw.test_dynamical_parallelism: a relocatable module launching from the device."""
    total, chunk = 169, 13
    obj = kjit.compile(DEVICE_LAUNCH, options=kjit.CompileOptions(relocatable=True))
    k = kjit.load(kjit.link([obj])).get_function("fill_all")
    data = kjit.zeros(total, np.float32)
    k[1, total // chunk](data, total, chunk)
    expect = np.repeat(1.5 + np.arange(total // chunk, dtype=np.float32), chunk)
    np.testing.assert_array_equal(data.get(), expect)


@gpu
def test_cu_double_complex_arrays_and_scalars():
    """TestRaw.test_cuDoubleComplex: cuDoubleComplex* from complex128 arrays; the by-value
    cuDoubleComplex from a Python complex and from a numpy complex128."""
    n = 100
    a = (rng.random(n) + 1j * rng.random(n)).astype(np.complex128)
    b = (rng.random(n) + 1j * rng.random(n)).astype(np.complex128)
    mod = kjit.load(kjit.compile(COMPLEX))
    da, db = kjit.to_device(a), kjit.to_device(b)
    out = kjit.zeros(n, np.complex128)
    mod.get_function("z_mul")[4, 32](da, db, out, n)
    np.testing.assert_allclose(out.get(), a * b, rtol=1e-12)
    for scalar in (2 + 3j, np.complex128(-1.5 + 0.25j)):
        mod.get_function("z_shift")[4, 32](da, scalar, out, n)
        np.testing.assert_array_equal(out.get(), a + complex(scalar))
    norms = kjit.zeros(n, np.float64)
    mod.get_function("z_norm")[4, 32](da, norms, n)
    np.testing.assert_allclose(norms.get(), np.abs(a), rtol=1e-12)
    narrow = kjit.zeros(n, np.complex64)
    mod.get_function("narrow")[4, 32](da, narrow, n)
    np.testing.assert_array_equal(narrow.get(), a.astype(np.complex64))


@gpu
def test_cu_float_complex_arrays_and_scalars():
    """TestRaw.test_cuFloatComplex: cuFloatComplex / cuComplex from complex64 arrays and
    from numpy complex64 and Python complex scalars."""
    n = 100
    a, b, c = ((rng.random(n) + 1j * rng.random(n)).astype(np.complex64) for _ in range(3))
    mod = kjit.load(kjit.compile(COMPLEX))
    out = kjit.zeros(n, np.complex64)
    mod.get_function("c_fma")[4, 32](kjit.to_device(a), kjit.to_device(b), kjit.to_device(c), out, n)
    np.testing.assert_allclose(out.get(), a * b + c, rtol=1e-5)
    for scalar in (np.complex64(2 + 3j), 0.5 - 1j):
        mod.get_function("c_shift")[4, 32](kjit.to_device(a), scalar, out, n)
        np.testing.assert_allclose(out.get(), a + np.complex64(scalar), rtol=1e-6)


@gpu
def test_constant_memory_set_through_get_global():
    """TestRaw.test_const_memory: RawModule.get_global as Module.get_global."""
    mod = kjit.load(kjit.compile(CONSTANT))
    w = rng.standard_normal(64).astype(np.float32)
    mod.get_global("weights").copy_from_host(w)
    x = kjit.to_device(np.ones(64, np.float32))
    mod.get_function("weigh")[1, 64](x, 64)
    np.testing.assert_array_equal(x.get(), w)


@gpu
def test_template_specializations_run_and_unknown_ones_are_not_found():
    """TestRaw.test_template_specialization and test_template_failure."""
    mod = kjit.load(kjit.compile(TEMPLATE, name_expressions=NAME_EXPRESSIONS))
    n = 10
    cases = {"square_in_place<int>": rng.integers(-50, 50, n).astype(np.int32),
             "square_in_place<float>": rng.standard_normal(n).astype(np.float32),
             "square_in_place<cuda::std::complex<double>>":
                 (rng.random(n) + 1j * rng.random(n)).astype(np.complex128)}
    for name, host in cases.items():
        data = kjit.to_device(host)
        mod.get_function(name)[1, 32](data, n)
        np.testing.assert_allclose(data.get(), host * host, rtol=1e-6)
    halves = rng.standard_normal(n)
    data = kjit.to_device(halves)
    mod.get_function("halve")[1, 32](data, n)
    np.testing.assert_array_equal(data.get(), halves / 2)
    with pytest.raises(KernelNotFoundError, match="square_in_place<double>"):
        mod.get_function("square_in_place<double>")
    bare = kjit.load(kjit.compile(TEMPLATE))   # no name expressions: nothing instantiated
    with pytest.raises(KernelNotFoundError):
        bare.get_function("square_in_place<int>")


@gpu
def test_void_pointer_takes_any_device_memory():
    """TestRaw.test_raw_pointer: a `void*` parameter from an array or a raw address."""
    k = kjit.load(kjit.compile(VOID_POINTER)).get_function("affine")
    host = rng.standard_normal(100)
    data = kjit.to_device(host)
    k[1, 128](data, 100)
    np.testing.assert_array_equal(data.get(), 4.0 * host - 1.0)
    k[1, 128](kjit.ptr(data.ptr), 100)
    np.testing.assert_array_equal(data.get(), 4.0 * (4.0 * host - 1.0) - 1.0)


@gpu
@pytest.mark.parametrize("n", [10, 1000])
@pytest.mark.parametrize("block", [64, 256])
def test_grid_sync_needs_a_cooperative_launch(n, block):
    """TestRawGridSync: cooperative groups' grid.sync() with a cooperative launch."""
    k = kjit.load(kjit.compile(GRID_SYNC)).get_function("two_phase")
    count = n * n
    a, b = _operands(count)
    out = kjit.zeros(count, np.float32)
    grid = min(kjit.cdiv(count, block), k.max_active_blocks(block) *
               kjit.Device(0).attribute("multiprocessor_count"))
    k.launch(grid, block, kjit.to_device(a), kjit.to_device(b), out, count, cooperative=True)
    np.testing.assert_array_equal(out.get(), a + b)


@gpu
def test_compiled_code_loads_and_runs_in_another_process(tmp_path):
    """TestRawPicklable: the pickled compiled code runs in a fresh process, with the Python
    int for `unsigned int` typed from the declarations that travelled with it."""
    path = tmp_path / "code.pkl"
    path.write_bytes(pickle.dumps(kjit.compile(BLOCK)))
    script = textwrap.dedent(f'''
        import pickle
        import numpy as np
        import kjit
        obj = pickle.loads(open({str(path)!r}, "rb").read())
        k = kjit.load(obj).get_function("pair_add")
        a = np.arange(100, dtype=np.float32); b = np.ones(100, np.float32)
        out = kjit.zeros(100, np.float32)
        k[4, 32](kjit.to_device(a), kjit.to_device(b), out, 100)
        assert (out.get() == a + b).all()
        print("ran")
        ''')
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ran"


@gpu
def test_module_and_kernel_say_they_belong_to_one_process():
    """TestRawPicklable pickles RawModule/RawKernel; kjit's loaded Module and Kernel hold
    driver handles of this process, and say so when pickled."""
    mod = kjit.load(kjit.compile(ADD))
    for thing in (mod, mod.get_function("pair_add")):
        with pytest.raises(TypeError, match="process"):
            pickle.dumps(thing)


@gpu
def test_cupy_style_call_shows_the_kjit_launch():
    """RawKernel is called as k(grid, block, args); a kjit Kernel is launched with
    k[grid, block](*args), and the CuPy form says so."""
    k = kjit.load(kjit.compile(ADD)).get_function("pair_add")
    x = kjit.zeros(32, np.float32)
    with pytest.raises(TypeError, match=r"\[grid, block"):
        k((1,), (32,), (x, x, x, 32))


@gpu
def test_cupy_arrays_are_pointer_arguments():
    """TestRaw._helper launches on CuPy arrays: kjit takes them too."""
    cupy = import_cupy()
    n = 100
    a = cupy.arange(n, dtype=cupy.float32)
    b = cupy.ones(n, dtype=cupy.float32)
    out = cupy.zeros(n, dtype=cupy.float32)
    k = kjit.load(kjit.compile(BLOCK)).get_function("pair_add")
    k[kjit.cdiv(n, 32), 32](a, b, out, n)
    cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(a + b))


@gpu
def test_kernel_fetched_on_device_0_runs_on_device_1():
    """TestRaw.test_context_switch_RawKernel / RawModule1-6 (two GPUs)."""
    from kjit import driver
    if driver.device_count() < 2:
        pytest.skip("needs two GPUs")
    mod = kjit.load(kjit.compile(BLOCK))
    k = mod.get_function("pair_add")
    n = 64
    a, b = _operands(n)
    with kjit.Device(1):
        out = kjit.zeros(n, np.float32)
        k[2, 32](kjit.to_device(a), kjit.to_device(b), out, n)
        np.testing.assert_array_equal(out.get(), a + b)
