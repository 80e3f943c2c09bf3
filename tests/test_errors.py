"""The error tree: DriverError's three names, CompileError's rendering, and the checked
driver call that turns a missing libcuda into one clear line."""
from __future__ import annotations

import types

import pytest

import kjit
from kjit.compiler.diagnostics import compile_error
from kjit import driver
from kjit.errors import (HIP_ERROR_NAMES, ArgumentError, CompileError, CudaUnavailableError,
                         DriverError, InvalidOptionError, KernelNotFoundError, KjitError,
                         LinkError, hip_name, runtime_name)

from conftest import SAXPY


def test_every_error_is_a_kjit_error():
    for cls in (CompileError, LinkError, DriverError, CudaUnavailableError,
                KernelNotFoundError, ArgumentError, InvalidOptionError):
        assert issubclass(cls, KjitError)
        assert getattr(kjit, cls.__name__) is cls
    # and the builtin a caller would catch without knowing kjit
    assert issubclass(InvalidOptionError, ValueError)
    assert issubclass(ArgumentError, TypeError)
    assert issubclass(KernelNotFoundError, KeyError)


# --- DriverError's names -----------------------------------------------------------------

def test_runtime_names_match_cuda_bindings_runtime():
    """For every CUresult the runtime has a code for, runtime_name is that code's name."""
    from cuda.bindings import driver as drv, runtime as rt
    runtime_by_code: dict[int, set[str]] = {}
    for member in rt.cudaError_t:
        runtime_by_code.setdefault(int(member), set()).add(member.name)
    wrong, checked = [], 0
    for member in drv.CUresult:
        twins = runtime_by_code.get(int(member))
        got = runtime_name(member.name)
        if twins is None:
            if got is not None:
                wrong.append(f"{member.name}: no runtime twin, got {got}")
        else:
            checked += 1
            if got not in twins:
                wrong.append(f"{member.name}: {got} not in {sorted(twins)}")
    assert not wrong, "\n".join(wrong)
    assert checked > 90  # nearly every driver error has a runtime twin


