"""Benchmark 4, on two GPUs: kjit's host cost per launch on device 1 against device 0 (the
same kernel, the devices taking turns), and launch throughput with one thread per device
against one thread alone. Each result is checked on the device."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import kjit
from kjit import driver

from .kernels import expected, launch_args, launch_source
from .timing import per_launch_us

NARGS = 3
ROUNDS = 15               # per-launch cost: devices take turns, best round's median each
BATCHES_PER_ROUND = 10
THROUGHPUT_ROUNDS = 7     # throughput: one thread alone and one per device, taking turns
THROUGHPUT_BATCHES = 100
PER_BATCH = 200           # launches between synchronizations (the queue never fills)


def _check(what: str, out: kjit.DeviceArray) -> None:
    got = float(out.get()[0])
    if abs(got - expected(NARGS)) >= 1e-3:
        raise SystemExit(f"{what} left {got} in out[0], expected {expected(NARGS)}: its "
                         "launches did nothing")


def _ratio_summary(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]"


def _per_launch_cost(obj) -> dict:
    """µs per `k[1, 32](...)` on each device, the devices taking turns each round: under
    kjit.Device(d) with d's kernel, and on device 1's arrays with device 0 current (the
    launch routed to device 1, its context pushed for the call). Per-round ratios to device 0."""
    state = {}
    for d in (0, 1):
        with kjit.Device(d):
            k = kjit.load(obj).get_function(f"k{NARGS}")
            out = kjit.zeros(16, np.float32)
        state[d] = (k, out, [out, *launch_args(NARGS)])
    k0 = state[0][0]
    routed_args = state[1][2]
    samples: dict[str, list[float]] = {"0": [], "1": [], "routed": []}
    for r in range(-1, ROUNDS):   # round -1 warms both up untimed
        for d in (0, 1):
            k, out, args = state[d]
            with kjit.Device(d):
                us = per_launch_us(lambda: k[1, 32](*args), kjit.synchronize,
                                   batches=BATCHES_PER_ROUND)
            if r >= 0:
                samples[str(d)].append(us)
        with kjit.Device(0):   # device 0 current, device 1's arrays: device 1 runs it
            us = per_launch_us(lambda: k0[1, 32](*routed_args), kjit.synchronize,
                               batches=BATCHES_PER_ROUND)
        if r >= 0:
            samples["routed"].append(us)
    for d in (0, 1):
        with kjit.Device(d):
            kjit.synchronize()
            _check(f"device {d} launch loop", state[d][1])
    per_round_1 = [b / a for a, b in zip(samples["0"], samples["1"])]
    per_round_routed = [b / a for a, b in zip(samples["0"], samples["routed"])]
    return {"device 0 us per launch": statistics.median(samples["0"]),
            "device 1 us per launch": statistics.median(samples["1"]),
            "device 1 / device 0": statistics.median(per_round_1),
            "device 1 / device 0, per-round median [min-max]": _ratio_summary(per_round_1),
            "device 1 arrays, device 0 current: us per launch": statistics.median(samples["routed"]),
            "device 1 arrays, device 0 current / device 0": _ratio_summary(per_round_routed),
            "device rounds": {k: [round(x, 3) for x in v] for k, v in samples.items()}}


def _first_launch_on_each_device(count: int) -> dict:
    """One @kjit.kernel never compiled before, launched first on device 0 then on each other
    device: the compile happens once (the others are cache hits of the same arch), and each
    other device pays only its module load."""
    tag = time.time_ns()

    @kjit.kernel(name=f"k{NARGS}")
    def fresh():
        return launch_source(NARGS) + f"// {tag}\n"
    events: list[str] = []
    kjit.cache.add_listener(lambda e: events.append(e.event))
    firsts = []
    for d in range(count):
        with kjit.Device(d):
            out = kjit.zeros(16, np.float32)
            kjit.synchronize()
            t0 = time.perf_counter()
            fresh[1, 32](out, *launch_args(NARGS))
            firsts.append((time.perf_counter() - t0) * 1e3)
            kjit.synchronize()
            _check(f"first launch on device {d}", out)
    return {"first launch on device 0 (compile + load) ms": firsts[0],
            "first launch on another device (load only) ms": statistics.median(firsts[1:]),
            f"compiles for {count} devices": events.count("miss")}


def _c_threads(obj) -> list[float]:
    """Two threads / one of cuLaunchKernel from C (benchmarks/c/threads_bench.c), per round:
    how far the driver itself scales; [] where nvcc is missing."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        return []
    work = Path(tempfile.mkdtemp(prefix="kjit-threads-"))
    exe = work / "threads_bench"
    subprocess.run([nvcc, "-O2", "-o", str(exe), str(Path(__file__).parent / "c" / "threads_bench.c"),
                    "-lcuda"], check=True, capture_output=True)
    cubin = work / "k.cubin"
    kjit.compile(launch_source(NARGS), target="cubin").save(cubin)

    def rate(threads: int) -> float:
        res = subprocess.run([str(exe), str(cubin), f"k{NARGS}", str(threads),
                              str(THROUGHPUT_BATCHES), str(PER_BATCH)],
                             check=True, capture_output=True, text=True)
        return json.loads(res.stdout)["launches_per_s"]
    return [rate(2) / rate(1) for _ in range(THROUGHPUT_ROUNDS)]


