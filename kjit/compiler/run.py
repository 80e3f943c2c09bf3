"""Run the chosen compiler for a validated request and wrap its output as an ObjectCode."""
from __future__ import annotations

from ..objectcode import ObjectCode
from . import declarations, search
from .request import CompileRequest


def compiler_version(backend: str) -> str:
    if backend == "hip":
        from . import hiprtc
        return "hiprtc " + hiprtc.version_string()
    from . import nvrtc
    return "nvrtc " + ".".join(map(str, nvrtc.version()))


def compile_uncached(req: CompileRequest) -> ObjectCode:
    """Run the compiler for a validated request, searching includes where search.py says."""
    path = search.for_options(req.options, req.backend)
    extra: dict = {}
    if req.backend == "hip":
        from . import hiprtc
        code, log, symbols, ms = hiprtc.compile_source(
            req.source, name=req.name, arch=req.arch, target=req.target, options=req.options,
            name_expressions=req.name_expressions, headers=path.headers)
    else:
        from . import nvrtc
        code, log, symbols, ms = nvrtc.compile_source(
            req.source, name=req.name, arch=req.arch, target=req.target, options=req.options,
            name_expressions=req.name_expressions, search=path)
        from .pch import note  # how a precompiled header served this compile, if one did
        used = note()
        extra = {"pch": used} if used else {}
    return ObjectCode(code, kind=req.target, arch=req.arch, log=log, symbols=symbols,
                      name=req.name, metadata={
                          "compiler": compiler_version(req.backend), "compile_ms": round(ms, 3),
                          "options": req.options.describe(), "backend": req.backend,
                          "name_expressions": list(req.name_expressions),
                          "declarations": declarations.extract(req.source), **extra})
