"""Benchmark 10: the host cost per kernel of replaying a kjit graph of 1, 10 and 100 launches,
and of an update then a replay, against the same launches made one by one (kjit and C's
cuLaunchKernel, `benchmarks/c/launch_bench.c`) in one run, rounds interleaved. Each result is
checked on the device."""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import numpy as np

import kjit

from .kernels import expected, launch_args, launch_source
from .timing import per_launch_us

NARGS = 3
SIZES = (1, 10, 100)
ROUNDS = 9
REPLAYS = 200   # graph launches per timed batch for the 1-node graph; fewer for larger ones


def _check(what: str, out: kjit.DeviceArray) -> None:
    got = float(out.get()[0])
    if abs(got - expected(NARGS)) >= 1e-3:
        raise SystemExit(f"{what} left {got} in out[0], expected {expected(NARGS)}")


def run() -> dict:
    from .launch import C
    obj = kjit.compile(launch_source(NARGS))
    k = kjit.load(obj).get_function(f"k{NARGS}")
    out = kjit.zeros(16, np.float32)
    args = [out, *launch_args(NARGS)]
    launch = k[1, 32]
    launch(*args)
    kjit.synchronize()
    graphs = {}
    for size in SIZES:
        with kjit.graph() as g:
            for _ in range(size):
                launch(*args)
        graphs[size] = g
    c = C(Path(tempfile.mkdtemp(prefix="kjit-graph-bench-")))
    c.prepare(NARGS)
    samples: dict[str, list[float]] = {}

    def note(name: str, us: float) -> None:
        samples.setdefault(name, []).append(us)

    node = graphs[1].nodes[0]
    for r in range(-1, ROUNDS):   # round -1 warms up, untimed
        c_us = c.time_round(NARGS)
        eager = per_launch_us(lambda: launch(*args), kjit.synchronize)
        per_kernel = {}
        for size, g in graphs.items():
            per_call = per_launch_us(g.launch, g.synchronize, per_batch=max(2, REPLAYS // size),
                                     batches=20)
            per_kernel[size] = per_call / size
        upd = per_launch_us(lambda: (node.update(*args), graphs[1].launch()), graphs[1].synchronize,
                            per_batch=100, batches=20)
        if r < 0:
            continue
        note("C cuLaunchKernel us", c_us)
        note("kjit k[1, 32] eager us", eager)
        for size, us in per_kernel.items():
            note(f"kjit graph of {size}: us per kernel", us)
        note("kjit update + replay (1 node) us", upd)
    for size, g in graphs.items():
        g.launch()
        g.synchronize()
    _check("graph replays", out)
    c.check(NARGS)
    res: dict = {name: statistics.median(v) for name, v in samples.items()}
    for name, v in samples.items():
        if name.startswith("kjit"):
            ratios = [a / b for a, b in zip(v, samples["C cuLaunchKernel us"])]
            res[f"{name} / C (median [min-max])"] = (
                f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]")
    return res
