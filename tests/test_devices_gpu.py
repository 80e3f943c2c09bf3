"""Every device as good as device 0, on a machine with two GPUs: the current device decides
where kernels run, under kjit, PyTorch and CuPy alike; arrays and streams of device 1 work
and those of the wrong device are refused before launch; one thread or one process per GPU.
Tests needing two devices skip, saying so, where there is one."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import kjit
from kjit import driver
from kjit.errors import ArgumentError

from conftest import SAXPY   # the saxpy every runtime test launches
from cupy_family import import_cupy

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()



@kjit.kernel
def saxpy():
    return SAXPY


N = 10_000
GRID = kjit.cdiv(N, 256)


@pytest.fixture
def two_gpus():
    count = driver.device_count()
    if count < 2:
        pytest.skip(f"needs two GPUs; this machine has {count}")


def same_arch_or_skip():
    if kjit.Device(0).arch != kjit.Device(1).arch:
        pytest.skip("devices 0 and 1 have different archs: one cubin cannot serve both")


def floats(n: int = N) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def current_context() -> int:
    err, ctx = driver.bindings().cuCtxGetCurrent()
    assert not err
    return int(ctx)


def libcuda_ordinal(address: int) -> int:
    """CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL asked of libcuda itself (not through cuda.bindings,
    which answers 0 for every device in 13.3-13.5)."""
    fn = ctypes.CDLL("libcuda.so.1").cuPointerGetAttribute
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_ulonglong]
    fn.restype = ctypes.c_int
    ordinal = ctypes.c_int(-7)
    assert fn(ctypes.byref(ordinal), 9, address) == 0
    return ordinal.value


def switch(how: str, ordinal: int):
    """The device-switching context manager a program of that framework uses."""
    if how == "torch":
        return pytest.importorskip("torch").cuda.device(ordinal)
    if how == "cupy":
        return import_cupy().cuda.Device(ordinal)
    return kjit.Device(ordinal)


# --- which device a pointer is on -------------------------------------------------------

def test_the_device_of_foreign_memory_agrees_with_libcuda(two_gpus):
    from kjit.runtime import libcuda
    arrays = []   # (what, address, device it was made on), kept alive while asked about
    keep = []
    for d in (0, 1):
        with kjit.Device(d):
            a = kjit.zeros(16, "float32")
        keep.append(a)
        arrays.append((f"kjit array on {d}", a.ptr, d))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        for d in (0, 1):
            t = torch.zeros(16, device=f"cuda:{d}")
            keep.append(t)
            arrays.append((f"torch tensor on {d}", t.data_ptr(), d))
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        for d in (0, 1):
            with cupy.cuda.Device(d):
                c = cupy.zeros(16, cupy.float32)
            keep.append(c)
            arrays.append((f"cupy array on {d}", c.data.ptr, d))
    queries = {"kjit": libcuda.pointer_device, "ctypes": libcuda.ctypes_pointer_device()}
    ext = libcuda.extension()
    if ext is not None:
        queries["C extension"] = ext.pointer_device
    for what, address, d in arrays:
        for inside in (address, address + 60):      # the allocation's start and a later byte
            assert libcuda_ordinal(inside) == d, what
            for name, query in queries.items():
                assert query(inside) == d, (what, name)
    host = np.zeros(4, np.float32)
    assert libcuda.pointer_device(host.ctypes.data) is None   # host memory: no device


# --- the current device decides ---------------------------------------------------------

@pytest.mark.parametrize("how", ["kjit", "torch", "cupy"])
def test_the_decorator_runs_on_the_current_device_with_one_compile(two_gpus, how):
    same_arch_or_skip()
    tag = int(rng.integers(1, 2**31))

    @kjit.kernel
    def scale():   # a source of its own, so this test's compiles are the only ones counted
        return SAXPY.replace("saxpy", "scale") + f"\n// {tag}\n"
    events = []
    kjit.cache.add_listener(events.append)
    driver.ensure_context()   # the main thread works in device 0's context, as a program would
    before = current_context()
    try:
        for d in (0, 1):
            xh, yh = floats(), floats()
            with switch(how, d):
                x, y = kjit.to_device(xh), kjit.to_device(yh)
                assert y.device == d
                scale[GRID, 256](2.0, x, y, N)
                got = y.get()
            np.testing.assert_allclose(got, 2 * xh.astype(np.float64) + yh, rtol=1e-6, atol=1e-6)
            assert current_context() == before   # the switch is undone, kjit left nothing behind
    finally:
        kjit.cache.remove_listener(events.append)
    assert sorted(k.device for k in scale._by_context.values()) == [0, 1]
    assert len(scale._modules) == 1                       # one Module, loaded into both contexts
    assert [e.event for e in events] == ["miss", "memory_hit"], events   # one compile, one hit


@pytest.mark.parametrize("how", ["kjit", "torch", "cupy"])
def test_a_kernel_launched_under_another_device_runs_there(two_gpus, how):
    same_arch_or_skip()
    with kjit.Device(0):
        mod = kjit.load(kjit.compile(SAXPY))
        k = mod.get_function("saxpy")
    assert k.device == 0
    xh, yh = floats(), floats()
    with switch(how, 1):
        x, y = kjit.to_device(xh), kjit.to_device(yh)
        k[GRID, 256](2.0, x, y, N)                     # the module is loaded on device 1 here
        k.launch(GRID, 256, 1.0, x, y, N)              # keywords: same rule
        for _ in range(3):
            k[GRID, 256](0.0, x, y, N)                 # later launches reuse the loaded twin
        got = y.get()
        twin = mod.get_function("saxpy")
    np.testing.assert_allclose(got, 3 * xh.astype(np.float64) + yh, rtol=1e-6, atol=1e-6)
    assert twin.device == 1 and twin is not k and k.device == 0
    assert len(mod._handles) == 2                      # loaded once per device


def devices_to_test() -> list[int]:
    """Devices 0 and 1 and the last one: ordinals above 1 on machines of four or eight GPUs."""
    count = driver.device_count()
    return sorted({0, 1, count - 1})


@pytest.mark.parametrize("how", ["kjit", "torch", "cupy"])
def test_a_launch_runs_on_the_device_of_its_arrays_whatever_is_current(two_gpus, how):
    """As a PyTorch operator runs on its tensors' device: device 0 stays current, the arrays
    say where each launch runs; the thread's current context is left as it was."""
    same_arch_or_skip()
    with kjit.Device(0):
        k = kjit.load(kjit.compile(SAXPY)).get_function("saxpy")   # a kernel of device 0
    driver.ensure_context()
    before = current_context()
    for d in devices_to_test():
        xh, yh = floats(), floats()
        if how == "torch":
            torch = pytest.importorskip("torch")
            x, y = (torch.as_tensor(h, device=f"cuda:{d}") for h in (xh, yh))
            get = lambda a: a.cpu().numpy()   # noqa: E731
        elif how == "cupy":
            cp = import_cupy()
            with cp.cuda.Device(d):
                x, y = cp.asarray(xh), cp.asarray(yh)
                cp.cuda.Device(d).synchronize()
            get = cp.asnumpy
        else:
            with kjit.Device(d):
                x, y = kjit.to_device(xh), kjit.to_device(yh)
            get = lambda a: a.get()   # noqa: E731
        saxpy[GRID, 256](2.0, x, y, N)           # @kjit.kernel: loaded on device d
        k[GRID, 256](1.0, x, y, N)               # a kernel of device 0: its twin on d runs
        k.launch(GRID, 256, 1.0, x, y, N)        # keywords: the same rule
        assert current_context() == before, d
        with kjit.Device(d):
            kjit.synchronize()
        np.testing.assert_allclose(get(y), 4 * xh.astype(np.float64) + yh, rtol=1e-5, atol=1e-5)
    assert current_context() == before


