"""The HIP runtime path, tested up to each hip* call.

No AMD GPU exists here: these tests check the library binding, the error mapping, the
launch configuration and the parameter buffer hipModuleLaunchKernel reads, and that
hipInit failing gives one clear error. The one test that launches needs an AMD GPU and
skips without one; it has never run on AMD hardware here.
"""
from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

import kjit
from kjit.compiler import hiprtc
from kjit.compiler.options import CompileOptions
from kjit.errors import ArgumentError, CudaUnavailableError, DriverError
from kjit.hip import comgr, loader
from kjit.hip import runtime as hip

HAVE_RUNTIME = loader.load_first(loader.RUNTIME_NAMES, "hipModuleLaunchKernel") is not None
needs_runtime = pytest.mark.skipif(
    not HAVE_RUNTIME, reason="libamdhip64 not installed: apt-get install libamdhip64-5")
needs_hiprtc = pytest.mark.skipif(
    not hiprtc.available(), reason="hiprtc not installed: apt-get install libamdhip64-5 libhiprtc-builtins5")
pytestmark = pytest.mark.hip

SAXPY = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''


@pytest.fixture(autouse=True)
def _fresh_runtime():
    hip._reset_for_tests()
    yield
    hip._reset_for_tests()


# --- errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("hip_name, cuda_name", [
    ("hipErrorInvalidValue", "CUDA_ERROR_INVALID_VALUE"),
    ("hipErrorInvalidKernelFile", "CUDA_ERROR_INVALID_PTX"),
    ("hipErrorNoDevice", "CUDA_ERROR_NO_DEVICE"),
    ("hipErrorNoBinaryForGpu", "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    ("hipErrorNotFound", "CUDA_ERROR_NOT_FOUND"),
    ("hipErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED"),
    ("hipErrorECCNotCorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE"),
    ("hipErrorSetOnActiveProcess", "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"),
    ("hipErrorInvalidHandle", "CUDA_ERROR_INVALID_HANDLE"),
])
def test_cuda_twin_names(hip_name, cuda_name):
    assert hip.cuda_twin(hip_name) == cuda_name


def _library_error_names() -> dict[int, str]:
    names = {}
    for code in range(1, 1100):
        name = hip.error_name(code)
        if name != "hipErrorUnknown" or code == 999:
            names[code] = name
    return names


@needs_runtime
def test_every_hip_error_maps_to_a_real_cuda_driver_error_with_the_same_number():
    from cuda.bindings.driver import CUresult
    names = _library_error_names()
    assert names[218] == "hipErrorInvalidKernelFile" and names[100] == "hipErrorNoDevice"
    for code, name in names.items():
        twin = hip.cuda_twin(name)
        assert hasattr(CUresult, twin), (name, twin)
        if name not in hip._NO_DRIVER_TWIN:
            # HIP reuses CUDA's numbers for the errors both have: a wrong twin shows here
            assert int(getattr(CUresult, twin)) == code, (name, twin)


@needs_runtime
def test_hip_error_becomes_a_driver_error_under_both_names():
    err = hip.make_error(218, "hipModuleLoadData")
    assert isinstance(err, DriverError)
    assert (err.code, err.cuda_name, err.hip_name) == (218, "CUDA_ERROR_INVALID_PTX",
                                                      "hipErrorInvalidKernelFile")
    assert str(err).startswith("hipModuleLoadData failed: CUDA_ERROR_INVALID_PTX (218")
    assert "hipErrorInvalidKernelFile" in str(err)
    # a runtime-only HIP error keeps its exact HIP name next to the nearest driver error
    err = hip.make_error(9, "hipModuleLaunchKernel")
    assert err.cuda_name == "CUDA_ERROR_INVALID_VALUE"
    assert err.hip_name == "hipErrorInvalidConfiguration"
    assert "hipErrorInvalidConfiguration" in str(err) and err.args == (str(err),)


# --- no GPU: one clear error ------------------------------------------------------------
@needs_runtime
def test_init_without_an_amd_gpu_is_a_clear_unavailable_error():
    if hip.available():
        pytest.skip("an AMD GPU is present")
    hip._reset_for_tests()
    with pytest.raises(CudaUnavailableError) as info:
        hip.init()
    assert isinstance(info.value, hip.HipUnavailableError)
    text = str(info.value)
    assert text.startswith("no AMD GPU: hipInit failed (hipError") or \
        text.startswith("no AMD GPU: hipGetDeviceCount")
    assert "compile HIP" in text
    # remembered: the second call raises the same error without calling hipInit again
    with pytest.raises(hip.HipUnavailableError) as again:
        hip.call("hipDeviceSynchronize")
    assert again.value is info.value


