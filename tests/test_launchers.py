"""A launcher built from a kernel's parts (kjit/runtime/kernel.py's `build` over the
`Launchable` protocol), run on the CPU with a
stand-in launch call: what reaches the driver (the packed buffer, the stream, the grid) and
what is refused before it, through the C launcher's Python form and the Python form alone."""
from __future__ import annotations

import ctypes
import struct
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from kjit.errors import ArgumentError
from kjit.runtime import kernel as kernel_mod, stream as stream_mod
from kjit.runtime.cdecl import parse_signatures
from kjit.runtime.libcuda import c_function
from kjit.runtime.memory import DeviceArray
from kjit.runtime.params import Packer, layout

SRC = 'extern "C" __global__ void k(float a, const float* x, float* y, int n) {}'


class CupyLike:   # a CuPy array as far as kjit can tell without CuPy (no device memory)
    __module__ = "cupy._core.core"

    def __init__(self, ptr):
        self.ptr = ptr

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.ptr, False), "typestr": "<f4", "shape": (4,), "version": 3}

    def __dlpack_device__(self):
        return (2, 0)   # CUDA device 0


def _kernel(pack):
    sig = parse_signatures(SRC)["k"]
    packer = Packer("k", layout([p.ctype for p in sig.params], [p.name for p in sig.params], None), 0)
    buf, ptrs, addr = packer.new_buffers()
    calls = []

    def launch(func, gx, gy, gz, bx, by, bz, shared, s, params):
        calls.append((func, (gx, gy, gz, bx, by, bz), shared, s, params,
                      struct.unpack_from(packer.format, buf.raw)))
        return 0

    # a Launchable: every name the launch builders read, nothing more
    k = SimpleNamespace(
        name="k", device=0, handle=0x99, params=tuple(packer.slots), packer=packer,
        fill=packer.filler(buf, pack), params_address=addr,
        block_size=0,
        # no live context in the cell: a C launcher hands every launch to the Python one, so
        # the fake handle never reaches a driver another test bound in this process
        owner_thread=threading.get_ident(), context_address=1, context_cell=ctypes.c_uint64(kernel_mod.NO_CONTEXT),
        c_launch=launch, current_context=lambda: 1, launcher_for=None, launch_elsewhere=None,
        _buf=buf)
    return k, calls


@pytest.mark.parametrize("pack", [c_function("pack"), None], ids=["c packer", "python"])
def test_a_launcher_packs_every_argument_and_launches_once(pack, monkeypatch):
    k, calls = _kernel(pack)
    x = DeviceArray(4, np.float32, ptr=0x7000, device=0)
    y = DeviceArray(4, np.float32, ptr=0x8000, device=0)
    run = kernel_mod.build(k, (2, 1, 1, 32, 1, 1), 16, None, (2, 32), kernel_mod.AUTO_STREAM)
    run(2.5, x, y, 7)
    assert calls == [(0x99, (2, 1, 1, 32, 1, 1), 16, 0, k.params_address, (2.5, 0x7000, 0x8000, 7))]
    # a framework's array: its current stream, read per launch
    monkeypatch.setattr(stream_mod, "current_stream", lambda kind, device: 0x10)
    run(1.0, CupyLike(0x5000), y, 3)
    assert calls[-1][3] == 0x10 and calls[-1][5] == (1.0, 0x5000, 0x8000, 3)
    # a named stream is kept whatever the arrays
    named = kernel_mod.build(k, (1, 1, 1, 1, 1, 1), 0, 0x20, (1, 1, 0x20), 0)
    named(1.0, CupyLike(0x5000), y, 3)
    assert calls[-1][3] == 0x20
    # refused before anything is launched, naming the parameter
    for args, pattern in [((2.5, x, y), r"takes 4 arguments \(a, x, y, n\), got 3"),
                          ((2.5, x, y, 2**31), r"parameter 3 'n' \(int\)"),
                          ((2.5, DeviceArray(4, np.int32, ptr=0x7000, device=0), y, 1), r"parameter 1 'x'.*int32"),
                          (("2", x, y, 1), r"parameter 0 'a' \(float\)")]:
        with pytest.raises(ArgumentError, match=pattern):
            run(*args)
    assert len(calls) == 3


