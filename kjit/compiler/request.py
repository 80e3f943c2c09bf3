"""A compile request: every argument of kjit.compile validated and normalised, before any work."""
# (no `from __future__ import annotations`: NamedTuples would then compile each field's
# annotation text, and a fresh process's first compile() costs ~1.5 ms of a ~20 ms disk hit)

from typing import Iterable, NamedTuple

from .. import arch as arch_mod
from ..errors import InvalidOptionError
from .options import TARGETS, CompileOptions
from .targets import check_supported

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
    # where its sources are kept for debuggers (compiler/kept.py): set when line or debug
    # information puts their paths into the binary; part of the key, as those paths are
    sources_dir: "str | None" = None


def make_request(source: str, *, arch=None, target: str | None = None,
                 options: CompileOptions | None = None, name_expressions: Iterable[str] = (),
                 backend: str = "cuda", name: str | None = None) -> CompileRequest:
    """Validate and normalise compile arguments; raise InvalidOptionError before any compile.
    An Arch (kjit.compile resolves the device's once) is taken as resolved."""
    from . import source_text
    if isinstance(source, bytes):
        source = source_text.decode(source, name or "source")
    if not isinstance(source, str):
        raise InvalidOptionError(f"source must be a string of CUDA/HIP C++, got {type(source).__name__}")
    source_text.check(source, name or "source")
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
        check_supported(resolved)
    else:
        target = target or "cubin"
        if target not in TARGETS:
            raise InvalidOptionError(f"target={target!r} is not one of {', '.join(TARGETS)}")
        resolved = arch_mod.resolve(arch, "cuda")
        if resolved.virtual and target == "cubin":
            raise InvalidOptionError(
                f"target 'cubin' needs a real architecture (sm_{resolved.number}{resolved.suffix}), "
                f"not the virtual {resolved.name}")
        check_supported(resolved)
    name = name or ("kernel.hip" if backend == "hip" else "kernel.cu")
    kept = None
    if options.line_info or options.debug or options.extra:   # a plain compile loads nothing more
        from .kept import sources_dir
        kept = sources_dir(source, name, backend, options)
    return CompileRequest(source, resolved.name, target, backend, options, exprs, name, kept)
