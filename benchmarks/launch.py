"""Benchmark 1: host-side cost per launch of the same kernel, with 1, 3 and 16 arguments:
raw C cuLaunchKernel, cuda.bindings with a prebuilt void**, kjit k[grid, block](...) and
k.launch, cuda.core launch, CuPy RawKernel. Each result is checked on the device."""
from __future__ import annotations

import ctypes
import json
import os
import statistics
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

import kjit
from kjit import driver

from .kernels import cuda_core_device, cuda_core_kernel, expected, launch_args, launch_source, numpy_args
from .timing import PER_BATCH, Loop

NARGS = (1, 3, 16)
HERE = Path(__file__).parent


def _check(name: str, nargs: int, got: float) -> dict:
    ok = abs(got - expected(nargs)) < 1e-3
    if not ok:
        raise SystemExit(f"{name} with {nargs} args left {got} in out[0], expected {expected(nargs)}: "
                         "its launches did nothing")
    return {"check": got}


# The paired method, batch by batch: in each round every toolkit's batches alternate with
# batches of C's loop in this process, so each batch has a C batch beside it in time, on the
# same thread and CPU; a round's figure is the ratio of the two medians over its batches, and
# a row is the median of those per-round ratios (with their min and max). A VM's neighbours
# move C itself by 30% between rounds; a ratio taken between neighbouring batches cancels it.
# A toolkit launching on a stream of its own is paired with C's loop on that same stream.
ROUNDS = int(os.environ.get("KJIT_BENCH_LAUNCH_ROUNDS", "21"))
BATCHES_PER_ROUND = 10


class Toolkit:
    """One way to launch the benchmark kernels: prepare once, then time batches. A Python
    toolkit keeps, per argument count, a tuple whose last item is its launch Loop."""

    name = ""
    state: dict
    # the stream its launches go to, where not the legacy one: C's loop beside it runs there too
    # (the driver's cost differs between the legacy stream and a created one)
    c_stream: int | None = None

    def prepare(self, n: int) -> None: ...

    def batch(self, n: int) -> float:
        """µs per launch over one batch of PER_BATCH launches (the queue not drained)."""
        return self.state[n][-1](PER_BATCH) / PER_BATCH / 1e3

    def sync(self) -> None:
        kjit.synchronize()

    def check(self, n: int) -> None:
        _check(self.name, n, float(self.state[n][0].get()[0]))


def _prebuilt(n: int) -> tuple:
    """(CUfunction, output array, argument holders, void** array) of the n-argument kernel:
    what a C caller passes cuLaunchKernel."""
    func = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}").handle
    buf = kjit.zeros(16, np.float32)
    holders = [ctypes.c_uint64(buf.ptr)]
    for v in launch_args(n):
        holders.append(ctypes.c_int32(v) if isinstance(v, int) else ctypes.c_float(v))
    return func, buf, holders, (ctypes.c_void_p * n)(*[ctypes.addressof(h) for h in holders])


class CInProcess(Toolkit):
    """C's cuLaunchKernel loop in this process (benchmarks/c/launch_loop.c through ctypes, one
    call per batch): the floor every ratio is taken to. It runs on the thread, CPU and
    context the Python toolkits run on, so a round's ratios compare like with like."""
    name = "C cuLaunchKernel"

    def __init__(self, workdir: Path):
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        lib = workdir / "liblaunch_loop.so"
        subprocess.run([nvcc, "-O2", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib),
                        str(HERE / "c" / "launch_loop.c"), "-lcuda"], check=True, capture_output=True)
        self.lib = ctypes.CDLL(str(lib))
        self.lib.launch_batch.restype = ctypes.c_double
        self.lib.launch_batch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.lib.launch_block_batch.restype = ctypes.c_double
        self.lib.launch_block_batch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                ctypes.c_int, ctypes.c_void_p]
        self.lib.graph_batch.restype = ctypes.c_double
        self.lib.graph_batch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.state: dict = {}

    def prepare(self, n):
        func, buf, holders, arr = _prebuilt(n)
        self.state[n] = (buf, holders, arr, int(func))

    def batch(self, n, stream: int | None = None):
        _, _, arr, func = self.state[n]
        us = self.lib.launch_batch(func, ctypes.addressof(arr), PER_BATCH, stream)
        if us < 0:
            raise SystemExit(f"C cuLaunchKernel failed: CUresult {-int(us)}")
        return us


