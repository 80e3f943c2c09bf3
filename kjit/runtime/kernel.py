"""Kernels and their launches: a loaded kernel (attributes, occupancy), and how one launch
configuration, `k[grid, block]`, becomes a callable that packs and launches.

`k[grid, block]` is looked up in C (`_launch.KernelBase`, kjit/runtime/_tables.c); a miss
calls `Kernel._configure`, which checks the configuration and builds its launcher (`build`)
from the kernel's parts, named by the `Launchable` protocol. When the C packer writes every
parameter, the launcher is a `_launch.Launcher` (kjit/runtime/_launch.c), handed out as a
builtin function bound to it: one C call packs into the launcher's own buffer and calls
cuLaunchKernel, asking which context is current only where the driver refuses the launch. It
hands anything else (another thread, another context where its arrays do not tie the launch
to this device, an argument it declines, every error) to the Python launcher built from the
same parts. `Kernel.launch(cooperative=, cluster=)` goes
through cuLaunchKernelEx instead.

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
import struct
import threading
import weakref
from operator import itemgetter
from typing import Any, Callable, NamedTuple, Protocol

from .. import driver
from ..errors import ArgumentError, DriverError
from . import context as context_mod
from . import torch_compile
from .dims import dim3
from .libcuda import c_function, current_context_fn, extension
from .memory import DeviceArray, PendingCopies
from .params import K_ARRAY, K_ARRAY_BITS, Packer, ParamSlot
from .pointers import arguments_device, detach_grads
from .stream import (OPERATOR_STREAM, as_handle, capture_hint, check_stream_context,
                     framework_stream, stream_owner)

DEFAULT_SHARED_LIMIT = 48 * 1024
_MAX_CONFIGS = 512
# Launcher flags; the C launcher's L_* (kjit/runtime/_launch.c), checked against these by
# tests/test_c_constants.py. AUTO_STREAM: no stream given, the arrays' framework's current
# one; GRAD_OK: tensors that require grad are taken (an operator runs below autograd);
# HAS_ARRAYS: its arrays say which device a launch is for.
AUTO_STREAM, GRAD_OK, HAS_ARRAYS = 1, 2, 4
# A destroyed context's address in a kernel (`context_address`, `context_cell`): never a
# context's, nor 0 (no context current). _launch.c's NO_CONTEXT, checked as above.
NO_CONTEXT = 2**64 - 1


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


class Launchable(Protocol):
    """What a launcher is built from (`build`): a loaded kernel's parts, read once per
    configuration. Per launch, the Python launcher reads `context_address` alone and the C
    one `context_cell`, both NO_CONTEXT once kjit destroyed the context. `Kernel` is one;
    tests build launchers from stand-ins."""

    @property
    def name(self) -> str: ...
    @property
    def device(self) -> int: ...
    @property
    def handle(self) -> Any: ...                  # the CUfunction
    @property
    def params(self) -> tuple[ParamSlot, ...]: ...
    @property
    def packer(self) -> Packer: ...               # layout, the C packer's spec, count errors
    @property
    def fill(self) -> Callable[[tuple, list], None]: ...   # packs into the kernel's buffer
    @property
    def params_address(self) -> int: ...          # its void** array: cuLaunchKernel's kernelParams
    @property
    def block_size(self) -> int: ...              # the buffer's size where the driver laid it out, else 0
    @property
    def owner_thread(self) -> int: ...            # the thread whose launches use the buffers
    @property
    def context_address(self) -> int: ...
    @property
    def context_cell(self) -> ctypes.c_uint64: ...
    @property
    def c_launch(self) -> Callable[..., int] | None: ...   # _launch.launch; None: cuda.bindings
    @property
    def current_context(self) -> Callable[[], int]: ...    # cuCtxGetCurrent's answer as an int

    # this configuration's launcher on the device the arguments' arrays are on
    def launcher_for(self, args: tuple, config: Any) -> Callable[..., None]: ...

    # a launch from another thread than owner_thread, or while another context is current
    def launch_elsewhere(self, args: tuple, config: Any, dims: tuple, shared: int,
                         stream: Any) -> None: ...


# Kernels by the address of their context. When kjit destroys a context, its kernels forget
# it (`Kernel._context_destroyed`): the driver may put a new context at the same address, and
# the launchers compare addresses only.
_kernels_by_context: dict[int, "weakref.WeakSet[Kernel]"] = {}


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
    if kernel.current_context() == kernel.context_address:
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
                 device: int, context: Any, driver_layout: bool = False):
        self.module = module
        self.handle = handle
        self.name = name
        self.symbol = symbol
        self.device = device
        self.context = context
        # The Launchable parts: plain attributes, so a launch reads them at no extra cost
        self.context_address = int(context)
        self.context_cell = ctypes.c_uint64(self.context_address)   # C launchers read it per launch
        self._epoch = driver.context_epoch(context)
        _kernels_by_context.setdefault(self.context_address, weakref.WeakSet()).add(self)
        _kernels_by_handle[int(handle)] = self
        self.params = tuple(slots)
        self.packer = Packer(name, slots, device)
        self._buf, self._ptrs, self.params_address = self.packer.new_buffers()
        # a layout the driver gave (cuFuncGetParamInfo) is its parameter block exactly: C
        # launchers (each with a buffer of its own) hand theirs over whole, which the driver
        # copies in one piece
        self.block_size = self.packer.size if driver_layout and slots else 0
        self.owner_thread = threading.get_ident()
        self._configs: dict[Any, Callable] = {}
        self._shared_limit = DEFAULT_SHARED_LIMIT
        self.c_launch = c_launch()
        self.current_context = current_context_fn()
        # the packing step every configuration's launcher shares (this kernel's buffer); with
        # KJIT_LAUNCH=bindings, or no C extension, Python alone packs as well as launches
        self.fill = self.packer.filler(self._buf, c_function("pack") if self.c_launch else None)
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
        grid, block = dim3(config[0], "grid"), dim3(config[1], "block")
        flags = AUTO_STREAM | GRAD_OK if given is OPERATOR_STREAM else \
            AUTO_STREAM if given is None else 0
        stream = None   # none given: the arrays' framework's current stream, per launch
        if not flags:
            stream = as_handle(given)
            check_stream_context(stream, self.context_address, self.device, self.name)
            # the C launch call takes the stream as a plain int handle
            stream = int(stream) if self.c_launch else stream
        shared = config[3] if len(config) > 3 else 0
        self._check_shared(shared)
        launcher = build(self, (*grid, *block), shared, stream, config, flags)
        self._cache_launcher(config, launcher)
        return launcher

    def _cache_launcher(self, config: Any, launcher: Callable[..., None]) -> None:
        if len(self._configs) >= _MAX_CONFIGS:
            self._configs = {}   # a new table, never cleared in place: C's memo forgets with it
        try:
            self._configs[config] = launcher
        except TypeError:  # unhashable stream object: don't cache
            pass

    def _context_destroyed(self) -> None:
        """kjit destroyed this kernel's context: its handle is dead. Every launcher of it,
        cached or held, hands each launch over (`launch_elsewhere`) to the module's kernel
        in the context then current, loaded there on first use."""
        self.context_address = NO_CONTEXT
        self.context_cell.value = NO_CONTEXT
        self._configs = {}

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
        grid, block = dim3(grid, "grid"), dim3(block, "block")
        here = self._for_arguments(args, stream)
        _current_in(here, lambda: here._launch_ex(grid, block, args, shared_mem, stream,
                                                  cooperative, cluster))

    def _launch_ex(self, grid: tuple, block: tuple, args: tuple, shared_mem: int, stream: Any,
                   cooperative: bool, cluster: Any) -> None:
        """Launch through cuLaunchKernelEx, with launch attributes, this kernel's context
        current: the same argument packing and stream rules as `k[grid, block](...)`."""
        stream = as_handle(framework_stream(args, self.device, self.name) if stream is None
                           else stream)
        check_stream_context(stream, self.context_address, self.device, self.name)
        drv = driver.bindings()
        self._check_shared(shared_mem)
        dev = driver.call(drv.cuDeviceGet, self.device)
        attrs = []
        if cooperative:
            if not driver.call(drv.cuDeviceGetAttribute,
                               drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev):
                raise ArgumentError(f"device {self.device} does not support cooperative launch")
            per_sm = self.max_active_blocks(block[0] * block[1] * block[2], shared_mem)
            sms = driver.call(drv.cuDeviceGetAttribute,
                              drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
            if grid[0] * grid[1] * grid[2] > per_sm * sms:
                raise ArgumentError(
                    f"cooperative launch of {grid[0] * grid[1] * grid[2]} blocks exceeds the "
                    f"{per_sm * sms} that can be resident at once on device {self.device}")
            a = drv.CUlaunchAttribute()
            a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            a.value.cooperative = 1
            attrs.append(a)
        if cluster is not None:
            cdims = dim3(cluster, "cluster")
            if not driver.call(drv.cuDeviceGetAttribute,
                               drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, dev):
                raise ArgumentError(f"device {self.device} does not support thread-block clusters")
            if any(g % c for g, c in zip(grid, cdims)):
                raise ArgumentError(f"grid {grid} is not a multiple of the cluster shape {cdims}")
            a = drv.CUlaunchAttribute()
            a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cdims
            attrs.append(a)
        cfg = drv.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = shared_mem
        cfg.hStream = stream
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        buf, ptrs, addr, pending = self._pack_slow(args, stream)
        context_mod.last_launch[0] = self.name
        (err,) = drv.cuLaunchKernelEx(cfg, self.handle, addr, 0)
        if err:
            launch_failed(self, err, (*grid, *block), shared_mem, stream, pending)
        finish_copies(self.name, pending, stream)

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
        buf, ptrs, addr = self.packer.new_buffers()
        self.packer.careful(buf, args, pending)
        return buf, ptrs, addr, pending

    # --- launches off the fast path -----------------------------------------------------
    def _in_current_context(self) -> "Kernel":
        """This kernel if its context is the one current in this thread (a thread with none
        gets its default device's, as for any kjit call), else the module's kernel of the
        same name there, loaded on first use."""
        current = self.current_context() or int(driver.ensure_context())
        if current == self.context_address and driver.context_epoch(current) == self._epoch:
            return self
        return self.module.get_function(self.name)

    def _twin_on(self, device: int) -> "Kernel":
        """The module's kernel of this name in device `device`'s primary context."""
        if device == self.device and self.context_address != NO_CONTEXT and \
                int(driver.primary_context(device)) == self.context_address:
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
        if owner is None or owner == here.context_address:
            return here
        if owner == self.context_address and driver.context_epoch(owner) == self._epoch:
            return self   # a stream of this kernel's own context: the driver runs it there
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

    # --- the Launchable callbacks ---------------------------------------------------------
    def launcher_for(self, args: tuple, config: Any) -> Callable[..., None]:
        """This configuration's launcher in the kernel these arguments' arrays route the launch
        to (on their device), configured in that kernel's context."""
        given = config[2] if isinstance(config, tuple) and len(config) > 2 else None
        target = self._for_arguments(args, given)
        with driver.context_pushed(target.context):
            return target[config]

    def launch_elsewhere(self, args: tuple, config: Any, dims: tuple, shared: int,
                         stream: Any) -> None:
        """A launch a launcher handed over: on another device than this kernel's or while
        another context is current (routed by its arguments), or from a thread other than the
        kernel's first (per-call buffers)."""
        given = config[2] if isinstance(config, tuple) and len(config) > 2 else None
        here = self._for_arguments(args, given)
        if here is not self:
            return _current_in(here, lambda: here[config](*args))
        _current_in(self, lambda: self._launch_with_own_buffers(args, dims, shared, stream))

    def _launch_with_own_buffers(self, args: tuple, dims: tuple, shared: int, stream: Any) -> None:
        if stream is None:
            stream = framework_stream(args, self.device, self.name)
            stream = stream if self.c_launch else as_handle(stream)
        buf, ptrs, addr, pending = self._pack_slow(args, stream)
        context_mod.last_launch[0] = self.name
        call, func = launch_call(self)
        err = call(func, *dims, shared, int(stream) if self.c_launch else stream, addr)
        if err:
            launch_failed(self, err, dims, shared, stream, pending)
        finish_copies(self.name, pending, stream)


def launch_failed(kernel: Launchable, err: int, dims: tuple, shared: int, stream: Any,
                  pending: PendingCopies | None = None) -> None:
    """Raise the DriverError of a failed launch, naming the kernel and its configuration."""
    if pending is not None:
        pending.clear()  # nothing ran: no Out copies to make, now or at a later launch
    gx, gy, gz, bx, by, bz = dims
    try:
        driver.raise_for(err, f"cuLaunchKernel({kernel.name})")
    except DriverError as exc:
        exc.hint = "\n".join(filter(None, [
            f"kernel {kernel.name!r} on device {kernel.device}, grid=({gx}, {gy}, {gz}), "
            f"block=({bx}, {by}, {bz}), shared_mem={shared}", capture_hint(err, stream),
            exc.hint]))
        raise


def finish_copies(kernel_name: str, pending: PendingCopies, stream: Any) -> None:
    """Copy Out/InOut host arrays back once the launch has completed."""
    if not pending:
        return
    try:
        drv = driver.bindings()
        (err,) = drv.cuStreamSynchronize(as_handle(stream))
        if err:
            context_mod.raise_async(err, f"cuStreamSynchronize after {kernel_name}")
        for host, dev in pending:
            host.finish(dev)
    finally:
        pending.clear()


# --- launchers: one configuration as a callable -------------------------------------------
def build(kernel: Launchable, dims: tuple, shared: int, stream: Any, config: Any,
          flags: int) -> Callable[..., None]:
    """The launcher of one configuration: grid and block `dims` (six ints), dynamic shared
    memory, a stream (None: the arrays' framework's current stream, read per launch)."""
    pending = PendingCopies(stream)   # this configuration's In/Out copies
    make = c_function("launcher") if kernel.c_launch is not None else None
    fronted = make is not None and not kernel.packer.python_slots
    launch = torch_compile.launch_entry(_python_launcher(kernel, dims, shared, stream, config,
                                                         flags, pending, fronted))
    if not fronted:
        return launch
    spec, tokens = kernel.packer.c_spec()
    if any(kind in (K_ARRAY, K_ARRAY_BITS) for kind, _offset in struct.iter_unpack("<ii", spec)):
        flags |= HAS_ARRAYS

    def failed(err: int, s: int) -> None:
        launch_failed(kernel, err, dims, shared, s, pending)
    return make(launch, failed, spec, tokens, DeviceArray, context_mod.last_launch, kernel.name,
                int(kernel.handle), stream or 0, *dims, shared, kernel.owner_thread,
                kernel.context_cell, flags, kernel.device, kernel.block_size)


def _python_launcher(kernel: Launchable, dims: tuple, shared: int, stream: Any, config: Any,
                     flags: int, pending: PendingCopies, fronted: bool) -> Callable[..., None]:
    """The launch in Python. `fronted`: a C launcher runs first and hands this one only what
    it declines, such as arrays of another device, so those are routed before packing."""
    gx, gy, gz, bx, by, bz = dims
    owner, current, name, device = kernel.owner_thread, kernel.current_context, kernel.name, kernel.device
    params, n, count_error = kernel.params_address, len(kernel.params), kernel.packer.count_error
    arrays = _picker(kernel.packer.pointer_indices, n)   # where a framework's array may be
    fill, elsewhere, slots = kernel.fill, kernel.launch_elsewhere, kernel.params
    call, func = launch_call(kernel)
    bindings, grad_ok = kernel.c_launch is None, flags & GRAD_OK
    last, get_ident = context_mod.last_launch, threading.get_ident
    routes: dict[int, Callable[..., None]] = {}   # device -> this configuration's launcher there

    def route(args: tuple) -> Callable[..., None] | None:
        """This configuration's launcher on the device of the arguments' arrays where that is
        another device (made once per device), else None; arrays on two devices, or on
        another device than a stream given, are refused, naming them."""
        there = arguments_device(name, slots, args)
        if there is None or there == device:
            return None
        routed = routes.get(there)
        if routed is None:
            routed = routes[there] = kernel.launcher_for(args, config)
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
        if get_ident() != owner or current() != kernel.context_address:
            return elsewhere(args, config, dims, shared, stream)
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
            launch_failed(kernel, err, dims, shared, s, pending)
        if pending:
            finish_copies(name, pending, s)
    return launch


def launch_call(kernel: Launchable) -> tuple[Callable[..., int], Any]:
    """(call, function): `call(function, gx, gy, gz, bx, by, bz, shared, stream, params)`
    launches and returns the driver's result code, through the C extension or cuda.bindings."""
    if kernel.c_launch is not None:
        return kernel.c_launch, int(kernel.handle)
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


if _KernelBase is not _PyKernelBase:
    def _compiled_getitem(self: Kernel, config: Any,
                          _lookup: Callable = _KernelBase.__getitem__) -> Callable[..., None]:
        return _lookup(self, config)
    torch_compile.visible_subscript(Kernel, _compiled_getitem)
