"""Kernels: attributes, occupancy, and the launch path.

`k[grid, block](*args)` returns a launcher cached per configuration (`launchers.build`): a
launch packs all arguments into the kernel's buffer, whose void** array the driver reads,
then calls cuLaunchKernel.

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
import threading
import weakref
from typing import Any, Callable, NamedTuple

from .. import driver
from ..errors import ArgumentError, DriverError
from . import context as context_mod
from .libcuda import c_function, current_context_fn, extension
from . import launchers, torch_compile
from .launch_ex import _dim3, launch_ex
from .launchers import AUTO_STREAM, GRAD_OK, launch_call
from .memory import PendingCopies
from .params import Packer, ParamSlot
from .pointers import arguments_device
from .stream import (OPERATOR_STREAM, as_handle, capture_hint, check_stream_context,
                     framework_stream, stream_owner)

DEFAULT_SHARED_LIMIT = 48 * 1024
_MAX_CONFIGS = 512


def c_launch() -> Callable[..., int] | None:
    """The compiled launch call (kjit/runtime/_launch.c), or None to use cuda.bindings'
    cuLaunchKernel: when it was not built, or KJIT_LAUNCH=bindings asks for the fallback."""
    from ..settings import launch_mode
    if launch_mode() == "bindings":   # a value it does not know is a SettingError
        return None
    ext = extension()
    return ext.launch if ext is not None else None


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of blocks of size b that cover a items."""
    return -(-a // b)


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
    cache_mode_ca: int                     # 1: compiled with -Xptxas -dlcm=ca (L1-cached loads)
    preferred_shared_memory_carveout: int  # percent of L1 preferred as shared memory, -1: default


class LaunchConfig(NamedTuple):
    grid: Any
    block: Any
    stream: Any = None
    shared_mem: int = 0


# Kernels by the address of their context. When kjit destroys a context, its kernels forget
# it (`Kernel._context_destroyed`): the driver may put a new context at the same address, and
# the launchers compare addresses only.
_kernels_by_context: dict[int, "weakref.WeakSet[Kernel]"] = {}
_NO_CONTEXT = 2**64 - 1   # never a context's address, nor 0 (no context current)


# Kernels by the address of their CUfunction: what a captured graph node launches
_kernels_by_handle: "weakref.WeakValueDictionary[int, Kernel]" = weakref.WeakValueDictionary()


def kernel_for_handle(handle: int) -> "Kernel | None":
    """The loaded Kernel whose CUfunction this is (None: one kjit did not load)."""
    return _kernels_by_handle.get(handle)


def wrong_stream_device(kernel: str, device: int, stream_device: int) -> str:
    """The refusal of a stream of another device than the launch's arrays."""
    return (f"kernel {kernel!r}: its arrays are on device {device} but the stream given is on "
            f"device {stream_device}. Pass a stream of device {device} "
            f"(torch.cuda.Stream(device={device}), kjit.Stream() under kjit.Device({device})), or "
            "name none: the launch then runs on the current stream of device "
            f"{device}. (torch.cuda.graph captures on one stream it makes the first time it is "
            f"used, on the device current then: capture on device {device} with "
            f"torch.cuda.graph(g, stream=torch.cuda.Stream(device={device})).)")


def _current_in(kernel: "Kernel", run: Callable[[], Any]) -> Any:
    """run() with the kernel's context current: as it is, or pushed for the call."""
    if kernel._current() == kernel._ctx:
        return run()
    with driver.context_pushed(kernel.context):
        return run()


def _forget_context(ctx: int) -> None:
    for k in list(_kernels_by_context.pop(ctx, ())):
        k._context_destroyed()


driver.context_destroyed_hooks.append(_forget_context)


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
        self._ctx_cell = ctypes.c_uint64(self._ctx)   # the C launchers read it per launch
        self._epoch = driver.context_epoch(context)
        _kernels_by_context.setdefault(self._ctx, weakref.WeakSet()).add(self)
        _kernels_by_handle[int(handle)] = self
        self.params = tuple(slots)
        self._packer = Packer(name, slots, device)
        self._buf, self._ptrs, self._ptrs_addr = self._packer.new_buffers()
        self._buf_addr = ctypes.addressof(self._buf)
        self._owner = threading.get_ident()
        self._configs: dict[Any, Callable] = {}
        self._shared_limit = DEFAULT_SHARED_LIMIT
        self._c_launch = c_launch()
        self._current = current_context_fn()
        # the packing step every configuration's launcher shares (this kernel's buffer); with
        # KJIT_LAUNCH=bindings, or no C extension, Python alone packs as well as launches
        self._fill = self._packer.filler(self._buf, c_function("pack") if self._c_launch else None)
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
                get("BINARY_VERSION"), get("MAX_DYNAMIC_SHARED_SIZE_BYTES"), get("CACHE_MODE_CA"),
                get("PREFERRED_SHARED_MEMORY_CARVEOUT"))
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

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        # CuPy's RawKernel is called k(grid, block, args), PyCUDA's f(*args, block=, grid=)
        names = ", ".join(s.name for s in self.params)
        raise ArgumentError(
            f"a kjit.Kernel is launched with its configuration in brackets: "
            f"{self.name}[grid, block](*args), or {self.name}[grid, block, stream, shared_mem]"
            f"(*args), or {self.name}.launch(grid, block, *args, stream=..., shared_mem=...); "
            f"its arguments: ({names}). (CuPy's k(grid, block, (args...)) is "
            f"k[grid, block](*args) here.)")

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise ArgumentError(
            f"kjit.Kernel {self.name!r} cannot be pickled or copied: it is a function loaded into "
            "a CUDA context of this process. Pickle the code it came from (kernel.module.object, "
            "a kjit.ObjectCode) and, in the other process, kjit.load(code).get_function("
            f"{self.name!r})")

    # --- launching --------------------------------------------------------------------
    # k[config]: _KernelBase looks the launcher up in self._configs, else calls _configure.
    def _configure(self, config: Any) -> Callable[..., None]:
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise ArgumentError("launch configuration is k[grid, block], k[grid, block, stream] "
                                "or k[grid, block, stream, shared_mem]")
        given = config[2] if len(config) > 2 else None
        here = self._in_current_context()
        owner = self._for_stream(given, here)
        if owner is not here and owner is not self:
            # a stream of another device: the launch runs there wherever the thread is, so
            # that device's launcher serves this kernel's table too
            launcher = owner[config]
            self._cache_launcher(config, launcher)
            return launcher
        if owner is here and here is not self:   # another device is current: its kernel
            return here[config]                  # configures (and caches) it
        grid, block = _dim3(config[0], "grid"), _dim3(config[1], "block")
        flags = AUTO_STREAM | GRAD_OK if given is OPERATOR_STREAM else \
            AUTO_STREAM if given is None else 0
        stream = None   # none given: the arrays' framework's current stream, per launch
        if not flags:
            stream = as_handle(given)
            check_stream_context(stream, self._ctx, self.device, self.name)
            # the C launch call takes the stream as a plain int handle
            stream = int(stream) if self._c_launch else stream
        shared = config[3] if len(config) > 3 else 0
        self._check_shared(shared)
        launcher = launchers.build(self, self._fill, (*grid, *block), shared, stream, config, flags)
        self._cache_launcher(config, launcher)
        return launcher

    def _cache_launcher(self, config: Any, launcher: Callable[..., None]) -> None:
        if len(self._configs) >= _MAX_CONFIGS:
            self._configs.clear()
        try:
            self._configs[config] = launcher
        except TypeError:  # unhashable stream object: don't cache
            pass

    def _context_destroyed(self) -> None:
        """kjit destroyed this kernel's context: its handle is dead. Every launcher of it,
        cached or held, hands each launch over (`_launch_elsewhere`) to the module's kernel
        in the context then current, loaded there on first use."""
        self._ctx = _NO_CONTEXT
        self._ctx_cell.value = _NO_CONTEXT
        self._configs.clear()

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
        here = self._for_arguments(args, stream)
        _current_in(here, lambda: launch_ex(here, grid, block, args, shared_mem, stream,
                                            cooperative, cluster))

    def as_torch_op(self, name: str, *, grid: Any, block: Any, shared_mem: int = 0,
                    outputs: dict[str, Any] | None = None) -> Any:
        """This kernel as the PyTorch operator `name` ("mylib::saxpy"), schema from its C
        signature; see kjit.runtime.torch_op.as_torch_op."""
        from .torch_op import as_torch_op
        return as_torch_op(self, name, grid=grid, block=block, shared_mem=shared_mem,
                           outputs=outputs)

    def as_jax_op(self, *, grid: Any, block: Any, shared_mem: int = 0,
                  outputs: dict[str, Any] | None = None, ndim: dict[str, int] | None = None,
                  vmap: str = "sequential") -> Any:
        """This kernel as a JAX function (eager, jax.jit, jax.vmap), parameters from its C
        signature; see kjit.runtime.jax_op.as_jax_op. It runs on every GPU JAX has: the
        module is loaded in each when a call is first traced."""
        from .jax_op import as_jax_op
        return as_jax_op(self, grid=grid, block=block, shared_mem=shared_mem, outputs=outputs,
                         ndim=ndim, vmap=vmap)

    def _pack_slow(self, args: tuple, stream: Any) -> tuple[Any, Any, int, PendingCopies]:
        """Fresh buffers filled by the careful converters: for a launch off the kernel's
        first thread, which must not share its buffer."""
        pending = PendingCopies(stream)
        buf, ptrs, addr = self._packer.new_buffers()
        self._packer.careful(buf, args, pending)
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

    def _twin_on(self, device: int) -> "Kernel":
        """The module's kernel of this name in device `device`'s primary context."""
        if device == self.device and self._ctx != _NO_CONTEXT and \
                int(driver.primary_context(device)) == self._ctx:
            return self
        with driver.context_pushed(driver.primary_context(device)):
            return self.module.get_function(self.name)

    def _for_stream(self, given: Any, here: "Kernel | None" = None) -> "Kernel":
        """The kernel a configuration naming stream `given` belongs to: the current context's
        (`here`), or, for a stream of another device's primary context, that device's."""
        here = here or self._in_current_context()
        if given is None or given is OPERATOR_STREAM:
            return here
        owner = stream_owner(as_handle(given))
        if owner is None or owner == here._ctx:
            return here
        device = driver.context_device(owner)
        if device is None or int(driver.primary_context(device)) != owner:
            return here   # another context of this device: its own check refuses it
        return self._twin_on(device)

    def _for_arguments(self, args: tuple, given: Any) -> "Kernel":
        """The kernel a launch with these arguments runs: on the device of its arrays (the
        stream named, if any, must be there), else on the stream's or the current device."""
        device = arguments_device(self.name, self.params, args)
        if device is None:
            return self._for_stream(given)
        if given is not None and given is not OPERATOR_STREAM:
            stream = as_handle(given)
            owner = stream_owner(stream)
            sdev = driver.context_device(owner) if owner is not None else None
            if sdev is not None and sdev != device:
                raise ArgumentError(wrong_stream_device(self.name, device, sdev))
        if device == self.device:   # the current context's kernel, if it is on that device
            here = self._in_current_context()
            if here.device == device:
                return here
        return self._twin_on(device)

    def _launch_elsewhere(self, args, config, gx, gy, gz, bx, by, bz, shmem, stream) -> None:
        """A launch the fast path handed over: on another device than this kernel's or while
        another context is current (routed by its arguments), or from a thread other than the
        kernel's first (per-call buffers)."""
        given = config[2] if isinstance(config, tuple) and len(config) > 2 else None
        here = self._for_arguments(args, given)
        if here is not self:
            return _current_in(here, lambda: here[config](*args))
        _current_in(self, lambda: self._launch_with_own_buffers(args, gx, gy, gz, bx, by, bz,
                                                                shmem, stream))

    def _launch_with_own_buffers(self, args, gx, gy, gz, bx, by, bz, shmem, stream) -> None:
        if stream is None:
            stream = framework_stream(args, self.device, self.name)
            stream = stream if self._c_launch else as_handle(stream)
        buf, ptrs, addr, pending = self._pack_slow(args, stream)
        context_mod.last_launch[0] = self.name
        call, func = launch_call(self)
        err = call(func, gx, gy, gz, bx, by, bz, shmem, int(stream) if self._c_launch else stream, addr)
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
