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

from .kernels import expected, launch_args, launch_source
from .timing import PER_BATCH, Loop, per_launch_us

NARGS = (1, 3, 16)
HERE = Path(__file__).parent


def _check(name: str, nargs: int, got: float) -> dict:
    ok = abs(got - expected(nargs)) < 1e-3
    if not ok:
        raise SystemExit(f"{name} with {nargs} args left {got} in out[0], expected {expected(nargs)}: "
                         "its launches did nothing")
    return {"check": got}


# Toolkits take turns, round after round, so drift hits them alike. Each round gives every
# toolkit its median over batches; a figure is then the median over rounds of the per-round
# ratio to C (with its min and max), the paired method: the VM's neighbours move C itself by
# 30% between rounds, and a ratio taken within one round cancels that.
ROUNDS = int(os.environ.get("KJIT_BENCH_LAUNCH_ROUNDS", "21"))
BATCHES_PER_ROUND = 10


class Toolkit:
    """One way to launch the benchmark kernels: prepare once, then time rounds."""

    name = ""

    def prepare(self, n: int) -> None: ...
    def time_round(self, n: int) -> float: ...
    def check(self, n: int) -> None: ...


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
        self.state: dict = {}

    def prepare(self, n):
        func = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}").handle
        buf = kjit.zeros(16, np.float32)
        holders = [ctypes.c_uint64(buf.ptr)]
        for v in launch_args(n):
            holders.append(ctypes.c_int32(v) if isinstance(v, int) else ctypes.c_float(v))
        arr = (ctypes.c_void_p * n)(*[ctypes.addressof(h) for h in holders])
        self.state[n] = (buf, holders, arr, int(func))

    def time_round(self, n):
        buf, _, arr, func = self.state[n]
        samples = []
        for b in range(-1, BATCHES_PER_ROUND):
            us = self.lib.launch_batch(func, ctypes.addressof(arr), PER_BATCH, None)
            if us < 0:
                raise SystemExit(f"C cuLaunchKernel failed: CUresult {-int(us)}")
            kjit.synchronize()
            if b >= 0:
                samples.append(us)
        return statistics.median(samples)

    def check(self, n):
        _check(self.name, n, float(self.state[n][0].get()[0]))


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


class Bindings(Toolkit):
    """cuda.bindings with a prebuilt void** array: the Python floor."""
    name = "cuda.bindings void**"

    def __init__(self):
        self.state = {}

    def prepare(self, n):
        drv = driver.bindings()
        func = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}").handle
        buf = kjit.zeros(16, np.float32)
        holders = [ctypes.c_uint64(buf.ptr)]
        for v in launch_args(n):
            holders.append(ctypes.c_int32(v) if isinstance(v, int) else ctypes.c_float(v))
        arr = (ctypes.c_void_p * n)(*[ctypes.addressof(h) for h in holders])
        addr, stream, launch = ctypes.addressof(arr), drv.CUstream(0), drv.cuLaunchKernel
        self.state[n] = (buf, holders, arr, Loop("launch(func, 1, 1, 1, 32, 1, 1, 0, stream, addr, 0)",
                                                  launch=launch, func=func, stream=stream, addr=addr))

    def time_round(self, n):
        return per_launch_us(self.state[n][3], kjit.synchronize, batches=BATCHES_PER_ROUND)

    def check(self, n):
        _check(self.name, n, float(self.state[n][0].get()[0]))


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

    def time_round(self, n):
        return per_launch_us(self.state[n][1], kjit.synchronize, batches=BATCHES_PER_ROUND)

    def check(self, n):
        _check(self.name, n, float(self.state[n][0].get()[0]))


class KjitStreamShared(KjitGetitem):
    name = "kjit k[grid, block, stream, 0](...)"

    def make(self, k, args):
        stream = kjit.Stream()
        self.stream = stream
        return Loop("k[1, 32, stream, 0]({args})", args, k=k, stream=stream)


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
        self.state = {}

    def prepare(self, n):
        k = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}")
        buf = self.torch.zeros(16, dtype=self.torch.float32, device="cuda")
        args, stream = [buf, *launch_args(n)], self.stream
        self.state[n] = (buf, Loop("k[1, 32, stream]({args})", args, k=k, stream=stream))

    def time_round(self, n):
        return per_launch_us(self.state[n][1], self.stream.synchronize, batches=BATCHES_PER_ROUND)

    def check(self, n):
        _check(self.name, n, float(self.state[n][0][0].item()))


