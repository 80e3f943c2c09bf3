"""kjit's own CUDA graphs: captured from a stream or built node by node, replayed with one
call, updated in place without capturing again; with kjit, PyTorch and CuPy arrays, on any
device; what a capture cannot record refused before it ends the capture."""
from __future__ import annotations

import numpy as np
import pytest

import kjit
from conftest import SAXPY
from kjit import driver
from kjit.errors import ArgumentError
from cupy_family import import_cupy

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()
N = 1 << 14
GRID, BLOCK = kjit.cdiv(N, 256), 256


@kjit.kernel
def saxpy():
    return SAXPY


SCALE = r"""
extern "C" __global__ void scale(float* x, float f, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= f;
}"""


@kjit.kernel
def scale():
    return SCALE


def floats() -> np.ndarray:
    return rng.standard_normal(N).astype(np.float32)


def test_a_captured_graph_replays_and_updates_in_place():
    xh, yh = floats(), floats()
    x, y = kjit.to_device(xh), kjit.to_device(yh)
    saxpy[GRID, BLOCK](0.0, x, y, N)   # warm-up: loads the modules outside the capture
    scale[GRID, BLOCK](x, 1.0, N)
    kjit.synchronize()
    with kjit.graph() as g:
        saxpy[GRID, BLOCK](2.0, x, y, N)          # given no stream: the capture stream
        scale[GRID, BLOCK, g.stream](y, 0.5, N)   # or named
    g.synchronize()
    np.testing.assert_array_equal(y.get(), yh)    # capturing ran nothing
    assert [n.name for n in g.nodes] == ["saxpy", "scale"]
    expect = yh.astype(np.float64)
    for _ in range(3):
        g.launch()
        expect = (2 * xh + expect) * 0.5
    g.synchronize()
    np.testing.assert_allclose(y.get(), expect, rtol=1e-5, atol=1e-5)
    # new arguments and grid for the first node: no capture again
    x2, y2 = kjit.to_device(floats()), kjit.zeros(N, "float32")
    g.nodes[0].update(1.0, x2, y2, N)
    g.nodes[1].update(y2, 3.0, N, grid=(GRID,), block=(BLOCK,))
    g.launch()
    g.synchronize()
    np.testing.assert_allclose(y2.get(), 3 * x2.get(), rtol=1e-6)
    np.testing.assert_allclose(y.get(), expect, rtol=1e-5, atol=1e-5)   # untouched now
    with pytest.raises(ArgumentError, match="parameter 0 'a'"):
        g.nodes[0].update("two", x2, y2, N)


def test_a_graph_built_node_by_node_runs_in_order_on_any_stream():
    xh = floats()
    x, y = kjit.to_device(xh), kjit.zeros(N, "float32")
    g = kjit.Graph()
    first = g.add(saxpy, GRID, BLOCK, 1.0, x, y, N)      # y = x
    g.add(scale, GRID, BLOCK, y, 4.0, N)                 # after it: y = 4x
    assert len(g.nodes) == 2 and g.nodes[0] is first
    other = kjit.Stream(non_blocking=True)
    g.launch(other)
    other.synchronize()
    np.testing.assert_allclose(y.get(), 4 * xh, rtol=1e-6)
    g.add(scale, GRID, BLOCK, y, 0.5, N)                 # a new node: instantiated again
    first.update(0.0, x, y, N)                           # y += 0
    g.launch()
    g.synchronize()
    np.testing.assert_allclose(y.get(), 4 * 4 * xh * 0.5, rtol=1e-5)


def _free_bytes() -> int:
    return int(driver.call(driver.bindings().cuMemGetInfo)[0])


def test_an_array_collected_during_a_capture_is_freed_and_the_capture_survives():
    # a plain cuMemFree inside a capture would end it: an array whose last reference goes (or
    # that the garbage collector takes) while this thread captures is freed in relaxed mode
    import gc
    xh = floats()
    x, y = kjit.to_device(xh), kjit.zeros(N, "float32")
    saxpy[GRID, BLOCK](0.0, x, y, N)
    doomed = [kjit.zeros(64 << 20, "uint8") for _ in range(2)]
    cycle = [doomed.pop()]
    cycle.append(cycle)   # the second goes only with the collector
    kjit.synchronize()
    gc.collect()   # earlier tests' garbage, so that the collection below takes the cycle alone
    gc.disable()
    try:
        before = _free_bytes()
        with kjit.graph() as g:
            saxpy[GRID, BLOCK](1.0, x, y, N)
            del doomed, cycle
            gc.collect()
            saxpy[GRID, BLOCK](1.0, x, y, N)   # the capture is still alive
        assert _free_bytes() >= before + (120 << 20)
    finally:
        gc.enable()
    g.launch()
    g.synchronize()
    np.testing.assert_allclose(y.get(), 2 * xh, rtol=1e-6)


def test_what_a_capture_cannot_record_is_refused_and_the_capture_survives():
    xh = floats()
    x, y = kjit.to_device(xh), kjit.zeros(N, "float32")
    saxpy[GRID, BLOCK](0.0, x, y, N)
    module = kjit.load(kjit.compile('extern "C" __global__ void unused(int* p) { *p = 0; }'))
    module.get_function("unused")
    kjit.synchronize()
    with kjit.graph() as g:
        saxpy[GRID, BLOCK](1.0, x, y, N)
        for what, call in [("allocating", lambda: kjit.zeros(4, "float32")),
                           ("unloading a module", module.unload),
                           ("allocating", lambda: kjit.to_device(xh)),
                           ("kjit.synchronize", kjit.synchronize),
                           ("Stream.synchronize", lambda: g.stream.synchronize()),
                           ("copy_to_host", y.get),
                           ("graph capture cannot record",
                            lambda: saxpy[GRID, BLOCK](1.0, kjit.In(xh), y, N))]:
            with pytest.raises(ArgumentError, match=what):
                call()
        saxpy[GRID, BLOCK](1.0, x, y, N)
    g.launch()
    g.synchronize()
    np.testing.assert_allclose(y.get(), 2 * xh, rtol=1e-6)
    kjit.zeros(4, "float32")   # outside the capture everything works again
    kjit.synchronize()


