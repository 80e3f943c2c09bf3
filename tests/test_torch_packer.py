"""The C packer with real PyTorch tensors, on the CPU: it writes a learned tensor type's
address read through torch's own C accessors, declines (for the Python path to name the
parameter and say what to do) every tensor a kernel must not get, and follows a tensor type
whose accessors are replaced after it was learned."""
from __future__ import annotations

import ctypes
import struct

import pytest

from kjit.errors import ArgumentError
from kjit.runtime.libcuda import c_function
from kjit.runtime.memory import DeviceArray

torch = pytest.importorskip("torch")
pack, register = c_function("pack"), c_function("register_foreign")
if pack is None:
    pytest.skip("the C extension (kjit/runtime/_launch.c) is not built", allow_module_level=True)

SPEC = struct.pack("<ii", 20, 0)   # one typed pointer at offset 0
CPU_F32 = (("<f4", -1),)           # a token a CPU tensor matches: float32 on "device -1"


def _pack(value, tokens=CPU_F32):
    buf = ctypes.create_string_buffer(8)
    r = pack(SPEC, tokens, (value,), ctypes.addressof(buf), DeviceArray)
    return r, struct.unpack("<Q", buf.raw)[0]


@pytest.fixture(autouse=True)
def learned():
    for cls in (torch.Tensor, torch.nn.Parameter):
        register(cls, 1, torch.float32, "<f4")
        register(cls, 1, torch.float64, "<f8")


def test_a_learned_tensor_is_written_in_c():
    t = torch.ones(16)
    assert _pack(t) == (0, t.data_ptr())
    p = torch.nn.Parameter(torch.ones(4), requires_grad=False)
    assert _pack(p) == (0, p.data_ptr())
    t.set_(torch.zeros(32))   # storage swapped in place: the new address, never a cached one
    assert _pack(t) == (0, t.data_ptr())


@pytest.mark.parametrize("why, value", [
    ("another element type", lambda: torch.ones(4, dtype=torch.float64)),
    ("an element type never learned", lambda: torch.ones(4, dtype=torch.int16)),
    ("a strided view", lambda: torch.ones(4, 2)[:, 0]),
    ("requires grad", lambda: torch.ones(4, requires_grad=True)),
    ("a parameter that requires grad", lambda: torch.nn.Parameter(torch.ones(4))),
])
def test_what_a_kernel_must_not_get_is_left_to_the_python_path(why, value):
    assert _pack(value())[0] == 1, why


def test_a_tensor_on_another_device_than_the_kernels_is_declined():
    assert _pack(torch.ones(4), tokens=(("<f4", 0),))[0] == 1   # a CPU tensor, a device-0 kernel


def test_replaced_accessors_are_followed():
    class Tracked(torch.Tensor):
        pass

    register(Tracked, 1, torch.float32, "<f4")
    t = torch.ones(4).as_subclass(Tracked)
    assert _pack(t) == (0, t.data_ptr())
    Tracked.data_ptr = lambda self: 0x1234
    Tracked.is_contiguous = lambda self, memory_format=None: True
    assert _pack(t) == (0, 0x1234)
    del Tracked.data_ptr
    assert _pack(t) == (0, torch.Tensor.data_ptr(t))
    Tracked.is_contiguous = lambda self, memory_format=None: False
    assert _pack(t)[0] == 1


def test_the_python_path_names_the_parameter_for_what_c_declined():
    from kjit.runtime.cdecl import parse_signatures
    from kjit.runtime.params import convert
    from kjit.runtime.slots import ParamSlot
    from kjit.runtime.pointers import tensor_pointer
    sig = parse_signatures('extern "C" __global__ void k(const float* x, int n) {}')["k"]
    slot = ParamSlot(0, "x", 0, 8, sig.params[0].ctype)
    with pytest.raises(ArgumentError, match=r"parameter 0 'x' \(const float\*\): got a tensor on "
                                            r"cpu.*x\.to\('cuda:0'\)"):
        convert(slot, torch.ones(4), 0, [])
    meta = torch.ones(4, device="meta")   # checked as if on the kernel's device
    for value, pattern in [
            (meta.double(), r"'x'.*holds torch\.float64.*reads float32.*x\.to\(torch\.float32\)"),
            (torch.ones(4, 2, device="meta")[:, 0], r"'x'.*not C-contiguous.*x\.contiguous\(\)"),
            (meta.requires_grad_(), r"'x'.*requires grad.*x\.detach\(\).*as_torch_op")]:
        with pytest.raises(ArgumentError, match=pattern):
            tensor_pointer(slot, value, 0, check_only=True)


