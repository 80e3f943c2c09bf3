"""HIP modules and kernels: hipModuleLoadData, hipModuleGetFunction, hipModuleLaunchKernel."""
from __future__ import annotations

import ctypes
from typing import Any

from ...errors import ArgumentError, DriverError, KernelNotFoundError
from .calls import call
from .launch import HipParams, LaunchConfig

def _loadable(code: Any) -> tuple[bytes, list[str], list[str]]:
    """(bytes hipModuleLoadData takes, kernel names, archs) of an ObjectCode or raw bytes."""
    from ...objectcode import ObjectCode
    obj = code if isinstance(code, ObjectCode) else ObjectCode(bytes(code))
    if obj.kind not in ("hsaco", "hipfb"):
        raise ArgumentError(
            f"a HIP module loads AMD code objects (hsaco) or offload bundles (hipfb), not "
            f"{obj.kind}; compile with backend='hip'")
    if obj.kind == "hipfb":
        from ...formats import read_bundle
        archs = [e.arch for e in read_bundle(obj.code) if e.kind == "hsaco"]
    else:
        archs = [obj.arch] if obj.arch else []
    return obj.code, list(obj.entry_points), archs


class HipModule:
    """A loaded AMD code object or offload bundle (hipModuleLoadData)."""

    def __init__(self, code: Any):
        from ...objectcode import ObjectCode
        self.object = code if isinstance(code, ObjectCode) else ObjectCode(bytes(code))
        self.code, self.kernel_names, self.archs = _loadable(self.object)
        self._image = ctypes.create_string_buffer(self.code, len(self.code))
        handle = ctypes.c_void_p()
        call("hipModuleLoadData", ctypes.byref(handle), ctypes.addressof(self._image),
             hint=f"the module holds code for: {', '.join(self.archs) or 'unknown targets'}; "
                  "compile for this GPU's gfx arch (rocminfo lists it)")
        self.handle = handle.value
        self._functions: dict[str, HipFunction] = {}

    def get_function(self, name: str) -> "HipFunction":
        """The kernel `name` (its lowered name for templates); KernelNotFoundError lists those there are."""
        fn = self._functions.get(name)
        if fn is not None:
            return fn
        symbol = self.object.lowered_name(name)   # "axpy<float>" -> its lowered name
        handle = ctypes.c_void_p()
        try:
            call("hipModuleGetFunction", ctypes.byref(handle), self.handle, symbol.encode())
        except DriverError as exc:
            if exc.hip_name in ("hipErrorNotFound", "hipErrorInvalidDeviceFunction"):
                raise KernelNotFoundError(name, self.kernel_names) from None
            raise
        fn = self._functions[name] = HipFunction(self, name, handle.value, symbol)
        return fn

    def code_object(self) -> bytes:
        """One AMD code object of this module (argument layouts are the same in each)."""
        if self.object.kind == "hipfb":
            from ...formats import read_bundle
            for entry in read_bundle(self.code):
                if entry.kind == "hsaco":
                    return entry.code
        return self.code

    def get_global(self, name: str) -> tuple[int, int]:
        """(device address, size in bytes) of a __device__ variable (hipModuleGetGlobal)."""
        ptr, size = ctypes.c_void_p(), ctypes.c_size_t()
        try:
            call("hipModuleGetGlobal", ctypes.byref(ptr), ctypes.byref(size), self.handle,
                 name.encode())
        except DriverError as exc:
            if exc.hip_name in ("hipErrorNotFound", "hipErrorInvalidSymbol"):
                raise KernelNotFoundError(name, (), what="global") from None
            raise
        return ptr.value or 0, size.value

    def unload(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, None
            call("hipModuleUnload", handle)

    def __enter__(self) -> "HipModule":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unload()


class HipFunction:
    """A kernel of a HipModule: `fn[grid, block](*args)` checks and packs arguments like a
    CUDA kjit.Kernel; launch() takes an already packed parameter buffer."""

    def __init__(self, module: HipModule, name: str, handle: int, symbol: str | None = None):
        self.module = module  # keeps the module loaded while the function lives
        self.name = name
        self.symbol = symbol or name
        self.handle = handle
        self._packer = None

    @property
    def params(self) -> tuple:
        """Parameter slots: layout from the code object's metadata (comgr), types from the code."""
        return tuple(self._packer_for().slots)

    def _packer_for(self):
        if self._packer is None:
            from ...runtime import Packer
            from ...runtime import resolve_slots
            from ..comgr import kernel_args
            info = kernel_args(self.module.code_object()).get(self.symbol)
            layout = [tuple(a) for a in info.args] if info is not None else None
            slots = resolve_slots(self.module.object, self.name, self.symbol, layout)
            self._packer = Packer(self.name, slots, device=0)
        return self._packer

    def pack(self, args: tuple) -> HipParams:
        """Arguments checked and converted exactly as for CUDA kernels, packed for HIP."""
        from ...runtime import HostTransfer as _HostTransfer
        packer = self._packer_for()
        for slot, a in zip(packer.slots, args):
            if isinstance(a, _HostTransfer):   # its copies would go through CUDA memory
                kind = type(a).__name__
                raise ArgumentError(
                    f"{slot.describe()}: kjit.{kind} copies through CUDA memory, which a HIP "
                    f"kernel cannot use. Pass a device array: copy the data into a "
                    f"kjit.hip.runtime.HipBuffer (copy_from_host), pass kjit.ptr(int(buf)), "
                    f"and copy it back with copy_to_host after hip.synchronize()")
        buf = ctypes.create_string_buffer(max(packer.size, 1))
        packer.careful(buf, args, [])
        return HipParams(buf, size=packer.size)

    def __getitem__(self, config: Any):
        """`fn[grid, block]` / `fn[grid, block, stream, shared_mem]`, like a CUDA kjit.Kernel."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise ArgumentError("launch configuration is f[grid, block], f[grid, block, stream] "
                                "or f[grid, block, stream, shared_mem]")
        grid, block = config[0], config[1]
        stream = config[2] if len(config) > 2 else None
        shared = config[3] if len(config) > 3 else 0
        LaunchConfig.make(grid, block, shared, stream)   # validate before any launch

        def launch(*args: Any) -> None:
            self.launch(self.pack(args), grid, block, shared, stream)
        return launch

    def launch_args(self, params: HipParams, config: LaunchConfig) -> tuple:
        """The exact arguments of hipModuleLaunchKernel for this launch."""
        return (self.handle, *config.grid, *config.block, config.shared_mem, config.stream,
                None, params.extra)

    def launch(self, params: HipParams | bytes | bytearray | ctypes.Array, grid: Any, block: Any,
               shared_mem: int = 0, stream: Any = None) -> None:
        """Launch on `grid` blocks of `block` threads with the packed `params`."""
        if not isinstance(params, HipParams):
            params = HipParams(params)
        config = LaunchConfig.make(grid, block, shared_mem, stream)
        call("hipModuleLaunchKernel", *self.launch_args(params, config))

    def __repr__(self) -> str:
        return f"HipFunction({self.name!r})"