def test_torch_and_cupy_work_inside_a_kjit_graph():
    torch = pytest.importorskip("torch")
    x = torch.randn(N, device="cuda")
    y = torch.zeros(N, device="cuda")
    saxpy[GRID, BLOCK](0.0, x, y, N)
    torch.cuda.synchronize()
    with kjit.graph() as g:
        saxpy[GRID, BLOCK](1.0, x, y, N)   # torch's current stream is the capture stream
        y.mul_(2)                          # PyTorch's own work is recorded too
    for _ in range(2):
        g.launch()
    g.synchronize()
    torch.testing.assert_close(y, 6 * x)   # (0 + x) * 2 = 2x, then (2x + x) * 2 = 6x
    cp = import_cupy()
    a = cp.asarray(floats())
    b = cp.zeros(N, cp.float32)
    cp.cuda.Device().synchronize()
    with kjit.graph() as g2:
        saxpy[GRID, BLOCK](1.0, a, b, N)
    g2.launch()
    g2.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(b), cp.asnumpy(a))


def test_a_capture_takes_only_its_own_threads_launches(monkeypatch):
    """A launch given no stream goes to the capture stream only in the thread capturing: a
    kernel of another thread, launched there in C meanwhile, runs at once on the legacy stream,
    and the capturing thread's next launch is captured again. Each thread launches a kernel it
    made itself, so both launch in C (a kernel launches in C from the thread that made it)."""
    import threading
    from kjit.runtime import kernel as kernel_mod
    xh, yh = floats(), floats()
    x, y = kjit.to_device(xh), kjit.to_device(yh)
    here = kjit.load(kjit.compile(SCALE)).get_function("scale")
    here[GRID, BLOCK](x, 1.0, N)   # warm-up: the launcher made, the module loaded
    kjit.synchronize()
    captured, launched = threading.Event(), threading.Event()
    out, errors = {}, []

    def capture():
        try:
            there = kjit.load(kjit.compile(SCALE)).get_function("scale")
            there[GRID, BLOCK](y, 1.0, N)
            kjit.synchronize()
            python_path.clear()
            with kjit.graph() as g:
                there[GRID, BLOCK](y, 2.0, N)
                captured.set()
                assert launched.wait(60), "the main thread did not launch"
                there[GRID, BLOCK](y, 3.0, N)   # captured again, after the other thread's launch
            out["graph"] = g
        except BaseException as exc:  # reported below
            errors.append(exc)
            captured.set()

    python_path = []
    real = kernel_mod.framework_stream
    monkeypatch.setattr(kernel_mod, "framework_stream", lambda *a: python_path.append(1) or real(*a))
    worker = threading.Thread(target=capture)
    worker.start()
    assert captured.wait(60)
    here[GRID, BLOCK](x, 5.0, N)
    launched.set()
    worker.join(60)
    assert not errors, errors
    assert python_path == [], "a launch went through the Python launcher, not C's"
    kjit.synchronize()
    np.testing.assert_array_equal(x.get(), xh * np.float32(5))   # ran at once, not captured
    np.testing.assert_array_equal(y.get(), yh)                  # captured, not run
    g = out["graph"]
    assert [n.name for n in g.nodes] == ["scale", "scale"]
    g.launch()
    g.synchronize()
    np.testing.assert_allclose(y.get(), yh * 6, rtol=1e-6)


def test_a_graph_on_another_device():
    count = driver.device_count()
    if count < 2:
        pytest.skip(f"needs two GPUs; this machine has {count}")
    d = count - 1
    xh = floats()
    with kjit.Device(d):
        x, y = kjit.to_device(xh), kjit.zeros(N, "float32")
        saxpy[GRID, BLOCK](0.0, x, y, N)
        kjit.synchronize()
        with kjit.graph() as g:
            saxpy[GRID, BLOCK](1.0, x, y, N)
    assert g.device == d
    g.launch()          # from device 0's thread state: the graph's own context
    g.synchronize()
    np.testing.assert_array_equal(y.get(), xh)
    with kjit.Device(0):
        x0 = kjit.to_device(xh)
    with pytest.raises(ArgumentError, match="device"):
        g.nodes[0].update(1.0, x0, y, N)


def test_a_capture_in_a_process_whose_pytorch_has_not_used_cuda_yet():
    """PyTorch imported but not yet initialised on the GPU: kjit.graph() makes PyTorch's
    current stream the capture stream, and PyTorch's first CUDA use (its initialisation)
    must happen outside the capture, or it would end it."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent
    code = f"""
import sys; sys.path.insert(0, {str(root)!r})
import numpy as np, torch, kjit
from conftest import SAXPY
k = kjit.compile(SAXPY)
saxpy = kjit.load(k).get_function("saxpy")
x = kjit.to_device(np.ones(1024, np.float32)); y = kjit.zeros(1024, "float32")
saxpy[4, 256](1.0, x, y, 1024)
kjit.synchronize()
assert not torch.cuda.is_initialized()
with kjit.graph() as g:
    saxpy[4, 256](2.0, x, y, 1024)
g.launch(); g.synchronize()
assert float(y.get()[0]) == 3.0, y.get()[:4]
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(root.parent), os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]