def _prebuilt_block(n: int) -> tuple:
    """(CUfunction, output array, argument holders, parameter block, its size) of the
    n-argument kernel: the block laid out as cuFuncGetParamInfo says."""
    k = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}")
    if not k.block_size:
        raise RuntimeError("the driver does not report parameter layouts (cuFuncGetParamInfo)")
    func, buf, holders, _ = _prebuilt(n)
    block = ctypes.create_string_buffer(k.block_size)
    for slot, held in zip(k.params, holders):
        ctypes.memmove(ctypes.addressof(block) + slot.offset, ctypes.addressof(held), ctypes.sizeof(held))
    return func, buf, holders, block, k.block_size


class CBlock(Toolkit):
    """C's loop with the parameters as one buffer (CU_LAUNCH_PARAM_BUFFER_POINTER), laid out as
    cuFuncGetParamInfo says: what kjit's C launchers hand the driver, written in C."""
    name = "C cuLaunchKernel, parameters as one buffer"

    def __init__(self, floor: CInProcess):
        self.floor = floor
        self.state: dict = {}

    def prepare(self, n):
        func, buf, holders, block, size = _prebuilt_block(n)
        self.state[n] = (buf, holders, block, int(func), size)

    def batch(self, n):
        _, _, block, func, size = self.state[n]
        us = self.floor.lib.launch_block_batch(func, ctypes.addressof(block), size, PER_BATCH, None)
        if us < 0:
            raise SystemExit(f"C cuLaunchKernel with one buffer failed: CUresult {-int(us)}")
        return us


class C(Toolkit):
    """The same loop as a program of its own (benchmarks/c/launch_bench.c), a fresh process
    each round: what a C program pays, shown beside the in-process floor."""
    name = "C cuLaunchKernel, a separate program"

    def __init__(self, workdir: Path):
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        self.exe = workdir / "launch_bench"
        self.workdir = workdir
        subprocess.run([nvcc, "-O2", "-o", str(self.exe), str(HERE / "c" / "launch_bench.c"), "-lcuda"],
                       check=True, capture_output=True)
        self.last: dict[int, float] = {}

    def prepare(self, n):
        kjit.compile(launch_source(n), target="cubin").save(self.workdir / f"k{n}.cubin")

    def time_round(self, n):
        res = subprocess.run([str(self.exe), str(self.workdir / f"k{n}.cubin"), f"k{n}", str(n),
                              str(PER_BATCH), str(BATCHES_PER_ROUND)], check=True,
                             capture_output=True, text=True)
        data = json.loads(res.stdout)
        self.last[n] = data["check"]
        return data["per_launch_us_median"]

    def check(self, n):
        _check(self.name, n, self.last[n])


class PythonFloor(Toolkit):
    """A C extension function that reads none of its arguments and calls cuLaunchKernel
    (benchmarks/c/py_floor.c): the loop, the call and the launch every Python launcher pays
    before any work of its own. One kernel at a time is prepared in it, so each batch prepares
    its own."""
    name = "Python's floor: a bare C function call, then cuLaunchKernel"

    def __init__(self, workdir: Path):
        import importlib.util
        import sysconfig
        so = workdir / ("py_floor" + sysconfig.get_config_var("EXT_SUFFIX"))
        cuda = Path(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc").resolve().parent.parent
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC",
                        f"-I{sysconfig.get_paths()['include']}", f"-I{cuda / 'include'}",
                        "-o", str(so), str(HERE / "c" / "py_floor.c"), f"-L{cuda / 'lib64' / 'stubs'}",
                        "-lcuda"], check=True, capture_output=True)
        spec = importlib.util.spec_from_file_location("py_floor", so)
        self.ext = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.ext)
        self.state = {}

    def prepare(self, n):
        func, buf, holders, arr = _prebuilt(n)
        args = [buf, *launch_args(n)]
        self.state[n] = (buf, holders, arr, int(func), Loop("launch({args})", args, launch=self.ext.launch))

    def batch(self, n):
        _, _, arr, func, loop = self.state[n]
        self.ext.prepare(func, ctypes.addressof(arr))
        return loop(PER_BATCH) / PER_BATCH / 1e3


