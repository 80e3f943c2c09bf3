"""Multi-device rules that hold without a GPU: which device an array says it is on, the
messages for sticky and capture errors, and the C extension's direct libcuda queries.
The GPU side of the same rules is in test_devices_gpu.py."""
from __future__ import annotations

import pytest

from kjit import driver
from kjit.errors import ArgumentError, DriverError
from kjit.runtime import libcuda
from kjit.runtime.cdecl import parse_signatures
from kjit.runtime.dlpack import kDLCUDA, kDLCUDAManaged, to_capsule
from kjit.runtime.memory import DeviceArray
from kjit.runtime.params import Packer, layout


def packer(device: int) -> Packer:
    sig = parse_signatures('extern "C" __global__ void k(const float* x) {}')["k"]
    return Packer("k", layout([p.ctype for p in sig.params], [p.name for p in sig.params], None),
                  device)


class DlpackArray:
    """A foreign array known only through DLPack, declaring the device type and id given."""

    def __init__(self, dev_type: int, dev_id: int):
        # describes memory at 4096 (allocates nothing, never dereferenced)
        self.array = DeviceArray(4, "float32", ptr=4096, device=dev_id)
        self.device = (dev_type, dev_id)

    def __dlpack__(self, **kw):
        return to_capsule(self.array)

    def __dlpack_device__(self):
        return self.device


def test_dlpack_array_of_another_device_is_refused_naming_both():
    with pytest.raises(ArgumentError, match="on device 1 but this launch runs on device 0") as err:
        packer(0).convert_all((DlpackArray(kDLCUDA, 1),), [])
    assert "enable_peer_access" in str(err.value)   # says how to use it in place on purpose
    assert packer(1).convert_all((DlpackArray(kDLCUDA, 1),), []) == [4096]


def test_managed_memory_is_usable_from_every_device():
    assert packer(0).convert_all((DlpackArray(kDLCUDAManaged, 1),), []) == [4096]


def test_an_address_no_driver_knows_has_no_device():
    # host memory, or no driver at all: kjit cannot tell, so it does not refuse
    assert libcuda.pointer_device(4096) is None
    assert libcuda.pointer_device(0) is None
    assert isinstance(libcuda.current_context(), int)


def test_extension_queries_need_binding_first():
    if driver.available():
        pytest.skip("a CUDA driver is present: the GPU tests use the bound queries")
    _launch = pytest.importorskip("kjit.runtime._launch", reason="C launch call not built here")
    for call in (_launch.current_context, lambda: _launch.pointer_device(4096)):
        with pytest.raises(RuntimeError, match="bind"):
            call()


@pytest.fixture
def fresh_sticky_record():
    saved = dict(driver._broken)
    driver._broken.clear()
    yield
    driver._broken.clear()
    driver._broken.update(saved)


def raised(code: int, call: str, context: int) -> DriverError:
    with pytest.raises(DriverError) as err:
        driver.raise_for(code, call, context=context)
    return err.value


def test_a_sticky_error_says_the_process_is_unusable_and_later_errors_say_the_same(
        fresh_sticky_record):
    """After a fault on one device the driver fails every later call of the process, in every
    context of every device (tests/test_devices_gpu.py sees it on two GPUs): the first error
    says so, and every later one, in any context, names that cause."""
    ctx, other = 0x7F00_0000_1000, 0x7F00_0000_2000   # two contexts, as keys only
    first = raised(700, "cuCtxSynchronize", ctx)
    assert first.cuda_name == "CUDA_ERROR_ILLEGAL_ADDRESS" and first.code == 700
    assert "sticky" in str(first) and "new process" in str(first)
    assert "every other device" in str(first)
    again = raised(700, "cuMemAlloc", ctx)                 # the same error from a later call
    assert "unusable in this process since an earlier CUDA_ERROR_ILLEGAL_ADDRESS" in str(again)
    assert "(reported by cuCtxSynchronize)" in str(again)
    unrelated = raised(201, "cuModuleLoadDataEx", ctx)      # an unrelated code in that context
    assert unrelated.cuda_name == "CUDA_ERROR_ILLEGAL_ADDRESS" and unrelated.call == "cuModuleLoadDataEx"
    assert "this call returned CUDA_ERROR_INVALID_CONTEXT" in str(unrelated)
    assert "new process" in str(unrelated)
    elsewhere = raised(700, "cuDevicePrimaryCtxRetain", other)   # another device's context
    assert "unusable in this process since an earlier CUDA_ERROR_ILLEGAL_ADDRESS" in str(elsewhere)


