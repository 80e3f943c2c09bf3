"""The nvJitLink backend (cuda.bindings.nvjitlink): needs no GPU, takes LTO-IR.

Ships with NVRTC, so it accepts whatever PTX NVRTC emits, also when the driver is older.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..errors import LinkError
from . import diagnostics

if TYPE_CHECKING:
    from .inputs import LinkInput
    from .options import LinkOptions


@dataclass(frozen=True)
class Linked:
    """What a linker produced: the cubin and both logs."""

    code: bytes
    info_log: str
    error_log: str
    wall_time_ms: float


def _nvjitlink():
    from ..families import load_family_library
    load_family_library("nvjitlink")
    try:
        from cuda.bindings import nvjitlink
        nvjitlink.version()  # loads libnvJitLink
    except Exception as exc:
        from ..families import family_install_hint
        raise LinkError(f"nvJitLink is not installed: {family_install_hint()} "
                        f"[{type(exc).__name__}: {str(exc).strip()}]", backend="nvjitlink") from None
    return nvjitlink


def version() -> tuple[int, int]:
    """nvJitLink's (major, minor)."""
    return tuple(int(v) for v in _nvjitlink().version())  # type: ignore[return-value]


def available() -> bool:
    try:
        version()
        return True
    except LinkError:
        return False


def flags(arch: str, options: "LinkOptions", lto: bool) -> list[str]:
    """The nvJitLink command line; the one place LinkOptions become nvJitLink flags."""
    out = [f"-arch={arch}"]
    if lto:
        out.append("-lto")
    if options.max_registers is not None:
        out.append(f"-maxrregcount={options.max_registers}")
    if options.optimization_level is not None:
        level = options.optimization_level
        out.append(f"-Xptxas=-O{min(level, 3)}")
        if lto and level == 0:
            out.append("-O0")  # nvJitLink's own (LTO) level takes only 0 and 3
    if options.debug:
        out.append("-g")
    if options.line_info:
        out.append("-lineinfo")
    if options.verbose:
        out.append("-verbose")
    if options.fast_math:
        out += ["-ftz=1", "-prec-div=0", "-prec-sqrt=0", "-fma=1"]
    out += list(options.extra)
    return out


def _log(nj, handle: int, which: str) -> str:
    size = getattr(nj, f"get_{which}_log_size")(handle)
    if not size:
        return ""
    buf = bytearray(size)  # nvJitLink tells the size: nothing is ever cut
    getattr(nj, f"get_{which}_log")(handle, buf)
    return bytes(buf).rstrip(b"\0").decode("utf-8", "replace")


def _input_type(nj, kind: str):
    T = nj.InputType
    return {"ptx": T.PTX, "cubin": T.CUBIN, "object": T.CUBIN, "fatbin": T.FATBIN,
            "ltoir": T.LTOIR, "library": T.LIBRARY, "hostobject": T.OBJECT}[kind]


def link(inputs: Sequence["LinkInput"], *, arch: str, options: "LinkOptions", lto: bool,
         libraries: Sequence[Path] = ()) -> Linked:
    """Link with nvJitLink for `arch` (sm_XY); LinkError carries both logs and the culprit."""
    nj = _nvjitlink()
    names = [i.name for i in inputs] + [str(p) for p in libraries]
    opts = flags(arch, options, lto)
    t0 = time.perf_counter()
    try:
        handle = nj.create(len(opts), opts)
    except nj.nvJitLinkError as exc:
        raise LinkError(f"nvJitLink rejected the link options {' '.join(opts)}: {exc}",
                        backend="nvjitlink", inputs=names) from None
    current: str | None = None
    try:
        try:
            for item in inputs:
                current = item.name
                kind = _input_type(nj, item.kind)
                if item.path is not None:
                    nj.add_file(handle, kind, str(item.path))
                else:
                    nj.add_data(handle, kind, item.code, len(item.code), item.name)
            for lib in libraries:
                current = str(lib)
                nj.add_file(handle, nj.InputType.LIBRARY, str(lib))
            current = None
            nj.complete(handle)
        except nj.nvJitLinkError as exc:
            error_log, info_log = _log(nj, handle, "error"), _log(nj, handle, "info")
            stage = f"adding {current}" if current else "linking"
            raise diagnostics.link_error(
                f"nvJitLink failed {stage}: {exc}", error_log=error_log, info_log=info_log,
                backend="nvjitlink", inputs=inputs, libraries=[str(p) for p in libraries],
                input_name=current, arch=arch) from None
        size = nj.get_linked_cubin_size(handle)
        cubin = bytearray(size)
        nj.get_linked_cubin(handle, cubin)
        info_log, error_log = _log(nj, handle, "info"), _log(nj, handle, "error")
    finally:
        nj.destroy(handle)
    return Linked(bytes(cubin), info_log, error_log, (time.perf_counter() - t0) * 1e3)
