"""HIP C++ to AMD GPU code objects through hiprtc (ctypes); no GPU needed.

hiprtc ships inside libamdhip64 up to ROCm 5.x and as libhiprtc from ROCm 6; the library
is found by trying those names. Debian 12's ROCm 5.2.3 (`libamdhip64-5`,
`libhiprtc-builtins5`) accepts one `--offload-arch` per compile and has no hiprtcLink*.

hiprtc 5.2 aborts the whole process (heap corruption) when asked for a target its
compiler does not know, e.g. gfx942 or `gfx1030:xnack+`. So every target is checked first
against the code-object manager (comgr) that hiprtc compiles through.
"""
from __future__ import annotations

import ctypes
import functools
import re
import time
from typing import Mapping, Sequence

from ..errors import InvalidOptionError, KjitError
from .diagnostics import compile_error
from .. import hip as hip_libs   # its face: the library loader and comgr, read at each call
from .keys import observe
from .options import HIP_STDS, CompileOptions

HIPRTC_SUCCESS = 0
HIPRTC_ERROR_COMPILATION = 6

# NVRTC spellings users carry over in `extra`, and the clang flag that means the same.
_NVRTC_ONLY_FLAGS = {
    "--use_fast_math": "CompileOptions(fast_math=True) (clang: -ffast-math)",
    "-use_fast_math": "CompileOptions(fast_math=True) (clang: -ffast-math)",
    "--maxrregcount": "__launch_bounds__ on the kernel (AMD GPUs have no register cap flag)",
    "-maxrregcount": "__launch_bounds__ on the kernel (AMD GPUs have no register cap flag)",
    "--device-debug": "CompileOptions(debug=True) (clang: -g -O0)",
    "-G": "CompileOptions(debug=True) (clang: -g -O0)",
    "--generate-line-info": "CompileOptions(line_info=True) (clang: -gline-tables-only)",
    "-lineinfo": "CompileOptions(line_info=True) (clang: -gline-tables-only)",
    "--gpu-architecture": "the arch argument",
}


