"""Benchmark: the cost per call, inside XLA, of a small kernel run as a kjit JAX op
(`as_jax_op`, kjit's FFI handler), against the same launch through a C++ FFI handler written
by hand (benchmarks/c/jax_handler.cc, built now with g++ against jaxlib's headers) and a native
JAX op of the same size (x + 1, one fused XLA kernel).

Each row is one jitted function chaining CHAIN calls (y = op(y)), run RUNS times; its figure is
time / (RUNS * CHAIN) in µs. XLA's command buffers are turned off for this section
(XLA_FLAGS), so every call goes through its handler rather than a replayed graph. Rows take turns
round after round; the ratio reported is the median over rounds of kjit / C++ per round
[min-max] (target: <= 1.2), with the eager per-call cost (one op called from Python) beside."""
from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

N = 1024
CHAIN = 100
RUNS = 20
ROUNDS = 15
EAGER_CALLS = 200
TARGET = 1.2
SOURCE = r'''
extern "C" __global__ void add_one(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.0f;
}'''
KJIT = "kjit as_jax_op"
CPP = "C++ FFI handler"
NATIVE = "native JAX x + 1"


def _cpp_handler(jax):
    src = Path(__file__).parent / "c" / "jax_handler.cc"
    out = Path(tempfile.mkdtemp(prefix="kjit-jax-bench-")) / "jax_handler.so"
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", "-w", "-I", jax.ffi.include_dir(),
                    str(src), "-o", str(out), "-ldl"], check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(out))
    if lib.bench_bind() != 0:
        raise RuntimeError("the C++ handler could not bind cuLaunchKernel")
    jax.ffi.register_ffi_target("kjit_bench_cpp", jax.ffi.pycapsule(lib.BenchLaunch), platform="CUDA")
    return lib


def _time_chain(fn, x, sync) -> float:
    sync(fn(x))
    t0 = time.perf_counter()
    for _ in range(RUNS):
        y = fn(x)
    sync(y)
    return (time.perf_counter() - t0) / (RUNS * CHAIN) * 1e6


def _time_eager(fn, x, sync) -> float:
    sync(fn(x))
    t0 = time.perf_counter()
    for _ in range(EAGER_CALLS):
        y = fn(x)
    sync(y)
    return (time.perf_counter() - t0) / EAGER_CALLS * 1e6


def run() -> dict:
    os.environ.setdefault("XLA_FLAGS", "--xla_gpu_enable_command_buffer=")
    import jax
    import jax.numpy as jnp
    import numpy as np

    import kjit
    from kjit.runtime.jax_ffi import kernel_on

    @kjit.kernel
    def add_one():
        return SOURCE
    kjit_op = add_one.as_jax_op(grid=(kjit.cdiv(N, 256),), block=256, outputs={"y": "x"})
    _cpp_handler(jax)
    fn_address = np.int64(int(kernel_on(add_one, 0).handle))
    cpp_call = jax.ffi.ffi_call("kjit_bench_cpp", jax.ShapeDtypeStruct((N,), jnp.float32),
                                vmap_method="sequential")
    ops = {KJIT: lambda y: kjit_op(y, N),
           CPP: lambda y: cpp_call(y, fn=fn_address, n=np.int32(N)),
           NATIVE: lambda y: y + 1}

    def chained(op):
        def body(y):
            for _ in range(CHAIN):
                y = op(y)
            return y
        return jax.jit(body)
    x = jax.device_put(jnp.zeros(N, jnp.float32), jax.devices("gpu")[0])
    sync = jax.block_until_ready
    chains = {name: chained(op) for name, op in ops.items()}
    for name, fn in chains.items():   # each row computes the same thing
        got = float(np.asarray(fn(x))[0])
        if got != CHAIN:
            raise RuntimeError(f"{name}: {got} after {CHAIN} increments")
    per_call: dict[str, list[float]] = {n: [] for n in ops}
    eager: dict[str, list[float]] = {n: [] for n in ops}
    ratios = []
    for r in range(ROUNDS):
        order = list(ops) if r % 2 == 0 else list(reversed(ops))
        row = {name: _time_chain(chains[name], x, sync) for name in order}
        for name in order:
            per_call[name].append(row[name])
            eager[name].append(_time_eager(ops[name], x, sync))
        ratios.append(row[KJIT] / row[CPP])
    out: dict = {}
    for name in ops:
        out[name] = {"us per call in jit": statistics.median(per_call[name]),
                     "us per eager call": statistics.median(eager[name])}
    out["kjit / C++ handler, median of per-round ratios"] = \
        f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]"
    out["ratio"] = statistics.median(ratios)
    out["target"] = TARGET
    out["jax"] = jax.__version__
    out["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    return out


def lines(data: dict) -> list[str]:
    if "error" in data:
        return [f"jax: {data['error']}"]
    out = [f"JAX ops (jax {data['jax']}, XLA_FLAGS={data['xla_flags']!r}): µs per call, "
           f"{CHAIN} chained calls in one jit, and per eager call"]
    for name in (KJIT, CPP, NATIVE):
        r = data[name]
        out.append(f"  {name:32s} {r['us per call in jit']:8.2f} {r['us per eager call']:8.2f}")
    out.append(f"  kjit / C++ handler (median of per-round ratios) "
               f"{data['kjit / C++ handler, median of per-round ratios']} (target <= {TARGET})")
    return out
