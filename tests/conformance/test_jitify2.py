"""Conformance with Jitify2's tests and test kernels.

Upstream: NVIDIA/jitify, commit 44e978b21fc8bdb6b2d7d8d179523c8350db72e5 (branch jitify2):
jitify2_test.cu, jitify2_test_kernels.cu and example_headers/class_arg_kernel.cuh. Tests
whose behaviour is checked here: Jitify2Test.Simple, MultipleKernels, LaunchAttributes,
StdFlag, CompiledProgram, ConstantMemory, InvalidPrograms, CompileLTO_IR,
LinkMultiplePrograms, LinkLTO, LinkExternalFiles, ClassKernelArg, GetAttribute,
SetAttribute, Thrust, CubBlockPrimitives, LibCudaCxx, AssertHeader, LineNumbers. The rest
(Jitify's own preprocessing, option parsing, reflection, path helpers, serialization
goldens, launch-latency benchmark, LinkCurrentExecutable) have no kjit counterpart:
tests/conformance/README.md says why.

Jitify2 programs are C++ without extern "C": templates instantiated by name, kernels with
C++ linkage fetched by plain name, structs passed by value. The kernels are kjit's own.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import kjit
from kjit.errors import CompileError

ARCH = "sm_90"
gpu = pytest.mark.gpu
RDC = kjit.CompileOptions(relocatable=True)

POWER = r'''
template <int N, typename T>
__global__ void raise_to(T* data) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  T base = data[0];
  for (int i = 0; i < N - 1; ++i) data[0] *= base;
}
'''

# a header given in memory (Jitify's header callback) and a plain + a template kernel
HELPER_HEADER = r'''
#pragma once
template <typename T> __device__ T negated(T x) { return -x; }
template <typename T> __device__ T squared(T x) { return x * x; }
'''
TWO_KERNELS = r'''
#include "helpers/negate_square.cuh"

__global__ void copy_first(const float* in, float* out) {
  out[0] = in[0] + 1;
  out[0] -= 1;
}

template <int C, typename T>
__global__ void root_of_square(const T* in, T* out) {
  for (int i = 0; i < C; ++i) out[0] = sqrt(squared(negated(in[0])));
}
'''

CONSTANTS = r'''
__constant__ int a;
__device__ int d;
namespace b { __constant__ int a; __device__ int d; }
namespace x { __constant__ int a = 3; __device__ int d = 7; }
namespace y { __constant__ int a[] = {4, 5}; }

__global__ void read_constants(int* out) {
  out[0] = a; out[1] = b::a; out[2] = d; out[3] = b::d;
  out[4] = x::a; out[5] = x::d; out[6] = y::a[0]; out[7] = y::a[1];
}
'''
CONSTANT_NAMES = ["&a", "&b::a", "&d", "&b::d", "&x::a", "&x::d", "&y::a"]

# the arch a program was compiled for, kept alive by a kernel reading it (LTO drops unused globals)
ARCH_CONSTANT = r'''
__device__ int arch = __CUDA_ARCH__ / 10;
extern "C" __global__ void read_arch(int* out) { *out = arch; }
'''

LIB = r'''
__constant__ int c = 5;
__device__ int d = 7;
__device__ int f(int i) { return i + 11; }
'''
USER = r'''
extern __constant__ int c;
extern __device__ int d;
extern __device__ int f(int);
__global__ void use_lib(int* data) { *data = f(*data + c + d); }
'''
LTO_LIB = LIB.replace("__device__ int f", 'extern "C" __device__ int f')
# extern "C" with a by-value int: its type must survive the link (the caller passes an int)
LTO_USER = r'''
extern __constant__ int c;
extern __device__ int d;
extern "C" __device__ int f(int);
extern "C" __global__ void use_lib_n(int* data, int extra) { *data = f(*data + c + d) + extra; }
'''

# a struct by value, by reference and by pointer (class_arg_kernel.cuh's three kernels)
STRUCT_ARG = r'''
struct Arg { int x; };
struct Pair { int tag; int c[2]; double w; };

template <typename T>
__global__ void by_value(int* out, T arg) { *out = arg.x; }
template <typename T>
__global__ void by_reference(int* out, T& arg) { *out = arg.x; }
template <typename T>
__global__ void by_pointer(int* out, T* arg) { *out = arg->x; }

extern "C" __global__ void unpack_pair(double* out, Pair p) {
  out[0] = p.tag; out[1] = p.c[0]; out[2] = p.c[1]; out[3] = p.w;
}
'''

STATIC_SHARED = r'''
__global__ void staged(int* out, const int* in) {
  __shared__ int buffer[4096];
  buffer[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.y] = buffer[threadIdx.x];
}
'''
DYNAMIC_SHARED = r'''
__global__ void staged_dynamic(int* out, const int* in) {
  extern __shared__ int buffer[];
  buffer[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.y] = buffer[threadIdx.x];
}
'''

STORE = r'''
__global__ void store_pi(float* data) { *data = 3.14f; }
'''


# --- CPU ----------------------------------------------------------------------------------

def test_compiled_program_lowered_name_and_clean_log():
    """CompiledProgram: my_kernel<float> lowers to _Z9my_kernelIfEvv; a clean compile's log
    is empty."""
    obj = kjit.compile("template <typename T>\n__global__ void my_kernel() {}\n", arch=ARCH,
                       name_expressions=["my_kernel<float>"], cache=False)
    assert obj.lowered_name("my_kernel<float>") == "_Z9my_kernelIfEvv"
    assert dict(obj.symbols) == {"my_kernel<float>": "_Z9my_kernelIfEvv"}
    assert obj.log.strip() == ""


def test_serialized_compiled_and_linked_programs_round_trip(tmp_path):
    """Simple: Jitify2 serializes each stage and deserializes it; kjit's ObjectCode and
    LinkResult pickle, and save / from_file keep the name-expression symbols."""
    obj = kjit.compile(POWER, arch=ARCH, name_expressions=["raise_to<3, float>"], options=RDC)
    back = pickle.loads(pickle.dumps(obj))
    assert back == obj and back.lowered_name("raise_to<3, float>") == obj.lowered_name("raise_to<3, float>")
    linked = kjit.link([obj], arch=ARCH)
    again = pickle.loads(pickle.dumps(linked))
    assert again.object == linked.object
    assert again.object.lowered_name("raise_to<3, float>") == obj.lowered_name("raise_to<3, float>")
    saved = kjit.ObjectCode.from_file(linked.object.save(tmp_path / "power.cubin"))
    assert saved.lowered_name("raise_to<3, float>") == obj.lowered_name("raise_to<3, float>")


def test_multiple_kernels_with_an_in_memory_header():
    """MultipleKernels: a header from a callback (CompileOptions(headers=...)), a plain kernel
    and a template instantiation in one program."""
    obj = kjit.compile(TWO_KERNELS, arch=ARCH, name_expressions=["root_of_square<123, float>"],
                       options=kjit.CompileOptions(headers={"helpers/negate_square.cuh": HELPER_HEADER}))
    assert "_Z10copy_firstPKfPf" in obj.entry_points
    assert obj.lowered_name("root_of_square<123, float>") in obj.entry_points


def test_std_flag_selects_the_dialect():
    """StdFlag: C++17 code compiles with std="c++17" and not with c++11."""
    src = "template <typename T> __global__ void k(T* p) { if constexpr (sizeof(T) == 4) *p = 1; }\n"
    assert kjit.compile(src, arch=ARCH, name_expressions=["k<int>"], options=kjit.CompileOptions(std="c++17"))
    with pytest.raises(CompileError):
        kjit.compile(src, arch=ARCH, name_expressions=["k<int>"], options=kjit.CompileOptions(std="c++11"))


def test_namespaced_globals_have_lowered_names():
    """ConstantMemory: __constant__ and __device__ variables in namespaces, named by
    "&ns::name" name expressions."""
    obj = kjit.compile(CONSTANTS, arch=ARCH, name_expressions=CONSTANT_NAMES)
    assert obj.lowered_name("&x::a") == "_ZN1x1aE"
    assert obj.lowered_name("&b::d") == "_ZN1b1dE"
    assert obj.lowered_name("&a") == "a"


def test_invalid_programs():
    """InvalidPrograms: an empty program and one including <cstdio> compile; a missing
    header and non-CUDA text are CompileErrors whose log and options say why."""
    kjit.compile("#include <cstdio>\n__global__ void k() { printf(\"hi\\n\"); }\n", arch=ARCH)
    with pytest.raises(CompileError, match="cantfindme"):
        kjit.compile("#include <cantfindme>\n", arch=ARCH)
    with pytest.raises(CompileError) as err:
        kjit.compile("NOT CUDA C!\n", arch=ARCH, name="bad_program")
    assert 'identifier "NOT" is undefined' in err.value.log
    assert err.value.options and "bad_program" in str(err.value)


def test_error_reports_the_line_it_is_on():
    """LineNumbers: the compiler's error names the source and line."""
    src = "\n\n__global__ void k(int* p) {\n  *p = undeclared_thing;\n}\n"
    with pytest.raises(CompileError) as err:
        kjit.compile(src, arch=ARCH, name="lines.cu")
    assert "lines.cu(4)" in str(err.value)