class KjitCuPy(KjitTorch):
    name = "kjit k[g, b, cupy stream](cupy array, ...)"

    def __init__(self):
        import cupy
        self.cp = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.state = {}

    def prepare(self, n):
        k = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}")
        buf = self.cp.zeros(16, self.cp.float32)
        args, stream = [buf, *launch_args(n)], self.stream
        self.state[n] = (buf, Loop("k[1, 32, stream]({args})", args, k=k, stream=stream))

    def check(self, n):
        _check(self.name, n, float(self.state[n][0][0].get()))


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
        try:
            from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
        except ImportError:
            from cuda.core.experimental import Device, LaunchConfig, Program, ProgramOptions, launch
        self.api = (Program, ProgramOptions, LaunchConfig, launch)
        dev = Device(0)
        dev.set_current()
        self.stream = dev.create_stream()
        self.arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
        self.state = {}

    def prepare(self, n):
        Program, ProgramOptions, LaunchConfig, launch = self.api
        prog = Program(launch_source(n), code_type="c++", options=ProgramOptions(arch=self.arch))
        kern = prog.compile("cubin").get_kernel(f"k{n}")
        buf = kjit.zeros(16, np.float32)
        args = [buf.ptr]  # cuda.core takes ints as pointers: scalars as exact numpy types
        args += [np.int32(v) if isinstance(v, int) else np.float32(v) for v in launch_args(n)]
        cfg, stream = LaunchConfig(grid=1, block=32), self.stream
        self.state[n] = (buf, Loop("launch(stream, cfg, kern, {args})", args, launch=launch,
                                   stream=stream, cfg=cfg, kern=kern))

    def time_round(self, n):
        return per_launch_us(self.state[n][1], self.stream.sync, batches=BATCHES_PER_ROUND)

    def check(self, n):
        _check(self.name, n, float(self.state[n][0].get()[0]))


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
        args = (buf, *[np.int32(v) if isinstance(v, int) else np.float32(v) for v in launch_args(n)])
        self.state[n] = (buf, Loop("kern((1,), (32,), kargs)", kargs=args, kern=kern))

    def time_round(self, n):
        return per_launch_us(self.state[n][1], self.cp.cuda.Device().synchronize, batches=BATCHES_PER_ROUND)

    def check(self, n):
        _check(self.name, n, float(self.state[n][0][0].get()))


ORDER = ["C cuLaunchKernel", "C cuLaunchKernel, a separate program", "cuda.bindings void**", "kjit k[grid, block](...)",
         "kjit k[grid, block, stream, 0](...)", "kjit @kernel f[grid, block](...)",
         "kjit bound launcher L(...)", "kjit k.launch(...)",
         "kjit k[g, b, torch stream](torch tensor, ...)",
         "kjit k[g, b, cupy stream](cupy array, ...)", "kjit k[...] via cuda.bindings call",
         "cuda.core launch", "CuPy RawKernel"]


def paired(samples: dict[str, dict[int, list[float]]], c_name: str = "C cuLaunchKernel") -> dict:
    """{toolkit: {nargs: {"us", "ratio", "min", "max"}}}: per-round ratios to C, their median,
    min and max, and the median µs."""
    out: dict = {}
    c = samples[c_name]
    for name, rows in samples.items():
        out[name] = {}
        for n, values in rows.items():
            ratios = [v / cv for v, cv in zip(values, c[n])]
            out[name][n] = {"us": round(statistics.median(values), 3),
                            "ratio": round(statistics.median(ratios), 3),
                            "min": round(min(ratios), 3), "max": round(max(ratios), 3)}
    return out


def run() -> tuple[dict, dict]:
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        toolkits: list[Toolkit] = [CInProcess(Path(tmp)), C(Path(tmp)), Bindings(), KjitGetitem(), KjitStreamShared(),
                                   KjitDecorator(), KjitBound(), KjitLaunch(), KjitViaBindings()]
        for factory in (KjitTorch, KjitCuPy, CudaCore, CuPy):
            try:
                toolkits.append(factory())
            except Exception as exc:  # a peer that is missing or changed its API
                results[factory.name] = f"unavailable: {type(exc).__name__}: {exc}"
        ready = []
        for t in toolkits:
            try:
                for n in NARGS:
                    t.prepare(n)
                ready.append(t)
            except Exception as exc:
                results[t.name] = f"failed to prepare: {type(exc).__name__}: {exc}"
        samples: dict[str, dict[int, list[float]]] = {t.name: {n: [] for n in NARGS} for t in ready}
        for r in range(-1, ROUNDS):   # round -1 warms every path (clocks, caches) untimed
            for n in NARGS:
                turn = (r + 1) % len(ready)   # each toolkit takes each place in the order in turn
                for t in ready[turn:] + ready[:turn]:
                    us = t.time_round(n)
                    if r >= 0:
                        samples[t.name][n].append(us)
        for t in ready:
            for n in NARGS:
                t.check(n)   # every figure came from launches that did their work
        results.update(paired(samples))
    rounds = {name: {n: [round(x, 3) for x in v] for n, v in rows.items()} for name, rows in samples.items()}
    return {k: results[k] for k in ORDER if k in results}, rounds
