"""kjit.compile: validate everything, then compile through the cache with the chosen backend."""
from __future__ import annotations

from typing import Iterable, NamedTuple

from .. import arch as arch_mod
from ..cache.compiled import compile_through_cache
from ..errors import InvalidOptionError
from ..objectcode import ObjectCode
from . import declarations
from .options import TARGETS, CompileOptions

BACKENDS = ("cuda", "hip")


class CompileRequest(NamedTuple):
    """Everything that determines a compile's output, validated and normalised."""

    source: str
    arch: str
    target: str
    backend: str
    options: CompileOptions
    name_expressions: tuple[str, ...] = ()
    name: str = "kernel.cu"

    def compiler_version(self) -> str:
        if self.backend == "hip":
            from . import hiprtc
            return "hiprtc " + hiprtc.version_string()
        from . import nvrtc
        return "nvrtc " + ".".join(map(str, nvrtc.version()))


def make_request(source: str, *, arch=None, target: str | None = None,
                 options: CompileOptions | None = None, name_expressions: Iterable[str] = (),
                 backend: str = "cuda", name: str | None = None) -> CompileRequest:
    """Validate and normalise compile arguments; raise InvalidOptionError before any compile."""
    if isinstance(source, bytes):
        source = source.decode()
    if not isinstance(source, str):
        raise InvalidOptionError(f"source must be a string of CUDA/HIP C++, got {type(source).__name__}")
    if backend not in BACKENDS:
        raise InvalidOptionError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    if options is None:
        options = CompileOptions()
    elif not isinstance(options, CompileOptions):
        raise InvalidOptionError("options must be a kjit.CompileOptions")
    if isinstance(name_expressions, str):
        raise InvalidOptionError("name_expressions must be a list of strings, not one string")
    exprs = tuple(name_expressions)
    for e in exprs:
        if not isinstance(e, str) or not e.strip():
            raise InvalidOptionError(f"name expression {e!r} must be a non-empty string")
    if backend == "hip":
        target = "hsaco" if target in (None, "cubin", "hsaco") else target
        if target != "hsaco":
            raise InvalidOptionError(f"target={target!r}: the HIP backend produces 'hsaco' code objects")
        from .hiprtc import check_options
        check_options(options)
        resolved = arch_mod.resolve(arch, "hip")
        arch_mod.check_supported(resolved)
    else:
        target = target or "cubin"
        if target not in TARGETS:
            raise InvalidOptionError(f"target={target!r} is not one of {', '.join(TARGETS)}")
        resolved = arch_mod.resolve(arch, "cuda")
        if resolved.virtual and target == "cubin":
            raise InvalidOptionError(
                f"target 'cubin' needs a real architecture (sm_{resolved.number}{resolved.suffix}), "
                f"not the virtual {resolved.name}")
        arch_mod.check_supported(resolved)
    return CompileRequest(source, resolved.name, target, backend, options, exprs,
                          name or ("kernel.hip" if backend == "hip" else "kernel.cu"))


def compile_uncached(req: CompileRequest) -> ObjectCode:
    """Run the compiler for a validated request."""
    if req.backend == "hip":
        from . import hiprtc as backend
    else:
        from . import nvrtc as backend  # type: ignore[no-redef]
    code, log, symbols, ms = backend.compile_source(
        req.source, name=req.name, arch=req.arch, target=req.target, options=req.options,
        name_expressions=req.name_expressions)
    return ObjectCode(code, kind=req.target, arch=req.arch, log=log, symbols=symbols,
                      name=req.name, metadata={
                          "compiler": req.compiler_version(), "compile_ms": round(ms, 3),
                          "options": req.options.describe(), "backend": req.backend,
                          "name_expressions": list(req.name_expressions),
                          "declarations": declarations.extract(req.source)})


def compile(source: str, *, arch=None, target: str | None = None,
            options: CompileOptions | None = None, name_expressions: Iterable[str] = (),
            backend: str = "cuda", name: str | None = None, cache: bool = True) -> ObjectCode:
    """Compile CUDA (NVRTC) or HIP (hiprtc) source to PTX, cubin, LTO-IR or an AMD code object.

    arch: "sm_90", "compute_90", "gfx90a"...; None means the current device, else $KJIT_ARCH.
    target: "cubin" (default for CUDA), "ptx", "ltoir"; "hsaco" for HIP.
    Raises InvalidOptionError for bad arguments and CompileError (with log and source
    excerpts) when the compiler rejects the source.
    """
    return compile_through_cache(source, arch=arch, target=target, options=options,
                                 name_expressions=name_expressions, backend=backend, name=name,
                                 cache=cache)
