"""kjit: compile, link, cache, load and launch CUDA and HIP kernels written as source strings.

Importing kjit touches no driver and imports neither numpy nor cuda.bindings: the public
names below are loaded on first use.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (ArgumentError, CompileError, CompileWarning, CudaUnavailableError, DriverError,
                     InvalidOptionError, KernelNotFoundError, KjitError, LinkError)

# public name -> module that defines it
_LAZY = {
    "CompileOptions": "kjit.compiler",
    "ObjectCode": "kjit.objectcode",
    "Arch": "kjit.arch",
    "link": "kjit.linker",
    "LinkOptions": "kjit.linker",
    "LinkResult": "kjit.linker",
    "Module": "kjit.runtime",
    "JitOptions": "kjit.jit_options",
    "Kernel": "kjit.runtime",
    "LaunchConfig": "kjit.runtime",
    "Device": "kjit.runtime",
    "Context": "kjit.runtime",
    "synchronize": "kjit.runtime",
    "Stream": "kjit.runtime",
    "Event": "kjit.runtime",
    "DeviceArray": "kjit.runtime",
    "to_device": "kjit.runtime",
    "empty": "kjit.runtime",
    "zeros": "kjit.runtime",
    "ptr": "kjit.runtime",
    "In": "kjit.runtime",
    "Out": "kjit.runtime",
    "InOut": "kjit.runtime",
    "cdiv": "kjit.runtime",
    "Graph": "kjit.runtime.graph",
    "KernelNode": "kjit.runtime.graph",
    "graph": "kjit.runtime.graph",
    "kernel": "kjit.decorator",
    "compile_many": "kjit.compiler",
    "autotune": "kjit.tune",
    "supported_archs": "kjit.compiler",
}
_SUBMODULES = ("cache",)

__all__ = sorted([*_LAZY, *_SUBMODULES, "compile", "load", "__version__", "ArgumentError", "CompileError",
                  "CompileWarning",
                  "CudaUnavailableError", "DriverError", "InvalidOptionError",
                  "KernelNotFoundError", "KjitError", "LinkError"])


def compile(source: str, *, arch: Any = None, backend: str = "cuda", **kwargs: Any) -> Any:
    """Compile CUDA (NVRTC) or HIP (hiprtc) source to PTX, cubin, LTO-IR or an AMD code object,
    through kjit's cache: a source compiled before (with the same headers, options and
    compiler) comes back from it without compiling.

    Args:
        source: the kernel source.
        arch: "sm_90", "sm_90a", "compute_90" (PTX), "gfx90a" (HIP), a kjit.Arch or an int
            (90). None: the current device, else $KJIT_ARCH, else an InvalidOptionError that
            says how to choose one.
        backend: "cuda" (NVRTC) or "hip" (hiprtc).
        target: "cubin" (the default for CUDA), "ptx", "ltoir"; "hsaco" for HIP.
        options: a kjit.CompileOptions.
        name_expressions: template instantiations to compile, such as ["axpy<float>"];
            ObjectCode.lowered_name gives each one's mangled name.
        name: the source's file name in messages and logs.
        cache: False compiles without reading or writing the cache.

    Returns:
        kjit.ObjectCode, whose cache_hit says where it came from.

    Raises:
        InvalidOptionError: for bad arguments, before anything compiles.
        CompileError: when the compiler rejects the source (with its log and source excerpts).
    """
    device_arch = arch is None and backend == "cuda"
    if device_arch:
        # The current device's arch: cuInit starts first, in the background, so that the
        # compile path's imports overlap it. Asking for the arch then starts the device's
        # context in the background, so the compile and its cache lookup overlap the ~100 ms
        # the driver takes to make it, instead of running before it starts.
        from . import driver
        driver.start_init()
        from .compiler import compile as compile_through_cache
        from .arch import resolve
        arch = resolve(None, "cuda")   # an Arch, taken as resolved below: asked once
    else:
        if backend == "cuda" and _compiles(kwargs):
            # NVRTC's first compile in a process calls cuInit where a CUDA driver is installed
            # (tens of ms, inside nvrtcCompileProgram): started now, in the background, it
            # overlaps the imports and NVRTC's load instead, and NVRTC's own call returns at once
            from . import driver
            driver.start_init(context=False)
        from .compiler import compile as compile_through_cache
    obj = compile_through_cache(source, arch=arch, backend=backend, **kwargs)
    if device_arch and driver.making_context():
        # the load that usually follows needs the runtime: its imports now overlap the
        # context still being made (once it is made, they cost the same now or at the load)
        from .runtime import load  # noqa: F401
    return obj


def _compiles(kwargs: dict) -> bool:
    """Whether this compile certainly runs the compiler: caching is off for it or by
    KJIT_CACHE=0, or there is no cache directory yet (a process's first compile on a new machine or cache). Otherwise a hit
    is possible, and a hit needs no driver."""
    global _cache_seen_for
    if kwargs.get("cache") is False:
        return True
    from .settings import cache_enabled, env_raw
    if not cache_enabled():
        return True
    where = env_raw("KJIT_CACHE_DIR")
    if where == _cache_seen_for:   # a directory once there stays: not looked for on every call
        return False
    from .locations import cache_dirs
    try:
        if not any(d.exists() for d in cache_dirs()):
            return True
    except OSError:   # a name too long for the filesystem: the cache's own check says so
        return True
    _cache_seen_for = where
    return False


_cache_seen_for: object = object()   # the KJIT_CACHE_DIR whose directory was found


def load(code: Any, *, jit_options: Any = None) -> Any:
    """Load compiled or linked code and return a kjit.Module.

    Args:
        code: a kjit.ObjectCode or kjit.LinkResult; a cuda.core ObjectCode (its symbol
            mapping included); the bytes of a cubin, PTX, fatbin or AMD code object; PTX text
            as a str; or the path of such a file (a str with no line break that names a file).
            CUDA source is refused: compile it first, kjit.load(kjit.compile(source)).
        jit_options: kjit.JitOptions for the driver's JIT (PTX) and loader.

    The code is loaded now, in the current context, so that load errors and the JIT's logs
    come here rather than at the first launch. The Module belongs to this process: to move
    code to another, pickle the ObjectCode and load it there.
    """
    from .runtime import load as load_module
    return load_module(code, jit_options=jit_options)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"kjit.{name}")
    else:
        raise AttributeError(f"module 'kjit' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # static checkers see the real names
    from . import cache
    from .arch import Arch
    from .compiler import CompileOptions, compile_many
    from .decorator import kernel
    from .tune import autotune
    from .linker import LinkOptions, LinkResult, link
    from .objectcode import ObjectCode
    from .runtime import (Context, Device, DeviceArray, Event, In, InOut, Kernel, LaunchConfig,
                          Module, Out, Stream, cdiv, empty, ptr, synchronize, to_device, zeros)
    from .jit_options import JitOptions
