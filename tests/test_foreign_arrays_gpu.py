"""PyTorch tensors and CuPy arrays as kernel arguments, launch after launch: the first goes
through kjit's Python checks, which teach the C packer the array type; later ones are packed
in C. Both must give the same results and refuse the same mistakes."""
from __future__ import annotations

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
