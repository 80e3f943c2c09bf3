"""Benchmark 1: host-side cost per launch of the same kernel, with 1, 3 and 16 arguments:
raw C cuLaunchKernel, cuda.bindings with a prebuilt void**, kjit k[grid, block](...) and
k.launch, cuda.core launch, CuPy RawKernel. Each result is checked on the device."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

import kjit
from kjit import driver

from .kernels import expected, launch_args, launch_source
from .timing import BATCHES, PER_BATCH, per_launch_us

NARGS = (1, 3, 16)
HERE = Path(__file__).parent


def _check(name: str, nargs: int, got: float) -> dict:
    ok = abs(got - expected(nargs)) < 1e-3
    if not ok:
        raise SystemExit(f"{name} with {nargs} args left {got} in out[0], expected {expected(nargs)}: "
                         "its launches did nothing")
    return {"check": got}


def bench_c(workdir: Path) -> dict[int, float]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    exe = workdir / "launch_bench"
    subprocess.run([nvcc, "-O2", "-o", str(exe), str(HERE / "c" / "launch_bench.c"), "-lcuda"],
                   check=True, capture_output=True)
    out = {}
    for n in NARGS:
        cubin = workdir / f"k{n}.cubin"
        kjit.compile(launch_source(n), target="cubin").save(cubin)
        res = subprocess.run([str(exe), str(cubin), f"k{n}", str(n), str(PER_BATCH), str(BATCHES)],
                             check=True, capture_output=True, text=True)
        data = json.loads(res.stdout)
        _check("C", n, data["check"])
        out[n] = data["per_launch_us_median"]
    return out


def bench_bindings() -> dict[int, float]:
    """cuda.bindings with a prebuilt void** array: the Python floor."""
    drv = driver.bindings()
    out = {}
    for n in NARGS:
        mod = kjit.load(kjit.compile(launch_source(n)))
        func = mod.get_function(f"k{n}").handle
        buf = kjit.zeros(16, np.float32)
        holders = [ctypes.c_uint64(buf.ptr)]
        for v in launch_args(n):
            holders.append(ctypes.c_int32(v) if isinstance(v, int) else ctypes.c_float(v))
        arr = (ctypes.c_void_p * n)(*[ctypes.addressof(h) for h in holders])
        addr = ctypes.addressof(arr)
        stream = drv.CUstream(0)
        launch = drv.cuLaunchKernel
        out[n] = per_launch_us(lambda: launch(func, 1, 1, 1, 32, 1, 1, 0, stream, addr, 0),
                               kjit.synchronize)
        _check("cuda.bindings", n, float(buf.get()[0]))
    return out


def bench_kjit() -> tuple[dict[int, float], dict[int, float]]:
    sub, meth = {}, {}
    for n in NARGS:
        k = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}")
        buf = kjit.zeros(16, np.float32)
        args = [buf, *launch_args(n)]
        launcher = k[1, 32]

        def via_getitem():
            k[1, 32](*args)
        sub[n] = per_launch_us(via_getitem, kjit.synchronize)
        _check("kjit k[]", n, float(buf.get()[0]))
        buf.fill_zero()
        meth[n] = per_launch_us(lambda: k.launch(1, 32, *args), kjit.synchronize)
        _check("kjit.launch", n, float(buf.get()[0]))
        del launcher
    return sub, meth


def bench_cuda_core() -> dict[int, float] | str:
    try:
        try:
            from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
        except ImportError:
            from cuda.core.experimental import Device, LaunchConfig, Program, ProgramOptions, launch
    except ImportError as exc:
        return f"not installed ({exc})"
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    arch = "".join(str(x) for x in dev.compute_capability)
    out = {}
    for n in NARGS:
        prog = Program(launch_source(n), code_type="c++", options=ProgramOptions(arch=f"sm_{arch}"))
        kern = prog.compile("cubin").get_kernel(f"k{n}")
        buf = kjit.zeros(16, np.float32)
        args = [buf.ptr]
        for v in launch_args(n):  # cuda.core takes ints as pointers: pass exact numpy types
            args.append(np.int32(v) if isinstance(v, int) else np.float32(v))
        cfg = LaunchConfig(grid=1, block=32)
        out[n] = per_launch_us(lambda: launch(stream, cfg, kern, *args), stream.sync)
        _check("cuda.core", n, float(buf.get()[0]))
    return out


def bench_cupy() -> dict[int, float] | str:
    try:
        import cupy as cp
    except ImportError as exc:
        return f"not installed ({exc})"
    out = {}
    for n in NARGS:
        kern = cp.RawKernel(launch_source(n), f"k{n}")
        buf = cp.zeros(16, cp.float32)
        args = (buf, *[np.int32(v) if isinstance(v, int) else np.float32(v) for v in launch_args(n)])
        out[n] = per_launch_us(lambda: kern((1,), (32,), args), cp.cuda.Device().synchronize)
        _check("CuPy", n, float(buf[0].get()))
    return out


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        results = {"C cuLaunchKernel": bench_c(Path(tmp))}
    results["cuda.bindings void**"] = bench_bindings()
    results["kjit k[grid, block](...)"], results["kjit k.launch(...)"] = bench_kjit()
    results["cuda.core launch"] = bench_cuda_core()
    results["CuPy RawKernel"] = bench_cupy()
    return results