def test_kjit_arrays_copy_between_devices(two_gpus):
    xh = floats()
    chain = devices_to_test() + [0]
    with kjit.Device(chain[0]):
        a = kjit.to_device(xh)
    for d in chain[1:]:
        b = a.to(d)
        assert b.device == d and (b is a) == (a.device == d)
        np.testing.assert_array_equal(b.get(), xh)
        with kjit.Device(d):
            out = kjit.zeros(N, "float32")
        saxpy[GRID, 256](1.0, b, out, N)         # a kernel on d reads it
        with kjit.Device(d):
            kjit.synchronize()
        np.testing.assert_array_equal(out.get(), xh)
        a = b
    with pytest.raises(kjit.ArgumentError, match="device must be an ordinal"):
        a.to(-1)


def test_kjit_streams_of_device_1_work_and_those_of_device_0_are_refused(two_gpus):
    with kjit.Device(0):
        s0 = kjit.Stream()
    xh, yh = floats(), floats()
    with kjit.Device(1):
        x, y = kjit.to_device(xh), kjit.to_device(yh)
        s1 = kjit.Stream(non_blocking=True)
        saxpy[GRID, 256, s1](2.0, x, y, N)
        s1.synchronize()
        np.testing.assert_allclose(y.get(), 2 * xh.astype(np.float64) + yh, rtol=1e-6, atol=1e-6)
        for stream in (s0, s0.ptr):
            with pytest.raises(ArgumentError, match="arrays are on device 1 but the stream given is on device 0"):
                saxpy[GRID, 256, stream](2.0, x, y, N)
        with pytest.raises(ArgumentError, match="arrays are on device 1 but the stream given is on device 0"):
            saxpy.launch(GRID, 256, 2.0, x, y, N, stream=s0)
        kjit.synchronize()
        np.testing.assert_allclose(y.get(), 2 * xh.astype(np.float64) + yh, rtol=1e-6, atol=1e-6)


