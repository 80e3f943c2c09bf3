"""Kernels: attributes, occupancy, and the launch path.

`k[grid, block](*args)` returns a launcher cached per configuration; a launcher's code is
generated once per kernel so that a launch converts and packs all arguments with one
struct.pack_into into a buffer whose void** array the driver reads, then calls cuLaunchKernel.

A Kernel is loaded in one context (one device). The context current in the launching thread
decides where a launch runs: while another one is current (torch.cuda.device(1),
cupy.cuda.Device(1), kjit.Device(1)), the launch goes to the same kernel of the module in
that context, loaded there on first use. A stream must belong to the context the launch
runs in; one of another device is refused before anything is launched. A launch given no
stream runs on the current stream of the framework whose arrays it receives
(`stream.framework_stream`), read per launch.
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading
from typing import Any, Callable, NamedTuple

from .. import driver
from ..errors import ArgumentError, DriverError
from . import context as context_mod
from .libcuda import c_function, current_context_fn, extension
from . import torch_compile
from .launch_ex import _dim3, launch_ex
from .memory import PendingCopies
from .params import Packer, ParamSlot
from .pointers import detach_grads
from .stream import (OPERATOR_STREAM, as_handle, capture_hint, check_stream_context,
                     framework_stream)

DEFAULT_SHARED_LIMIT = 48 * 1024
_MAX_CONFIGS = 512


def c_launch() -> Callable[..., int] | None:
    """The compiled launch call (kjit/runtime/_launch.c), or None to use cuda.bindings'
    cuLaunchKernel: when it was not built, or KJIT_LAUNCH=bindings asks for the fallback."""
    if os.environ.get("KJIT_LAUNCH", "").strip().lower() == "bindings":
        return None
    ext = extension()
    return ext.launch if ext is not None else None


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of blocks of size b that cover a items."""
    return -(-a // b)


_AUTO_STREAM, _GRAD_OK = 1, 2   # launcher flags (kjit/runtime/_launch.c)


class _PyKernelBase:
    """k[config] in Python, where the C extension (its KernelBase) is not built."""

    __slots__ = ()

    @torch_compile.launch_entry
    def __getitem__(self, config: Any) -> Callable[..., None]:
        try:
            launcher = self._configs.get(config)  # type: ignore[attr-defined]
        except TypeError:   # k[[2, 1], 32]: lists are fine, just not as a cache key
            launcher = None
        if launcher is None:
            launcher = self._configure(config)  # type: ignore[attr-defined]
        return launcher


# k[grid, block] is the README's idiom: the C base does its table lookup without a Python
# frame (about a tenth of a launch's cost), and calls _configure on a miss.
_KernelBase: type = c_function("KernelBase") or _PyKernelBase


class Attributes(NamedTuple):
    """cuFuncGetAttribute's answers for one kernel."""

    num_regs: int
    shared_size_bytes: int
    local_size_bytes: int
    const_size_bytes: int
    max_threads_per_block: int
    ptx_version: int
    binary_version: int
    max_dynamic_shared_size_bytes: int


class LaunchConfig(NamedTuple):
    grid: Any
    block: Any
    stream: Any = None
    shared_mem: int = 0


class Kernel(_KernelBase):
    """A kernel loaded in one context (one device). Launch with `k[grid, block](*args)`,
    `k[grid, block, stream, shared_mem](*args)` or `k.launch(grid, block, *args, ...)`; a
    launch while another context is current runs this kernel's twin there. With no stream,
    a launch runs on the current stream of its PyTorch tensors or CuPy arrays."""

    def __init__(self, module: Any, handle: Any, name: str, symbol: str, slots: list[ParamSlot],
                 device: int, context: Any):
        self.module = module
        self.handle = handle
        self.name = name
        self.symbol = symbol
        self.device = device
        self.context = context
        self._ctx = int(context)
        self._epoch = driver.context_epoch(context)
        self.params = tuple(slots)
        self._packer = Packer(name, slots, device)
        self._buf, self._ptrs, self._ptrs_addr = self._packer.new_buffers()
        self._owner = threading.get_ident()
        self._configs: dict[Any, Callable] = {}
        self._shared_limit = DEFAULT_SHARED_LIMIT
        self._c_launch = c_launch()
        self._current = current_context_fn()
        self._make = self._build_factory()
        self._attributes: Attributes | None = None

    # --- introspection ----------------------------------------------------------------
    @property
    def attributes(self) -> Attributes:
        if self._attributes is None:
            drv = driver.bindings()
            A = drv.CUfunction_attribute

            def get(name: str) -> int:
                return int(driver.call(drv.cuFuncGetAttribute, getattr(A, "CU_FUNC_ATTRIBUTE_" + name), self.handle))
            self._attributes = Attributes(
                get("NUM_REGS"), get("SHARED_SIZE_BYTES"), get("LOCAL_SIZE_BYTES"),
                get("CONST_SIZE_BYTES"), get("MAX_THREADS_PER_BLOCK"), get("PTX_VERSION"),
                get("BINARY_VERSION"), get("MAX_DYNAMIC_SHARED_SIZE_BYTES"))
        return self._attributes

    def max_active_blocks(self, block_size: int, shared_mem: int = 0) -> int:
        """Resident blocks per multiprocessor at this block size (occupancy API)."""
        return int(driver.call(driver.bindings().cuOccupancyMaxActiveBlocksPerMultiprocessor,
                               self.handle, block_size, shared_mem))

    def suggested_block_size(self, shared_mem: int = 0, max_block: int = 0) -> tuple[int, int]:
        """(minimum grid size for full occupancy, block size) from cuOccupancyMaxPotentialBlockSize."""
        min_grid, block = driver.call(driver.bindings().cuOccupancyMaxPotentialBlockSize,
                                      self.handle, None, shared_mem, max_block)
        return int(min_grid), int(block)

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow `nbytes` of dynamic shared memory (needed above 48 KiB)."""
        drv = driver.bindings()
        driver.call(drv.cuFuncSetAttribute, self.handle,
                    drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        self._shared_limit = max(self._shared_limit, nbytes)

    def __repr__(self) -> str:
        sig = ", ".join(s.ctype.name if s.ctype else f"?{s.size}" for s in self.params)
        return f"kjit.Kernel({self.name}({sig}), device={self.device})"

    # --- launching --------------------------------------------------------------------
    # k[config]: _KernelBase looks the launcher up in self._configs, else calls _configure.
    def _configure(self, config: Any) -> Callable[..., None]:
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise ArgumentError("launch configuration is k[grid, block], k[grid, block, stream] "
                                "or k[grid, block, stream, shared_mem]")
        here = self._in_current_context()
        if here is not self:   # another device is current: its twin configures (and caches) it
            return here[config]
        grid, block = _dim3(config[0], "grid"), _dim3(config[1], "block")
        given = config[2] if len(config) > 2 else None
        flags = _AUTO_STREAM | _GRAD_OK if given is OPERATOR_STREAM else \
            _AUTO_STREAM if given is None else 0
        stream = None   # none given: the arrays' framework's current stream, per launch
        if not flags:
            stream = as_handle(given)
            check_stream_context(stream, self._ctx, self.device, self.name)
            # the C launch call takes the stream as a plain int handle
            stream = int(stream) if self._c_launch else stream
        shared = config[3] if len(config) > 3 else 0
        self._check_shared(shared)
        launcher = self._make(*grid, *block, shared, stream, config, flags)
        if len(self._configs) >= _MAX_CONFIGS:
            self._configs.clear()
        try:
            self._configs[config] = launcher
        except TypeError:  # unhashable stream object: don't cache
            pass
        return launcher

    def _check_shared(self, shared: Any) -> None:
        if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < 2**32:
            raise ArgumentError(f"shared_mem must be a byte count in 0..2**32-1, got {shared!r}")
        if shared > self._shared_limit:
            self.set_max_dynamic_shared(shared)

    @torch_compile.launch_entry
    def launch(self, grid: Any, block: Any, *args: Any, shared_mem: int = 0, stream: Any = None,
               cooperative: bool = False, cluster: Any = None) -> None:
        """Launch with explicit keywords; cooperative launches and thread-block clusters go
        through cuLaunchKernelEx."""
        if not cooperative and cluster is None:
            config = (grid, block, stream, shared_mem)
            try:
                launcher = self._configs.get(config)
            except TypeError:   # lists, or a stream object that cannot be a key
                launcher = None
            (launcher or self._configure(config))(*args)
            return
        self._launch_ex(_dim3(grid, "grid"), _dim3(block, "block"), args, shared_mem,
                        stream, cooperative, cluster)

    def _launch_ex(self, grid, block, args, shared_mem, stream, cooperative, cluster) -> None:
        here = self._in_current_context()
        if here is not self:
            return here._launch_ex(grid, block, args, shared_mem, stream, cooperative, cluster)
        launch_ex(self, grid, block, args, shared_mem, stream, cooperative, cluster)

    def as_torch_op(self, name: str, *, grid: Any, block: Any, shared_mem: int = 0,
                    outputs: dict[str, Any] | None = None) -> Any:
        """This kernel as the PyTorch operator `name` ("mylib::saxpy"), schema from its C
        signature; see kjit.runtime.torch_op.as_torch_op."""
        from .torch_op import as_torch_op
        return as_torch_op(self, name, grid=grid, block=block, shared_mem=shared_mem,
                           outputs=outputs)

    # --- the generated fast path ------------------------------------------------------
    def _build_factory(self) -> Callable:
        spec = self._packer.c_spec() if self._c_launch else None
        pack = c_function("pack") if spec is not None else None
        if pack is not None:
            return self._build_c_factory(pack, *spec)
        return self._build_python_factory()

    def _common_names(self) -> dict:
        return dict(
            get_ident=threading.get_ident, OWNER=self._owner, CURRENT=self._current, CTX=self._ctx,
            ELSEWHERE=self._launch_elsewhere, Pending=PendingCopies, SLOW=self._fill_slow,
            LAST=context_mod.last_launch, NAME=self.name, PARAMS=self._ptrs_addr,
            FAILED=self._launch_failed, FINISH=self._finish, GRAD_OK=_GRAD_OK,
            DETACH=detach_grads, STREAM_OF=framework_stream, DEVICE=self.device,
            ENTRY=torch_compile.launch_entry)

    def _build_c_factory(self, pack: Callable, spec: bytes, tokens: tuple) -> Callable:
        """Every parameter is a number or a typed pointer: the C packer writes the common
        values (exact ints and floats, matching kjit arrays) straight into the buffer and
        hands anything else, every error included, to the Python converters."""
        from .memory import DeviceArray
        src = (
            "def make(gx, gy, gz, bx, by, bz, shmem, stream, config, flags):\n"
            "    pending = Pending(stream)   # this configuration's In/Out copies\n"
            "    def launch(*args):\n"
            "        if flags & GRAD_OK: args = DETACH(args)\n"
            "        if get_ident() != OWNER or CURRENT() != CTX:\n"
            "            return ELSEWHERE(args, config, gx, gy, gz, bx, by, bz, shmem, stream)\n"
            "        s = stream if stream is not None else STREAM_OF(args, DEVICE, NAME)\n"
            "        pending.stream = s\n"
            "        if PACK(SPEC, TOKENS, args, BUFADDR, DeviceArray): SLOW(args, pending)\n"
            "        LAST[0] = NAME\n"
            "        err = LAUNCH(FUNC, gx, gy, gz, bx, by, bz, shmem, s, PARAMS)\n"
            "        if err: FAILED(err, gx, gy, gz, bx, by, bz, shmem, s, PARAMS, pending)\n"
            "        if pending: FINISH(pending, s)\n"
            "    if LAUNCHER is None: return ENTRY(launch)\n"
            "    def failed(err, s): FAILED(err, gx, gy, gz, bx, by, bz, shmem, s, PARAMS, pending)\n"
            "    return LAUNCHER(ENTRY(launch), failed, SPEC, TOKENS, DeviceArray, LAST, NAME, BUFADDR,\n"
            "                    FUNC, stream or 0, PARAMS, gx, gy, gz, bx, by, bz, shmem, OWNER, CTX,\n"
            "                    flags, DEVICE)\n")
        names = dict(self._common_names(), LAUNCHER=c_function("launcher"), PACK=pack, SPEC=spec,
                     TOKENS=tokens, BUFADDR=ctypes.addressof(self._buf), DeviceArray=DeviceArray,
                     LAUNCH=self._c_launch, FUNC=int(self.handle))
        self._source = src
        exec(compile(src, torch_compile.generated_filename(self.name), "exec"), names)
        return names["make"]

    def _fill_slow(self, args: tuple, pending: PendingCopies) -> None:
        """The Python converters for a launch the C packer declined: they write every
        argument (In/Out copies go to `pending`) or raise an ArgumentError."""
        try:
            values = self._packer.convert_all(args, pending)
            self._packer.struct.pack_into(self._buf, 0, *values)
        except (struct.error, OverflowError):
            pending.clear()
            raise self._packer.diagnose(args) from None
        except BaseException:
            pending.clear()
            raise

    def _build_python_factory(self) -> Callable:
        packer = self._packer
        fill_src, names = packer.fast_source()
        fill_body = fill_src.split("\n", 1)[1].rsplit("    pack_into(buf, 0", 1)
        convert_lines, pack_tail = fill_body[0], "    pack_into(buf, 0" + fill_body[1]
        n = len(self.params)
        unpack = f"    {', '.join(f'a{i}' for i in range(n))}{',' if n == 1 else ''} = args\n" if n else ""
        indent = lambda text: "\n".join("    " + ln if ln else ln for ln in text.splitlines())  # noqa: E731
        src = (
            "def make(gx, gy, gz, bx, by, bz, shmem, stream, config, flags):\n"
            "    pending = Pending(stream)   # this configuration's In/Out copies\n"
            "    def launch(*args):\n"
            f"        if len(args) != {n}: raise COUNT(len(args))\n"
            "        if flags & GRAD_OK: args = DETACH(args)\n"
            "        if get_ident() != OWNER or CURRENT() != CTX:\n"
            "            return ELSEWHERE(args, config, gx, gy, gz, bx, by, bz, shmem, stream)\n"
            "        s = stream if stream is not None else TO_STREAM(STREAM_OF(args, DEVICE, NAME))\n"
            "        pending.stream = s\n"
            f"{indent(unpack)}\n"
            "        buf = BUF\n"
            "        try:\n"
            f"{indent(indent(convert_lines))}\n"
            f"{indent(indent(pack_tail.rstrip()))}\n"
            "        except (StructError, OverflowError):\n"
            "            pending.clear()\n"
            "            SLOW(args, pending)  # the careful converters: they pack it or name what is wrong\n"
            "        except BaseException:\n"
            "            pending.clear()\n"
            "            raise\n"
            "        LAST[0] = NAME\n"
            + ("        err = LAUNCH(FUNC, gx, gy, gz, bx, by, bz, shmem, s, PARAMS)\n"
               if self._c_launch else
               "        err = LAUNCH(FUNC, gx, gy, gz, bx, by, bz, shmem, s, PARAMS, 0)[0]\n") +
            "        if err: FAILED(err, gx, gy, gz, bx, by, bz, shmem, s, PARAMS, pending)\n"
            "        if pending: FINISH(pending, s)\n"
            "    return ENTRY(launch)\n")
        names.update(self._common_names())
        names.update(
            COUNT=packer.count_error, BUF=self._buf, StructError=struct.error,
            LAUNCH=self._c_launch or driver.bindings().cuLaunchKernel,
            FUNC=int(self.handle) if self._c_launch else self.handle,
            TO_STREAM=(lambda s: s) if self._c_launch else as_handle)
        self._source = src
        exec(compile(src, torch_compile.generated_filename(self.name), "exec"), names)
        return names["make"]

    def _pack_slow(self, args: tuple, stream: Any) -> tuple[Any, Any, int, PendingCopies]:
        pending = PendingCopies(stream)
        values = self._packer.convert_all(args, pending)
        buf, ptrs, addr = self._packer.new_buffers()
        try:
            self._packer.struct.pack_into(buf, 0, *values)
        except (struct.error, OverflowError):
            raise self._packer.diagnose(args) from None
        return buf, ptrs, addr, pending

    # --- launches off the fast path -----------------------------------------------------
    def _in_current_context(self) -> "Kernel":
        """This kernel if its context is the one current in this thread (a thread with none
        gets its default device's, as for any kjit call), else the module's kernel of the
        same name there, loaded on first use."""
        current = self._current() or int(driver.ensure_context())
        if current == self._ctx and driver.context_epoch(current) == self._epoch:
            return self
        return self.module.get_function(self.name)

    def _launch_elsewhere(self, args, config, gx, gy, gz, bx, by, bz, shmem, stream) -> None:
        """A launch the fast path handed over: while another context is current (its twin
        launches it), or from a thread other than the kernel's first (per-call buffers)."""
        here = self._in_current_context()
        if here is not self:
            return here[config](*args)
        if stream is None:
            stream = framework_stream(args, self.device, self.name)
            stream = stream if self._c_launch else as_handle(stream)
        buf, ptrs, addr, pending = self._pack_slow(args, stream)
        context_mod.last_launch[0] = self.name
        if self._c_launch:
            err = self._c_launch(int(self.handle), gx, gy, gz, bx, by, bz, shmem, int(stream), addr)
        else:
            (err,) = driver.bindings().cuLaunchKernel(self.handle, gx, gy, gz, bx, by, bz, shmem,
                                                       stream, addr, 0)
        if err:
            self._launch_failed(err, gx, gy, gz, bx, by, bz, shmem, stream, addr, pending)
        self._finish(pending, stream)

    def _launch_failed(self, err, gx, gy, gz, bx, by, bz, shmem, stream, params,
                       pending: PendingCopies | None = None) -> None:
        if pending is not None:
            pending.clear()  # nothing ran: no Out copies to make, now or at a later launch
        try:
            driver.raise_for(err, f"cuLaunchKernel({self.name})")
        except DriverError as exc:
            exc.hint = "\n".join(filter(None, [
                f"kernel {self.name!r} on device {self.device}, grid=({gx}, {gy}, {gz}), "
                f"block=({bx}, {by}, {bz}), shared_mem={shmem}", capture_hint(err, stream),
                exc.hint]))
            raise

    def _finish(self, pending: PendingCopies, stream: Any) -> None:
        """Copy Out/InOut host arrays back once the launch has completed."""
        if not pending:
            return
        try:
            drv = driver.bindings()
            (err,) = drv.cuStreamSynchronize(as_handle(stream))
            if err:
                context_mod.raise_async(err, f"cuStreamSynchronize after {self.name}")
            for host, dev in pending:
                host.finish(dev)
        finally:
            pending.clear()


if _KernelBase is not _PyKernelBase:
    def _compiled_getitem(self: Kernel, config: Any,
                          _lookup: Callable = _KernelBase.__getitem__) -> Callable[..., None]:
        return _lookup(self, config)
    torch_compile.visible_subscript(Kernel, _compiled_getitem)