class PythonFloorBlock(PythonFloor):
    """Python's floor with the parameters as one block, as kjit's launcher hands them: the floor
    of kjit's own form (the driver copies one piece instead of one per parameter, and reads
    no pointer array)."""
    name = "Python's floor, parameters as one buffer"

    def __init__(self, floor: PythonFloor):
        self.ext, self.state = floor.ext, {}

    def prepare(self, n):
        func, buf, holders, block, size = _prebuilt_block(n)
        args = [buf, *launch_args(n)]
        self.state[n] = (buf, holders, block, int(func), size,
                         Loop("launch({args})", args, launch=self.ext.launch_block))

    def batch(self, n):
        _, _, block, func, size, loop = self.state[n]
        self.ext.prepare_block(func, ctypes.addressof(block), size)
        return loop(PER_BATCH) / PER_BATCH / 1e3


class Bindings(Toolkit):
    """cuda.bindings with a prebuilt void** array."""
    name = "cuda.bindings void**"

    def __init__(self):
        self.state = {}

    def prepare(self, n):
        drv = driver.bindings()
        func, buf, holders, arr = _prebuilt(n)
        addr, stream, launch = ctypes.addressof(arr), drv.CUstream(0), drv.cuLaunchKernel
        self.state[n] = (buf, holders, arr, Loop("launch(func, 1, 1, 1, 32, 1, 1, 0, stream, addr, 0)",
                                                  launch=launch, func=func, stream=stream, addr=addr))



class KjitGetitem(Toolkit):
    name = "kjit k[grid, block](...)"

    def __init__(self):
        self.state = {}

    def prepare(self, n):
        k = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}")
        buf = kjit.zeros(16, np.float32)
        args = [buf, *launch_args(n)]
        self.state[n] = (buf, self.make(k, args))

    def make(self, k, args):
        return Loop("k[1, 32]({args})", args, k=k)



class KjitStreamShared(KjitGetitem):
    name = "kjit k[grid, block, stream, 0](...)"

    def make(self, k, args):
        if self.c_stream is None:
            self.stream = kjit.Stream()
            self.c_stream = int(self.stream.handle)
        return Loop("k[1, 32, stream, 0]({args})", args, k=k, stream=self.stream)


class KjitDecorator(KjitGetitem):
    """@kjit.kernel: each call finds the specialization for the current context, then launches."""
    name = "kjit @kernel f[grid, block](...)"

    def prepare(self, n):
        src = launch_source(n)
        f = kjit.kernel(lambda: src, name=f"k{n}")
        buf = kjit.zeros(16, np.float32)
        args = [buf, *launch_args(n)]
        f[1, 32](*args)  # compile and load outside the timing
        self.state[n] = (buf, Loop("f[1, 32]({args})", args, f=f))


class KjitBound(KjitGetitem):
    name = "kjit bound launcher L(...)"

    def make(self, k, args):
        launcher = k[1, 32]
        return Loop("launcher({args})", args, launcher=launcher)


class KjitTorch(Toolkit):
    """A PyTorch tensor and a torch.cuda.Stream passed straight to a kjit kernel."""
    name = "kjit k[g, b, torch stream](torch tensor, ...)"

    def __init__(self):
        import torch
        self.torch = torch
        self.stream = torch.cuda.Stream()
        self.c_stream = self.stream.cuda_stream
        self.state = {}

    def prepare(self, n):
        from kjit.runtime import torch_facts
        k = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}")
        buf = self.torch.zeros(16, dtype=self.torch.float32, device="cuda")
        args, stream = [buf, *launch_args(n)], self.stream
        self.state[n] = (buf, Loop("k[1, 32, stream]({args})", args, k=k, stream=stream))
        # the first launch hands the C packer PyTorch's shim, and builds the one-call reader
        # (kept: a later process loads it): time what a program gets once it is in use
        self.state[n][-1](1)
        torch_facts.wait()

    def sync(self):
        self.stream.synchronize()

    def check(self, n):
        _check(self.name, n, float(self.state[n][0][0].item()))


class KjitCuPy(KjitTorch):
    name = "kjit k[g, b, cupy stream](cupy array, ...)"
    stmt = "k[1, 32, stream]({args})"

    def __init__(self):
        import cupy
        self.cp = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.c_stream = self.stream.ptr
        self.state = {}

    def prepare(self, n):
        k = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}")
        buf = self.cp.zeros(16, self.cp.float32)
        args, stream = [buf, *launch_args(n)], self.stream
        self.state[n] = (buf, Loop(self.stmt, args, k=k, stream=stream))

    def check(self, n):
        _check(self.name, n, float(self.state[n][0][0].get()))


