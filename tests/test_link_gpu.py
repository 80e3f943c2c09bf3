"""kjit.link on a real GPU: the driver's cuLink path, linked code that runs, version skew.

Kernels are loaded with cuModuleLoadData and launched with cuLaunchKernel through
kjit.driver.call, so these tests depend on nothing but the linker and the driver.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import kjit
from kjit import driver
from kjit.errors import DriverError, LinkError
from kjit.linker import LinkOptions, devrt, link
from kjit.linker.choice import cuda_version_for_ptx, max_ptx_for_driver, ptx_too_new
from kjit.linker import ptx_to_cubin
from kjit.linker import nvjitlink

pytestmark = pytest.mark.gpu
RDC = kjit.CompileOptions(relocatable=True)

LIB = r'''extern "C" __device__ float twice(float x) { return 2.0f * x; }'''
MAIN = r'''
extern "C" __device__ float twice(float x);
extern "C" __global__ void doubler(float* y) { y[threadIdx.x] = twice(y[threadIdx.x]) + 1.0f; }
'''
MOD_A = r'''
extern "C" __device__ int pong(int x);
extern "C" __device__ int ping(int x) { return x > 0 ? pong(x - 1) + 1 : 0; }
'''
MOD_B = r'''
extern "C" __device__ int ping(int x);
extern "C" __device__ int pong(int x) { return x > 0 ? ping(x - 1) + 10 : 0; }
extern "C" __global__ void bounce(int* out) { out[threadIdx.x] = ping(threadIdx.x); }
'''
SQUARE = r'''
extern "C" __global__ void square(float* y) { y[threadIdx.x] = y[threadIdx.x] * y[threadIdx.x]; }
'''
MANY_KERNELS = "\n".join(
    f'extern "C" __global__ void k{i}(float* y) {{ y[threadIdx.x] = y[threadIdx.x] * {i}.0f + {i}; }}'
    for i in range(24))


def dev_arch() -> str:
    from kjit.arch import device_arch
    return device_arch().sm


def run(code: bytes, kernel: str, data: np.ndarray) -> np.ndarray:
    """Load `code`, launch `kernel(data_ptr)` with one block of len(data) threads, return data."""
    drv = driver.bindings()
    driver.ensure_context()
    module = driver.call(drv.cuModuleLoadData, code)
    try:
        fn = driver.call(drv.cuModuleGetFunction, module, kernel.encode())
        ptr = driver.call(drv.cuMemAlloc, data.nbytes)
        try:
            driver.call(drv.cuMemcpyHtoD, ptr, data.ctypes.data, data.nbytes)
            arg = np.array([int(ptr)], dtype=np.uint64)
            params = np.array([arg.ctypes.data], dtype=np.uint64)
            driver.call(drv.cuLaunchKernel, fn, 1, 1, 1, len(data), 1, 1, 0, 0, params.ctypes.data, 0)
            driver.call(drv.cuCtxSynchronize)
            out = np.empty_like(data)
            driver.call(drv.cuMemcpyDtoH, out.ctypes.data, ptr, data.nbytes)
        finally:
            driver.call(drv.cuMemFree, ptr)
    finally:
        driver.call(drv.cuModuleUnload, module)
    return out


def driver_ptx(src: str, name: str, relocatable: bool = True) -> kjit.ObjectCode:
    """PTX the driver accepts. With an NVRTC newer than the driver, the `.version` line is
    lowered to the driver's newest: these small kernels use no newer instruction."""
    obj = kjit.compile(src, arch=dev_arch(), target="ptx", name=name,
                       options=RDC if relocatable else None)
    limit = max_ptx_for_driver(driver.driver_version())
    if ptx_too_new(obj.ptx_version, driver.driver_version()):
        code = re.sub(rb"^\.version \d+\.\d+", f".version {limit[0]}.{limit[1]}".encode(),
                      obj.code, count=1, flags=re.M)
        obj = kjit.ObjectCode(code, kind="ptx", name=name)
    return obj


def ping(x: int) -> int:
    return pong(x - 1) + 1 if x > 0 else 0