def test_torch_arrays_and_streams_on_device_1(two_gpus):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("PyTorch sees fewer than two GPUs")
    torch.zeros(1, device="cuda:0")   # PyTorch has device 0's context too, as programs do
    x = torch.randn(N, device="cuda:1")
    y = torch.randn(N, device="cuda:1")
    s1 = torch.cuda.Stream(device=1)
    s0 = torch.cuda.Stream(device=0)
    expect = y.clone()
    with torch.cuda.device(1):
        saxpy[GRID, 256](2.0, x, y, N)      # the reported bug: "array is on device 0"
        expect += 2 * x
        s1.wait_stream(torch.cuda.current_stream())
        for stream in (s1, s1.cuda_stream):  # the stream object and its raw handle
            saxpy[GRID, 256, stream](1.0, x, y, N)
            expect += x
        with torch.cuda.stream(s1):
            saxpy[GRID, 256, torch.cuda.current_stream()](1.0, x, y, N)
            expect += x
        s1.synchronize()
        torch.testing.assert_close(y, expect)
        x0 = torch.randn(N, device="cuda:0")
        with pytest.raises(ArgumentError, match="arrays are on device 1 but the stream given is on device 0"):
            saxpy[GRID, 256, s0](2.0, x, y, N)
        with pytest.raises(ArgumentError, match="arrays are on 2 devices \\('x' on device 0; 'y' on device 1\\)"):
            saxpy[GRID, 256](2.0, x0, y, N)
        torch.cuda.synchronize()
    torch.testing.assert_close(y, expect)   # the refused launches did nothing
    with torch.cuda.device(0):              # and the other way round
        with pytest.raises(ArgumentError, match="arrays are on device 0 but the stream given is on device 1"):
            saxpy[GRID, 256, s1](2.0, x0, x0, N)
        with pytest.raises(ArgumentError, match="'y' on device 0; 'x' on device 1"):
            saxpy[GRID, 256](2.0, x, x0, N)

    class DlpackOnly:   # a device-1 array known only through DLPack
        def __init__(self, t): self.t = t
        def __dlpack__(self, **kw): return self.t.__dlpack__(**kw)
        def __dlpack_device__(self): return self.t.__dlpack_device__()
    out = torch.zeros(N, device="cuda:1")
    with torch.cuda.device(1):
        saxpy[GRID, 256](1.0, DlpackOnly(x), DlpackOnly(out), N)
        torch.cuda.synchronize()
    torch.testing.assert_close(out, x)


