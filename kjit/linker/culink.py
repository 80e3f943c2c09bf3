"""The "driver" backend, the driver's own linker: cuLinkCreate / cuLinkAddData / cuLinkAddFile /
cuLinkComplete / cuLinkDestroy.

Needs a GPU (a current context). The JIT option arrays and the log bytearrays they point
into are kept alive until cuLinkDestroy, the cubin (owned by the link state) is copied out
before it, and a log that filled its buffer is never returned cut: the link is run again
with bigger buffers.
"""
from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..errors import DriverError, LinkError
from ..jit_options import log_full, log_text
from . import diagnostics
from .nvjitlink import Linked

if TYPE_CHECKING:
    from .inputs import LinkInput
    from .options import LinkOptions

MAX_LOG_BYTES = 1 << 28


class PtxTooNewForDriver(LinkError):
    """The driver rejected PTX with CUDA_ERROR_UNSUPPORTED_PTX_VERSION (auto mode retries
    with nvJitLink)."""


def _input_type(drv, kind: str):
    T = drv.CUjitInputType
    return {"ptx": T.CU_JIT_INPUT_PTX, "cubin": T.CU_JIT_INPUT_CUBIN,
            "object": T.CU_JIT_INPUT_CUBIN, "fatbin": T.CU_JIT_INPUT_FATBINARY,
            "hostobject": T.CU_JIT_INPUT_OBJECT, "library": T.CU_JIT_INPUT_LIBRARY}[kind]


def version() -> int:
    """cuDriverGetVersion (13000 for CUDA 13.0)."""
    from ..driver import driver_version
    return driver_version()


def link(inputs: Sequence["LinkInput"], *, arch: str | None, options: "LinkOptions",
         libraries: Sequence[Path] = ()) -> Linked:
    """Link on the driver for `arch` (None: the current context's device)."""
    for item in inputs:
        if item.kind == "ltoir":
            raise LinkError("the driver linker cannot link LTO-IR; use nvJitLink",
                            input_name=item.name, backend="driver")
    log_bytes = options.log_bytes
    while True:
        linked, error, cut = _attempt(inputs, arch, options.replace(log_bytes=log_bytes), libraries)
        if not cut or log_bytes >= MAX_LOG_BYTES:
            if error is not None:
                raise error
            assert linked is not None
            return linked
        log_bytes = min(log_bytes * 4, MAX_LOG_BYTES)


def _attempt(inputs, arch, options, libraries):
    """One cuLink run: (Linked or None, LinkError or None, whether a log filled its buffer)."""
    from ..driver import bindings, call, ensure_context
    drv = bindings()
    ensure_context()
    info = bytearray(options.log_bytes)
    err = bytearray(options.log_bytes)
    keys, values = options.jit_options(arch).driver_options(info, err)
    t0 = time.perf_counter()
    try:
        state = call(drv.cuLinkCreate, len(keys), keys, values)
    except DriverError as exc:
        raise LinkError(f"cuLinkCreate refused the link options {options.describe()}: {exc}",
                        backend="driver", inputs=[i.name for i in inputs]) from None
    current: str | None = None
    linked = error = None
    try:
        for item in inputs:
            current = item.name
            kind = _input_type(drv, item.kind)
            if item.path is not None:
                call(drv.cuLinkAddFile, state, kind, str(item.path).encode(), 0, [], [])
            else:
                data = item.code
                if item.kind == "ptx" and not data.endswith(b"\0"):
                    data += b"\0"  # the driver reads PTX as a C string
                call(drv.cuLinkAddData, state, kind, data, len(data), item.name.encode(), 0, [], [])
        for lib in libraries:
            current = str(lib)
            call(drv.cuLinkAddFile, state, drv.CUjitInputType.CU_JIT_INPUT_LIBRARY,
                 str(lib).encode(), 0, [], [])
        current = None
        cubin_ptr, size = call(drv.cuLinkComplete, state)
        # The image belongs to the link state: copy it before cuLinkDestroy frees it.
        code = ctypes.string_at(int(cubin_ptr), int(size))
        linked = Linked(code, log_text(info), log_text(err), (time.perf_counter() - t0) * 1e3)
    except DriverError as exc:
        cls = PtxTooNewForDriver if exc.cuda_name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" else LinkError
        stage = f"adding {current}" if current else "linking"
        built = diagnostics.link_error(
            f"the driver linker failed {stage}: {exc.cuda_name}"
            + (f": {exc.description}" if exc.description else ""),
            error_log=log_text(err), info_log=log_text(info), backend="driver", inputs=inputs,
            libraries=[str(p) for p in libraries], input_name=current, arch=arch)
        error = cls(built.message, error_log=built.error_log, info_log=built.info_log,
                    input_name=built.input_name, backend="driver", symbol=built.symbol,
                    inputs=built.inputs)
    finally:
        call(drv.cuLinkDestroy, state)
    # The driver wrote into these until cuLinkDestroy; only now may they go.
    cut = log_full(info) or log_full(err)
    del keys, values, info, err
    return linked, error, cut