class KjitCuPyCurrent(KjitCuPy):
    """No stream named: the launch follows CuPy's current stream, read on every launch."""
    name = "kjit k[g, b](cupy array, ...) in `with cupy stream:`"
    stmt = "k[1, 32]({args})"

    def batch(self, n):
        with self.stream:
            return super().batch(n)


class KjitViaBindings(KjitGetitem):
    """kjit's launcher with cuda.bindings' cuLaunchKernel instead of the C call (the fallback
    when kjit/runtime/_launch.c is not built)."""
    name = "kjit k[...] via cuda.bindings call"

    def prepare(self, n):
        os.environ["KJIT_LAUNCH"] = "bindings"
        try:
            super().prepare(n)
        finally:
            del os.environ["KJIT_LAUNCH"]


class KjitLaunch(KjitGetitem):
    name = "kjit k.launch(...)"

    def make(self, k, args):
        return Loop("k.launch(1, 32, {args})", args, k=k)


class CudaCore(Toolkit):
    name = "cuda.core launch"

    def __init__(self):
        self.state = {}
        core, dev, _ = cuda_core_device()
        self.stream, self.config, self.launch = dev.create_stream(), core.LaunchConfig(grid=1, block=32), core.launch
        self.c_stream = int(self.stream.handle)

    def prepare(self, n):
        kern = cuda_core_kernel(n)[2]
        buf = kjit.zeros(16, np.float32)
        args = [buf.ptr, *numpy_args(n)]   # cuda.core takes ints as pointers: scalars as exact numpy types
        self.state[n] = (buf, Loop("launch(stream, cfg, kern, {args})", args, launch=self.launch,
                                   stream=self.stream, cfg=self.config, kern=kern))

    def sync(self):
        self.stream.sync()


class CuPy(Toolkit):
    name = "CuPy RawKernel"

    def __init__(self):
        import cupy
        self.cp = cupy
        self.state = {}

    def prepare(self, n):
        cp = self.cp
        kern = cp.RawKernel(launch_source(n), f"k{n}")
        buf = cp.zeros(16, cp.float32)
        args = (buf, *numpy_args(n))
        self.state[n] = (buf, Loop("kern((1,), (32,), kargs)", kargs=args, kern=kern))

    def sync(self):
        self.cp.cuda.Device().synchronize()

    def check(self, n):
        _check(self.name, n, float(self.state[n][0][0].get()))


ORDER = ["C cuLaunchKernel", "C cuLaunchKernel, a separate program", "C cuLaunchKernel, parameters as one buffer",
         "Python's floor: a bare C function call, then cuLaunchKernel", "Python's floor, parameters as one buffer",
         "cuda.bindings void**", "kjit k[grid, block](...)",
         "kjit k[grid, block, stream, 0](...)", "kjit @kernel f[grid, block](...)",
         "kjit bound launcher L(...)", "kjit k.launch(...)",
         "kjit k[g, b, torch stream](torch tensor, ...)",
         "kjit k[g, b, cupy stream](cupy array, ...)", "kjit k[g, b](cupy array, ...) in `with cupy stream:`",
         "kjit k[...] via cuda.bindings call",
         "cuda.core launch", "CuPy RawKernel", "torch tensors read through"]
TORCH_READER = ORDER[-1]


def _row(us: list[float], floors: list[float], stream: bool) -> dict:
    ratios = [u / f for u, f in zip(us, floors)]
    row = {"us": round(statistics.median(us), 3), "ratio": round(statistics.median(ratios), 3),
           "min": round(min(ratios), 3), "max": round(max(ratios), 3)}
    if stream:   # C's own figure on that stream
        row["c_stream_us"] = round(statistics.median(floors), 3)
    return row


def paired_round(t: Toolkit, floor: CInProcess, n: int) -> tuple[float, float]:
    """(t's median µs, C's median µs) over one round's batches, the two alternating (which
    goes first alternating too), after an untimed pair. C launches on t's stream (c_stream)."""
    ts, cs = [], []
    for b in range(-1, BATCHES_PER_ROUND):
        for who in ((floor, t) if b % 2 else (t, floor)):
            us = floor.batch(n, t.c_stream) if who is floor else t.batch(n)
            who.sync()
            if b >= 0:
                (cs if who is floor else ts).append(us)
    return statistics.median(ts), statistics.median(cs)


def _alone(t: Toolkit, n: int) -> float:
    samples = []
    for _ in range(BATCHES_PER_ROUND):
        samples.append(t.batch(n))
        t.sync()
    return statistics.median(samples)