def test_cupy_arrays_and_streams_on_device_1(two_gpus):
    cp = import_cupy()
    xh, yh = floats(), floats()
    with cp.cuda.Device(0):
        s0 = cp.cuda.Stream(non_blocking=True)
        x0 = cp.asarray(xh)
    with cp.cuda.Device(1):
        x, y = cp.asarray(xh), cp.asarray(yh)
        s1 = cp.cuda.Stream(non_blocking=True)
        cp.cuda.Device(1).synchronize()
        for stream in (s1, s1.ptr):
            saxpy[GRID, 256, stream](1.0, x, y, N)
        s1.synchronize()
        np.testing.assert_allclose(cp.asnumpy(y), 2 * xh.astype(np.float64) + yh, rtol=1e-6, atol=1e-6)
        with pytest.raises(ArgumentError, match="arrays are on device 1 but the stream given is on device 0"):
            saxpy[GRID, 256, s0](1.0, x, y, N)
        with pytest.raises(ArgumentError, match="'x' on device 0; 'y' on device 1"):
            saxpy[GRID, 256](1.0, x0, y, N)
        cp.cuda.Device(1).synchronize()
        np.testing.assert_allclose(cp.asnumpy(y), 2 * xh.astype(np.float64) + yh, rtol=1e-6, atol=1e-6)


@kjit.kernel
def late_fill():
    # waits ~50 ms before writing: work queued behind it on its stream must wait
    return r'''
    extern "C" __global__ void late_fill(float* x, float v, int n) {
        unsigned long long start, now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
        do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < 50000000ull);
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] = v;
    }'''


def test_a_launch_given_no_stream_follows_cupys_stream_of_its_arrays_device(two_gpus):
    """CuPy keeps a current stream per device; arrays of device 1 launched on while device 0 is
    current run on device 1's, as CuPy's own kernels would with device 1 current."""
    cp = import_cupy()
    xh = floats()
    with cp.cuda.Device(1):
        s1 = cp.cuda.Stream(non_blocking=True)
        s1.use()
    try:
        for _ in range(3):   # the first launch goes through Python, the later ones through C
            with cp.cuda.Device(1):
                x, y = cp.asarray(xh), cp.zeros(N, cp.float32)
                cp.cuda.Device(1).synchronize()
            late_fill[GRID, 256, s1](y, 1.0, N)
            with cp.cuda.Device(0):
                saxpy[GRID, 256](2.0, x, y, N)   # must queue behind the fill on s1
            s1.synchronize()
            np.testing.assert_allclose(cp.asnumpy(y), 2 * xh + 1, rtol=1e-6, atol=1e-6)
    finally:
        with cp.cuda.Device(1):
            cp.cuda.Stream.null.use()


def test_peer_access_is_the_programs_explicit_choice(two_gpus):
    if not kjit.Device(1).can_access_peer(0):
        pytest.skip("device 1 cannot access device 0's memory (no peer access)")
    xh = floats()
    with kjit.Device(0):
        x0 = kjit.to_device(xh)
    with kjit.Device(1):
        y1 = kjit.zeros(N, "float32")
        with pytest.raises(ArgumentError, match=r"enable_peer_access\(0\)"):
            saxpy[GRID, 256](1.0, x0, y1, N)
        kjit.Device(1).enable_peer_access(0)
        kjit.Device(1).enable_peer_access(0)            # twice is fine
        saxpy[GRID, 256](1.0, kjit.ptr(x0.ptr), y1, N)  # reads device 0's memory in place
        np.testing.assert_array_equal(y1.get(), xh)


# --- threads and processes --------------------------------------------------------------

