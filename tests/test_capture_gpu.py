"""kjit launches inside CUDA graph captures (PyTorch's and CuPy's) are recorded and replay
with the right results; what a capture cannot hold is refused first, saying why. A sticky
fault says the context is unusable, and later calls say the same."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kjit
from conftest import SAXPY
from kjit import driver
from kjit.errors import ArgumentError
from cupy_family import import_cupy

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()


@kjit.kernel
def saxpy():
    return SAXPY


N = 1 << 14
GRID = kjit.cdiv(N, 256)


@pytest.fixture(params=[0, 1, "last"], ids=["device0", "device1", "last_device"])
def device(request):
    """Devices 0 and 1, and the last one where there are more than two."""
    count = driver.device_count()
    if request.param == "last":
        if count < 3:
            pytest.skip(f"needs three GPUs or more; this machine has {count}")
        return count - 1
    if request.param >= count:
        pytest.skip(f"needs two GPUs; this machine has {count}")
    return request.param


def test_kjit_launches_are_recorded_in_a_torch_graph(device):
    torch = pytest.importorskip("torch")
    with torch.cuda.device(device):
        x = torch.randn(N, device=f"cuda:{device}")
        y = torch.zeros(N, device=f"cuda:{device}")
        # warm up on a side stream, as PyTorch asks before capturing: the first launch on a
        # device loads the kernel's module there, which is no work for a graph
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            saxpy[GRID, 256, torch.cuda.current_stream()](2.0, x, y, N)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # PyTorch's default mode (cudaStreamCaptureModeGlobal), on a stream of this device:
        # torch.cuda.graph's own capture stream is made once, on the device current then
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            capture = torch.cuda.current_stream()
            y.zero_()
            saxpy[GRID, 256, capture](2.0, x, y, N)
            saxpy[GRID, 256, capture](1.0, x, y, N)
            with pytest.raises(ArgumentError, match="graph capture cannot record"):
                saxpy[GRID, 256, capture](1.0, kjit.In(np.ones(N, np.float32)), y, N)
            out = np.zeros(N, np.float32)
            with pytest.raises(ArgumentError, match="graph capture cannot record"):
                saxpy[GRID, 256, capture](1.0, x, kjit.Out(out), N)
        for _ in range(3):   # replays run the recorded launches on whatever x holds then
            new = torch.randn(N, device=f"cuda:{device}")
            x.copy_(new)
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(y, 3 * new)
        assert not out.any()   # the refused Out copy never ran


def test_dlpack_export_inside_a_torch_capture_does_not_synchronize(device):
    torch = pytest.importorskip("torch")
    with torch.cuda.device(device):
        arr = kjit.to_device(np.arange(N, dtype=np.float32))
        y = torch.zeros(N, device=f"cuda:{device}")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            view = torch.from_dlpack(arr)   # a synchronize here would invalidate the capture
            y.copy_(view * 2)
        graph.replay()
        torch.cuda.synchronize()
        assert y.cpu().tolist() == [2.0 * i for i in range(N)]


def _free_bytes() -> int:
    return int(driver.call(driver.bindings().cuMemGetInfo)[0])


@pytest.mark.parametrize("where", ["this thread", "another thread"])
def test_kjit_objects_released_during_a_torch_capture_do_not_end_it(where):
    # PyTorch captures in global mode: a cuMemFree, cuGraphExecDestroy or cuModuleUnload from
    # any thread would invalidate its graph. kjit releases its arrays, graphs and modules in
    # relaxed mode, whichever thread lets them go.
    import gc
    import threading
    import weakref
    torch = pytest.importorskip("torch")
    x = torch.randn(N, device="cuda")
    y = torch.zeros(N, device="cuda")
    saxpy[GRID, 256](1.0, x, y, N)   # loaded before the capture
    doomed = {"array": kjit.zeros(64 << 20, "uint8")}
    with kjit.graph() as g:
        saxpy[GRID, 256](1.0, x, y, N)
    g.launch()   # instantiated: its release destroys an executable graph
    doomed["graph"], graph_gone = g, weakref.ref(g)
    del g
    other = kjit.load(kjit.compile('extern "C" __global__ void unused(int* p) { *p = 0; }'))
    other.get_function("unused")[1, 1](kjit.zeros(1, "int32"))   # loaded in this context
    doomed["module"] = other
    del other
    torch.cuda.synchronize()
    before = _free_bytes()

    def release():
        doomed.pop("module").unload()
        doomed.clear()
        gc.collect()   # a Graph and its nodes are a cycle

    gc.collect()   # earlier tests' garbage, so that the collection inside takes ours alone
    gc.disable()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            saxpy[GRID, 256](1.0, x, y, N)
            if where == "this thread":
                release()
            else:
                worker = threading.Thread(target=release)
                worker.start()
                worker.join()
            saxpy[GRID, 256](1.0, x, y, N)
    finally:
        gc.enable()
    assert not doomed and graph_gone() is None
    assert _free_bytes() >= before + (60 << 20)   # the array's memory was released
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, 2 * x)


def test_kjit_launches_are_recorded_in_a_cupy_graph(device):
    cp = import_cupy()
    xh = rng.standard_normal(N).astype(np.float32)
    with cp.cuda.Device(device):
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            x = cp.asarray(xh)
            y = cp.zeros(N, cp.float32)
        stream.synchronize()
        saxpy[GRID, 256, stream](1.0, x, y, N)   # warm-up: loads the module on this device
        stream.begin_capture()
        saxpy[GRID, 256, stream](1.0, x, y, N)
        saxpy[GRID, 256, stream](1.0, x, y, N)
        with pytest.raises(ArgumentError, match="graph capture cannot record"):
            saxpy[GRID, 256, stream](1.0, kjit.InOut(np.ones(N, np.float32)), y, N)
        graph = stream.end_capture()
        stream.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(y), xh)   # capturing ran nothing
        for _ in range(2):
            graph.launch(stream=stream)
        stream.synchronize()
        np.testing.assert_allclose(cp.asnumpy(y), 5 * xh.astype(np.float64), rtol=1e-5, atol=1e-5)


STICKY = textwrap.dedent('''
    import kjit
    src = 'extern "C" __global__ void bad_kernel(int* p) { p[threadIdx.x] = 1; }'
    bad = kjit.load(kjit.compile(src)).get_function("bad_kernel")
    bad[1, 32](kjit.ptr(8))

    def report(tag, call):
        try:
            call()
        except kjit.DriverError as e:
            print(tag, e.cuda_name, "|", str(e).replace(chr(10), " "))
        else:
            print(tag, "NO ERROR")

    def launch_again():
        bad[1, 32](kjit.ptr(8))
        kjit.synchronize()
    report("FIRST", kjit.synchronize)
    report("ALLOC", lambda: kjit.zeros(4, "int32"))
    report("LAUNCH", launch_again)
    report("LOAD", lambda: kjit.load(kjit.compile(src.replace("bad_kernel", "other"))))
''')


def test_a_sticky_fault_says_the_context_is_unusable_now_and_later():
    path = os.pathsep.join([str(Path(kjit.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", STICKY], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": path})
    lines = {ln.split()[0]: ln for ln in res.stdout.splitlines() if ln.strip()}
    assert set(lines) == {"FIRST", "ALLOC", "LAUNCH", "LOAD"}, res.stdout + res.stderr
    first = lines["FIRST"]
    assert first.startswith("FIRST CUDA_ERROR_ILLEGAL_ADDRESS"), first
    assert "bad_kernel" in first and "sticky" in first and "Start a new process" in first, first
    for tag in ("ALLOC", "LAUNCH"):   # later calls report the same cause, not a new puzzle
        assert lines[tag].startswith(f"{tag} CUDA_ERROR_ILLEGAL_ADDRESS"), lines[tag]
        assert "unusable in this process since an earlier CUDA_ERROR_ILLEGAL_ADDRESS" in lines[tag], lines[tag]
        assert "Start a new process" in lines[tag], lines[tag]
    load = lines["LOAD"]   # loading may or may not reach the device; if it fails, it says why
    assert load == "LOAD NO ERROR" or (load.startswith("LOAD CUDA_ERROR_ILLEGAL_ADDRESS")
                                       and "unusable in this process since an earlier" in load), load
