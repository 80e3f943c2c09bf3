"""kjit as a PyTorch user meets it: launches follow torch's (and CuPy's) current stream, are
captured by torch.cuda.graph and CuPy captures without naming the stream, kernels become
operators that torch.compile keeps in one graph (CUDA graphs included) with a backward, a
plain launch in a compiled function is a graph break, and wrong tensors are refused with the
parameter's name."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import kjit
from kjit.errors import ArgumentError

from conftest import SAXPY
from cupy_family import import_cupy

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

N = 1 << 16
GRID = kjit.cdiv(N, 256)
SPIN_NS = 50_000_000   # the fill kernel waits this long before writing


@kjit.kernel
def slow_fill():
    # every thread waits ~50 ms before writing: work queued behind it on its stream must wait
    return r'''
    extern "C" __global__ void slow_fill(float* x, float v, int n, long long spin_ns) {
        unsigned long long start, now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
        do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
        while (now - start < (unsigned long long)spin_ns);
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] = v;
    }'''


@kjit.kernel
def add_one():
    return r'''
    extern "C" __global__ void add_one(float* x, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] += 1.0f;
    }'''


@kjit.kernel
def saxpy():
    return SAXPY


@kjit.kernel
def scale():
    return r'''
    extern "C" __global__ void scale(const double* x, const double* w, double* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] * w[i] * w[i];
    }'''


def _grid(*args):
    return (kjit.cdiv(args[-1], 256),)


# --- the current stream ----------------------------------------------------------------

@pytest.mark.parametrize("route", ["C launcher", "Python launcher"])
def test_a_launch_without_a_stream_runs_on_torchs_current_stream(route, monkeypatch):
    inc = add_one
    if route == "Python launcher":   # the launcher kjit uses without its C extension
        monkeypatch.setenv("KJIT_LAUNCH", "bindings")
        inc = kjit.kernel(add_one.source_fn, name="add_one")
    s = torch.cuda.Stream()
    for i in range(4):   # the first launch goes through Python, the later ones through C
        x = torch.zeros(N, device="cuda")
        torch.cuda.synchronize()
        slow_fill[GRID, 256, s](x, 5.0, N, SPIN_NS)
        with torch.cuda.stream(s):
            if i < 3:
                inc[GRID, 256](x, N)   # must queue behind the fill on s, not race it
            else:
                inc.launch(GRID, 256, x, N)
        s.synchronize()
        assert torch.all(x == 6.0), "the increment ran before the fill finished"


def _increments_follow_cupys_stream(cp):
    """An increment launched given no stream inside `with s:` queues behind a slow fill on s."""
    s = cp.cuda.Stream(non_blocking=True)
    for _ in range(3):   # the first launch may go through Python, the later ones through C
        x = cp.zeros(N, cp.float32)
        cp.cuda.Device().synchronize()
        slow_fill[GRID, 256, s](x, 5.0, N, SPIN_NS)
        with s:
            add_one[GRID, 256](x, N)
        s.synchronize()
        assert bool((x == 6.0).all()), "the increment ran before the fill finished"


def test_a_launch_without_a_stream_runs_on_cupys_current_stream():
    _increments_follow_cupys_stream(import_cupy())


@pytest.mark.parametrize("reader", ["CuPy's C reader", "CuPy's Python getter"])
def test_cupys_current_stream_is_read_without_a_python_call(reader, monkeypatch):
    """The C launcher reads CuPy's current stream through get_stream_ptr, the C function CuPy's
    own kernels read it with, once kjit has checked it against cupy.cuda.get_current_stream;
    the Python getter it replaces is kept for a CuPy without it, and both follow the stream."""
    cp = import_cupy()
    from kjit.runtime import cupy_capi, libcuda
    from kjit.runtime import kernel as kernel_mod
    from kjit.runtime.stream import CUPY, stream_getter
    capsule = cupy_capi.stream_capsule()
    x = cp.zeros(N, cp.float32)
    add_one[GRID, 256](x, N)   # the Python path learns CuPy arrays and registers the reader
    register, current = libcuda.c_function("register_stream"), libcuda.c_function("current_stream")
    asked = []

    def getter(device):
        asked.append(device)
        return cp.cuda.get_current_stream(device)

    register(CUPY, getter, capsule if reader == "CuPy's C reader" else None)
    assert capsule is not None and cupy_capi.agrees(lambda device: current(CUPY, device)), \
        "this CuPy's get_stream_ptr was not found, or disagreed with CuPy"
    entered = []   # launches that went to the Python launcher instead of C's
    real = kernel_mod.framework_stream
    monkeypatch.setattr(kernel_mod, "framework_stream", lambda *a: entered.append(1) or real(*a))
    try:
        _increments_follow_cupys_stream(cp)
    finally:
        register(CUPY, stream_getter(CUPY), capsule)
    assert entered == [], "a launch went through the Python launcher"
    if reader == "CuPy's C reader":
        assert asked == [], "the C launcher called CuPy's Python getter"
    else:
        assert asked and set(asked) == {0}


def test_kjit_arrays_keep_the_legacy_stream_and_mixed_streams_are_refused():
    cp = import_cupy()
    y = kjit.zeros(N, np.float32)
    add_one[GRID, 256](y, N)   # kjit arrays: the legacy stream, as before
    kjit.synchronize()
    assert (y.get() == 1.0).all()
    t = torch.zeros(N, device="cuda")
    c = cp.zeros(N, cp.float32)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), pytest.raises(ArgumentError, match="current streams differ"):
        saxpy[GRID, 256](1.0, c, t, N)
    saxpy[GRID, 256](1.0, c, t, N)   # both on their default streams: no conflict
    torch.cuda.synchronize()


# --- graph capture -------------------------------------------------------------------------

def test_torch_graph_captures_launches_that_name_no_stream():
    x = torch.randn(N, device="cuda")
    y = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up, as PyTorch asks before capturing
        saxpy[GRID, 256](2.0, x, y, N)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(g):
            y.zero_()
            saxpy[GRID, 256](2.0, x, y, N)
            saxpy[GRID, 256](1.0, x, y, N)
    assert not [w for w in caught if "empty" in str(w.message)], [str(w.message) for w in caught]
    for _ in range(3):
        new = torch.randn(N, device="cuda")
        x.copy_(new)
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, 3 * new)


def test_a_kernels_first_launch_may_happen_inside_a_capture():
    @kjit.kernel
    def twice():
        return r'''
        extern "C" __global__ void twice(const float* x, float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = 2.0f * x[i];
        }'''
    x = torch.randn(N, device="cuda")
    y = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):   # compiles, loads the module and launches, all in the capture
        twice[GRID, 256](x, y, N)
    torch.cuda.synchronize()
    assert not y.any()   # capturing ran nothing
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, 2 * x)


def test_cupy_capture_records_launches_that_name_no_stream():
    cp = import_cupy()
    xh = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.asarray(xh)
        y = cp.zeros(N, cp.float32)
        saxpy[GRID, 256](1.0, x, y, N)   # warm-up
        stream.synchronize()
        y.fill(0)
        stream.begin_capture()
        saxpy[GRID, 256](1.0, x, y, N)
        saxpy[GRID, 256](1.0, x, y, N)
        graph = stream.end_capture()
    stream.synchronize()
    assert not bool(y.any())
    graph.launch(stream=stream)
    stream.synchronize()
    np.testing.assert_allclose(cp.asnumpy(y), 2 * xh, rtol=1e-6)


# --- operators and torch.compile ------------------------------------------------------------

@pytest.fixture(scope="module")
def ops():
    axpy = saxpy.as_torch_op("kjit_gpu_test::saxpy", grid=_grid, block=256)
    sc = scale.as_torch_op("kjit_gpu_test::scale", grid=_grid, block=256, outputs={"y": "x"})

    def setup_context(ctx, inputs, output):
        x, w, n = inputs
        ctx.save_for_backward(x, w)

    def backward(ctx, gy):   # y = x * w^2
        x, w = ctx.saved_tensors
        return gy * w * w, 2 * gy * x * w, None

    torch.library.register_autograd("kjit_gpu_test::scale", backward, setup_context=setup_context)
    return axpy, sc


def test_operator_schema_comes_from_the_c_signature(ops):
    axpy, sc = ops
    assert str(axpy._schema) == \
        "kjit_gpu_test::saxpy(float a, Tensor x, Tensor(a!) y, SymInt n) -> ()"
    assert str(sc._schema) == "kjit_gpu_test::scale(Tensor x, Tensor w, SymInt n) -> Tensor"
    x = torch.randn(N, device="cuda")
    torch.library.opcheck(axpy, (2.0, x, torch.randn(N, device="cuda"), N))
    xd = torch.randn(64, device="cuda", dtype=torch.float64, requires_grad=True)
    wd = torch.randn(64, device="cuda", dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(sc, (xd, wd, 64))


def test_operators_compile_into_one_graph_with_fullgraph(ops):
    axpy, sc = ops

    def f(x, y, w):
        axpy(2.0, x, y, x.numel())
        return sc(y.double(), w, y.numel()) + 1

    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    w = torch.randn(N, device="cuda", dtype=torch.float64)
    y_ref = 2 * x + y
    expect = y_ref.double() * w * w + 1
    explain = torch._dynamo.explain(f)(x, y.clone(), w)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(f, fullgraph=True)
    got = compiled(x, y, w)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(got, expect)


def test_operators_run_under_cuda_graphs_with_reduce_overhead(ops):
    _, sc = ops
    from torch._dynamo.utils import counters

    def f(x, w):
        return sc(x, w, x.numel()) * 2

    compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    counters.clear()
    for _ in range(5):   # warm-up runs, then recorded and replayed graphs
        x = torch.randn(N, device="cuda", dtype=torch.float64)
        w = torch.randn(N, device="cuda", dtype=torch.float64)
        got = compiled(x, w)
        torch.testing.assert_close(got, 2 * x * w * w)
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])


def test_an_operator_with_a_backward_trains(ops):
    _, sc = ops
    x = torch.randn(256, device="cuda", dtype=torch.float64, requires_grad=True)
    w = torch.randn(256, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: sc(a, b, 256), (x, w))
    compiled = torch.compile(lambda a, b: sc(a, b, 256).sum(), fullgraph=True)
    compiled(x, w).backward()
    torch.testing.assert_close(x.grad, (w * w).detach())
    torch.testing.assert_close(w.grad, (2 * x * w).detach())


def test_a_plain_launch_in_a_compiled_function_is_a_graph_break_not_a_crash():
    def f(x, y):
        y = y * 1
        saxpy[GRID, 256](2.0, x, y, N)
        return y + 1

    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    torch._dynamo.reset()
    got = torch.compile(f)(x, y)
    torch.testing.assert_close(got, 2 * x + y + 1)
    explain = torch._dynamo.explain(f)(x, y)
    assert explain.graph_break_count >= 1
    assert any("as_torch_op" in str(r) for r in explain.break_reasons), explain.break_reasons
    with pytest.raises(Exception, match="as_torch_op"):
        torch.compile(f, fullgraph=True)(x, y)


# --- wrong tensors -------------------------------------------------------------------------

@pytest.mark.parametrize("route", ["launch", "operator"])
def test_wrong_tensors_are_refused_naming_the_parameter(route, ops):
    axpy, _ = ops
    y = torch.zeros(N, device="cuda")
    x = torch.randn(N, device="cuda")

    def run(xx):
        if route == "launch":
            saxpy[GRID, 256](2.0, xx, y, N)
        else:
            axpy(2.0, xx, y, N)

    for _ in range(2):   # once learnt by the C packer, still refused with the same words
        run(x)
        with pytest.raises(ArgumentError, match=r"'x'.*on cpu.*x\.to\('cuda:0'\)"):
            run(x.cpu())
        with pytest.raises(ArgumentError, match=r"'x'.*not C-contiguous.*contiguous\(\)"):
            run(torch.randn(N, 2, device="cuda")[:, 0])
        with pytest.raises(ArgumentError, match=r"'x'.*torch\.float64.*float32.*x\.to\(torch\.float32\)"):
            run(x.double())
        with pytest.raises(ArgumentError, match=r"'x'.*torch\.sparse_coo.*to_dense\(\)"):
            run(x.to_sparse())
    if route == "launch":
        with pytest.raises(ArgumentError, match=r"'x'.*requires grad.*detach\(\).*as_torch_op"):
            run(torch.randn(N, device="cuda", requires_grad=True))


def test_tensors_are_read_through_pytorchs_c_shim():
    """torch.Tensor and Parameter are packed through PyTorch's C shim once it has agreed with
    PyTorch's Python answers, and the current stream is read through it too: every address a
    launch takes is the tensor's own (views past their storage's start, storage swapped in
    place, every learned element type), and a launch on a torch stream lands there."""
    import ctypes
    import struct

    from kjit.runtime import torch_shim
    from kjit.runtime.libcuda import c_function
    from kjit.runtime.memory import DeviceArray

    @kjit.kernel
    def add_to():
        return r'''
        extern "C" __global__ void add_to(double* y, const float* x, const int* k, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] += x[i] * k[i];
        }'''

    n = 1000
    y = torch.zeros(n + 7, dtype=torch.float64, device="cuda")
    base = torch.arange(n + 3, dtype=torch.float32, device="cuda")
    k = torch.full((n,), 2, dtype=torch.int32, device="cuda")
    add_to[kjit.cdiv(n, 256), 256](y[7:], base[3:], k, n)   # learnt here, on the Python path
    assert torch_shim.install(base) is True
    assert torch_shim._stream_reader(torch_shim._library(), 0) != 0
    assert torch_shim._tensor_offset(base, torch.empty(4)) != 0   # no `_cdata` call per tensor
    view, buf = base[3:], ctypes.create_string_buffer(8)
    torch.Tensor.data_ptr = lambda self: 0x1234   # what the accessors would answer now
    try:
        r = c_function("pack")(struct.pack("<ii", 20, 0), (("<f4", 0),), (view,),
                               ctypes.addressof(buf), DeviceArray)
    finally:
        del torch.Tensor.data_ptr
    assert (r, struct.unpack("<Q", buf.raw)[0]) == (0, view.data_ptr())
    want = torch.zeros(n + 7, dtype=torch.float64, device="cuda")
    want[7:] += base[3:].double() * 2
    p = torch.nn.Parameter(torch.ones(n, device="cuda"), requires_grad=False)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):   # the C packer, through the shim
            add_to[kjit.cdiv(n, 256), 256](y[7:], base[3:], k, n)
            want[7:] += base[3:].double() * 2
        add_to[kjit.cdiv(n, 256), 256](y[7:], p, k, n)
        want[7:] += 2
        base.set_(torch.arange(n, dtype=torch.float32, device="cuda") * 3)   # swapped in place
        add_to[kjit.cdiv(n, 256), 256](y[7:], base, k, n)
        want[7:] += base.double() * 2
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(y, want)
    assert torch.all(y[:7] == 0)


@kjit.kernel
def bf16_axpb():
    return r'''
    #include <cuda_bf16.h>
    #include <cuda_fp8.h>
    extern "C" __global__ void bf16_axpb(const __nv_bfloat16* x, __nv_bfloat16* out,
                                         __nv_fp8_e4m3* q, float a, float b, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) {
            float v = __bfloat162float(x[i]) * a + b;
            out[i] = __float2bfloat16(v);
            q[i] = __nv_fp8_e4m3(v);
        }
    }'''


def test_bfloat16_and_float8_tensors_launch_on_their_cuda_types():
    """torch.bfloat16 and torch.float8_e4m3fn tensors go to __nv_bfloat16* and
    __nv_fp8_e4m3* parameters, packed in C after the first launch; another element type is
    refused naming the parameter."""
    import ctypes
    import struct

    from kjit.runtime.libcuda import c_function
    from kjit.runtime.memory import DeviceArray
    n = 4096
    x = torch.randn(n, device="cuda").bfloat16()
    out = torch.empty_like(x)
    q = torch.empty(n, device="cuda", dtype=torch.float8_e4m3fn)
    for _ in range(3):   # learnt by the first, packed in C after
        bf16_axpb[kjit.cdiv(n, 256), 256](x, out, q, 1.5, -0.25, n)
    want = x.float() * 1.5 - 0.25
    torch.testing.assert_close(out.float(), want.bfloat16().float(), rtol=2 ** -7, atol=1e-6)
    torch.testing.assert_close(q.float(), want.to(torch.float8_e4m3fn).float(), rtol=0.13, atol=2 ** -9)
    buf = ctypes.create_string_buffer(8)
    assert c_function("pack")(struct.pack("<ii", 21, 0), ((("bfloat16", 0), ("<u2", 0)),), (x,),
                              ctypes.addressof(buf), DeviceArray) == 0
    assert struct.unpack("<Q", buf.raw)[0] == x.data_ptr()
    with pytest.raises(ArgumentError, match=r"'x'.*torch\.float16 but the kernel reads bfloat16.*"
                                            r"x\.to\(torch\.bfloat16\)"):
        bf16_axpb[kjit.cdiv(n, 256), 256](x.half(), out, q, 1.5, -0.25, n)


def test_tensors_a_kernel_cannot_read_are_refused_after_learning_too():
    """Tensors with no readable memory, or whose memory holds something else than their values,
    are refused naming the parameter, also once the C packer knows their type and dtype."""
    n = 1024
    x = torch.zeros(n + 8, device="cuda")
    for _ in range(2):   # learnt by the first launch; the C packer then declines the rest
        add_one[kjit.cdiv(n, 256), 256](x[8:], n)
    gone = torch.zeros(n + 8, device="cuda")[8:]
    gone.untyped_storage().resize_(0)   # as FSDP frees a parameter's memory
    with pytest.raises(ArgumentError, match=r"'x'.*elements do not lie in its storage.*0 bytes"):
        add_one[kjit.cdiv(n, 256), 256](gone, n)
    nested = torch.nested.nested_tensor([torch.ones(3), torch.ones(5)], device="cuda")
    with pytest.raises(ArgumentError, match=r"'x'.*nested.*to_padded_tensor"):
        add_one[1, 256](nested, 8)
    with pytest.raises(ArgumentError, match=r"'x'.*no memory a kernel can read.*torch\.func"):
        torch.func.functionalize(lambda t: add_one[kjit.cdiv(n, 256), 256](t, n))(x[8:])

    @kjit.kernel
    def conj_copy():
        return r'''
        extern "C" __global__ void conj_copy(const void* src, void* dst, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) ((float2*)dst)[i] = ((const float2*)src)[i];
        }'''

    z = torch.randn(n, dtype=torch.complex64, device="cuda")
    out = torch.empty_like(z)
    for _ in range(2):
        conj_copy[kjit.cdiv(n, 256), 256](z, out, n)
        with pytest.raises(ArgumentError, match=r"'src'.*lazy conjugate view.*resolve_conj"):
            conj_copy[kjit.cdiv(n, 256), 256](z.conj(), out, n)
    conj_copy[kjit.cdiv(n, 256), 256](z.conj().resolve_conj(), out, n)
    torch.testing.assert_close(out, z.conj())
    torch.cuda.synchronize()
    assert torch.all(x[8:] == 2) and torch.all(x[:8] == 0)


def test_tensors_on_two_devices_are_refused_naming_both():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs; this machine has one")
    x = torch.randn(N, device="cuda:1")
    y = torch.zeros(N, device="cuda:0")
    with pytest.raises(ArgumentError, match=r"arrays are on 2 devices \('y' on device 0; 'x' on device 1\)"):
        saxpy[GRID, 256](2.0, x, y, N)


@pytest.mark.parametrize("device", range(8), ids=lambda d: f"cuda{d}")
def test_operators_run_on_their_tensors_device_whatever_is_current(ops, device):
    """As every PyTorch operator does: eager, under torch.compile (CUDA graphs included) and
    autograd, with device 0 current throughout."""
    if device >= torch.cuda.device_count() or (device > 1 and device != torch.cuda.device_count() - 1):
        pytest.skip(f"device {device}: the first two and the last of the "
                    f"{torch.cuda.device_count()} GPUs here are tested")
    axpy, sc = ops
    torch.cuda.set_device(0)
    dev = f"cuda:{device}"
    x, y = torch.randn(N, device=dev), torch.randn(N, device=dev)
    expect = 2 * x + y
    axpy(2.0, x, y, N)
    torch.testing.assert_close(y, expect)
    xd = torch.randn(N, device=dev, dtype=torch.float64, requires_grad=True)
    wd = torch.randn(N, device=dev, dtype=torch.float64, requires_grad=True)
    out = sc(xd, wd, N)
    assert out.device == xd.device
    out.sum().backward()
    torch.testing.assert_close(xd.grad, (wd * wd).detach())
    for mode in ("default", "reduce-overhead"):
        compiled = torch.compile(lambda a, b: sc(a, b, a.numel()) * 2, mode=mode, fullgraph=True)
        for _ in range(4):   # reduce-overhead records a CUDA graph on this device, then replays
            a = torch.randn(N, device=dev, dtype=torch.float64)
            b = torch.randn(N, device=dev, dtype=torch.float64)
            torch.testing.assert_close(compiled(a, b), 2 * a * b * b)
    torch.cuda.synchronize(device)
    assert torch.cuda.current_device() == 0


def test_the_training_example_trains_under_torch_compile(capsys):
    import runpy
    from pathlib import Path
    runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "torch_train.py"),
                   run_name="__main__")
    assert "ok" in capsys.readouterr().out