@needs_runtime
@needs_hiprtc
def test_loading_a_module_without_an_amd_gpu_fails_clearly():
    if hip.available():
        pytest.skip("an AMD GPU is present")
    obj = kjit.compile(SAXPY, backend="hip", arch="gfx90a")
    with pytest.raises(hip.HipUnavailableError, match="no AMD GPU"):
        hip.HipModule(obj)
    with pytest.raises(hip.HipUnavailableError):
        hip.HipBuffer(1024)


def test_missing_runtime_library_says_what_to_install(monkeypatch):
    monkeypatch.setattr(loader, "RUNTIME_NAMES", ("libkjit-no-such-amdhip64.so",))
    with pytest.raises(hip.HipUnavailableError, match="libamdhip64-5"):
        hip.init()
    assert not hip.available()


@needs_runtime
def test_cuda_code_is_refused_before_any_hip_call(saxpy_src):
    cubin = kjit.compile(saxpy_src, arch="sm_90")
    with pytest.raises(ArgumentError, match="not cubin; compile with backend='hip'"):
        hip.HipModule(cubin)
    from kjit.hip.runtime import calls
    assert not calls._initialized  # refused before hipInit


# --- launch configuration ----------------------------------------------------------------
def test_launch_config_normalises_dims():
    cfg = hip.LaunchConfig.make(40, (128, 2))
    assert (cfg.grid, cfg.block, cfg.shared_mem, cfg.stream) == ((40, 1, 1), (128, 2, 1), 0, 0)
    cfg = hip.LaunchConfig.make((2, 3, 4), [8, 8, 8], shared_mem=4096, stream=0x1234)
    assert (cfg.grid, cfg.block, cfg.shared_mem, cfg.stream) == ((2, 3, 4), (8, 8, 8), 4096, 0x1234)