def test_lto_ir_program_links_to_a_cubin():
    """CompileLTO_IR: -dlto output is LTO-IR, which links into a cubin."""
    obj = kjit.compile(ARCH_CONSTANT, arch=ARCH, target="ltoir", options=RDC)
    assert obj.kind == "ltoir"
    assert kjit.link([obj], arch=ARCH).object.kind == "cubin"


@pytest.mark.parametrize("target,arch", [("ptx", "compute_90"), ("cubin", ARCH), ("ltoir", ARCH)])
def test_link_multiple_programs(target, arch):
    """LinkMultiplePrograms / LinkLTO: a program defining globals and a device function,
    another using them."""
    lib = kjit.compile(LTO_LIB if target == "ltoir" else LIB, arch=arch, target=target, options=RDC)
    user = kjit.compile(LTO_USER if target == "ltoir" else USER, arch=arch, target=target, options=RDC)
    entry = "use_lib_n" if target == "ltoir" else "_Z7use_libPi"
    assert entry in kjit.link([lib, user], arch=ARCH).object.entry_points


def test_link_external_files(tmp_path):
    """LinkExternalFiles: a PTX file on disk linked by path."""
    path = kjit.compile(LIB, arch="compute_90", target="ptx", options=RDC).save(tmp_path / "linktest.ptx")
    user = kjit.compile(USER, arch="compute_90", target="ptx", options=RDC)
    for backend in ("nvjitlink", "auto"):
        assert "_Z7use_libPi" in kjit.link([user, str(path)], arch=ARCH, backend=backend).object.entry_points


@pytest.mark.parametrize("header,body", [
    ("<cuda/std/tuple>", "cuda::std::tuple<int, float> t(1, 2.f); *p = cuda::std::get<0>(t);"),
    ("<cuda/std/limits>", "*p = cuda::std::numeric_limits<int>::max();"),
    ("<cub/block/block_reduce.cuh>",
     "typedef cub::BlockReduce<int, 128> R; __shared__ typename R::TempStorage s;"
     " int v = R(s).Sum(threadIdx.x); if (threadIdx.x == 0) *p = v;"),
    pytest.param(
        "<thrust/complex.h>", "thrust::complex<float> z(1.f, 2.f); *p = (int)thrust::abs(z * z);",
        # CCCL 13.3's thrust/detail/complex/stream.h defines its stream operators outside the
        # _CCCL_HOSTED() guard the rest of thrust/complex.h keeps, so NVRTC (no hosted
        # standard library: no std::basic_ostream) stops there. Strict: it passes once fixed.
        marks=pytest.mark.xfail(strict=True, reason="CCCL 13.3: thrust/complex.h needs "
                                "std::basic_ostream, which NVRTC has not")),
    ("<cassert>", "assert(p != nullptr); *p = 1;"),
])
def test_library_headers_compile(header, body):
    """LibCudaCxx, LibCudaCxxAndBuiltinTuple/Limits, CubBlockPrimitives, Thrust, AssertHeader."""
    src = f"#include {header}\nextern \"C\" __global__ void k(int* p) {{ {body} }}\n"
    assert "k" in kjit.compile(src, arch=ARCH, options=kjit.CompileOptions(std="c++17")).entry_points


# --- GPU ----------------------------------------------------------------------------------

@gpu
def test_simple_template_with_non_type_parameter():
    """Simple: raise_to<3, float> turns 5 into 125, launched by a fixed configuration and by
    the occupancy-suggested one."""
    name = "raise_to<3, float>"
    k = kjit.load(kjit.compile(POWER, name_expressions=[name])).get_function(name)
    data = kjit.to_device(np.array([5.0], np.float32))
    k[1, 1](data)
    assert data.get()[0] == 125.0
    data = kjit.to_device(np.array([5.0], np.float32))
    _, block = k.suggested_block_size()
    k[1, block](data)
    assert data.get()[0] == 125.0


@gpu
def test_multiple_kernels_plain_and_template():
    """MultipleKernels: get_kernel("copy_first") by its plain name (C++ linkage) and the
    template by its instantiation."""
    name = "root_of_square<123, float>"
    mod = kjit.load(kjit.compile(TWO_KERNELS, name_expressions=[name], options=kjit.CompileOptions(
        headers={"helpers/negate_square.cuh": HELPER_HEADER})))
    inp = kjit.to_device(np.array([3.14159], np.float32))
    out = kjit.zeros(1, np.float32)
    mod.get_function(name)[1, 1](inp, out)
    np.testing.assert_allclose(out.get(), [3.14159], rtol=1e-6)
    out = kjit.zeros(1, np.float32)
    mod.get_function("copy_first")[1, 1](inp, out)
    np.testing.assert_allclose(out.get(), [3.14159], rtol=1e-6)


@gpu
def test_launch_attributes_cooperative_and_cluster():
    """LaunchAttributes: with_cooperative(true), and with_cluster on sm_90 and later."""
    mod = kjit.load(kjit.compile('extern "C"' + STORE))
    k = mod.get_function("store_pi")
    data = kjit.zeros(1, np.float32)
    k.launch(1, 1, data, cooperative=True)
    assert data.get()[0] == np.float32(3.14)
    if int(kjit.Device(0).arch[3:5]) >= 9:
        data = kjit.zeros(1, np.float32)
        k.launch((2, 3, 1), 1, data, cluster=(2, 3, 1))
        assert data.get()[0] == np.float32(3.14)


@gpu
def test_constant_memory_by_namespaced_names():
    """ConstantMemory: get and set __constant__ / __device__ globals by namespaced name."""
    mod = kjit.load(kjit.compile(CONSTANTS, name_expressions=CONSTANT_NAMES))
    assert mod.get_global("&x::a").copy_to_host(np.int32)[0] == 3
    assert mod.get_global("&x::d").copy_to_host(np.int32)[0] == 7
    np.testing.assert_array_equal(mod.get_global("&y::a").copy_to_host(np.int32), [4, 5])
    values = [2, 4, 8, 12, 14, 18, 22, 26]
    for name, v in zip(CONSTANT_NAMES[:6], values):
        mod.get_global(name).copy_from_host(np.array([v], np.int32))
    mod.get_global("&y::a").copy_from_host(np.array(values[6:], np.int32))
    out = kjit.zeros(8, np.int32)
    mod.get_function("read_constants")[1, 1](out)
    np.testing.assert_array_equal(out.get(), values)


@gpu
def test_lto_ir_global_holds_the_device_arch():
    """CompileLTO_IR: the linked program's `arch` global is the device's compute capability."""
    arch = kjit.Device(0).arch
    obj = kjit.compile(ARCH_CONSTANT, arch=arch, target="ltoir", options=RDC)
    mod = kjit.load(kjit.link([obj]))
    assert mod.get_global("arch").copy_to_host(np.int32)[0] == int(arch[3:].rstrip("af"))