def test_the_c_launcher_is_the_fast_form_only_where_c_packs_everything():
    if c_function("launcher") is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")
    k, _ = _kernel(c_function("pack"))
    run = kernel_mod.build(k, (1, 1, 1, 1, 1, 1), 0, None, (1, 1), kernel_mod.AUTO_STREAM)
    assert type(getattr(run, "__self__", None)).__name__ == "Launcher"
    sig = parse_signatures('extern "C" __global__ void k(float4 v, int n) {}')["k"]
    k.packer = Packer("k", layout([p.ctype for p in sig.params], [p.name for p in sig.params], None), 0)
    run = kernel_mod.build(k, (1, 1, 1, 1, 1, 1), 0, None, (1, 1), kernel_mod.AUTO_STREAM)
    assert type(run).__name__ == "function"


def test_the_c_packers_spec_is_made_once_per_kernel(monkeypatch):
    # each launch configuration builds a launcher; the spec and the slots left to Python are
    # the kernel's, not remade per configuration or per look
    seen = []
    kind = Packer.c_kind
    monkeypatch.setattr(Packer, "c_kind", lambda self, slot: seen.append(slot) or kind(self, slot))
    k, _ = _kernel(c_function("pack"))
    for g in range(1, 6):
        kernel_mod.build(k, (g, 1, 1, 32, 1, 1), 0, None, (g, 32), kernel_mod.AUTO_STREAM)
        assert k.packer.python_slots == () and k.packer.c_spec()[1][1] is not None
    assert len(seen) == len(k.packer.slots)


def test_a_kernel_whose_context_was_destroyed_never_launches_its_dead_handle(monkeypatch):
    # The driver may put a new context at the address of one kjit destroyed. A kernel of the
    # old one, and every launcher of it (cached, or held by the caller), must then hand each
    # launch to the module's kernel loaded in the new context, never launch its dead handle.
    from kjit import driver
    # the Python launch path here: its handles are made up, and a C launcher would hand them
    # to a driver another test bound in this process
    monkeypatch.setattr(kernel_mod, "c_launch", lambda: None)
    real_c_function = kernel_mod.c_function
    monkeypatch.setattr(kernel_mod, "c_function", lambda name: None if name == "launcher" else real_c_function(name))
    sig = parse_signatures(SRC)["k"]
    slots = layout([p.ctype for p in sig.params], [p.name for p in sig.params], None)
    ctx, launched, loads = 0x5150_0000, [], []

    class Module:   # the kernel of the context current now, loaded there on first use
        kernels = {}

        def get_function(self, name):
            key = (ctx, driver.context_epoch(ctx), name)
            if key not in self.kernels:
                loads.append(key[1])
                self.kernels[key] = make(0x77)
            return self.kernels[key]

    def make(handle):
        k = kernel_mod.Kernel(Module(), handle, "k", "k", slots, 0, ctx)
        k.current_context = lambda: ctx
        k.c_launch = lambda func, *rest: launched.append(func) or 0
        return k

    old = make(0x99)
    x = DeviceArray(4, np.float32, ptr=0x7000, device=0)
    held = old[1, 32]
    held(1.0, x, x, 4)
    assert launched == [0x99] and loads == []
    epoch = driver.context_epoch(ctx)
    driver.context_destroyed(ctx)   # kjit.Context.close(); a new context then at the same address
    held(1.0, x, x, 4)
    old[1, 32](1.0, x, x, 4)
    old.launch(1, 32, 1.0, x, x, 4)
    assert launched == [0x99, 0x77, 0x77, 0x77]
    assert loads == [epoch + 1]   # asked for in the new context only