@pytest.mark.parametrize("how", ["kjit", "torch"])
def test_one_thread_per_gpu_launching_together(two_gpus, how):
    if how == "torch":
        torch = pytest.importorskip("torch")
    rounds = 300
    devices = list(range(driver.device_count()))
    inputs = {d: floats() for d in devices}
    results, seen, errors = {}, {}, []
    barrier = threading.Barrier(len(devices))
    main_before = current_context()

    def work(d: int) -> None:
        try:
            fresh = current_context()   # a new thread has no context
            if how == "torch":
                torch.cuda.set_device(d)
                x = torch.as_tensor(inputs[d], device=f"cuda:{d}")
                y = torch.zeros(N, device=f"cuda:{d}")
            else:
                dev = kjit.Device(d)
                dev.__enter__()
                x, y = kjit.to_device(inputs[d]), kjit.zeros(N, "float32")
            barrier.wait()
            for _ in range(rounds):
                saxpy[GRID, 256](1.0, x, y, N)
            kjit.synchronize()
            seen[d] = (fresh, current_context(), int(driver.primary_context(d)))
            results[d] = y.cpu().numpy() if how == "torch" else y.get()
            if how == "kjit":
                dev.__exit__(None, None, None)
                seen[d] += (current_context(),)
        except BaseException as exc:  # reported by the main thread
            errors.append((d, exc))
            barrier.abort()
    threads = [threading.Thread(target=work, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for d in devices:
        np.testing.assert_allclose(results[d], rounds * inputs[d].astype(np.float64), rtol=1e-4, atol=1e-4)
        fresh, during, primary = seen[d][:3]
        assert fresh == 0 and during == primary      # each thread ran in its own device's context
        if how == "kjit":
            assert seen[d][3] == 0                   # and kjit.Device left no context behind
    assert len({seen[d][1] for d in devices}) == len(devices)
    assert current_context() == main_before          # nothing leaked into the main thread


CHILD = textwrap.dedent('''
    import numpy as np, kjit
    from kjit import driver
    src = 'extern "C" __global__ void twice(const float* x, float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2 * x[i]; }'
    n = 4096
    x = np.arange(n, dtype=np.float32)
    y = kjit.zeros(n, "float32")
    kjit.load(kjit.compile(src)).get_function("twice")[n // 256, 256](kjit.to_device(x), y, n)
    assert np.array_equal(y.get(), 2 * x)
    drv = driver.bindings()
    bus = driver.call(drv.cuDeviceGetPCIBusId, 64, driver.call(drv.cuDeviceGet, 0))
    bus = bus.decode() if isinstance(bus, bytes) else str(bus)
    print("OK", driver.device_count(), bus.split(chr(0))[0])
''')


def pci_bus_id(ordinal: int) -> str:
    drv = driver.bindings()
    bus = driver.call(drv.cuDeviceGetPCIBusId, 64, driver.call(drv.cuDeviceGet, ordinal))
    return (bus.decode() if isinstance(bus, bytes) else str(bus)).split(chr(0))[0]


SPAWNED = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.multiprocessing as mp

    SRC = ('extern "C" __global__ void twice(const float* x, float* y, int n) {'
           ' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2 * x[i]; }')

    def rank(local_rank, out_dir, tag):
        os.environ["LOCAL_RANK"] = str(local_rank)    # as torchrun sets it
        import kjit
        events = []
        kjit.cache.add_listener(lambda e: events.append(e.event))
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

        @kjit.kernel
        def twice():
            return SRC + f"// {tag}\\n"
        n = 1 << 16
        x = torch.arange(n, device="cuda", dtype=torch.float32)
        y = torch.empty_like(x)
        for _ in range(50):
            twice[n // 256, 256](x, y, n)
        torch.cuda.synchronize()
        ok = bool(torch.equal(y, 2 * x)) and y.device.index == local_rank
        with open(os.path.join(out_dir, f"{local_rank}.json"), "w") as f:
            json.dump({"ok": ok, "events": events}, f)

    if __name__ == "__main__":
        mp.spawn(rank, args=(sys.argv[1], sys.argv[2]), nprocs=torch.cuda.device_count())
''')


def test_one_process_per_gpu_spawned_with_local_rank_compiles_once(two_gpus, tmp_path):
    """torch.multiprocessing.spawn, one rank per GPU, each choosing its GPU by LOCAL_RANK as a
    torchrun script does: every rank right on its own device, one compile for all of them
    (the others find it in the shared disk cache)."""
    pytest.importorskip("torch")
    same_arch_or_skip()
    script = tmp_path / "ranks.py"
    script.write_text(SPAWNED)
    path = os.pathsep.join([str(Path(kjit.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "KJIT_CACHE_DIR": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, str(script), str(tmp_path), str(rng.integers(2**31))],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    import json
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(driver.device_count())]
    assert all(r["ok"] for r in ranks), ranks
    misses = sum(r["events"].count("miss") for r in ranks)
    assert misses == 1, ranks   # one compile; every other rank a hit


def test_one_process_per_gpu_with_cuda_visible_devices(two_gpus):
    path = os.pathsep.join([str(Path(kjit.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    procs = {d: subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "CUDA_VISIBLE_DEVICES": str(d), "PYTHONPATH": path})
             for d in (0, 1)}   # both at once, as a launcher starting one rank per GPU would
    for d, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        ok, count, bus = out.split()
        assert (ok, count) == ("OK", "1")                # the child sees its one GPU as device 0
        assert bus.lower() == pci_bus_id(d).lower()      # and it is the GPU it was given


STICKY_ELSEWHERE = textwrap.dedent('''
    import sys, threading, kjit
    mode = sys.argv[1]
    src = 'extern "C" __global__ void fill(int* p) { p[threadIdx.x] = 7; }'
    code = kjit.compile(src)
    if mode == "ready":   # device 1's context made, module loaded and launched before the fault
        with kjit.Device(1):
            fill1, out1 = kjit.load(code).get_function("fill"), kjit.zeros(32, "int32")
            fill1[1, 32](out1)
            kjit.synchronize()
    bad = kjit.load(kjit.compile('extern "C" __global__ void bad_kernel(int* p) { p[threadIdx.x] = 1; }'))
    bad.get_function("bad_kernel")[1, 32](kjit.ptr(8))
    try:
        kjit.synchronize()
    except kjit.DriverError as e:
        print("DEVICE0", e.cuda_name, "every other device" in str(e))
    def on_device_1():
        try:
            with kjit.Device(1):
                if mode == "ready":
                    fill, out = fill1, out1
                else:
                    fill, out = kjit.load(code).get_function("fill"), kjit.zeros(32, "int32")
                fill[1, 32](out)
                print("DEVICE1", out.get().tolist() == [7] * 32)
        except kjit.DriverError as e:
            said = "unusable in this process since an earlier CUDA_ERROR_ILLEGAL_ADDRESS on device 0" in str(e)
            print("DEVICE1 refused", e.cuda_name, said)
    if mode == "thread":
        t = threading.Thread(target=on_device_1)
        t.start()
        t.join()
    else:
        on_device_1()
''')


@pytest.mark.parametrize("mode", ["fresh", "thread", "ready"])
def test_a_fault_on_one_device_ends_cuda_for_the_process_and_says_so(two_gpus, mode):
    """What the driver allows after a sticky error on device 0 (driver 580, two H100s): no
    CUDA call of the process succeeds any more on device 1 either: not making its context
    (from the faulting thread or another one), nor launching in a context made before the
    fault. kjit's errors say exactly that, naming the first fault; a new process is the only
    way back, which one process per GPU limits to that GPU's rank."""
    path = os.pathsep.join([str(Path(kjit.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", STICKY_ELSEWHERE, mode], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": path})
    assert "DEVICE0 CUDA_ERROR_ILLEGAL_ADDRESS True" in res.stdout, res.stdout + res.stderr
    assert "DEVICE1 refused CUDA_ERROR_ILLEGAL_ADDRESS True" in res.stdout, res.stdout + res.stderr
    # and a new process has device 1 back
    res = subprocess.run([sys.executable, "-c", CHILD],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": "1"})
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr
