"""How one launch configuration of a kernel becomes a callable, `k[grid, block]`.

A launcher is built from the kernel's parts: its packing step (`Packer.filler`: the C packer,
then Python converters for what it leaves), its launch call (the C extension's `launch`, else
cuda.bindings' cuLaunchKernel), and the checks every launch makes (the launching thread, the
current context, the stream). When the C packer writes every parameter, the launcher's fast
form is a `_launch.Launcher` (kjit/runtime/_launch.c): one C call packs and launches, and
hands anything else (another thread or context, an argument it declines, every error) to
the Python launcher built here from the same parts.
"""
from __future__ import annotations

import struct
import threading
from operator import itemgetter
from typing import Any, Callable

from .. import driver
from ..errors import ArgumentError
from . import context as context_mod
from . import torch_compile
from .libcuda import c_function
from .memory import DeviceArray, PendingCopies
from .pointers import arguments_device, detach_grads
from .stream import as_handle, framework_stream

# launcher flags; kjit/runtime/_launch.c keeps the same numbers
AUTO_STREAM, GRAD_OK, HAS_ARRAYS = 1, 2, 4
_ARRAY_KINDS = (20, 21)   # the C packer's array kinds (params.Packer.c_kind)


def build(kernel: Any, fill: Callable[[tuple, list], None], dims: tuple, shared: int,
          stream: Any, config: Any, flags: int) -> Callable[..., None]:
    """The launcher of one configuration: grid and block `dims` (six ints), dynamic shared
    memory, a stream (None: the arrays' framework's current stream, read per launch)."""
    pending = PendingCopies(stream)   # this configuration's In/Out copies
    make = c_function("launcher") if kernel._c_launch is not None else None
    fronted = make is not None and not kernel._packer.python_slots
    launch = torch_compile.launch_entry(_python_launcher(kernel, fill, dims, shared, stream,
                                                         config, flags, pending, fronted))
    if not fronted:
        return launch
    spec, tokens = kernel._packer.c_spec()
    if any(kind in _ARRAY_KINDS for kind, _offset in struct.iter_unpack("<ii", spec)):
        flags |= HAS_ARRAYS   # its arrays say which device a launch is for

    def failed(err: int, s: int) -> None:
        kernel._launch_failed(err, *dims, shared, s, kernel._ptrs_addr, pending)
    return make(launch, failed, spec, tokens, DeviceArray, context_mod.last_launch, kernel.name,
                kernel._buf_addr, int(kernel.handle), stream or 0, kernel._ptrs_addr, *dims, shared,
                kernel._owner, kernel._ctx_cell, flags, kernel.device)


def _python_launcher(kernel: Any, fill: Callable[[tuple, list], None], dims: tuple,
                     shared: int, stream: Any, config: Any, flags: int,
                     pending: PendingCopies, fronted: bool) -> Callable[..., None]:
    """The launch in Python. `fronted`: a C launcher runs first and hands this one only what
    it declines, such as arrays of another device, so those are routed before packing."""
    gx, gy, gz, bx, by, bz = dims
    owner, current, name, device = kernel._owner, kernel._current, kernel.name, kernel.device
    params, n, count_error = kernel._ptrs_addr, len(kernel.params), kernel._packer.count_error
    arrays = _picker(kernel._packer.pointer_indices, n)   # where a framework's array may be
    elsewhere, failed, finish = kernel._launch_elsewhere, kernel._launch_failed, kernel._finish
    call, func = launch_call(kernel)
    bindings, grad_ok = kernel._c_launch is None, flags & GRAD_OK
    last, get_ident = context_mod.last_launch, threading.get_ident
    given = config[2] if isinstance(config, tuple) and len(config) > 2 else None
    routes: dict[int, Callable[..., None]] = {}   # device -> this configuration's launcher there

    def route(args: tuple) -> Callable[..., None] | None:
        """This configuration's launcher on the device of the arguments' arrays where that is
        another device (made once per device), else None; arrays on two devices, or on
        another device than a stream given, are refused, naming them."""
        there = arguments_device(name, kernel.params, args)
        if there is None or there == device:
            return None
        routed = routes.get(there)
        if routed is None:
            target = kernel._for_arguments(args, given)
            with driver.context_pushed(target.context):   # configured in its own context
                routed = routes[there] = target[config]
        return routed

    def launch(*args: Any) -> None:
        if len(args) != n:
            raise count_error(len(args))
        if grad_ok:
            args = detach_grads(args)
        if fronted:
            routed = route(args)
            if routed is not None:
                return routed(*args)
        # the kernel's context, read per launch: once destroyed, it is none (a new context
        # at the same address is another context, where the module is loaded again)
        if get_ident() != owner or current() != kernel._ctx:
            return elsewhere(args, config, gx, gy, gz, bx, by, bz, shared, stream)
        s = stream
        if s is None:
            s = framework_stream(arrays(args), device, name)
            s = as_handle(s) if bindings else s
        pending.stream = s
        try:
            fill(args, pending)
        except ArgumentError:
            pending.clear()
            routed = route(args)   # arrays of another device: the launch belongs there
            if routed is None:
                raise
            return routed(*args)
        last[0] = name
        err = call(func, gx, gy, gz, bx, by, bz, shared, s, params)
        if err:
            failed(err, gx, gy, gz, bx, by, bz, shared, s, params, pending)
        if pending:
            finish(pending, s)
    return launch


def launch_call(kernel: Any) -> tuple[Callable[..., int], Any]:
    """(call, function): `call(function, gx, gy, gz, bx, by, bz, shared, stream, params)`
    launches and returns the driver's result code, through the C extension or cuda.bindings."""
    if kernel._c_launch is not None:
        return kernel._c_launch, int(kernel.handle)
    cu_launch = driver.bindings().cuLaunchKernel

    def call(func: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int,
             s: Any, params: int) -> Any:
        return cu_launch(func, gx, gy, gz, bx, by, bz, shared, s, params, 0)[0]
    return call, kernel.handle


def _picker(indices: tuple[int, ...], n: int) -> Callable[[tuple], tuple]:
    """A C-level function taking those items of an n-tuple, as a tuple."""
    if len(indices) == n:
        return tuple   # all of them: the arguments themselves
    if len(indices) == 1:
        return itemgetter(slice(indices[0], indices[0] + 1))
    return itemgetter(*indices) if indices else itemgetter(slice(0, 0))