def _raw_throughput(fn_name: str, devices: tuple[int, ...]) -> float:
    """Launches per second of cuLaunchKernel called through ctypes with a prebuilt void**,
    one thread per device: `CDLL` releases the GIL around each call, `PyDLL` holds it. What
    Python threads can reach at all, and what holding the GIL across the driver call costs."""
    import ctypes
    lib = getattr(ctypes, fn_name)("libcuda.so.1")
    obj = _raw_throughput.obj
    ready = threading.Barrier(len(devices) + 1)
    finished = threading.Barrier(len(devices) + 1)
    spans: list[float] = []

    def work(d: int) -> None:
        with kjit.Device(d):
            k = kjit.load(obj).get_function(f"k{NARGS}")
            out = kjit.zeros(16, np.float32)
            cells = [ctypes.c_uint64(out.ptr), ctypes.c_int(7), ctypes.c_float(2.5)]
            params = (ctypes.c_void_p * 3)(*(ctypes.addressof(c) for c in cells))
            launch = lib.cuLaunchKernel
            launch.restype = ctypes.c_int
            launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
            func = ctypes.c_void_p(int(k.handle))
            err = launch(func, 1, 1, 1, 32, 1, 1, 0, None, params, None)
            if err:
                raise SystemExit(f"raw {fn_name} cuLaunchKernel returned {err}")
            kjit.synchronize()
            ready.wait()
            spans.append(time.perf_counter())
            for _ in range(THROUGHPUT_BATCHES):
                for _ in range(PER_BATCH):
                    launch(func, 1, 1, 1, 32, 1, 1, 0, None, params, None)
                kjit.synchronize()
            spans.append(time.perf_counter())
            finished.wait()
            _check(f"raw {fn_name} thread on device {d}", out)

    threads = [threading.Thread(target=work, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    ready.wait()
    finished.wait()
    elapsed = max(spans) - min(spans)
    for t in threads:
        t.join()
    return len(devices) * THROUGHPUT_BATCHES * PER_BATCH / elapsed


def _throughput(obj, devices: tuple[int, ...]) -> float:
    """Launches per second, one thread per device in `devices`, all started together. Each
    thread loads its own kernel (so it launches on the C fast path) and fetches the launcher
    once, as a hot loop would."""
    ready = threading.Barrier(len(devices) + 1)
    finished = threading.Barrier(len(devices) + 1)
    errors: list[BaseException] = []
    spans: list[float] = []   # each thread's start and end, read by the threads themselves

    def work(d: int) -> None:
        try:
            with kjit.Device(d):
                module = kjit.load(obj)
                out = kjit.zeros(16, np.float32)
                launch, args = module.get_function(f"k{NARGS}")[1, 32], [out, *launch_args(NARGS)]
                launch(*args)
                kjit.synchronize()
                ready.wait()
                spans.append(time.perf_counter())
                for _ in range(THROUGHPUT_BATCHES):
                    for _ in range(PER_BATCH):
                        launch(*args)
                    kjit.synchronize()
                spans.append(time.perf_counter())
                finished.wait()
                _check(f"thread on device {d}", out)
                module.unload()
        except BaseException as exc:   # reported by the caller
            errors.append(exc)
            ready.abort()
            finished.abort()

    threads = [threading.Thread(target=work, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    try:
        ready.wait()
        finished.wait()
        elapsed = max(spans) - min(spans)
    except threading.BrokenBarrierError:   # a thread failed: its error is raised below
        elapsed = 0.0
    finally:
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return len(devices) * THROUGHPUT_BATCHES * PER_BATCH / elapsed


def run() -> dict:
    count = driver.device_count()
    if count < 2:
        return {"error": f"needs two GPUs; this machine has {count}"}
    if kjit.Device(0).arch != kjit.Device(1).arch:
        return {"error": "devices 0 and 1 have different archs"}
    obj = kjit.compile(launch_source(NARGS))   # one compile serves both devices
    results = _per_launch_cost(obj)
    results["device 1 / device 0"] = (results["device 1 us per launch"]
                                      / results["device 0 us per launch"])
    one, two = [], []
    for _ in range(THROUGHPUT_ROUNDS):
        one.append(_throughput(obj, (0,)))
        two.append(_throughput(obj, (0, 1)))
    results["one thread, device 0: launches/s"] = statistics.median(one)
    results["two threads, devices 0+1: launches/s"] = statistics.median(two)
    scaling = [b / a for a, b in zip(one, two)]
    results["two threads / one thread"] = statistics.median(scaling)
    results["two threads / one thread, per-round median [min-max]"] = _ratio_summary(scaling)
    results["throughput rounds"] = {"one": [round(x) for x in one], "two": [round(x) for x in two]}
    _raw_throughput.obj = obj
    from kjit.runtime.libcuda import extension
    ext = extension()
    if ext is not None and hasattr(ext, "gil_mode"):   # what releasing the GIL costs kjit
        held_one, held_two = [], []
        ext.gil_mode(1)
        try:
            for _ in range(3):
                held_one.append(_throughput(obj, (0,)))
                held_two.append(_throughput(obj, (0, 1)))
        finally:
            ext.gil_mode(0)
        results["kjit, GIL held across cuLaunchKernel: one thread launches/s"] = statistics.median(held_one)
        results["kjit, GIL held across cuLaunchKernel: two threads / one"] = \
            statistics.median([b / a for a, b in zip(held_one, held_two)])
    c_scaling = _c_threads(obj)
    if c_scaling:
        results["C, one thread per device: two threads / one"] = statistics.median(c_scaling)
        results["kjit two-thread scaling / C's"] = \
            results["two threads / one thread"] / statistics.median(c_scaling)
    for fn_name, what in (("CDLL", "GIL released"), ("PyDLL", "GIL held")):
        raw_one, raw_two = [], []
        for _ in range(3):
            raw_one.append(_raw_throughput(fn_name, (0,)))
            raw_two.append(_raw_throughput(fn_name, (0, 1)))
        results[f"raw ctypes cuLaunchKernel, {what}: one thread launches/s"] = statistics.median(raw_one)
        results[f"raw ctypes cuLaunchKernel, {what}: two threads / one"] = \
            statistics.median([b / a for a, b in zip(raw_one, raw_two)])
    results.update(_first_launch_on_each_device(count))
    return results
