"""Where a kjit launch's time goes beyond C's: `python -m benchmarks.launch_profile`.

perf is absent on the GPU image, so the launch is taken apart by timing variants of it, each
paired batch by batch with C's cuLaunchKernel loop in this process (benchmarks/launch.py's
floor), and by timing its pieces without a launch:

- the same launch as the program writes it (`L(x, n, a)`), with the subscript each time
  (`k[1, 32](x, n, a)`), through a lambda with `*args` (what a callback-style harness adds),
  and with the GIL released around cuLaunchKernel at every launch;
- without a launch: an empty loop iteration, a call into kjit's extension that asks libcuda
  for the current context (what the Python path and `f[...]` ask at every launch; the C
  launcher only after the driver refuses one), and the C packer (`_launch.pack`) with no
  argument, a kjit array, and the 3- and 16-argument signatures, and with a PyTorch tensor and
  a CuPy array in place of the kjit array.

Prints ns per launch above C (median of per-round differences, min-max) and ns per piece.
"""
from __future__ import annotations

import ctypes
import statistics
import struct
import tempfile
import time
from pathlib import Path

import numpy as np

import kjit
from kjit.runtime.libcuda import extension

from .kernels import launch_args, launch_source
from .launch import CInProcess, Toolkit, paired_round
from .timing import Loop

ROUNDS = 15
NARGS = (1, 3, 16)


def _paired(loop: Loop, floor: CInProcess, n: int) -> float:
    """One round: ns per launch of `loop` above C's, as benchmarks/launch.py pairs them."""
    variant = Toolkit()
    variant.state = {n: (loop,)}
    ours, c = paired_round(variant, floor, n)
    return (ours - c) * 1e3


def _per_call_ns(loop: Loop, calls: int = 20000) -> float:
    return statistics.median(loop(calls) / calls for _ in range(15))


def pieces(ext) -> dict:
    """The launch's pieces, timed without a launch (no GPU needed: the packer only writes an
    address, here one no memory is behind)."""
    from kjit.runtime.memory import DeviceArray
    out: dict = {"an empty loop iteration, ns": round(_per_call_ns(Loop("pass")), 1),
                 "a call into the extension asking libcuda for the current context, ns":
                     round(_per_call_ns(Loop("ctx()", ctx=ext.current_context)), 1)}
    a = DeviceArray(16, "float32", ptr=1 << 40, device=0)
    cell = ctypes.create_string_buffer(256)

    def spec(kinds: list[int]) -> bytes:
        return b"".join(struct.pack("ii", kind, 8 * i) for i, kind in enumerate(kinds))
    packs = {"no argument": (b"", (), ())}
    for n in NARGS:
        kinds = [ext.K_I32 if isinstance(v, int) else ext.K_F32 for v in launch_args(n)]
        packs[f"{n} arguments (a kjit array, then ints and floats)"] = (
            spec([ext.K_ARRAY, *kinds]), (a.launch_key,) + (None,) * len(kinds), (a, *launch_args(n)))
    base = None
    for name, (sp, toks, vals) in packs.items():
        if ext.pack(sp, toks, vals, ctypes.addressof(cell), DeviceArray) != 0:
            raise SystemExit(f"_launch.pack declined {name}")
        ns = _per_call_ns(Loop("pack(sp, toks, vals, addr, t)", pack=ext.pack, sp=sp, toks=toks,
                               vals=vals, addr=ctypes.addressof(cell), t=DeviceArray))
        base = ns if base is None else base
        out[f"_launch.pack, {name}: ns (above no argument)"] = f"{ns:.1f} ({ns - base:+.1f})"
    return out


def foreign_pieces(ext) -> dict:
    """_launch.pack of one PyTorch tensor and one CuPy array against a kjit array: what reading
    a framework's array costs per launch. Each is launched once first, which teaches the C
    packer its type."""
    from kjit.runtime.memory import DeviceArray
    k = kjit.load(kjit.compile(launch_source(1))).get_function("k1")
    spec, tokens = k.packer.c_spec()
    cell = ctypes.create_string_buffer(64)
    arrays = {"a kjit array": kjit.zeros(16, np.float32)}
    try:
        import torch
        arrays["a torch tensor"] = torch.zeros(16, dtype=torch.float32, device="cuda")
    except ImportError:
        pass
    try:
        import cupy
        arrays["a CuPy array"] = cupy.zeros(16, cupy.float32)
    except ImportError:
        pass
    out, base = {}, None
    for name, a in arrays.items():
        k[1, 32](a)
        if ext.pack(spec, tokens, (a,), ctypes.addressof(cell), DeviceArray) != 0:
            raise SystemExit(f"_launch.pack declined {name}")
        ns = _per_call_ns(Loop("pack(sp, toks, vals, addr, t)", pack=ext.pack, sp=spec, toks=tokens,
                               vals=(a,), addr=ctypes.addressof(cell), t=DeviceArray))
        base = ns if base is None else base
        out[f"_launch.pack of {name}: ns (above a kjit array)"] = f"{ns:.1f} ({ns - base:+.1f})"
    kjit.synchronize()
    return out


def run() -> dict:
    ext = extension()
    if ext is None:
        return {"error": "kjit's C extension is not built"}
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        floor = CInProcess(Path(tmp))
        for n in NARGS:
            floor.prepare(n)
            k = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}")
            buf = kjit.zeros(16, np.float32)
            args = [buf, *launch_args(n)]
            bound = k[1, 32]
            star = lambda: bound(*args)   # noqa: E731  (the harness being measured)
            variants = {
                "L(x, ...)": Loop("bound({args})", args, bound=bound),
                "k[1, 32](x, ...)": Loop("k[1, 32]({args})", args, k=k),
                "lambda: L(*args), called": Loop("star()", star=star),
                "L(x, ...), GIL released at every launch": Loop("bound({args})", args, bound=bound),
            }
            above: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(-1, ROUNDS):
                for name, loop in variants.items():
                    released = "GIL released" in name
                    ext.gil_mode(2 if released else 0)
                    try:
                        d = _paired(loop, floor, n)
                    finally:
                        ext.gil_mode(0)
                    if r >= 0:
                        above[name].append(d)
            for name, ds in above.items():
                out[f"{n} args: {name}: ns above C per launch"] = \
                    f"{statistics.median(ds):.0f} [{min(ds):.0f} to {max(ds):.0f}]"
            out[f"{n} args: C cuLaunchKernel, ns per launch"] = round(floor.batch(n) * 1e3)
        out.update(pieces(ext))
        out.update(foreign_pieces(ext))
    out["when"] = time.strftime("%Y-%m-%d")
    return out


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key:80s} {value}")
