"""Benchmark 11: what releasing the GIL around cuLaunchKernel costs a launch in a process with
one Python thread, where kjit keeps it (kjit/runtime/_gil.c): `k[1, 32](...)` with the GIL kept
against the same launch releasing it, rounds interleaved, per-round ratios. Checked on the
device."""
from __future__ import annotations

import statistics

import numpy as np

import kjit
from kjit.runtime.libcuda import extension

from .kernels import expected, launch_args, launch_source
from .timing import per_launch_us

NARGS = 3
ROUNDS = 11


def run() -> dict:
    ext = extension()
    if ext is None or not hasattr(ext, "gil_mode"):
        return {"error": "kjit's C extension is not built"}
    k = kjit.load(kjit.compile(launch_source(NARGS))).get_function(f"k{NARGS}")
    out = kjit.zeros(16, np.float32)
    args = [out, *launch_args(NARGS)]
    launch = k[1, 32]
    samples: dict[str, list[float]] = {"kept": [], "released": []}
    try:
        for r in range(-1, ROUNDS):
            for name, mode in (("kept", 0), ("released", 2)):
                ext.gil_mode(mode)
                us = per_launch_us(lambda: launch(*args), kjit.synchronize)
                if r >= 0:
                    samples[name].append(us)
    finally:
        ext.gil_mode(0)
    if abs(float(out.get()[0]) - expected(NARGS)) >= 1e-3:
        raise SystemExit("the launches did nothing")
    ratios = [a / b for a, b in zip(samples["released"], samples["kept"])]
    return {"one thread, GIL kept: us per launch": statistics.median(samples["kept"]),
            "one thread, GIL released: us per launch": statistics.median(samples["released"]),
            "released / kept (median [min-max])":
                f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]"}