def test_bfloat16_and_float8_tensors_meet_their_cuda_types():
    from kjit.runtime.cdecl import parse_signatures
    from kjit.runtime.pointers import tensor_pointer
    from kjit.runtime.slots import ParamSlot
    sig = parse_signatures('extern "C" __global__ void k(const __nv_bfloat16* x, '
                           '__nv_fp8_e4m3* y, void* z) {}')["k"]
    x, y, z = (ParamSlot(i, p.name, 0, 8, p.ctype) for i, p in enumerate(sig.params))
    meta = torch.ones(4, device="meta")
    for slot, value in [(x, meta.bfloat16()), (x, meta.to(torch.uint16)),   # its bits
                        (y, meta.to(torch.float8_e4m3fn)), (z, meta.bfloat16())]:
        assert tensor_pointer(slot, value, 0, check_only=True) == 0
    for slot, value, pattern in [
            (x, meta.half(), r"'x'.*holds torch\.float16 but the kernel reads bfloat16; "
                             r"convert it: x\.to\(torch\.bfloat16\)"),
            (y, meta.to(torch.float8_e5m2), r"'y'.*holds torch\.float8_e5m2.*reads float8_e4m3fn"),
            (y, meta.to(torch.float8_e4m3fnuz), r"'y'.*holds torch\.float8_e4m3fnuz.*reads float8_e4m3fn"),
            (z, meta.to(torch.float8_e4m3fnuz), r"'z'.*no element type for torch\.float8_e4m3fnuz")]:
        with pytest.raises(ArgumentError, match=pattern):
            tensor_pointer(slot, value, 0, check_only=True)


SHIM_SCRIPT = r'''
import ctypes, struct, sys, torch
from kjit.runtime import torch_shim
from kjit.runtime.libcuda import c_function
from kjit.runtime.memory import DeviceArray

lib = torch_shim._library()
assert lib is not None, "this PyTorch has no aoti_torch_* shim"
sample = torch.ones(4)
host = torch_shim._ask(lib, "get_device_type", sample, ctypes.c_int32)
strided = torch_shim._ask(lib, "get_layout", sample, ctypes.c_int32)
addrs = tuple(ctypes.cast(getattr(lib, "aoti_torch_" + n), ctypes.c_void_p).value
              for n in torch_shim._READERS)
# the host's device type stands in for CUDA's: the packer's checks are the same C calls
offset = torch_shim._tensor_offset(sample, torch.empty(4)) if sys.argv[1] == "observed" else 0
assert offset or sys.argv[1] == "_cdata", "the tensor object's layout was not observed"
c_function("register_torch_shim")(addrs, 0, host, strided, offset)
register, pack = c_function("register_foreign"), c_function("pack")
code = lambda dtype: torch_shim._ask(lib, "get_dtype", torch.ones(1, dtype=dtype), ctypes.c_int32)
for cls in (torch.Tensor, torch.nn.Parameter):
    for dtype, typestr, size in ((torch.float32, "<f4", 4), (torch.float64, "<f8", 8),
                                 (torch.bfloat16, "bfloat16", 2), (torch.uint16, "<u2", 2)):
        register(cls, 1, dtype, typestr, code(dtype), size)

def packed(value, token=("<f4", -1)):
    buf = ctypes.create_string_buffer(8)
    r = pack(struct.pack("<ii", 20, 0), (token,), (value,), ctypes.addressof(buf), DeviceArray)
    return r, struct.unpack("<Q", buf.raw)[0]

t = torch.ones(16)
assert packed(t) == (0, t.data_ptr())
view = t[3:]   # a dense view: its own address, past the storage's start
assert packed(view) == (0, view.data_ptr()) and view.data_ptr() != t.data_ptr()
t.set_(torch.zeros(32))   # storage swapped in place: the new address, never a cached one
assert packed(t) == (0, t.data_ptr())
torch.Tensor.data_ptr = lambda self: 0x1234   # what the accessors would answer now
try:
    assert packed(t) == (0, torch._C.TensorBase.data_ptr(t))
finally:
    del torch.Tensor.data_ptr
p = torch.nn.Parameter(torch.ones(4), requires_grad=False)
assert packed(p) == (0, p.data_ptr())
d = torch.ones(4, dtype=torch.float64)
assert packed(d, ("<f8", -1)) == (0, d.data_ptr())
def packed_bf16(value):   # a __nv_bfloat16* slot: its token and its bits'
    buf = ctypes.create_string_buffer(8)
    r = pack(struct.pack("<ii", 21, 0), ((("bfloat16", -1), ("<u2", -1)),), (value,),
             ctypes.addressof(buf), DeviceArray)
    return r, struct.unpack("<Q", buf.raw)[0]

for value in (torch.ones(4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.uint16)):
    assert packed_bf16(value) == (0, value.data_ptr())
assert packed_bf16(torch.ones(4, dtype=torch.float16))[0] == 1
gone = torch.ones(8)[2:]
gone.untyped_storage().resize_(0)   # its elements no longer lie in its storage
for why, value, token in [
        ("another element type", d, ("<f4", -1)),
        ("an element type never learned", torch.ones(4, dtype=torch.int16), ("<i2", -1)),
        ("a strided view", torch.ones(4, 2)[:, 0], ("<f4", -1)),
        ("requires grad", torch.ones(4, requires_grad=True), ("<f4", -1)),
        ("a parameter that requires grad", torch.nn.Parameter(torch.ones(4)), ("<f4", -1)),
        ("another device", torch.ones(4), ("<f4", 0)),
        ("sparse", torch.ones(4).to_sparse(), ("<f4", -1)),
        ("meta", torch.ones(4, device="meta"), ("<f4", -1)),
        ("nested", torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), ("<f4", -1)),
        ("a storage resized to nothing", gone, ("<f4", -1))]:
    assert packed(value, token)[0] == 1, why
got = []   # a functionalized view: its address is its offset from a storage with no memory
torch.func.functionalize(lambda t: got.append(packed(t[2:])[0]))(torch.ones(8))
assert got == [1], got
print("ok")
'''


