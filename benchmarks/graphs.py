"""Benchmark 10: the host cost per kernel of replaying a graph of 1, 10 and 100 launches of
the 3-argument kernel, kjit's beside C's, cuda.bindings', CuPy's and cuda.core's graphs of
the same launches, and of a kjit node's update then a replay; against the same launch made one
by one (C's cuLaunchKernel loop in this process, the floor of benchmarks/launch.py, and kjit's
`k[1, 32](...)`). Paired as the launch benchmark is: each variant's batches alternate with the
floor's, and a round's ratio is the ratio of their medians. Each result is checked on the
device."""
from __future__ import annotations

import ctypes
import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

import kjit
from kjit import driver

from .kernels import cuda_core_kernel, expected, launch_args, launch_source, numpy_args
from .launch import CInProcess, Toolkit, paired_round
from .timing import Loop

NARGS = 3
SIZES = (1, 10, 100)
ROUNDS = 9
REPLAYS = 200   # replays per batch of a 1-node graph; fewer for larger ones (as many kernels)


def _check(what: str, got: float) -> None:
    if abs(got - expected(NARGS)) >= 1e-3:
        raise SystemExit(f"{what} left {got} in out[0], expected {expected(NARGS)}: it did nothing")


class Variant(Toolkit):
    """A way to run `kernels` launches: `batch()` gives µs per kernel over one batch."""

    def __init__(self, name: str, kernels: int, loop: Loop | None = None,
                 c_batch: Callable[[int], float] | None = None, check: Callable[[], float] | None = None):
        self.name, self.kernels, self.loop, self.c_batch, self.check_value = name, kernels, loop, c_batch, check
        self.calls = max(2, REPLAYS // kernels)

    def batch(self, n: int = NARGS) -> float:
        us = self.c_batch(self.calls) if self.c_batch else self.loop(self.calls) / 1e3 / self.calls
        if us < 0:
            raise SystemExit(f"{self.name}: CUresult {-int(us)}")
        return us / self.kernels


def _captured(drv: Any, stream: Any, func: Any, addr: int, size: int) -> Any:
    """An executable graph of `size` launches captured from cuda.bindings' cuLaunchKernel."""
    driver.call(drv.cuStreamBeginCapture, stream,
                drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    for _ in range(size):
        driver.call(drv.cuLaunchKernel, func, 1, 1, 1, 32, 1, 1, 0, stream, addr, 0)
    graph = driver.call(drv.cuStreamEndCapture, stream)
    return driver.call(drv.cuGraphInstantiate, graph, 0)


def _peers(variants: list, skipped: dict) -> None:
    """CuPy's and cuda.core's graphs of the same launches, where they are installed."""
    try:
        import cupy as cp
        kern = cp.RawKernel(launch_source(NARGS), f"k{NARGS}")
        buf = cp.zeros(16, cp.float32)
        cargs = (buf, *numpy_args(NARGS))
        stream = cp.cuda.Stream(non_blocking=True)
        for size in SIZES:
            with stream:
                stream.begin_capture()
                for _ in range(size):
                    kern((1,), (32,), cargs)
                g = stream.end_capture()
            variants.append(Variant(f"CuPy graph of {size}: Graph.launch", size,
                                    Loop("g.launch(s)", g=g, s=stream),
                                    check=lambda: float(buf[0].get())))
    except Exception as exc:  # a peer that is missing or changed its API
        skipped["CuPy graphs"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        core, dev, kern = cuda_core_kernel(NARGS)
        out = kjit.zeros(16, np.float32)
        cargs = [out.ptr, *numpy_args(NARGS)]
        stream, cfg, launch = dev.create_stream(), core.LaunchConfig(grid=1, block=32), core.launch
        for size in SIZES:
            gb = dev.create_graph_builder().begin_building()
            for _ in range(size):
                launch(gb, cfg, kern, *cargs)
            g = gb.end_building().complete()
            variants.append(Variant(f"cuda.core graph of {size}: Graph.launch", size,
                                    Loop("g.launch(s)", g=g, s=stream),
                                    check=lambda out=out: float(out.get()[0])))
    except Exception as exc:
        skipped["cuda.core graphs"] = f"unavailable: {type(exc).__name__}: {exc}"


def run() -> dict:
    floor = CInProcess(Path(tempfile.mkdtemp(prefix="kjit-graph-bench-")))
    floor.prepare(NARGS)
    c_buf, _, c_arr, c_func = floor.state[NARGS]
    k = kjit.load(kjit.compile(launch_source(NARGS))).get_function(f"k{NARGS}")
    out = kjit.zeros(16, np.float32)
    args = [out, *launch_args(NARGS)]
    launcher = k[1, 32]
    launcher(*args)
    kjit.synchronize()
    drv = driver.bindings()
    stream = driver.call(drv.cuStreamCreate, 1)   # non-blocking, as kjit's graph stream is
    variants = [Variant("kjit k[1, 32](...), one by one", 1, Loop("k[1, 32]({args})", args, k=k),
                        check=lambda: float(out.get()[0]))]
    skipped: dict = {}
    for size in SIZES:
        with kjit.graph() as g:
            for _ in range(size):
                launcher(*args)
        execs = _captured(drv, stream, drv.CUfunction(c_func), ctypes.addressof(c_arr), size)
        driver.call(drv.cuGraphLaunch, execs, stream)   # the untimed replays' errors are not read
        raw = int(execs)
        variants += [
            Variant(f"C graph of {size}: cuGraphLaunch", size,
                    c_batch=lambda n, raw=raw: floor.lib.graph_batch(raw, n, int(stream)),
                    check=lambda: float(c_buf.get()[0])),
            Variant(f"cuda.bindings graph of {size}: cuGraphLaunch", size,
                    Loop("replay(e, s)", replay=drv.cuGraphLaunch, e=execs, s=stream)),
            Variant(f"kjit graph of {size}: g.launch()", size, Loop("g.launch()", g=g)),
        ]
        if size == 1:
            node, one = g.nodes[0], g
    variants.append(Variant("kjit node.update(...) then g.launch(), 1 node", 1,
                            Loop("node.update({args}); g.launch()", args, node=node, g=one)))
    _peers(variants, skipped)
    floor_us: list[float] = []
    rounds: dict[str, list[tuple[float, float]]] = {v.name: [] for v in variants}
    for r in range(-1, ROUNDS):   # round -1 warms up, untimed
        for v in variants:
            got = paired_round(v, floor, NARGS)
            if r >= 0:
                rounds[v.name].append(got)
                floor_us.append(got[1])
    floor.check(NARGS)
    for v in variants:
        if v.check_value is not None:
            _check(v.name, v.check_value())
    res: dict = {"C cuLaunchKernel, one by one (the floor): us per kernel": round(statistics.median(floor_us), 3)}
    for name, pairs in rounds.items():
        ratios = [u / c for u, c in pairs]
        res[f"{name}: us per kernel"] = round(statistics.median(u for u, _ in pairs), 3)
        res[f"{name}: / C one launch (median [min-max])"] = \
            f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]"
    res.update(skipped)
    driver.call(drv.cuStreamDestroy, stream)
    return res