def pong(x: int) -> int:
    return ping(x - 1) + 10 if x > 0 else 0


def skip_if_cubins_newer_than_driver() -> None:
    from kjit.compiler import nvrtc
    major, minor = nvrtc.version()
    dv = driver.driver_version()
    if 1000 * major + 10 * minor > dv:
        pytest.skip(f"NVRTC {major}.{minor} builds cubins newer than the driver (CUDA "
                    f"{dv // 1000}.{dv % 1000 // 10}); auto links those with nvJitLink, and the "
                    "forced-driver path is tested with an NVRTC as old as the driver")


# --- the driver's linker --------------------------------------------------------------

def test_driver_links_relocatable_cubins_and_the_result_runs():
    skip_if_cubins_newer_than_driver()
    arch = dev_arch()
    a = kjit.compile(LIB, arch=arch, target="cubin", options=RDC, name="lib.cu")
    b = kjit.compile(MAIN, arch=arch, target="cubin", options=RDC, name="main.cu")
    res = link([a, b], backend="driver")
    assert res.backend == "driver" and res.arch == arch
    y = np.arange(32, dtype=np.float32)
    np.testing.assert_array_equal(run(res.code, "doubler", y), 2 * y + 1)


def test_driver_links_ptx_with_a_cubin_and_the_result_runs():
    skip_if_cubins_newer_than_driver()
    arch = dev_arch()
    lib = kjit.compile(LIB, arch=arch, target="cubin", options=RDC, name="lib.cu")
    main = driver_ptx(MAIN, "main.cu")
    res = link([main, lib], backend="driver", cache=False)
    assert res.backend == "driver" and res.cache_hit is None
    y = np.linspace(-3, 3, 64, dtype=np.float32)
    np.testing.assert_array_equal(run(res.code, "doubler", y), 2 * y + 1)


def test_auto_uses_the_driver_for_ptx_it_accepts():
    res = link([driver_ptx(LIB, "lib.cu"), driver_ptx(MAIN, "main.cu")])
    assert res.backend == "driver", res.reason


def test_driver_logs_are_never_cut():
    """A 256-byte log buffer is too small for ptxas' verbose report of 24 kernels: kjit grows
    it and links again, so the log is the same as with a big buffer."""
    ptx = driver_ptx(MANY_KERNELS, "many.cu", relocatable=False)
    small = link([ptx], backend="driver", cache=False, options=LinkOptions(verbose=True, log_bytes=256))
    big = link([ptx], backend="driver", cache=False, options=LinkOptions(verbose=True, log_bytes=1 << 20))
    assert len(small.info_log) > 256
    assert small.info_log == big.info_log
    assert all(f"k{i}" in small.info_log for i in range(24))


def test_driver_link_error_names_the_symbol_and_the_input():
    with pytest.raises(LinkError) as info:
        link([driver_ptx(MAIN, "main.cu")], backend="driver")
    err = info.value
    assert err.backend == "driver"
    assert err.symbol == "twice", str(err)
    assert err.input_name == "main.ptx" and "main.ptx" in str(err)
    assert err.error_log.strip()


def test_driver_options_reach_the_jit():
    res = link([driver_ptx(LIB, "lib.cu"), driver_ptx(MAIN, "main.cu")], backend="driver",
               cache=False, options=LinkOptions(max_registers=16, optimization_level=1,
                                                line_info=True, verbose=True))
    assert res.backend == "driver" and res.info_log.strip()
    y = np.ones(32, dtype=np.float32)
    np.testing.assert_array_equal(run(res.code, "doubler", y), 3 * y)


# --- code split over modules runs -----------------------------------------------------

def test_device_functions_calling_each_other_across_modules_run_correctly():
    a = kjit.compile(MOD_A, arch=dev_arch(), target="ptx", options=RDC, name="a.cu")
    b = kjit.compile(MOD_B, arch=dev_arch(), target="ptx", options=RDC, name="b.cu")
    res = link([a, b])  # auto: whichever linker suits this machine
    out = run(res.code, "bounce", np.zeros(32, dtype=np.int32))
    np.testing.assert_array_equal(out, [ping(i) for i in range(32)])


