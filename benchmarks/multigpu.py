"""Benchmark 4, on two GPUs: kjit's host cost per launch on device 1 against device 0 (the
same kernel, the devices taking turns), and launch throughput with one thread per device
against one thread alone. Each result is checked on the device."""
from __future__ import annotations

import threading
import time

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


def _per_launch_cost(obj) -> dict:
    """µs per `k[1, 32](...)` on each device: the kernel of each device loaded from one
    compile, launched in the main thread under kjit.Device(d)."""
    state = {}
    for d in (0, 1):
        with kjit.Device(d):
            k = kjit.load(obj).get_function(f"k{NARGS}")
            out = kjit.zeros(16, np.float32)
        state[d] = (k, out, [out, *launch_args(NARGS)])
    samples: dict[int, list[float]] = {0: [], 1: []}
    for r in range(-1, ROUNDS):   # round -1 warms both up untimed
        for d in (0, 1):
            k, out, args = state[d]
            with kjit.Device(d):
                us = per_launch_us(lambda: k[1, 32](*args), kjit.synchronize,
                                   batches=BATCHES_PER_ROUND)
            if r >= 0:
                samples[d].append(us)
    for d in (0, 1):
        with kjit.Device(d):
            _check(f"device {d} launch loop", state[d][1])
    return {"device 0 us per launch": min(samples[0]), "device 1 us per launch": min(samples[1]),
            "device rounds": {d: [round(x, 3) for x in v] for d, v in samples.items()}}


def _throughput(obj, devices: tuple[int, ...]) -> float:
    """Launches per second, one thread per device in `devices`, all started together. Each
    thread loads its own kernel (so it launches on the C fast path) and fetches the launcher
    once, as a hot loop would."""
    ready = threading.Barrier(len(devices) + 1)
    finished = threading.Barrier(len(devices) + 1)
    errors: list[BaseException] = []

    def work(d: int) -> None:
        try:
            with kjit.Device(d):
                module = kjit.load(obj)
                out = kjit.zeros(16, np.float32)
                launch, args = module.get_function(f"k{NARGS}")[1, 32], [out, *launch_args(NARGS)]
                launch(*args)
                kjit.synchronize()
                ready.wait()
                for _ in range(THROUGHPUT_BATCHES):
                    for _ in range(PER_BATCH):
                        launch(*args)
                    kjit.synchronize()
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
        t0 = time.perf_counter()
        finished.wait()
        elapsed = time.perf_counter() - t0
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
    results["one thread, device 0: launches/s"] = max(one)
    results["two threads, devices 0+1: launches/s"] = max(two)
    results["two threads / one thread"] = max(two) / max(one)
    results["throughput rounds"] = {"one": [round(x) for x in one], "two": [round(x) for x in two]}
    return results
