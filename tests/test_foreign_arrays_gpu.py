"""PyTorch tensors and CuPy arrays as kernel arguments, launch after launch: the first goes
through kjit's Python checks, which teach the C packer the array type; later ones are packed
in C. Both must give the same results and refuse the same mistakes."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import kjit
from kjit.errors import ArgumentError
from cupy_family import import_cupy

pytestmark = pytest.mark.gpu

AXPY = r'''
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}'''


def _framework(name):
    if name == "torch":
        torch = pytest.importorskip("torch")
        return (lambda a: torch.tensor(a, device="cuda"), lambda t: t.cpu().numpy(),
                lambda t: t.double(), lambda t: t.t(), torch.cuda.Stream(),
                lambda s: s.synchronize())
    cp = import_cupy()
    return (cp.asarray, cp.asnumpy, lambda t: t.astype(cp.float64), lambda t: t.T,
            cp.cuda.Stream(non_blocking=True), lambda s: s.synchronize())


@pytest.mark.parametrize("name", ["torch", "cupy"])
def test_repeated_launches_with_framework_arrays_stay_right(name):
    to_dev, to_host, _, _, stream, sync = _framework(name)
    k = kjit.load(kjit.compile(AXPY)).get_function("axpy")
    n = 1000
    x = np.arange(n, dtype=np.float32)
    xd, yd = to_dev(x), to_dev(np.zeros(n, np.float32))
    for _ in range(5):          # the first launch teaches the C packer, the rest use it
        k[kjit.cdiv(n, 128), 128, stream](0.5, xd, yd, n)
    sync(stream)
    np.testing.assert_allclose(to_host(yd), 2.5 * x)


@pytest.mark.parametrize("name", ["torch", "cupy"])
def test_after_learning_the_type_wrong_arrays_are_still_refused(name):
    to_dev, _, as_double, transpose, stream, sync = _framework(name)
    k = kjit.load(kjit.compile(AXPY)).get_function("axpy")
    xd, yd = to_dev(np.ones(64, np.float32)), to_dev(np.zeros(64, np.float32))
    launch = k[1, 64, stream]
    launch(1.0, xd, yd, 64)
    sync(stream)
    with pytest.raises(ArgumentError, match="float64"):
        launch(1.0, as_double(xd), yd, 64)
    with pytest.raises(ArgumentError, match="not C-contiguous"):
        launch(1.0, transpose(to_dev(np.ones((8, 8), np.float32))), yd, 64)


def test_a_tensor_that_requires_grad_gets_torchs_own_advice():
    torch = pytest.importorskip("torch")
    k = kjit.load(kjit.compile(AXPY)).get_function("axpy")
    x = torch.ones(8, device="cuda")
    y = torch.zeros(8, device="cuda")
    k[1, 8](1.0, x, y, 8)
    w = torch.ones(8, device="cuda", requires_grad=True)
    with pytest.raises(Exception, match="(?i)grad"):
        k[1, 8](1.0, w, y, 8)
    k[1, 8](1.0, w.detach(), y, 8)
    torch.cuda.synchronize()
    assert y.cpu().tolist() == [2.0] * 8


def test_a_learned_tensor_launch_never_enters_the_python_launcher(monkeypatch):
    """After the first launch, a tensor launch given no stream is packed, streamed and launched
    in C: the Python launcher (which would read the framework stream in Python) is not run,
    and every tensor a kernel must not get still reaches it, to be refused by name."""
    torch = pytest.importorskip("torch")
    from kjit.runtime import kernel as kernel_mod
    k = kjit.load(kjit.compile(AXPY)).get_function("axpy")
    x, y = torch.ones(256, device="cuda"), torch.zeros(256, device="cuda")
    launch = k[2, 128]
    assert type(getattr(launch, "__self__", None)).__name__ == "Launcher"
    p = torch.nn.Parameter(torch.ones(256, device="cuda"), requires_grad=False)
    launch(1.0, x, y, 256)   # the Python path learns torch.Tensor / float32
    launch(1.0, p, y, 256)   # and torch.nn.Parameter
    torch.cuda.synchronize()
    entered = []
    real = kernel_mod.framework_stream
    monkeypatch.setattr(kernel_mod, "framework_stream", lambda *a: entered.append(1) or real(*a))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(10):
            launch(1.0, x, y, 256)
        launch(1.0, p, y, 256)
    s.synchronize()
    assert entered == []
    assert y.cpu().tolist() == [13.0] * 256
    for bad, pattern in [(x.double(), "float64"), (torch.ones(512, device="cuda")[::2], "not C-contiguous"),
                         (x.cpu(), "on cpu"), (x.clone().requires_grad_(), "requires grad")]:
        with pytest.raises(ArgumentError, match=r"'x'.*" + pattern):
            launch(1.0, bad, y, 256)
    assert len(entered) == 4


def test_the_one_call_tensor_reader_answers_as_pytorch_does():
    torch = pytest.importorskip("torch")
    from kjit.runtime import torch_facts, torch_shim
    k = kjit.load(kjit.compile(AXPY)).get_function("axpy")
    x, y = torch.ones(64, device="cuda"), torch.zeros(64, device="cuda")
    k[1, 64](1.0, x, y, 64)   # the Python path hands the C packer the shim, then the reader
    if torch_facts._compiler() is None:
        pytest.skip("no C++ compiler: tensors are read through the shim alone")
    assert torch_facts.wait(), torch_facts.why_not()
    base = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)
    samples = [base, base[1:], base.t(), base[:, ::2], base.half(), base.to(torch.int64), base.bool(),
               base.to(torch.bfloat16), base.to(torch.complex64), base[:0], base.clone().requires_grad_(),
               torch.nn.Parameter(base.clone()), base.view(-1)[5:]]
    for t in samples:
        f = torch_facts.facts(t)
        assert f is not None
        assert ((f.data or 0), f.device_index, bool(f.contiguous), f.numel, f.storage_offset,
                f.storage_nbytes, bool(f.requires_grad), f.dtype, bool(f.nested)) == (
            t.data_ptr(), t.get_device(), t.is_contiguous(), t.numel(), t.storage_offset(),
            t.untyped_storage().nbytes(), t.requires_grad, torch_shim.dtype_code(t), False), t


@pytest.mark.parametrize("reader", ["one call", "shim"])
def test_either_tensor_reader_launches_in_c_and_hands_every_wrong_tensor_to_python(monkeypatch, reader):
    """The C packer reads a torch.Tensor through one call compiled against this PyTorch
    (kjit/runtime/torch_facts.py) where a C++ compiler is found, else through PyTorch's C shim.
    Either way a right tensor, a view into its storage included, launches in C, and every
    tensor a kernel must not get goes to the Python path, which refuses it by name."""
    torch = pytest.importorskip("torch")
    from kjit.runtime import kernel as kernel_mod
    from kjit.runtime import torch_facts
    from kjit.runtime.libcuda import c_function
    k = kjit.load(kjit.compile(AXPY)).get_function("axpy")
    launch = k[2, 128]
    x, y = torch.arange(512, dtype=torch.float32, device="cuda"), torch.zeros(256, device="cuda")
    launch(1.0, x[:256], y, 256)   # teaches the C packer torch.Tensor: the shim, then the reader
    if torch_facts._compiler() is None:
        pytest.skip("no C++ compiler: tensors are read through the shim alone")
    assert torch_facts.wait(), torch_facts.why_not()
    register, address = c_function("register_torch_facts"), torch_facts.address()
    if reader == "shim":   # the reader set aside for this test, then put back
        register(0)
    try:
        entered = []
        real = kernel_mod.framework_stream
        monkeypatch.setattr(kernel_mod, "framework_stream", lambda *a: entered.append(1) or real(*a))
        p = torch.nn.Parameter(x[:256].clone(), requires_grad=False)
        launch(1.0, p, y, 256)   # learns torch.nn.Parameter
        torch.cuda.synchronize()
        entered.clear()
        for _ in range(3):
            launch(1.0, x[256:], y, 256)   # a view: its storage offset is 256 elements
        launch(2.0, p, y, 256)
        torch.cuda.synchronize()
        assert entered == []
        want = 4 * np.arange(256) + 3 * np.arange(256, 512)
        np.testing.assert_array_equal(y.cpu().numpy(), want.astype(np.float32))
        bare = torch.ones(256, device="cuda")
        bare.untyped_storage().resize_(0)
        with warnings.catch_warnings():   # nested tensors are a prototype and say so
            warnings.simplefilter("ignore")
            nested = torch.nested.nested_tensor([torch.ones(128), torch.ones(128)], device="cuda")
        wrong = [(x.double()[:256], "float64"), (x[::2], "not C-contiguous"), (x[:256].cpu(), "on cpu"),
                 (x[:256].clone().requires_grad_(), "requires grad"), (nested, "nested"),
                 (x[:256].to_sparse(), "sparse"), (bare, "do not lie in its storage")]
        for bad, pattern in wrong:
            with pytest.raises(ArgumentError, match=r"'x'.*" + pattern):
                launch(1.0, bad, y, 256)
        assert len(entered) == len(wrong)
    finally:
        register(address)


PUT = r'''extern "C" __global__ void put(int a, const float* t, int* out) { out[0] = a; }'''


def test_a_launch_made_by_python_code_that_reading_an_argument_runs_keeps_both_right():
    # Reading a tensor subclass's dtype or requires_grad runs its __torch_function__: Python
    # code, which may launch the very launcher that is reading it. That inner launch must not
    # write the parameter buffer the outer one is filling (nor leave it believing its bytes
    # are in place), and the outer one launches with its own arguments.
    torch = pytest.importorskip("torch")
    k = kjit.load(kjit.compile(PUT)).get_function("put")
    launch = k[1, 1]
    out, inner_out = kjit.zeros(1, "int32"), kjit.zeros(1, "int32")
    plain = torch.zeros(4, device="cuda")
    armed = []

    class Hooked(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if armed:
                armed.pop()
                launch(7, plain, inner_out)
            return super().__torch_function__(func, types, args, kwargs or {})
    Hooked.__module__ = "torch.hooked"   # a type of PyTorch's own: the C packer reads it
    t = torch.zeros(4, device="cuda").as_subclass(Hooked)
    a = 5
    launch(a, plain, out)   # learns torch.Tensor
    launch(a, t, out)       # learns the subclass; from here on both are read in C
    launch(a, t, out)
    armed.append(1)
    launch(a, t, out)       # `a` is the object written last: the outer launch keeps its bytes
    torch.cuda.synchronize()
    assert not armed        # the hook ran, inside the launch
    assert (int(out.get()[0]), int(inner_out.get()[0])) == (5, 7)


def test_cupy_arrays_are_read_in_place_where_cupys_own_getters_answer():
    """kjit reads a CuPy array's dtype, contiguity and address from the fields CuPy's getters
    return (their offsets observed on probe arrays, cupy_capi.py): arrays the probes never saw
    agree with the getters, and the C packer writes their addresses and declines the rest."""
    import ctypes
    import struct

    from kjit.runtime import cupy_capi
    from kjit.runtime.libcuda import c_function
    from kjit.runtime.memory import DeviceArray
    cp = import_cupy()
    layout = cupy_capi.array_layout()
    assert layout is not None, "CuPy's array fields were not found in one place each"

    class Sub(cp.ndarray):
        pass

    base = cp.arange(4096, dtype=cp.float32)
    arrays = [base[7:], base.reshape(64, 64)[3], cp.zeros((5, 3), cp.float64).T, base.view(cp.int32)[:9],
              cp.empty(0, cp.float32), base[::5], base[3:].view(Sub)]
    for a in arrays:
        assert ctypes.c_void_p.from_address(id(a) + layout.dtype).value == id(a.dtype)
        assert ctypes.c_int32.from_address(id(a) + layout.contiguous).value == a._c_contiguous
        assert ctypes.c_void_p.from_address(id(a) + layout.data).value == id(a.data)
        assert ctypes.c_uint64.from_address(id(a.data) + layout.ptr).value == a.data.ptr
        assert ctypes.c_int32.from_address(id(a.data) + layout.device_id).value == a.data.device_id
    y = cp.zeros(64, cp.float32)
    kjit.load(kjit.compile(AXPY)).get_function("axpy")[1, 64](1.0, y, y, 64)   # learns CuPy arrays
    pack = c_function("pack")
    buf = ctypes.create_string_buffer(8)

    def packed(a, typestr="<f4"):
        r = pack(struct.pack("<ii", 20, 0), ((typestr, 0),), (a,), ctypes.addressof(buf), DeviceArray)
        return r, struct.unpack("<Q", buf.raw)[0]

    assert packed(base[7:]) == (0, base.data.ptr + 28)
    assert packed(base.reshape(64, 64)[3]) == (0, base.data.ptr + 3 * 64 * 4)
    assert packed(base[::5])[0] == 1, "a strided array must go to the Python path"
    assert packed(base, "<f8")[0] == 1, "float32 memory must not pass for float64"
    # the packer reads the offsets it was handed: one pointing elsewhere writes another value
    register = c_function("register_cupy_layout")
    register(*layout._replace(ptr=layout.device_id))
    try:
        assert packed(base[7:])[1] != base.data.ptr + 28
    finally:
        register(*layout)
    assert packed(base[7:]) == (0, base.data.ptr + 28)