class HiprtcUnavailableError(KjitError):
    """No hiprtc library could be loaded; HIP compiles need one (no AMD GPU needed)."""


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The loaded hiprtc library (libhiprtc or libamdhip64), with its signatures declared."""
    lib = hip_libs.load_hip_library(hip_libs.HIPRTC_NAMES, "hiprtcCreateProgram")
    if lib is None:
        raise HiprtcUnavailableError(
            f"no hiprtc library found (tried {', '.join(hip_libs.HIPRTC_NAMES)}): the HIP backend "
            f"needs it to compile (an AMD GPU is not needed); install it: {hip_libs.HIP_INSTALL_HINT}")
    p, c_int, c_size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "hiprtcVersion": (c_int, [ctypes.POINTER(c_int), ctypes.POINTER(c_int)]),
        "hiprtcGetErrorString": (ctypes.c_char_p, [c_int]),
        "hiprtcCreateProgram": (c_int, [ctypes.POINTER(p), ctypes.c_char_p, ctypes.c_char_p,
                                        c_int, ctypes.POINTER(ctypes.c_char_p),
                                        ctypes.POINTER(ctypes.c_char_p)]),
        "hiprtcDestroyProgram": (c_int, [ctypes.POINTER(p)]),
        "hiprtcAddNameExpression": (c_int, [p, ctypes.c_char_p]),
        "hiprtcCompileProgram": (c_int, [p, c_int, ctypes.POINTER(ctypes.c_char_p)]),
        "hiprtcGetProgramLogSize": (c_int, [p, ctypes.POINTER(c_size)]),
        "hiprtcGetProgramLog": (c_int, [p, ctypes.c_char_p]),
        "hiprtcGetCodeSize": (c_int, [p, ctypes.POINTER(c_size)]),
        "hiprtcGetCode": (c_int, [p, ctypes.c_char_p]),
        "hiprtcGetLoweredName": (c_int, [p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]),
    }
    for fname, (restype, argtypes) in sigs.items():
        fn = getattr(lib, fname)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def available() -> bool:
    """True if a hiprtc library can be loaded. Never raises."""
    try:
        library()
        return True
    except KjitError:
        return False


def _error_string(code: int) -> str:
    text = library().hiprtcGetErrorString(code)
    return text.decode() if text else f"hiprtc error {code}"


def _check(code: int, what: str) -> None:
    if code != HIPRTC_SUCCESS:
        raise KjitError(f"{what} failed: {_error_string(code)}")


# --- versions ------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _hip_version_number() -> int | None:
    """HIP_VERSION of the installed runtime (50221153 for 5.2.21153); no GPU needed."""
    lib = library()
    if not hasattr(lib, "hipRuntimeGetVersion"):  # ROCm 6: hiprtc is its own library
        lib = hip_libs.load_hip_library(hip_libs.HIP_RUNTIME_NAMES, "hipRuntimeGetVersion")
    if lib is None:
        return None
    value = ctypes.c_int()
    if lib.hipRuntimeGetVersion(ctypes.byref(value)) != 0 or value.value <= 0:
        return None
    return value.value


@functools.lru_cache(maxsize=None)
def version() -> tuple[int, int]:
    """(major, minor) of the HIP release hiprtc belongs to, e.g. (5, 2).

    hiprtcVersion() itself answers a fixed (9, 0) in ROCm 5.x, which tells nothing
    apart, so the HIP runtime's version is used where the library has it.
    """
    number = _hip_version_number()
    if number is not None:
        return number // 10_000_000, (number // 100_000) % 100
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(library().hiprtcVersion(ctypes.byref(major), ctypes.byref(minor)), "hiprtcVersion")
    return major.value, minor.value


@functools.lru_cache(maxsize=None)
def version_string() -> str:
    """Everything that identifies the compiler, for cache keys: 'hip 5.2.21153, comgr 2.4'."""
    number = _hip_version_number()
    hip = (f"{number // 10_000_000}.{(number // 100_000) % 100}.{number % 100_000}"
           if number is not None else ".".join(map(str, version())))
    cg = hip_libs.comgr_version()
    return f"hip {hip}" + (f", comgr {cg[0]}.{cg[1]}" if cg else "")


# --- targets -------------------------------------------------------------------------
def supported_archs() -> tuple[str, ...]:
    """The gfx processors the installed hiprtc can compile for (from comgr); () if unknown."""
    return hip_libs.comgr_isa_names()


@functools.lru_cache(maxsize=None)
def check_arch(arch: str) -> None:
    """Raise InvalidOptionError unless hiprtc can compile for `arch` (gfx90a, gfx90a:xnack-).

    Must run before any compile: hiprtc 5.2 crashes the process on an unknown target.
    """
    processor, *features = arch.split(":")
    names = [f[:-1] for f in features]
    if len(set(names)) != len(names):
        raise InvalidOptionError(f"arch {arch!r} names a target feature twice")
    if hip_libs.comgr_is_valid_target(arch) is not False:
        return  # valid, or no comgr to ask (then hiprtc itself has to judge)
    known = supported_archs()
    if processor in known:
        raise InvalidOptionError(
            f"arch {arch!r}: {processor} does not support the feature(s) "
            f"{':'.join(features)} (xnack applies to gfx8/gfx9/gfx101x, sramecc to "
            "gfx906/gfx908/gfx90a/gfx94x); drop them or use the plain processor name")
    raise InvalidOptionError(
        f"arch {arch!r} is not a target the installed hiprtc (HIP {'.'.join(map(str, version()))})"
        f" can compile for; it supports: {', '.join(known)}. Newer GPUs (gfx94x, gfx11xx, "
        "gfx12xx) need a newer ROCm")


# --- options -------------------------------------------------------------------------
def check_options(options: CompileOptions) -> None:
    """Raise InvalidOptionError for options that have no meaning for hiprtc, before compiling."""
    if options.std is not None and options.std not in HIP_STDS:
        raise InvalidOptionError(
            f"std={options.std!r}: HIP's headers need C++11 or later; use one of "
            f"{', '.join(HIP_STDS)}")
    if options.max_registers is not None:
        raise InvalidOptionError(
            "max_registers has no HIP equivalent: clang has no per-compile register cap for "
            "AMD GPUs. Bound registers per kernel with __launch_bounds__(threads) or "
            "__attribute__((amdgpu_num_vgpr(N)))")
    if options.relocatable:
        raise InvalidOptionError(
            "relocatable=True: kjit cannot link HIP device code (hiprtc 5.x has no "
            "hiprtcLink*), so relocatable output could never be loaded; compile the whole "
            "program in one source (use headers= / include_dirs= to share code)")
    for flag in options.extra:
        key = flag.split("=", 1)[0]
        if key in _NVRTC_ONLY_FLAGS:
            raise InvalidOptionError(
                f"extra flag {flag!r} is an NVRTC flag that hiprtc rejects; for HIP use "
                f"{_NVRTC_ONLY_FLAGS[key]}")


def hiprtc_flags(options: CompileOptions, arch: str) -> list[str]:
    """The hiprtc (clang) command line for these options; the one place they become flags."""
    check_options(options)
    flags = [f"--offload-arch={arch}"]
    if options.std:
        flags.append(f"-std={options.std}")
    for name, value in options.defines:
        flags.append(f"-D{name}" if value is None else f"-D{name}={value}")
    flags += [f"-I{d}" for d in options.include_dirs]
    if options.fast_math:
        flags.append("-ffast-math")
    if options.line_info:
        flags.append("-gline-tables-only")
    if options.debug:
        flags += ["-g", "-O0"]
    flags += list(options.extra)
    return flags


# --- compile -------------------------------------------------------------------------
# comgr compiles a copy of the source in a temporary directory: "/tmp/comgr-1a2b3c/input/
# CompileSource" is the program, "/tmp/comgr-1a2b3c/include/h.h" an in-memory header.
# hiprtc appends `extern "C" constexpr auto __hiprtc_<i> = <expr>;` (i from 1) for each
# name expression, below the user's last line.
_TMP_SOURCE_RE = re.compile(r"(?:/[^\s:]*)?/comgr-[^/\s]+/input/CompileSource:(\d+):")
_TMP_INCLUDE_RE = re.compile(r"(?:/[^\s:]*)?/comgr-[^/\s]+/include/")
_NAME_EXPR_RE = re.compile(r"__hiprtc_(\d+)\s*=")
NAME_EXPRESSIONS_FILE = "<name expressions>"


def _clean_log(log: str, name: str, source_lines: int) -> str:
    """The log with comgr's temporary paths replaced by the names the user gave."""
    def source_name(m: re.Match) -> str:
        line = int(m.group(1))
        return f"{name if line <= source_lines else NAME_EXPRESSIONS_FILE}:{line}:"
    return _TMP_INCLUDE_RE.sub("", _TMP_SOURCE_RE.sub(source_name, log))


