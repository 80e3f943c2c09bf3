"""Kernels: attributes, occupancy, and the launch path.

`k[grid, block](*args)` returns a launcher cached per configuration; a launcher's code is
generated once per kernel so that a launch converts and packs all arguments with one
struct.pack_into into a buffer whose void** array the driver reads, then calls cuLaunchKernel.
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading
from typing import Any, Callable, NamedTuple, Sequence

from .. import driver
from ..errors import ArgumentError, DriverError
from . import context as context_mod
from .params import Packer, ParamSlot
from .stream import as_handle

DEFAULT_SHARED_LIMIT = 48 * 1024
_MAX_CONFIGS = 512


def c_function(name: str) -> Callable[..., Any] | None:
    """A function of the compiled extension (kjit/runtime/_launch.c), None when not built:
    "pack" (the argument packer) or "launcher" (`k[grid, block]` as one C callable that
    packs and launches, handing anything unusual to the Python launcher it wraps)."""
    try:
        from . import _launch
    except ImportError:
        return None
    return getattr(_launch, name, None)


def c_launch() -> Callable[..., int] | None:
    """The compiled launch call (kjit/runtime/_launch.c), or None to use cuda.bindings'
    cuLaunchKernel: when it was not built, or KJIT_LAUNCH=bindings asks for the fallback."""
    if os.environ.get("KJIT_LAUNCH", "").strip().lower() == "bindings":
        return None
    try:
        from . import _launch
        _launch.bind()
    except (ImportError, OSError):
        return None
    return _launch.launch


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of blocks of size b that cover a items."""
    return -(-a // b)


def _dim3(value: Any, what: str) -> tuple[int, int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        dims = (value, 1, 1)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3:
        dims = tuple(value) + (1,) * (3 - len(value))
    else:
        raise ArgumentError(f"{what} must be an int or a tuple of 1-3 ints, got {value!r}")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d < 2**32:
            raise ArgumentError(f"{what} dimensions must be ints in 1..2**32-1, got {value!r}")
    return dims  # type: ignore[return-value]


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


class Kernel:
    """A kernel loaded on one device. Launch with `k[grid, block](*args)`,
    `k[grid, block, stream, shared_mem](*args)` or `k.launch(grid, block, *args, ...)`."""

    def __init__(self, module: Any, handle: Any, name: str, symbol: str, slots: list[ParamSlot],
                 device: int, context: Any):
        self.module = module
        self.handle = handle
        self.name = name
        self.symbol = symbol
        self.device = device
        self.context = context
        self.params = tuple(slots)
        self._packer = Packer(name, slots, device)
        self._buf, self._ptrs, self._ptrs_addr = self._packer.new_buffers()
        self._owner = threading.get_ident()
        self._local = threading.local()
        self._configs: dict[Any, Callable] = {}
        self._shared_limit = DEFAULT_SHARED_LIMIT
        self._c_launch = c_launch()
        self._pending: list = []   # In/Out copies of the launch in flight (owner thread)
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
    def __getitem__(self, config: Any) -> Callable[..., None]:
        try:
            launcher = self._configs.get(config)
        except TypeError:   # k[[2, 1], 32]: lists are fine, just not as a cache key
            launcher = None
        if launcher is None:
            launcher = self._configure(config)
        return launcher

    def _configure(self, config: Any) -> Callable[..., None]:
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise ArgumentError("launch configuration is k[grid, block], k[grid, block, stream] "
                                "or k[grid, block, stream, shared_mem]")
        grid, block = _dim3(config[0], "grid"), _dim3(config[1], "block")
        stream = as_handle(config[2] if len(config) > 2 else None)
        shared = config[3] if len(config) > 3 else 0
        self._check_shared(shared)
        # the C launch call takes the stream as a plain int handle
        launcher = self._make(*grid, *block, shared, int(stream) if self._c_launch else stream)
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

    def launch(self, grid: Any, block: Any, *args: Any, shared_mem: int = 0, stream: Any = None,
               cooperative: bool = False, cluster: Any = None) -> None:
        """Launch with explicit keywords; cooperative launches and thread-block clusters go
        through cuLaunchKernelEx."""
        if not cooperative and cluster is None:
            config = (grid, block, stream, shared_mem)
            launcher = self._configs.get(config) if type(grid) is not list and type(block) is not list else None
            (launcher or self._configure(config))(*args)
            return
        self._launch_ex(_dim3(grid, "grid"), _dim3(block, "block"), args, shared_mem,
                        as_handle(stream), cooperative, cluster)

    def _launch_ex(self, grid, block, args, shared_mem, stream, cooperative, cluster) -> None:
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
            cdims = _dim3(cluster, "cluster")
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
        buf, ptrs, addr, pending = self._pack_slow(args)
        context_mod.last_launch[0] = self.name
        self._ensure_context()
        driver.call(drv.cuLaunchKernelEx, cfg, self.handle, addr, 0)
        self._finish(pending, stream)

    # --- the generated fast path ------------------------------------------------------
    def _build_factory(self) -> Callable:
        spec = self._packer.c_spec() if self._c_launch else None
        pack = c_function("pack") if spec is not None else None
        if pack is not None:
            return self._build_c_factory(pack, *spec)
        return self._build_python_factory()

    def _build_c_factory(self, pack: Callable, spec: bytes, tokens: tuple) -> Callable:
        """Every parameter is a number or a typed pointer: the C packer writes the common
        values (exact ints and floats, matching kjit arrays) straight into the buffer and
        hands anything else, every error included, to the Python converters."""
        from .memory import DeviceArray
        src = (
            "def make(gx, gy, gz, bx, by, bz, shmem, stream):\n"
            "    def launch(*args):\n"
            "        if get_ident() != OWNER: return OTHER(args, gx, gy, gz, bx, by, bz, shmem, stream)\n"
            "        if PACK(SPEC, TOKENS, args, BUFADDR, DeviceArray): SLOW(args)\n"
            "        LAST[0] = NAME\n"
            "        err = LAUNCH(FUNC, gx, gy, gz, bx, by, bz, shmem, stream, PARAMS)\n"
            "        if err: FAILED(err, gx, gy, gz, bx, by, bz, shmem, stream, PARAMS)\n"
            "        if PENDING: FINISH(PENDING, stream)\n"
            "    if LAUNCHER is None: return launch\n"
            "    def failed(err): FAILED(err, gx, gy, gz, bx, by, bz, shmem, stream, PARAMS)\n"
            "    return LAUNCHER(launch, failed, SPEC, TOKENS, DeviceArray, LAST, NAME, BUFADDR, FUNC,\n"
            "                    stream, PARAMS, gx, gy, gz, bx, by, bz, shmem, OWNER)\n")
        names = dict(
            get_ident=threading.get_ident, OWNER=self._owner, OTHER=self._launch_other_thread,
            LAUNCHER=c_function("launcher"),
            PACK=pack, SPEC=spec, TOKENS=tokens, BUFADDR=ctypes.addressof(self._buf),
            DeviceArray=DeviceArray, SLOW=self._fill_slow, LAST=context_mod.last_launch,
            NAME=self.name, LAUNCH=self._c_launch, FUNC=int(self.handle), PARAMS=self._ptrs_addr,
            FAILED=self._launch_failed, FINISH=self._finish, PENDING=self._pending)
        self._source = src
        exec(compile(src, f"<kjit launch {self.name}>", "exec"), names)
        return names["make"]

    def _fill_slow(self, args: tuple) -> None:
        """The Python converters for a launch the C packer declined: they write every
        argument (In/Out copies go to the pending list) or raise an ArgumentError."""
        try:
            self._ensure_context()  # In/Out copies must land in the kernel's context
            values = self._packer.convert_all(args, self._pending)
            self._packer.struct.pack_into(self._buf, 0, *values)
        except (struct.error, OverflowError):
            self._pending.clear()
            raise self._packer.diagnose(args) from None
        except BaseException:
            self._pending.clear()
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
            "def make(gx, gy, gz, bx, by, bz, shmem, stream):\n"
            "    def launch(*args):\n"
            f"        if len(args) != {n}: raise COUNT(len(args))\n"
            "        if get_ident() != OWNER: return OTHER(args, gx, gy, gz, bx, by, bz, shmem, stream)\n"
            f"{indent(unpack)}\n"
            "        pending = PENDING\n"
            "        buf = BUF\n"
            "        try:\n"
            f"{indent(indent(convert_lines))}\n"
            f"{indent(indent(pack_tail.rstrip()))}\n"
            "        except (StructError, OverflowError):\n"
            "            pending.clear()\n"
            "            SLOW(args)  # the careful converters: they pack it or name what is wrong\n"
            "        except BaseException:\n"
            "            pending.clear()\n"
            "            raise\n"
            "        LAST[0] = NAME\n"
            + ("        err = LAUNCH(FUNC, gx, gy, gz, bx, by, bz, shmem, stream, PARAMS)\n"
               if self._c_launch else
               "        err = LAUNCH(FUNC, gx, gy, gz, bx, by, bz, shmem, stream, PARAMS, 0)[0]\n") +
            "        if err: FAILED(err, gx, gy, gz, bx, by, bz, shmem, stream, PARAMS)\n"
            "        if pending: FINISH(pending, stream)\n"
            "    return launch\n")
        names.update(
            COUNT=packer.count_error, get_ident=threading.get_ident, OWNER=self._owner,
            OTHER=self._launch_other_thread, PENDING=self._pending, BUF=self._buf, StructError=struct.error,
            SLOW=self._fill_slow, LAST=context_mod.last_launch, NAME=self.name,
            LAUNCH=self._c_launch or driver.bindings().cuLaunchKernel,
            FUNC=int(self.handle) if self._c_launch else self.handle, PARAMS=self._ptrs_addr,
            FAILED=self._launch_failed, FINISH=self._finish)
        self._source = src
        exec(compile(src, f"<kjit launch {self.name}>", "exec"), names)
        return names["make"]

    def _pack_slow(self, args: tuple) -> tuple[Any, Any, int, list]:
        self._ensure_context()  # In/Out copies must land in the kernel's context
        pending: list = []
        values = self._packer.convert_all(args, pending)
        buf, ptrs, addr = self._packer.new_buffers()
        try:
            self._packer.struct.pack_into(buf, 0, *values)
        except (struct.error, OverflowError):
            raise self._packer.diagnose(args) from None
        return buf, ptrs, addr, pending

    def _launch_other_thread(self, args, gx, gy, gz, bx, by, bz, shmem, stream) -> None:
        """Launches from threads other than the kernel's first: per-thread buffers."""
        buf, ptrs, addr, pending = self._pack_slow(args)
        context_mod.last_launch[0] = self.name
        drv = driver.bindings()
        (err,) = drv.cuLaunchKernel(self.handle, gx, gy, gz, bx, by, bz, shmem, stream, addr, 0)
        if err:
            self._launch_failed(err, gx, gy, gz, bx, by, bz, shmem, stream, addr)
        self._finish(pending, stream)

    def _ensure_context(self) -> None:
        drv = driver.bindings()
        current = driver.current_context()
        if current is None or int(current) != int(self.context):
            driver.call(drv.cuCtxSetCurrent, self.context)

    def _launch_failed(self, err, gx, gy, gz, bx, by, bz, shmem, stream, params) -> None:
        drv = driver.bindings()
        R = drv.CUresult
        err = R(int(err))  # the C launch call returns a plain int
        if err in (R.CUDA_ERROR_INVALID_CONTEXT, R.CUDA_ERROR_INVALID_HANDLE):
            # A thread with no (or another) current context: make the kernel's context current
            # in this thread and launch again. Primary contexts are what CuPy/PyTorch use too.
            current = driver.current_context()
            if current is None or int(current) != int(self.context):
                driver.call(drv.cuCtxSetCurrent, self.context)
                (err,) = drv.cuLaunchKernel(self.handle, gx, gy, gz, bx, by, bz, shmem, stream, params, 0)
                if not err:
                    return
        self._pending.clear()  # nothing ran: no Out copies to make, now or at a later launch
        try:
            driver.raise_for(err, f"cuLaunchKernel({self.name})")
        except DriverError as exc:
            exc.hint = (f"kernel {self.name!r}, grid=({gx}, {gy}, {gz}), block=({bx}, {by}, {bz}), "
                        f"shared_mem={shmem}")
            raise

    def _finish(self, pending: list, stream: Any) -> None:
        """Copy Out/InOut host arrays back once the launch has completed."""
        if not pending:
            return
        try:
            drv = driver.bindings()
            (err,) = drv.cuStreamSynchronize(stream)
            if err:
                context_mod.raise_async(err, f"cuStreamSynchronize after {self.name}")
            for host, dev in pending:
                host.finish(dev)
        finally:
            pending.clear()
