"""CUDA C++ to PTX, cubin or LTO-IR through NVRTC (cuda.bindings.nvrtc); no GPU needed."""
from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, Sequence

from ..errors import KjitError
from . import sigkeep
from .diagnostics import compile_error
from .include_path import SearchPath
from .keys import observe
from .options import CompileOptions, nvrtc_flags



@functools.lru_cache(maxsize=None)
def version() -> tuple[int, int]:
    from . import facts
    major, minor = facts.nvrtc()["version"]
    return int(major), int(minor)


def _check(err, what: str) -> None:
    from cuda.bindings import nvrtc
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise KjitError(f"{what} failed: {text.decode() if isinstance(text, bytes) else text}")


def _read(prog, size_fn, get_fn, what: str) -> bytes:
    err, size = size_fn(prog)
    _check(err, what)
    # A fresh mutable buffer: the bindings write into what they are given, and the common
    # `b" " * size` idiom hands them CPython's shared one-byte b" " when size is 1 (an empty
    # log), corrupting every b" " in the process.
    buf = bytearray(size)
    (err,) = get_fn(prog, buf)
    _check(err, what)
    return bytes(buf)


def _warn_if_no_kernel(source: str, code: bytes, target: str, name: str) -> None:
    from .hints import uninstantiated_templates
    text = uninstantiated_templates(source, (), False)   # the source first: no binary read
    if not text or target == "ltoir":   # LTO-IR: kernels are named at link time
        return
    if target == "ptx":
        has = b".entry" in code
    else:
        from ..formats import ElfFile
        has = bool(ElfFile(code).cuda_kernels())
    if not has:
        import warnings
        from ..errors import CompileWarning
        warnings.warn(f"{name}: {text}", CompileWarning, stacklevel=2)


def _precompiled(text: str, name: str, flags: Any, headers: dict, anchored: tuple, shown: Any) -> Any:
    """A precompiled header's attempt (pch.attempt: a Use or None) around one compile; a
    source that includes nothing (or keeps its sources) has none and loads no PCH code. A
    fork waits for the compile either way (forkgate.py)."""
    if shown is None and "include" in text:
        from . import pch
        return pch.attempt(text, name, flags, headers, anchored)
    from .forkgate import compiling
    return _none_within(compiling())


@contextlib.contextmanager
def _none_within(ctx: Any) -> Any:
    with ctx:
        yield None


def compile_source(source: str, *, name: str, arch: str, target: str, options: CompileOptions,
                   name_expressions: Sequence[str] = (), search: Any = None,
                   sources_dir: str | None = None) -> tuple[bytes, str, dict[str, str], float]:
    """Compile with NVRTC. Returns (code, log, lowered names, milliseconds). `search`: the
    compile's SearchPath (compiler/include_path.py): its in-memory headers and toolkit directories.
    `sources_dir`: where the source and its in-memory headers are kept, for the line
    table to name (compiler/kept.py).
    A fork waits for it, program made to program destroyed (forkgate.py)."""
    from .forkgate import compiling
    with compiling():
        from .facts import loaded_nvrtc
        nvrtc = loaded_nvrtc()

        path = search if search is not None else SearchPath(options.headers, (), ())
        # the toolkit's directories go last, after the user's -I flags and any in `extra`
        flags = nvrtc_flags(options, arch, target) + [f"-I{d}" for d in path.automatic_dirs]
        headers, text, shown = path.headers, source, None
        if sources_dir is not None:
            from .kept import program
            text, headers, shown = program(source, name, headers, sources_dir)
        t0 = time.perf_counter()
        # -I flags in `extra` given relative follow the working directory: not anchors
        anchored = path.dirs if not path.relative else tuple(options.include_dirs) + path.automatic_dirs

        # A precompiled header (pch.py) serves the compile where one pays; NVRTC refusing it
        # (counted) means one more compile without it, whose observation alone keys the result.
        # (none for kept sources: each source's prologue would start with its own #line)
        with _precompiled(text, name, flags, headers, anchored, shown) as use:
            while True:
                mark = observe.mark()
                err, prog = nvrtc.nvrtcCreateProgram(
                    text.encode(), name.encode(), len(headers),
                    [h.encode() for h in headers.values()], [k.encode() for k in headers])
                _check(err, "nvrtcCreateProgram")
                try:
                    for expr in name_expressions:
                        (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
                        _check(err, f"nvrtcAddNameExpression({expr!r})")
                    all_flags = [f.encode() for f in (use.flags if use else []) + flags]  # PCH's first
                    # what it reads keys the cache (keys/observe.py)
                    # NVRTC 12's first compile re-installs SIGINT with SA_RESTART (sigkeep.py)
                    with observe.recording("cuda", name, ignore=use.ignore if use else (), anchored=anchored), \
                            sigkeep.kept(version()[0] < 13):
                        (result,) = nvrtc.nvrtcCompileProgram(prog, len(all_flags), all_flags)
                    log = _read(prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog, "log")
                except BaseException:
                    nvrtc.nvrtcDestroyProgram(prog)
                    raise
                log_text = log.rstrip(b"\0").decode("utf-8", "replace")
                if shown:
                    from .kept import unkept_log
                    log_text = unkept_log(log_text, shown)
                kept = use.finish(log_text, prog) if use is not None else log_text
                if kept is not None:
                    log_text = kept
                    break
                nvrtc.nvrtcDestroyProgram(prog)
                observe.forget_since(mark)
                use = use.again()   # a PCH built again (its heap grown), else none
        try:
            if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                _, text = nvrtc.nvrtcGetErrorString(result)
                message = f"NVRTC could not compile {name} for {arch} ({text.decode()})"
                from .hints import explain, host_toolkit_header, is_error_directive
                # a header's own #error, or a host API: the hint says why, not versions
                if path.automatic_dirs and not (is_error_directive(log_text)
                                                or host_toolkit_header(log_text)):
                    from .toolkit_headers import failure_note
                    note = failure_note(log_text, ".".join(map(str, version())))
                    message += f"\n{note}" if note else ""
                hint = explain(log_text, options.std_headers)
                message += f"\n{hint}" if hint else ""
                raise compile_error(
                    message,
                    log=log_text, options=flags, source=source, name=name, compiler="NVRTC")
            getters = {
                "ptx": (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX),
                "cubin": (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN),
                "ltoir": (nvrtc.nvrtcGetLTOIRSize, nvrtc.nvrtcGetLTOIR),
            }[target]
            code = _read(prog, *getters, target)
            if target == "ptx":
                code = code.rstrip(b"\0")
            if not name_expressions and "template" in source:
                _warn_if_no_kernel(source, code, target, name)
            symbols = {}
            for expr in name_expressions:
                err, lowered = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
                _check(err, f"nvrtcGetLoweredName({expr!r})")
                symbols[expr] = lowered.decode()
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
        return code, log_text, symbols, (time.perf_counter() - t0) * 1e3
