"""Modules: load code with JIT options (cuModuleLoadDataEx), keep the logs, find kernels
and globals. Code is loaded lazily into each context that asks for a kernel."""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from .. import driver
from ..errors import ArgumentError, KernelNotFoundError, KjitError
from ..jit_options import JitOptions, log_full, log_text
from ..objectcode import ObjectCode, from_foreign_code, from_text_or_path, is_foreign_code
from . import dtypes
from .kernel import Kernel
from .mangled import find_kernel
from .capture import check_not_capturing, relaxed_capture
from .signature import resolve_slots


def _as_object(code: Any) -> ObjectCode:
    if isinstance(code, ObjectCode):   # a LinkResult is one
        return code
    if is_foreign_code(code):          # cuda.core's ObjectCode
        return from_foreign_code(code)
    inner = getattr(code, "object", None)   # a kjit build result
    if isinstance(inner, ObjectCode):
        return inner
    if isinstance(code, (bytes, bytearray, memoryview)):
        return ObjectCode(bytes(code))
    if isinstance(code, (str, os.PathLike)):
        return from_text_or_path(code, "kjit.load")
    raise ArgumentError(
        f"kjit.load takes a kjit.ObjectCode or LinkResult, a cuda.core ObjectCode, bytes, PTX "
        f"text or a file path, got {type(code).__module__}.{type(code).__qualname__}")