def test_hip_names_follow_hip_error_codes():
    """HIP reuses CUDA's numbers, so the code says which hipError_t a CUresult is."""
    from cuda.bindings import driver as drv
    # HIP has no PTX: a PTX the driver cannot use is a kernel file HIP cannot use.
    semantic = {"CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "hipErrorInvalidKernelFile"}
    # Numbers HIP gave to errors of its own: CUDA's 911/912 (EXTERNAL_DEVICE,
    # INVALID_CLUSTER_SIZE) are hipErrorInvalidChannelDescriptor/InvalidTexture in HIP.
    collisions = {911, 912}
    wrong = []
    for member in drv.CUresult:
        code = int(member)
        expected = semantic.get(member.name,
                                None if code in collisions else HIP_ERROR_NAMES.get(code))
        if hip_name(member.name) != expected:
            wrong.append(f"{member.name} ({int(member)}): {hip_name(member.name)} != {expected}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("cuda, runtime, hip", [
    ("CUDA_SUCCESS", "cudaSuccess", "hipSuccess"),
    ("CUDA_ERROR_INVALID_VALUE", "cudaErrorInvalidValue", "hipErrorInvalidValue"),
    ("CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation", "hipErrorOutOfMemory"),
    ("CUDA_ERROR_INVALID_PTX", "cudaErrorInvalidPtx", "hipErrorInvalidKernelFile"),
    ("CUDA_ERROR_NO_BINARY_FOR_GPU", "cudaErrorNoKernelImageForDevice", "hipErrorNoBinaryForGpu"),
    ("CUDA_ERROR_INVALID_HANDLE", "cudaErrorInvalidResourceHandle", "hipErrorInvalidHandle"),
    ("CUDA_ERROR_ECC_UNCORRECTABLE", "cudaErrorECCUncorrectable", "hipErrorECCNotCorrectable"),
    ("CUDA_ERROR_LAUNCH_TIMEOUT", "cudaErrorLaunchTimeout", "hipErrorLaunchTimeOut"),
    ("CUDA_ERROR_MAP_FAILED", "cudaErrorMapBufferObjectFailed", "hipErrorMapFailed"),
    ("CUDA_ERROR_DEVICE_UNAVAILABLE", "cudaErrorDevicesUnavailable", None),
    ("CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "cudaErrorSetOnActiveProcess", "hipErrorSetOnActiveProcess"),
    ("CUDA_ERROR_KEY_ROTATION", None, None),
])
def test_known_name_triples(cuda, runtime, hip):
    assert (runtime_name(cuda), hip_name(cuda)) == (runtime, hip)


def test_driver_error_carries_and_renders_all_names():
    err = DriverError(1, "CUDA_ERROR_INVALID_VALUE", call="cuMemAlloc",
                      description="invalid argument", hint="check the size")
    assert (err.code, err.cuda_name, err.runtime_name, err.hip_name) == (
        1, "CUDA_ERROR_INVALID_VALUE", "cudaErrorInvalidValue", "hipErrorInvalidValue")
    text = str(err)
    for part in ("cuMemAlloc failed", "CUDA_ERROR_INVALID_VALUE", "cudaErrorInvalidValue",
                 "hipErrorInvalidValue", "invalid argument", "check the size"):
        assert part in text
    # a name with no twin is left out rather than invented
    lone = str(DriverError(916, "CUDA_ERROR_KEY_ROTATION"))
    assert lone == "CUDA_ERROR_KEY_ROTATION (916)"


# --- the checked call helper ------------------------------------------------------------

@pytest.fixture
def fresh_driver(monkeypatch):
    """driver.py's once-per-process state, reset for this test and restored after it."""
    monkeypatch.setattr(driver, "_initialized", False)
    monkeypatch.setattr(driver, "_unavailable", None)
    return monkeypatch


def fake_bindings(cu_init):
    from cuda.bindings import driver as real
    return types.SimpleNamespace(CUresult=real.CUresult, cuInit=cu_init,
                                 cuGetErrorString=lambda err: (real.CUresult.CUDA_SUCCESS, b"text"))


def test_missing_libcuda_on_this_machine_is_one_clear_line(fresh_driver):
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has libcuda")
    except OSError:
        pass
    with pytest.raises(CudaUnavailableError) as info:
        driver.init()
    msg = str(info.value)
    assert "\n" not in msg and "libcuda" in msg and "compile" in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__
    # every checked call says the same, and so does asking again
    with pytest.raises(CudaUnavailableError, match="libcuda"):
        driver.call(driver.bindings().cuDeviceGetCount)
    assert driver.available() is False


def test_loader_failure_becomes_cuda_unavailable_and_is_remembered(fresh_driver):
    calls = []

    def cu_init(flags):
        calls.append(flags)
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")
    fresh_driver.setattr(driver, "bindings", lambda: fake_bindings(cu_init))
    for _ in range(2):
        with pytest.raises(CudaUnavailableError) as info:
            driver.init()
        assert "\n" not in str(info.value) and "OSError" in str(info.value)
    assert calls == [0]  # the failure is remembered, not retried on every call


def test_cuinit_failure_names_the_error_and_what_to_check(fresh_driver):
    from cuda.bindings import driver as real
    fresh_driver.setattr(driver, "bindings", lambda: fake_bindings(
        lambda flags: (real.CUresult.CUDA_ERROR_NO_DEVICE,)))
    with pytest.raises(CudaUnavailableError, match="CUDA_ERROR_NO_DEVICE.*CUDA_VISIBLE_DEVICES"):
        driver.init()


def test_call_turns_an_error_result_into_driver_error(fresh_driver):
    from cuda.bindings import driver as real
    fresh_driver.setattr(driver, "init", lambda: None)

    def cuMemAlloc(size):
        return (real.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
    with pytest.raises(DriverError) as info:
        driver.call(cuMemAlloc, 1 << 40)
    err = info.value
    assert (err.code, err.cuda_name, err.runtime_name, err.hip_name, err.call) == (
        2, "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation", "hipErrorOutOfMemory",
        "cuMemAlloc")


def test_call_returns_the_outputs(fresh_driver):
    from cuda.bindings import driver as real
    ok = real.CUresult.CUDA_SUCCESS
    fresh_driver.setattr(driver, "init", lambda: None)
    assert driver.call(lambda: (ok,)) is None
    assert driver.call(lambda a: (ok, a + 1), 41) == 42
    assert driver.call(lambda: (ok, 1, 2)) == (1, 2)


def test_a_destroyed_context_says_what_destroyed_it_and_blames_no_kernel(monkeypatch):
    """A device reset by another library (numba's cuda.close(), CuPy's runtime.deviceReset())
    fails every later call with CONTEXT_IS_DESTROYED: the error names the likely causes and
    what to do, and a synchronize does not blame the kernel launched last, as it does a fault."""
    from kjit.runtime import context as context_mod
    monkeypatch.setattr(context_mod, "last_launch", ["saxpy"])
    with pytest.raises(DriverError) as info:
        context_mod.raise_async(709, "cuCtxSynchronize")
    text = str(info.value)
    assert info.value.cuda_name == "CUDA_ERROR_CONTEXT_IS_DESTROYED"
    assert "device reset" in text and "cudaDeviceReset" in text and "Start a new process" in text
    assert "saxpy" not in text
    with pytest.raises(DriverError) as info:   # any other error reported there names it
        context_mod.raise_async(1, "cuCtxSynchronize")
    assert "launched last was 'saxpy'" in str(info.value) and "device reset" not in str(info.value)


@pytest.mark.gpu
def test_real_driver_error_through_call():
    drv = driver.bindings()
    with pytest.raises(DriverError) as info:
        driver.call(drv.cuDeviceGet, 9999)
    err = info.value
    assert (err.cuda_name, err.runtime_name, err.hip_name) == (
        "CUDA_ERROR_INVALID_DEVICE", "cudaErrorInvalidDevice", "hipErrorInvalidDevice")
    assert err.call == "cuDeviceGet" and err.description  # the driver's own text


# --- CompileError ------------------------------------------------------------------------

BROKEN = '''extern "C" __global__ void k(float* x) {
    int i = threadIdx.x;
    float ok = 1.0f;
    x[i] = undefined_thing + ok;
    x[i] += 1.0f;
    x[i] *= 2.0f;
}
'''


def test_compile_error_has_log_options_and_marked_excerpt():
    opts = kjit.CompileOptions(defines=["FOO=1"])
    with pytest.raises(CompileError) as info:
        kjit.compile(BROKEN, arch="sm_90", options=opts, name="broken.cu")
    err = info.value
    assert 'broken.cu(4): error: identifier "undefined_thing" is undefined' in err.log
    assert "--gpu-architecture=sm_90" in err.options and "-DFOO=1" in err.options
    assert err.source == BROKEN and err.name == "broken.cu"
    text = str(err)
    assert "NVRTC log:" in text and "undefined_thing" in text
    assert "options: --gpu-architecture=sm_90 -DFOO=1" in text
    assert "broken.cu, line 4:" in text
    marked = [ln for ln in text.splitlines() if ln.lstrip().startswith(">")]
    assert marked == ["  > 4 |     x[i] = undefined_thing + ok;"]
    # the lines around it, unmarked
    assert "    3 |     float ok = 1.0f;" in text and "    6 |     x[i] *= 2.0f;" in text
    assert "  1 |" not in text  # two lines of context, not the whole file


def test_compile_error_excerpts_every_line_the_log_names():
    src = 'extern "C" __global__ void k(float* x) {\n  x[0] = a;\n\n\n\n\n  x[1] = b;\n}\n'
    with pytest.raises(CompileError) as info:
        kjit.compile(src, arch="sm_90")
    marked = [ln.split("|")[0].strip() for ln in str(info.value).splitlines()
              if ln.lstrip().startswith(">")]
    assert marked == ["> 2", "> 7"]


def test_excerpt_ignores_other_files_and_reads_clang_style_logs():
    log = ("my_kernel.cu(2): error: another file whose name ends the same\n"
           "kernel.cuh(1): error: a header\n"
           "kernel.cu:3:5: error: clang style, hiprtc's log\n"
           "/tmp/comgr-1a2b/input/kernel.cu:4:1: warning: hiprtc compiles a copy in a temp dir\n")
    err = compile_error("hiprtc could not compile kernel.cu", log=log, source="a\nb\nc\nd\n",
                       name="kernel.cu", compiler="hiprtc")
    text = str(err)
    assert "hiprtc log:" in text
    marked = [ln for ln in text.splitlines() if ln.lstrip().startswith(">")]
    assert marked == ["  > 3 | c", "  > 4 | d"]


def test_compile_error_without_source_or_log():
    err = CompileError("nothing to show")
    assert str(err) == "nothing to show"


# --- the others --------------------------------------------------------------------------

def test_link_error_shows_both_logs_and_the_failing_input():
    err = LinkError("link failed", error_log="undefined reference to 'helper'",
                    info_log="0 bytes gmem", input_name="b.ltoir", backend="nvjitlink",
                    symbol="helper", inputs=["a.ltoir", "b.ltoir"])
    text = str(err)
    for part in ("link failed [nvjitlink]", "failing input: b.ltoir", "undefined symbol: helper",
                 "inputs: a.ltoir, b.ltoir", "undefined reference to 'helper'", "0 bytes gmem"):
        assert part in text


def test_kernel_not_found_lists_what_there_is():
    err = KernelNotFoundError("sxpy", ["saxpy", "daxpy"])
    assert str(err) == "no kernel named 'sxpy' in this module; it has: saxpy, daxpy"
    assert "(none)" in str(KernelNotFoundError("k"))
    with pytest.raises(KeyError):
        raise err


def test_saxpy_compiles_cleanly_so_the_broken_one_is_what_fails():
    # guards the CompileError tests above against failing for the wrong reason
    assert kjit.compile(SAXPY, arch="sm_90", target="ptx").entry_points == ("saxpy",)