@gpu
@pytest.mark.parametrize("target", ["ptx", "cubin"])
def test_linked_programs_run(target):
    """LinkMultiplePrograms: 3 becomes f(3 + 5 + 7) = 26."""
    arch = kjit.Device(0).arch
    if target == "ptx":
        arch = "compute_" + arch[3:]
    progs = [kjit.compile(s, arch=arch, target=target, options=RDC) for s in (LIB, USER)]
    data = kjit.to_device(np.array([3], np.int32))
    kjit.load(kjit.link(progs)).get_function("use_lib")[1, 1](data)
    assert data.get()[0] == 26


@gpu
def test_lto_linked_kernel_keeps_its_parameter_types():
    """LinkLTO: two LTO-IR programs linked with nvJitLink; the kernel's `int extra` takes a
    Python int, its declaration kept through the link."""
    arch = kjit.Device(0).arch
    progs = [kjit.compile(s, arch=arch, target="ltoir", options=RDC) for s in (LTO_LIB, LTO_USER)]
    data = kjit.to_device(np.array([3], np.int32))
    kjit.load(kjit.link(progs)).get_function("use_lib_n")[1, 1](data, 100)
    assert data.get()[0] == 126


@gpu
def test_struct_argument_by_value_reference_and_pointer():
    """ClassKernelArg: Arg by value (from a tuple, a dict, a numpy record), by reference and
    by pointer (a device buffer holding one)."""
    names = ["by_value<Arg>", "by_reference<Arg>", "by_pointer<Arg>"]
    mod = kjit.load(kjit.compile(STRUCT_ARG, name_expressions=names))
    out = kjit.zeros(1, np.int32)
    by_value = mod.get_function("by_value<Arg>")
    record = np.array((-3,), dtype=[("x", np.int32)])
    for value, expect in (((-1,), -1), ({"x": -2}, -2), (record[()], -3)):
        by_value[1, 1](out, value)
        assert out.get()[0] == expect
    held = kjit.to_device(np.array([-4], np.int32))
    for name in names[1:]:
        mod.get_function(name)[1, 1](out, held)
        assert out.get()[0] == -4


@gpu
def test_struct_with_an_array_field_from_records_by_layout():
    """ClassKernelArg with `int c[2]`: a numpy record with a sub-array field ("c", "i4", (2,)),
    and a record whose field names differ but whose layout (offsets, sizes) matches."""
    k = kjit.load(kjit.compile(STRUCT_ARG)).get_function("unpack_pair")
    out = kjit.zeros(4, np.float64)
    same_names = np.dtype({"names": ["tag", "c", "w"], "formats": [np.int32, (np.int32, (2,)), np.float64],
                           "offsets": [0, 4, 16], "itemsize": 24})
    k[1, 1](out, np.array((9, (1, 2), 0.5), dtype=same_names)[()])
    np.testing.assert_array_equal(out.get(), [9, 1, 2, 0.5])
    other_names = np.dtype({"names": ["id", "pair", "weight"],
                            "formats": [np.int32, (np.int32, (2,)), np.float64],
                            "offsets": [0, 4, 16], "itemsize": 24})
    k[1, 1](out, np.array((7, (3, 4), -1.25), dtype=other_names)[()])
    np.testing.assert_array_equal(out.get(), [7, 3, 4, -1.25])


@gpu
def test_get_attribute_static_shared_size():
    """GetAttribute: CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES of int[4096]."""
    k = kjit.load(kjit.compile(STATIC_SHARED)).get_function("staged")
    assert k.attributes.shared_size_bytes == 4096 * 4


@gpu
def test_set_attribute_max_dynamic_shared_then_launch():
    """SetAttribute: raise the dynamic shared memory limit to the device's opt-in maximum,
    then launch with that much."""
    k = kjit.load(kjit.compile(DYNAMIC_SHARED)).get_function("staged_dynamic")
    most = kjit.Device(0).attribute("max_shared_memory_per_block_optin")
    k.set_max_dynamic_shared(most)
    assert k.attributes.max_dynamic_shared_size_bytes == most
    inp = kjit.to_device(np.array([11], np.int32))
    out = kjit.zeros(1, np.int32)
    k[1, 1, None, most](out, inp)
    assert out.get()[0] == 11