@pytest.mark.parametrize("handle", ["observed", "_cdata"])
def test_torch_tensors_are_read_through_pytorchs_c_shim(handle):
    """The shim path (torch.Tensor and Parameter once kjit/runtime/torch_shim.py has checked
    the shim on a CUDA tensor) on host tensors, with the host's device type registered as the
    device type to accept: the same addresses as PyTorch's accessors, and every tensor a kernel
    must not get declined, for the Python path to name. The at::Tensor handle is found both
    ways: in the tensor object where its place was observed, and through `_cdata`."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", SHIM_SCRIPT, handle], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_shim_is_not_taken_for_a_host_tensor():
    from kjit.runtime import torch_shim
    lib = torch_shim._library()
    if lib is None:
        pytest.skip("this PyTorch has no aoti_torch_* shim")
    assert torch_shim._agrees(lib, torch.ones(4)) is None   # its device type is the host's


def test_lazy_views_and_bits_are_named_before_a_launch():
    from kjit.runtime.cdecl import parse_signatures
    from kjit.runtime.pointers import tensor_pointer
    from kjit.runtime.slots import ParamSlot
    sig = parse_signatures('extern "C" __global__ void k(const float* x, unsigned short* u, '
                           'void* z) {}')["k"]
    x, u, z = (ParamSlot(i, p.name, 0, 8, p.ctype) for i, p in enumerate(sig.params))
    meta = torch.ones(4, device="meta")
    for slot, value, pattern in [
            (z, torch.ones(4, dtype=torch.complex64, device="meta").conj(),
             r"'z'.*lazy conjugate view.*x\.resolve_conj\(\)"),
            (x, torch._neg_view(meta), r"'x'.*lazy negative view.*x\.resolve_neg\(\)"),
            (u, meta.bfloat16(), r"'u'.*holds torch\.bfloat16 but the kernel reads uint16; "
                                 r"pass its bits: x\.view\(torch\.uint16\)")]:
        with pytest.raises(ArgumentError, match=pattern):
            tensor_pointer(slot, value, 0, check_only=True)


def test_arrays_whose_interface_raises_are_named_not_crashed_on():
    """PyTorch raises from __cuda_array_interface__ for bfloat16 and float8 tensors: a scalar
    parameter given one says what it got, and the tuner's buffers take tensors directly (on
    the GPU only)."""
    from kjit.runtime.cdecl import parse_signatures
    from kjit.runtime.params import convert
    from kjit.runtime.slots import ParamSlot
    from kjit.tune.timing import device_buffer

    class Refuses:
        @property
        def __cuda_array_interface__(self):
            raise KeyError(torch.float8_e4m3fn)

    n = parse_signatures('extern "C" __global__ void k(int n) {}')["k"].params[0]
    slot = ParamSlot(0, "n", 0, 4, n.ctype)
    with pytest.raises(ArgumentError, match=r"'n'.*expected an integer, got Refuses"):
        convert(slot, Refuses(), 0, [])
    with pytest.raises(ArgumentError, match=r"'n'.*expected an integer.*kernels take no pointers here"):
        convert(slot, torch.ones(4).to(torch.float8_e4m3fn), 0, [])
    with pytest.raises(ArgumentError, match=r"'t'.*restore_value/reset_to_zero.*tensor on cpu"):
        device_buffer("t", torch.ones(4, dtype=torch.bfloat16))   # never a host address


def test_an_untyped_parameter_never_takes_a_host_tensors_address():
    from kjit.runtime.aggregates import raw_bytes
    from kjit.runtime.slots import ParamSlot
    with pytest.raises(ArgumentError, match=r"'p'.*does not know this parameter's C type"):
        raw_bytes(ParamSlot(0, "p", 0, 8, None), torch.ones(4))
