"""kjit: compile, link, cache, load and launch CUDA and HIP kernels written as source strings.

Importing kjit touches no driver and imports neither numpy nor cuda.bindings: the public
names below are loaded on first use.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (ArgumentError, CompileError, CudaUnavailableError, DriverError,
                     InvalidOptionError, KernelNotFoundError, KjitError, LinkError)

# public name -> module that defines it
_LAZY = {
    "compile": "kjit.compiler.api",
    "CompileOptions": "kjit.compiler.options",
    "ObjectCode": "kjit.objectcode",
    "Arch": "kjit.arch",
    "link": "kjit.linker",
    "LinkOptions": "kjit.linker",
    "LinkResult": "kjit.linker",
    "load": "kjit.runtime.module",
    "Module": "kjit.runtime.module",
    "JitOptions": "kjit.jit_options",
    "Kernel": "kjit.runtime.kernel",
    "LaunchConfig": "kjit.runtime.kernel",
    "Device": "kjit.runtime.context",
    "Context": "kjit.runtime.context",
    "synchronize": "kjit.runtime.context",
    "Stream": "kjit.runtime.stream",
    "Event": "kjit.runtime.stream",
    "DeviceArray": "kjit.runtime.memory",
    "to_device": "kjit.runtime.memory",
    "empty": "kjit.runtime.memory",
    "zeros": "kjit.runtime.memory",
    "ptr": "kjit.runtime.params",
    "In": "kjit.runtime.memory",
    "Out": "kjit.runtime.memory",
    "InOut": "kjit.runtime.memory",
    "cdiv": "kjit.runtime.kernel",
    "kernel": "kjit.decorator",
}
_SUBMODULES = ("cache",)

__all__ = sorted([*_LAZY, *_SUBMODULES, "__version__", "ArgumentError", "CompileError",
                  "CudaUnavailableError", "DriverError", "InvalidOptionError",
                  "KernelNotFoundError", "KjitError", "LinkError"])


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
    from .compiler.api import compile
    from .compiler.options import CompileOptions
    from .decorator import kernel
    from .linker import LinkOptions, LinkResult, link
    from .objectcode import ObjectCode
    from .runtime.context import Context, Device, synchronize
    from .jit_options import JitOptions
    from .runtime.kernel import Kernel, LaunchConfig, cdiv
    from .runtime.memory import DeviceArray, In, InOut, Out, empty, to_device, zeros
    from .runtime.module import Module, load
    from .runtime.params import ptr
    from .runtime.stream import Event, Stream