def _failed_name_expressions(log: str, exprs: Sequence[str]) -> list[str]:
    bad = []
    for m in _NAME_EXPR_RE.finditer(log):
        i = int(m.group(1)) - 1
        if 0 <= i < len(exprs) and exprs[i] not in bad:
            bad.append(exprs[i])
    return bad


def _read(prog, size_fn, get_fn, what: str) -> bytes:
    size = ctypes.c_size_t()
    _check(size_fn(prog, ctypes.byref(size)), what)
    buf = ctypes.create_string_buffer(size.value)
    _check(get_fn(prog, buf), what)
    return buf.raw


def _c_strings(items: Sequence[str]):
    return (ctypes.c_char_p * len(items))(*(s.encode() for s in items)) if items else None


def compile_source(source: str, *, name: str, arch: str, target: str = "hsaco",
                   options: CompileOptions, name_expressions: Sequence[str] = (),
                   headers: Mapping[str, str] | None = None
                   ) -> tuple[bytes, str, dict[str, str], float]:
    """Compile HIP source with hiprtc. Returns (code object ELF, log, lowered names, ms).
    headers: the in-memory headers to give it (default: options.headers; kjit.compile passes
    its SearchPath's, which add the built-in header names, compiler/hip_headers.py)."""
    if target != "hsaco":
        raise InvalidOptionError(f"target={target!r}: the HIP backend produces 'hsaco' code objects")
    lib = library()
    flags = hiprtc_flags(options, arch)
    check_arch(arch)
    headers = headers if headers is not None else options.headers
    t0 = time.perf_counter()
    prog = ctypes.c_void_p()
    _check(lib.hiprtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(),
                                   len(headers), _c_strings(list(headers.values())),
                                   _c_strings(list(headers))), "hiprtcCreateProgram")
    try:
        for expr in name_expressions:
            _check(lib.hiprtcAddNameExpression(prog, expr.encode()),
                   f"hiprtcAddNameExpression({expr!r})")
        with observe.recording("hip", name):  # what it reads keys the cache (keys/observe.py)
            result = lib.hiprtcCompileProgram(prog, len(flags), _c_strings(flags))
        raw_log = _read(prog, lib.hiprtcGetProgramLogSize, lib.hiprtcGetProgramLog, "log")
        log = _clean_log(raw_log.rstrip(b"\0").decode("utf-8", "replace"), name,
                         source.count("\n") + 1)
        if result != HIPRTC_SUCCESS:
            message = f"hiprtc could not compile {name} for {arch} ({_error_string(result)})"
            bad = _failed_name_expressions(log, name_expressions)
            if bad:
                message += ("; these name expressions do not name anything in the source: "
                            + ", ".join(bad))
            elif result != HIPRTC_ERROR_COMPILATION and not log.strip():
                message += f"; is libhiprtc-builtins installed? {hip_libs.HIP_INSTALL_HINT}"
            else:
                from .hip_headers import missing_hint
                hint = missing_hint(log)
                message += f"\n{hint}" if hint else ""
            raise compile_error(message, log=log, options=flags, source=source, name=name,
                               compiler="hiprtc")
        code = _read(prog, lib.hiprtcGetCodeSize, lib.hiprtcGetCode, "hiprtcGetCode")
        symbols = {}
        for expr in name_expressions:
            lowered = ctypes.c_char_p()
            _check(lib.hiprtcGetLoweredName(prog, expr.encode(), ctypes.byref(lowered)),
                   f"hiprtcGetLoweredName({expr!r})")
            symbols[expr] = lowered.value.decode()  # copied before the program is destroyed
    finally:
        lib.hiprtcDestroyProgram(ctypes.byref(prog))
    return _code_object(code, arch), log, symbols, (time.perf_counter() - t0) * 1e3


def _code_object(code: bytes, arch: str) -> bytes:
    """The ELF code object; newer hiprtc may hand back an offload bundle holding it."""
    from ..formats import BUNDLE_MAGIC, read_bundle
    if code.startswith(BUNDLE_MAGIC):
        found = [e.code for e in read_bundle(code) if e.kind == "hsaco"]
        if len(found) != 1:
            raise KjitError(f"hiprtc returned an offload bundle with {len(found)} code objects "
                            f"for {arch}; expected one")
        return found[0]
    if not code.startswith(b"\x7fELF"):
        raise KjitError(f"hiprtc returned {len(code)} bytes that are not an AMD code object")
    return code