def pooled(files: list[str]) -> tuple[dict, dict]:
    """The launch section from the rounds of several runs of the same code (their JSON files'
    `launch_rounds`) taken together, as run() computes it from one run's: a median over more
    rounds moves less from run to run, and hosts differ."""
    runs = [json.loads(Path(f).read_text()) for f in files]
    rounds: dict[str, dict[str, list]] = {}
    for r in runs:
        for name, by_n in r["launch_rounds"].items():
            for n, pairs in by_n.items():
                rounds.setdefault(name, {}).setdefault(n, []).extend(pairs)
    first = runs[0]["launch"]
    streamed = {name for name, row in first.items()
                if isinstance(row, dict) and any("c_stream_us" in v for v in row.values())}
    results = {name: row for name, row in first.items() if isinstance(row, str)}
    return _tabulate(rounds, streamed, results), rounds


def _tabulate(rounds: dict, streamed: set, results: dict) -> dict:
    """The table's rows from each toolkit's rounds ((its µs, C's µs beside it) per argument
    count), added to `results` (the rows that have no rounds), in the table's order. C's own
    row comes from the rounds beside toolkits on the legacy stream; a row on a stream of its
    own keeps C's figure on that stream."""
    counts = next(iter(rounds.values())).keys()
    results[CInProcess.name] = {
        n: {"us": round(statistics.median(c for name, rows in rounds.items() if name not in streamed
                                          for _, c in rows[n]), 3), "ratio": 1.0, "min": 1.0, "max": 1.0}
        for n in counts}
    for name, rows in rounds.items():
        results[name] = {n: _row([u for u, _ in pairs], [c for _, c in pairs], name in streamed)
                         for n, pairs in rows.items()}
    return {k: results[k] for k in ORDER if k in results}


def run() -> tuple[dict, dict]:
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        floor = CInProcess(Path(tmp))
        toolkits: list[Toolkit] = [floor, C(Path(tmp)), CBlock(floor), Bindings(), KjitGetitem(), KjitStreamShared(),
                                   KjitDecorator(), KjitBound(), KjitLaunch(), KjitViaBindings()]
        for factory, args in ((PythonFloor, (Path(tmp),)), (KjitTorch, ()), (KjitCuPy, ()),
                              (KjitCuPyCurrent, ()), (CudaCore, ()), (CuPy, ())):
            try:
                toolkits.append(factory(*args))
            except Exception as exc:  # a peer that is missing or changed its API; no compiler
                results[factory.name] = f"unavailable: {type(exc).__name__}: {exc}"
            if factory is PythonFloor and isinstance(toolkits[-1], PythonFloor):
                toolkits.append(PythonFloorBlock(toolkits[-1]))
        ready = []
        for t in toolkits:
            try:
                for n in NARGS:
                    t.prepare(n)
                ready.append(t)
            except Exception as exc:
                results[t.name] = f"failed to prepare: {type(exc).__name__}: {exc}"
        if any(type(t) is KjitTorch for t in ready):
            from kjit.runtime import torch_facts
            results[TORCH_READER] = ("one C call built against this PyTorch" if torch_facts.installed()
                                     else f"PyTorch's C shim ({torch_facts.why_not()})")
        if floor not in ready:
            raise SystemExit(f"the C floor could not be prepared: {results.get(floor.name)}")
        others = [t for t in ready if t is not floor]
        # per toolkit and argument count: (its µs, C's µs beside it) for each round
        rounds: dict[str, dict[int, list[tuple[float, float]]]] = {t.name: {n: [] for n in NARGS} for t in others}
        for r in range(-1, ROUNDS):   # round -1 warms every path (clocks, caches) untimed
            for n in NARGS:
                turn = (r + 1) % len(others)   # each toolkit takes each place in the order in turn
                for t in others[turn:] + others[:turn]:
                    if isinstance(t, C):   # a program of its own: beside a round of the C floor
                        got = (t.time_round(n), _alone(floor, n))
                    else:
                        got = paired_round(t, floor, n)
                    if r >= 0:
                        rounds[t.name][n].append(got)
        for t in ready:
            for n in NARGS:
                t.check(n)   # every figure came from launches that did their work
        table = _tabulate(rounds, {t.name for t in others if t.c_stream is not None}, results)
    raw = {name: {n: [[round(u, 3), round(c, 3)] for u, c in v] for n, v in rows.items()}
           for name, rows in rounds.items()}
    return table, raw