def test_without_a_sticky_error_other_errors_say_nothing_of_one(fresh_sticky_record):
    err = raised(1, "cuMemAlloc", 0x7F00_0000_2000)
    assert err.cuda_name == "CUDA_ERROR_INVALID_VALUE" and "unusable" not in str(err)
    assert "sticky" not in str(err)


def test_capture_errors_say_what_a_capture_cannot_hold():
    err = raised(906, "cuMemsetD8", 0x7F00_0000_3000)
    assert err.cuda_name == "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"
    assert "stream capture" in str(err) and "before or after the capture" in str(err)


def test_integer_codes_get_their_names(fresh_sticky_record):
    assert raised(719, "cuLaunchKernel", 0x7F00_0000_4000).cuda_name == "CUDA_ERROR_LAUNCH_FAILED"


class CaiArray:
    """A foreign array seen through the CUDA array interface, optionally declaring its
    DLPack device as PyTorch and CuPy arrays do (address 4096: never dereferenced)."""

    def __init__(self, dlpack_device=None):
        self.__cuda_array_interface__ = {"data": (4096, False), "typestr": "<f4", "shape": (4,),
                                         "strides": None, "version": 3}
        if dlpack_device is not None:
            self.__dlpack_device__ = lambda: dlpack_device


def test_a_declared_dlpack_device_decides_for_interface_arrays():
    with pytest.raises(ArgumentError, match="on device 1 but this launch runs on device 0"):
        packer(0).convert_all((CaiArray((kDLCUDA, 1)),), [])
    assert packer(1).convert_all((CaiArray((kDLCUDA, 1)),), []) == [4096]
    assert packer(0).convert_all((CaiArray((kDLCUDAManaged, 1)),), []) == [4096]
    # no declared device and no driver that knows the address: nothing to refuse on
    assert packer(0).convert_all((CaiArray(),), []) == [4096]


def test_a_later_fault_of_another_kind_reports_the_first(fresh_sticky_record):
    ctx = 0x7F00_0000_5000
    raised(700, "cuCtxSynchronize", ctx)
    later = raised(719, "cuMemsetD8", ctx)
    assert later.cuda_name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert "this call returned CUDA_ERROR_LAUNCH_FAILED" in str(later)


def test_the_device_of_a_launch_is_the_one_its_arrays_live_on():
    """A launch runs where its arrays are, as a PyTorch operator does; scalars, kjit.ptr and
    host copies name no device; arrays of two devices are refused, each parameter named."""
    import kjit
    import numpy as np
    from kjit.runtime.pointers import arguments_device
    sig = parse_signatures('extern "C" __global__ void k(float a, const float* x, float* y, '
                           'float* z, int n) {}')["k"]
    slots = tuple(Packer("k", layout([p.ctype for p in sig.params], [p.name for p in sig.params],
                                     None), 0).slots)
    on = {d: DeviceArray(4, np.float32, ptr=4096 * (d + 1), device=d) for d in (0, 1, 3)}
    assert arguments_device("k", slots, (1.0, kjit.ptr(64), kjit.ptr(128), kjit.ptr(8), 4)) is None
    assert arguments_device("k", slots, (1.0, on[3], on[3], kjit.ptr(8), 4)) == 3
    assert arguments_device("k", slots, (1.0, kjit.In(np.ones(4, np.float32)), on[1],
                                         kjit.ptr(8), 4)) == 1
    with pytest.raises(ArgumentError) as err:
        arguments_device("k", slots, (1.0, on[1], on[0], on[1], 4))
    said = str(err.value)
    assert "arrays are on 2 devices ('y' on device 0; 'x', 'z' on device 1)" in said, said
    assert "kjit.Device(1).enable_peer_access(0)" in said and "kjit.ptr(address)" in said