def test_lto_link_runs_correctly():
    arch = dev_arch()
    la = kjit.compile(LIB, arch=arch, target="ltoir", options=RDC)
    lb = kjit.compile(MAIN, arch=arch, target="ltoir", options=RDC)
    res = link([la, lb])
    assert res.backend == "nvjitlink"
    y = np.arange(32, dtype=np.float32)
    np.testing.assert_array_equal(run(res.code, "doubler", y), 2 * y + 1)


def test_device_side_launch_runs_with_the_device_runtime_added():
    if devrt.find() is None:
        pytest.skip("libcudadevrt.a not installed (pip install nvidia-cuda-runtime)")
    src = r'''
    extern "C" __global__ void child(int* p) { p[threadIdx.x] += 1; }
    extern "C" __global__ void parent(int* p) { if (threadIdx.x == 0) child<<<1, 32>>>(p); }
    '''
    res = link([kjit.compile(src, arch=dev_arch(), target="ptx", options=RDC)])
    assert res.device_runtime
    out = run(res.code, "parent", np.arange(32, dtype=np.int32))
    np.testing.assert_array_equal(out, np.arange(32) + 1)


# --- version skew: PTX newer than the driver ------------------------------------------

def _newer_ptx_than_driver() -> kjit.ObjectCode:
    """PTX whose .version the driver rejects but nvJitLink reads, or skip saying why not."""
    obj = kjit.compile(SQUARE, arch=dev_arch(), target="ptx", name="square.cu")
    dv = driver.driver_version()
    nj = nvjitlink.version()
    nj_cuda = 1000 * nj[0] + 10 * nj[1]
    have = obj.ptx_version
    if ptx_too_new(have, dv):
        if cuda_version_for_ptx(have) > nj_cuda:
            pytest.skip(f"NVRTC emits PTX {have[0]}.{have[1]}, newer than nvJitLink {nj[0]}.{nj[1]} "
                        "reads too: carry an nvJitLink as new as NVRTC")
        return obj
    newest = max((v for v in ((nj[0] - 4, m) for m in range(10))
                  if cuda_version_for_ptx(v) <= nj_cuda), default=None)
    if newest is None or not ptx_too_new(newest, dv):
        pytest.skip(f"NVRTC (PTX {have[0]}.{have[1]}), nvJitLink {nj[0]}.{nj[1]} and the driver "
                    f"(CUDA {dv // 1000}.{dv % 1000 // 10}) are the same age: no skew to test "
                    "(run with shared/tools/device-wheels.sh --skew)")
    # The newest ISA nvJitLink reads is a superset: this kernel is valid PTX at that version.
    code = re.sub(rb"^\.version \d+\.\d+", f".version {newest[0]}.{newest[1]}".encode(),
                  obj.code, count=1, flags=re.M)
    return kjit.ObjectCode(code, kind="ptx", name="square.cu")


def test_ptx_newer_than_the_driver_is_routed_to_nvjitlink_and_runs():
    ptx = _newer_ptx_than_driver()
    drv = driver.bindings()
    driver.ensure_context()
    with pytest.raises(DriverError) as info:  # the skew is real: the driver refuses this PTX
        driver.call(drv.cuModuleLoadData, ptx.code + b"\0")
    assert info.value.cuda_name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"

    res = link([ptx])
    assert res.backend == "nvjitlink"
    assert "newer than the driver" in res.reason
    y = np.linspace(-2, 2, 32, dtype=np.float32)
    np.testing.assert_allclose(run(res.code, "square", y), y * y)

    cub = ptx_to_cubin(ptx.code, dev_arch())  # what the module loader uses for such PTX
    np.testing.assert_allclose(run(cub.code, "square", y), y * y)


def test_forcing_the_driver_on_too_new_ptx_is_a_clear_link_error():
    ptx = _newer_ptx_than_driver()
    with pytest.raises(LinkError) as info:
        link([ptx], backend="driver")
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in str(info.value)
    assert info.value.input_name == "square.ptx"