class Global:
    """A `__device__` or `__constant__` variable of a module: its address and size."""

    def __init__(self, module: "Module", name: str, ptr: int, nbytes: int):
        self.module, self.name, self.ptr, self.nbytes = module, name, int(ptr), int(nbytes)

    def copy_from_host(self, host: Any) -> "Global":
        arr = dtypes.numpy().ascontiguousarray(host)
        if arr.nbytes != self.nbytes:
            raise ArgumentError(f"global {self.name!r} is {self.nbytes} bytes; the host data is {arr.nbytes}")
        driver.call(driver.bindings().cuMemcpyHtoD, self.ptr, arr.ctypes.data, self.nbytes)
        return self

    def copy_to_host(self, dtype: Any = "uint8") -> Any:
        """The variable's bytes as a new numpy array of `dtype`."""
        np = dtypes.numpy()
        dtype = np.dtype(dtype)
        if self.nbytes % dtype.itemsize:
            raise ArgumentError(f"global {self.name!r} ({self.nbytes} bytes) is not a whole number of {dtype}")
        out = np.empty(self.nbytes // dtype.itemsize, dtype)
        driver.call(driver.bindings().cuMemcpyDtoH, out.ctypes.data, self.ptr, self.nbytes)
        return out

    get = copy_to_host

    def __repr__(self) -> str:
        return f"kjit.Global({self.name!r}, {self.nbytes} bytes at {self.ptr:#x})"


class Module:
    """Loaded code. `get_function(name)` accepts kernel names and name expressions.

    A Module is code loaded into this process's CUDA contexts: it cannot be pickled. Pickle
    its `object` (the ObjectCode, which keeps its kernels' parameter types) instead."""

    def __init__(self, obj: ObjectCode, jit_options: JitOptions | None = None):
        self.object = obj
        self.jit_options = jit_options or JitOptions()
        self.info_log = ""
        self.error_log = ""
        self.jit_wall_time_ms = 0.0
        self._image = self._loadable_image(obj)
        self._handles: dict[tuple[int, int], Any] = {}    # (context, epoch) -> CUmodule
        self._kernels: dict[tuple[int, str], Kernel] = {}
        self._closed = False
        self._lock = threading.RLock()   # threads of several devices may load it at once

    # --- loading ----------------------------------------------------------------------
    def _loadable_image(self, obj: ObjectCode) -> bytes:
        """The bytes handed to the driver. PTX newer than the driver accepts never reaches it:
        it is linked to cubin for the device with nvJitLink (same version as NVRTC)."""
        if obj.kind in ("object", "library"):
            raise KjitError(
                f"kjit.load cannot load a {'relocatable object' if obj.kind == 'object' else 'library'} "
                "directly: link it first, e.g. kjit.load(kjit.link([obj, ...]))")
        if obj.kind == "ltoir":
            raise KjitError("kjit.load cannot load LTO-IR: link it to a cubin first with "
                            "kjit.link([...], lto=True)")
        if obj.kind == "ptx" and obj.ptx_version is not None:
            from ..linker import cuda_version_text, ptx_too_new
            drv_version = driver.driver_version()
            if ptx_too_new(obj.ptx_version, drv_version):
                from ..arch import device_arch
                from ..linker import ptx_to_cubin
                target = device_arch()
                if target is None:  # pragma: no cover - load() runs only with a device
                    raise KjitError("no device to link PTX for")
                try:
                    cubin = ptx_to_cubin(obj.code, target.sm)
                except KjitError as exc:
                    raise KjitError(
                        f"PTX .version {'.'.join(map(str, obj.ptx_version))} is newer than the "
                        f"CUDA {cuda_version_text(drv_version)} driver accepts, and nvJitLink could "
                        f"not turn it into a {target.sm} cubin: {exc}\nCompile to cubin instead "
                        "(kjit.compile(..., target='cubin')), or install an NVRTC no newer than "
                        "the driver.") from exc
                self.info_log = (f"PTX .version {'.'.join(map(str, obj.ptx_version))} is newer than "
                                 f"the CUDA {cuda_version_text(drv_version)} driver accepts: linked "
                                 f"to a {target.sm} cubin with nvJitLink\n")
                return cubin.code
        if obj.kind == "fatbin":
            return self._fatbin_image(obj)
        return obj.code

    def _fatbin_image(self, obj: ObjectCode) -> bytes:
        """The driver picks from a fatbin itself, unless the entry it would use is PTX newer
        than it accepts: that PTX is linked to a cubin for the device with nvJitLink."""
        from ..arch import device_arch
        from ..formats import best_entry, fatbin_entries as entries
        from ..linker import ptx_too_new
        target = device_arch()
        chosen = best_entry(entries(obj.code, "fatbin"), target.name) if target else None
        if (chosen is None or chosen.kind != "ptx" or not chosen.decoded
                or chosen.ptx_version is None
                or not ptx_too_new(chosen.ptx_version, driver.driver_version())):
            return obj.code
        from ..linker import ptx_to_cubin
        cubin = ptx_to_cubin(chosen.code, target.sm)
        self.info_log = (f"the fatbin has no cubin for {target.sm} and its PTX ({chosen.arch}, "
                         f".version {'.'.join(map(str, chosen.ptx_version))}) is newer than the "
                         f"driver accepts: linked to a {target.sm} cubin with nvJitLink\n")
        return cubin.code

    def _handle(self) -> tuple[Any, int, Any]:
        """(CUmodule, device ordinal, context) for the current context, loading on first use."""
        if self._closed:
            raise KjitError("this module was unloaded")
        ctx = driver.ensure_context()
        key = (int(ctx), driver.context_epoch(ctx))   # a reused context address is a new context
        h = self._handles.get(key)
        if h is None:
            with self._lock:
                h = self._handles.get(key)
                if h is None:
                    h = self._handles[key] = self._load_into_current()
        return h, driver.current_device(), ctx

    def _load_into_current(self) -> Any:
        drv = driver.bindings()
        size = self.jit_options.log_bytes
        # a kernel's first launch may come inside a CUDA graph capture (PyTorch's global
        # mode refuses a module load there): the load runs at once and is not recorded
        with relaxed_capture():
            while True:
                info, error = bytearray(size), bytearray(size)
                keys, values = self.jit_options.driver_options(info, error)
                t0 = time.perf_counter()
                err, handle = drv.cuModuleLoadDataEx(self._image, len(keys), keys, values)
                self.jit_wall_time_ms = (time.perf_counter() - t0) * 1e3
                if (log_full(info) or log_full(error)) and size < (1 << 28):
                    if not err:
                        drv.cuModuleUnload(handle)
                    size *= 8  # a log filled its buffer: load again so nothing is cut
                    continue
                break
        self.info_log += log_text(info)
        self.error_log = log_text(error)
        if err:
            hint = f"JIT error log:\n{self.error_log}" if self.error_log.strip() else ""
            if err == drv.CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU:
                hint += (f"\nthe code holds no cubin for this GPU and no PTX it can JIT "
                         f"(code arch {self.object.arch}); compile for this device's arch")
            driver.raise_for(err, f"cuModuleLoadDataEx({self.object.name})", hint.strip())
        return handle

    # --- lookups ----------------------------------------------------------------------
    def get_function(self, name: str) -> Kernel:
        """The kernel `name`: an entry point, a name expression the code was compiled with
        ("axpy<float>"), or the C++ name of a kernel without extern "C" ("saxpy",
        "ns::saxpy", "axpy<float>") when one kernel of the module has it. A name several
        kernels have (overloads, template instantiations) raises KernelNotFoundError listing
        them with the name expressions that pick each."""
        handle, device, ctx = self._handle()
        key = (int(ctx), driver.context_epoch(ctx), name)
        cached = self._kernels.get(key)
        if cached is not None:
            return cached
        with self._lock:
            cached = self._kernels.get(key)
            if cached is None:
                cached = self._kernels[key] = self._new_kernel(handle, device, ctx, name)
        return cached

    def _new_kernel(self, handle: Any, device: int, ctx: Any, name: str) -> Kernel:
        symbol = self.object.lowered_name(name)
        drv = driver.bindings()
        err, func = drv.cuModuleGetFunction(handle, symbol.encode())
        if err == drv.CUresult.CUDA_ERROR_NOT_FOUND:
            # a C++-linkage kernel asked for by its C++ name, as PyCUDA users write it
            symbol = find_kernel(name, self.object.entry_points, self.object.symbols)
            err, func = drv.cuModuleGetFunction(handle, symbol.encode())
        if err:
            driver.raise_for(err, f"cuModuleGetFunction({name})")
        info = _driver_param_info(func)
        slots = resolve_slots(self.object, name, symbol, info, self._ptx_text)
        return Kernel(self, func, name, symbol, slots, device, ctx, driver_layout=info is not None)

    def _ptx_text(self) -> bytes | None:
        if self.object.kind == "ptx":
            return self.object.code
        if self.object.kind == "fatbin":
            from ..formats import fatbin_entries as entries
            for entry in entries(self.object.code, "fatbin"):
                if entry.kind == "ptx" and getattr(entry, "decoded", True):
                    return entry.code
        return None

    def get_global(self, name: str) -> Global:
        handle, _, _ = self._handle()
        drv = driver.bindings()
        symbol = self.object.lowered_name(name)
        err, ptr, size = drv.cuModuleGetGlobal(handle, symbol.encode())
        if err:
            if err == drv.CUresult.CUDA_ERROR_NOT_FOUND:
                raise KernelNotFoundError(name, (), what="global")
            driver.raise_for(err, f"cuModuleGetGlobal({name})")
        return Global(self, name, int(ptr), int(size))

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return self.object.entry_points

    def unload(self) -> None:
        """Unload from every context it was loaded into; its kernels must not be used after."""
        if self._closed:
            return
        check_not_capturing("unloading a module")   # the graph may hold its kernels
        self._closed = True
        drv = driver.bindings()
        for (ctx, epoch), h in self._handles.items():
            if driver.context_epoch(ctx) == epoch:   # its context still exists: unload there
                (err,) = drv.cuCtxPushCurrent(drv.CUcontext(ctx))
                if err:
                    continue
                try:
                    with relaxed_capture():   # a capture running meanwhile goes on
                        drv.cuModuleUnload(h)
                finally:
                    drv.cuCtxPopCurrent()
        self._handles.clear()
        self._kernels.clear()

    def __enter__(self) -> "Module":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unload()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise ArgumentError(
            "a kjit.Module cannot be pickled or copied: it is code loaded into this process's "
            "CUDA contexts. Pickle its code instead, module.object (a kjit.ObjectCode, which "
            "keeps its kernels' parameter types), and kjit.load() it in the other process")

    def __repr__(self) -> str:
        return f"kjit.Module({self.object.name!r}, {self.object.kind}, kernels={list(self.kernel_names)})"


def _driver_param_info(func: Any) -> list[tuple[int, int]] | None:
    """[(offset, size)] per parameter from cuFuncGetParamInfo, or None where the driver lacks it."""
    drv = driver.bindings()
    fn = getattr(drv, "cuFuncGetParamInfo", None)
    if fn is None:
        return None
    out = []
    while True:
        err, offset, size = fn(func, len(out))
        if err:
            if not out and err != drv.CUresult.CUDA_ERROR_INVALID_VALUE:
                return None
            break
        out.append((int(offset), int(size)))
    return out


def load(code: ObjectCode | bytes | str | os.PathLike, *, jit_options: JitOptions | None = None) -> Module:
    """Load compiled or linked code (ObjectCode, LinkResult, a cuda.core ObjectCode, bytes,
    PTX text or a file path).

    Loading happens in the current context when the first kernel or global is asked for.
    """
    obj = _as_object(code)
    if obj.kind in ("hsaco", "hipfb"):   # AMD code: the HIP runtime's twin of this path
        from ..hip.runtime import HipModule
        return HipModule(obj)  # type: ignore[return-value]
    if jit_options is not None and not isinstance(jit_options, JitOptions):
        raise ArgumentError("jit_options must be a kjit.JitOptions")
    mod = Module(obj, jit_options)
    mod._handle()  # load now so that load errors and logs surface here, not at first launch
    return mod