@pytest.mark.parametrize("grid, block, shared, match", [
    (1, (32, 33), 0, "1056 threads; AMD GPUs allow at most 1024"),
    (0, 32, 0, "grid must be a positive int"),
    (1, (1, 2, 3, 4), 0, "block must be"),
    (True, 32, 0, "grid must be"),
    (1, 32.0, 0, "block must be"),
    (2**32 // 256 + 1, 256, 0, "grid x: .* work-items; HIP on AMD allows at most 4294967295"),
    (1, 32, -1, "shared_mem must be a non-negative int"),
])
def test_launch_config_refuses_what_hip_would(grid, block, shared, match):
    with pytest.raises(ArgumentError, match=match):
        hip.LaunchConfig.make(grid, block, shared)


def test_stream_handles():
    assert hip.stream_handle(None) == 0
    assert hip.stream_handle(0xABC) == 0xABC
    with pytest.raises(ArgumentError, match="stream must be"):
        hip.stream_handle("default")


# --- the parameter buffer ----------------------------------------------------------------
def _extra_words(params: hip.HipParams) -> list[int]:
    return [params.extra[i] or 0 for i in range(5)]


def test_params_extra_array_is_what_hipModuleLaunchKernel_reads():
    packed = struct.pack("<f4xQQi", 2.0, 0x1000, 0x2000, 77)
    params = hip.HipParams(packed)
    words = _extra_words(params)
    assert words[0] == hip.HIP_LAUNCH_PARAM_BUFFER_POINTER == 1
    assert words[2] == hip.HIP_LAUNCH_PARAM_BUFFER_SIZE == 2
    assert words[4] == hip.HIP_LAUNCH_PARAM_END == 3
    assert ctypes.string_at(words[1], len(packed)) == packed
    assert ctypes.c_size_t.from_address(words[3]).value == len(packed) == 28


def test_params_use_a_writable_buffer_in_place():
    # the packer refills one buffer per launch; the extra array must keep pointing at it
    buf = bytearray(16)
    params = hip.HipParams(buf)
    struct.pack_into("<qq", buf, 0, -5, 6)
    assert ctypes.string_at(_extra_words(params)[1], 16) == struct.pack("<qq", -5, 6)
    cbuf = ctypes.create_string_buffer(24)
    params = hip.HipParams(cbuf, size=20)
    assert _extra_words(params)[1] == ctypes.addressof(cbuf)
    assert ctypes.c_size_t.from_address(_extra_words(params)[3]).value == 20


def test_params_reject_what_is_not_a_buffer():
    with pytest.raises(ArgumentError, match="packed bytes"):
        hip.HipParams([1, 2, 3])
    with pytest.raises(ArgumentError, match="exceeds"):
        hip.HipParams(ctypes.create_string_buffer(8), size=9)


@needs_runtime
def test_launch_arguments_match_the_hipModuleLaunchKernel_signature(monkeypatch):
    calls = []

    def record(name, *args, **kw):  # reads the buffer during the call, as HIP does
        extra = args[-1]
        calls.append((name, args, ctypes.string_at(extra[1], 28),
                      ctypes.c_size_t.from_address(extra[3]).value))

    from kjit.hip.runtime import module as hip_module
    monkeypatch.setattr(hip_module, "call", record)
    fn = hip.HipFunction(module=None, name="saxpy", handle=0x5000)
    packed = struct.pack("<f4xQQi", 2.0, 0x1000, 0x2000, 77)
    fn.launch(packed, grid=(4, 2), block=256, shared_mem=512, stream=0x77)
    (name, args, seen, size), = calls
    assert name == "hipModuleLaunchKernel"
    assert args[:10] == (0x5000, 4, 2, 1, 256, 1, 1, 512, 0x77, None)
    assert (seen, size) == (packed, 28)
    assert [args[10][i] for i in (0, 2, 4)] == [1, 2, 3]
    # every argument converts under the declared ctypes signature (what the real call does)
    argtypes = hip._library().hipModuleLaunchKernel.argtypes
    assert len(argtypes) == len(args)
    for argtype, value in zip(argtypes, args):
        argtype.from_param(value)


@needs_hiprtc
def test_kjit_packer_layout_matches_the_amd_kernarg_metadata():
    # The same packer serves CUDA and HIP; the AMD code object says where each argument goes.
    from kjit.runtime import cdecl, params
    src = r'''
    struct Pair { char tag; double value; };
    extern "C" __global__ void mixed(char c, double d, float4 v, int* p, short s, Pair st,
                                     float3 f3, bool b, const float* __restrict__ q) {
        if (c && b) *p = d + v.x + s + st.value + f3.x + q[0];
    }
    ''' + SAXPY
    code, *_ = hiprtc.compile_source(src, name="m.hip", arch="gfx90a", options=CompileOptions())
    amd = comgr.kernel_args(code)
    for kernel, sig in cdecl.parse_signatures(src).items():
        slots = params.layout([p.ctype for p in sig.params], [p.name for p in sig.params], None)
        assert [(s.offset, s.size) for s in slots] == list(amd[kernel].args), kernel
    assert amd["saxpy"].kinds == ("by_value", "global_buffer", "global_buffer", "by_value")


@needs_hiprtc
def test_packed_saxpy_arguments_land_where_the_kernel_reads_them():
    from kjit.runtime import cdecl, params
    code, *_ = hiprtc.compile_source(SAXPY, name="s.hip", arch="gfx90a", options=CompileOptions())
    sig = cdecl.parse_signatures(SAXPY)["saxpy"]
    slots = params.layout([p.ctype for p in sig.params], [p.name for p in sig.params],
                          list(comgr.kernel_args(code)["saxpy"].args))
    packer = params.Packer("saxpy", slots, device=0)
    buf, _arr, _addr = packer.new_buffers()
    packer.filler(buf)((2.5, params.ptr(0x7F0000001000), params.ptr(0x7F0000002000), 1000), [])
    hp = hip.HipParams(buf, size=packer.size)
    raw = ctypes.string_at(_extra_words(hp)[1], packer.size)
    assert struct.unpack_from("<f", raw, 0)[0] == 2.5
    assert struct.unpack_from("<Q", raw, 8)[0] == 0x7F0000001000
    assert struct.unpack_from("<Q", raw, 16)[0] == 0x7F0000002000
    assert struct.unpack_from("<i", raw, 24)[0] == 1000
    assert packer.size == comgr.kernel_args(code)["saxpy"].kernarg_size == 28


def test_kernel_metadata_refuses_what_is_not_a_code_object():
    if comgr.library() is None:
        pytest.skip("libamd_comgr not installed")
    with pytest.raises(kjit.errors.InvalidOptionError, match="not an AMD code object"):
        comgr.kernel_args(b"not an elf at all")


# --- on an AMD GPU (never run here) ------------------------------------------------------
@needs_hiprtc
def test_saxpy_on_an_amd_gpu():
    if not hip.available():
        pytest.skip("no AMD GPU: the HIP runtime path has not run on AMD hardware here")
    n = 1000
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    obj = kjit.compile(SAXPY, backend="hip", arch=kjit.arch.resolve(None, "hip").name)
    with hip.HipModule(obj) as mod, hip.HipBuffer(x.nbytes) as dx, hip.HipBuffer(y.nbytes) as dy:
        dx.copy_from_host(x)
        dy.copy_from_host(y)
        packed = struct.pack("<f4xQQi", 2.0, int(dx), int(dy), n)
        mod.get_function("saxpy").launch(packed, grid=(n + 255) // 256, block=256)
        hip.synchronize()
        out = np.empty_like(y)
        dy.copy_to_host(out)
    np.testing.assert_allclose(out, 2.0 * x + 1.0)


STRUCT_SRC = r'''
typedef struct { float f; float4 f4; } S;
extern "C" __global__ void saxpy_s(float a, const float* x, float* y, int n, S s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i] + s.f + s.f4.w;
}'''


def _function_without_a_gpu(obj, name):
    """A HipFunction over a compiled code object, built without hipModuleLoadData (no GPU)."""
    mod = hip.HipModule.__new__(hip.HipModule)
    mod.object, mod.code = obj, obj.code
    mod.kernel_names, mod.archs = list(obj.entry_points), [obj.arch]
    return hip.HipFunction(mod, name, 0, obj.lowered_name(name))


@needs_hiprtc
def test_hip_kernels_take_the_same_checked_arguments_as_cuda():
    obj = kjit.compile(STRUCT_SRC, backend="hip", arch="gfx90a")
    fn = _function_without_a_gpu(obj, "saxpy_s")
    # layout from the code object's metadata, types from the source, as for CUDA
    assert [(s.name, s.offset, s.size) for s in fn.params] == [
        ("a", 0, 4), ("x", 8, 8), ("y", 16, 8), ("n", 24, 4), ("s", 32, 32)]
    params = fn.pack((2.0, kjit.ptr(16), kjit.ptr(32), 5, {"f": 1.0, "f4": (1, 2, 3, 4)}))
    raw = ctypes.string_at(params.extra[1], params.size)
    assert struct.unpack_from("<f4xQQi", raw) == (2.0, 16, 32, 5)
    assert struct.unpack_from("<f12x4f", raw, 32) == (1.0, 1.0, 2.0, 3.0, 4.0)
    with pytest.raises(ArgumentError, match="host numpy array"):
        fn.pack((2.0, np.ones(3, np.float32), kjit.ptr(32), 5, {"f": 1.0, "f4": (1, 2, 3, 4)}))
    with pytest.raises(ArgumentError, match="does not fit"):
        fn.pack((2.0, kjit.ptr(16), kjit.ptr(32), 2**40, {"f": 1.0, "f4": (1, 2, 3, 4)}))
    # struct refuses an address beyond 64 bits that the converters let through: still named
    with pytest.raises(ArgumentError, match=r"parameter 2 'y' \(float\*\).*does not fit"):
        fn.pack((2.0, kjit.ptr(16), kjit.ptr(2**64), 5, {"f": 1.0, "f4": (1, 2, 3, 4)}))


@needs_hiprtc
@pytest.mark.parametrize("wrap", ["In", "Out", "InOut"])
def test_hip_kernels_refuse_in_out_copies_naming_the_parameter(wrap, monkeypatch):
    # In/Out copy through CUDA memory: a HIP kernel would read a CUDA address and an Out
    # array would never be filled; refused before any copy is made
    from kjit.runtime.memory import _HostTransfer
    monkeypatch.setattr(_HostTransfer, "to_device", lambda self: pytest.fail("copied"))
    obj = kjit.compile(STRUCT_SRC, backend="hip", arch="gfx90a")
    fn = _function_without_a_gpu(obj, "saxpy_s")
    y = getattr(kjit, wrap)(np.zeros(5, np.float32))
    with pytest.raises(ArgumentError, match=rf"parameter 2 'y' \(float\*\): kjit.{wrap} .*HipBuffer"):
        fn.pack((2.0, kjit.ptr(16), y, 5, {"f": 1.0, "f4": (1, 2, 3, 4)}))


@needs_hiprtc
def test_template_hip_kernel_types_come_from_the_mangled_name():
    src = r'''template <typename T> __global__ void axpy(T a, const T* x, T* y, int n) {
        int i = threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }'''
    obj = kjit.compile(src, backend="hip", arch="gfx90a", name_expressions=["axpy<double>"])
    fn = _function_without_a_gpu(obj, "axpy<double>")
    assert [s.ctype.name for s in fn.params] == ["double", "const double*", "double*", "int"]


@needs_hiprtc
def test_kjit_load_sends_amd_code_to_the_hip_runtime():
    obj = kjit.compile(STRUCT_SRC, backend="hip", arch="gfx90a")
    if hip.available():  # pragma: no cover - an AMD GPU is present
        assert isinstance(kjit.load(obj), hip.HipModule)
        return
    with pytest.raises(CudaUnavailableError, match="no AMD GPU"):
        kjit.load(obj)
