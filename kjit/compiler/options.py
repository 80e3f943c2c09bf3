"""CompileOptions: one validated, immutable value, turned into backend flags in one function each."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InvalidOptionError

CUDA_STDS = ("c++03", "c++11", "c++14", "c++17", "c++20")
HIP_STDS = ("c++11", "c++14", "c++17", "c++20")
TARGETS = ("ptx", "cubin", "ltoir")
_MACRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Flags that kjit sets itself from other arguments; passing them through `extra` would make
# the result disagree with what kjit records about it.
_RESERVED_FLAGS = ("-arch", "--gpu-architecture", "--offload-arch", "-dlto", "--dlto",
                   "-rdc", "--relocatable-device-code", "-std", "--std", "-lto")
# NVRTC's own precompiled headers keep state between compiles (a PCH file it writes and
# reads back, in the working directory or --pch-dir), which the cache cannot key: a header
# edited after the PCH was made gave stale results. kjit makes and keys precompiled headers
# itself (KJIT_PCH, docs/headers.md).
_PCH_FLAGS = tuple(f"{dash}{name}" for dash in ("-", "--") for name in (
    "pch", "create-pch", "create_pch", "use-pch", "use_pch", "pch-dir", "pch_dir"))


_FIELDS = ("std", "defines", "include_dirs", "headers", "fast_math", "line_info", "debug",
           "max_registers", "relocatable", "extra", "toolkit_headers", "std_headers",
           "nvcc_prelude")
PRELUDE = "__kjit_prelude.h"  # in stdinc/: what nvcc's implicit cuda_runtime.h gives device code


class CompileOptions:
    """Options for kjit.compile, validated on construction.

    std: C++ dialect ("c++17"); defines: macros, a mapping (NAME -> value or None) or a
    sequence of "NAME" / "NAME=value"; include_dirs: directories searched for #include;
    headers: in-memory headers, include name -> text; fast_math; line_info; debug (-G);
    max_registers; relocatable (-rdc, for linking); extra: raw compiler flags;
    toolkit_headers: search the CUDA toolkit and CCCL headers from NVIDIA's wheels after
    everything else (HIP: the names of hiprtc's built-in headers); see docs/headers.md.
    std_headers: kjit's device-side <cstdint>, <cmath>, <cstdio>, <algorithm>... (NVRTC only,
    searched after every other directory; docs/headers.md). nvcc_prelude: pre-include what
    nvcc's implicit cuda_runtime.h gives device code (INFINITY, NAN, M_PI, FLT_MAX, INT_MAX,
    uint...; NVRTC only; docs/headers.md).

    Immutable; `replace(**changes)` gives a changed copy. A plain class rather than a frozen
    dataclass: `dataclasses` imports `inspect`, a quarter of what a fresh process pays to hit
    the disk cache (docs/performance.md).
    """

    __slots__ = _FIELDS
    std: str | None
    defines: tuple[tuple[str, str | None], ...]
    include_dirs: tuple[str, ...]
    headers: dict[str, str]
    fast_math: bool
    line_info: bool
    debug: bool
    max_registers: int | None
    relocatable: bool
    extra: tuple[str, ...]
    toolkit_headers: bool
    std_headers: bool
    nvcc_prelude: bool

    def __init__(self, std: str | None = None,
                 defines: Mapping[str, str | None] | Sequence[str] = (),
                 include_dirs: Sequence[str | os.PathLike[str]] = (),
                 headers: Mapping[str, str] | None = None, fast_math: bool = False,
                 line_info: bool = False, debug: bool = False, max_registers: int | None = None,
                 relocatable: bool = False, extra: Sequence[str] = (),
                 toolkit_headers: bool = True, std_headers: bool = True,
                 nvcc_prelude: bool = True) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - immutable
        if std is not None and std not in CUDA_STDS:
            raise InvalidOptionError(f"std={std!r} is not one of {', '.join(CUDA_STDS)}")
        set_("std", std)
        set_("defines", _normalise_defines(defines))
        if isinstance(include_dirs, (str, os.PathLike)):
            raise InvalidOptionError("include_dirs must be a list of directories, not one string")
        dirs = []
        for d in include_dirs:
            p = Path(d)
            if not p.is_dir():
                raise InvalidOptionError(f"include directory {str(d)!r} does not exist")
            dirs.append(str(p.resolve()))
        set_("include_dirs", tuple(dirs))
        headers = {} if headers is None else headers
        if not isinstance(headers, Mapping):
            raise InvalidOptionError("headers must be a mapping of include name -> header text")
        for k, v in headers.items():
            if not isinstance(k, str) or not isinstance(v, (str, bytes)):
                raise InvalidOptionError(f"header {k!r}: names and contents must be strings")
        set_("headers", dict(sorted((k, v.decode() if isinstance(v, bytes) else v)
                                    for k, v in headers.items())))
        for flag, value in (("fast_math", fast_math), ("line_info", line_info), ("debug", debug),
                            ("relocatable", relocatable), ("toolkit_headers", toolkit_headers),
                            ("std_headers", std_headers), ("nvcc_prelude", nvcc_prelude)):
            if not isinstance(value, bool):
                raise InvalidOptionError(f"{flag} must be True or False, got {value!r}")
            set_(flag, value)
        if max_registers is not None:
            if isinstance(max_registers, bool) or not isinstance(max_registers, int) \
                    or not 1 <= max_registers <= 255:
                raise InvalidOptionError(
                    f"max_registers must be an int in 1..255, got {max_registers!r}")
        set_("max_registers", max_registers)
        if isinstance(extra, str):
            raise InvalidOptionError("extra must be a list of flags, e.g. ['--use_fast_math']")
        extra = tuple(str(x) for x in extra)
        for flag in extra:
            if _flag_name(flag) in _PCH_FLAGS:
                raise InvalidOptionError(
                    f"extra flag {flag!r}: kjit manages precompiled headers itself (KJIT_PCH, "
                    "docs/headers.md); NVRTC's own would keep state between compiles that the "
                    "cache cannot key. Remove the flag")
            if _flag_name(flag) in _RESERVED_FLAGS:
                raise InvalidOptionError(
                    f"extra flag {flag!r} is set by kjit itself: use the arch/target arguments "
                    "or the matching CompileOptions field")
        set_("extra", extra)

    def values(self) -> tuple:
        """Every field, in order."""
        return tuple(getattr(self, f) for f in _FIELDS)

    def as_dict(self) -> dict[str, Any]:
        """Field name -> value, in order."""
        return dict(zip(_FIELDS, self.values()))

    def replace(self, **changes: Any) -> "CompileOptions":
        values = self.as_dict()
        values.update(changes)
        return CompileOptions(**values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"CompileOptions is immutable: use options.replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("CompileOptions is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.values() == other.values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(tuple(tuple(v.items()) if isinstance(v, dict) else v for v in self.values()))

    def __repr__(self) -> str:
        return "CompileOptions(" + ", ".join(f"{f}={v!r}" for f, v in zip(_FIELDS, self.values())) + ")"

    def __reduce__(self) -> tuple:  # pickle and copy: through __init__, as slots can't be set
        return (CompileOptions, self.values())

    def describe(self) -> dict[str, Any]:
        """A canonical JSON-able description (for cache keys and `kjit cache show`)."""
        return {
            "std": self.std, "defines": [list(kv) for kv in self.defines],
            "include_dirs": list(self.include_dirs), "headers": sorted(self.headers),
            "fast_math": self.fast_math, "line_info": self.line_info, "debug": self.debug,
            "max_registers": self.max_registers, "relocatable": self.relocatable,
            "extra": list(self.extra), "toolkit_headers": self.toolkit_headers,
            "std_headers": self.std_headers,
            "nvcc_prelude": prelude_digest() if self.nvcc_prelude else False,
        }


def _flag_name(flag: str) -> str:
    """'-arch=sm_90' and '-arch sm_90' (one string) both name '-arch'."""
    parts = flag.strip().split("=", 1)[0].split()
    return parts[0] if parts else ""


def _normalise_defines(defines: Any) -> tuple[tuple[str, str | None], ...]:
    items: list[tuple[str, str | None]] = []
    if isinstance(defines, Mapping):
        for k, v in defines.items():
            items.append((str(k), None if v is None else str(v)))
    elif isinstance(defines, str):
        raise InvalidOptionError("defines must be a mapping or a list of 'NAME[=value]' strings")
    else:
        for d in defines:
            if isinstance(d, (tuple, list)) and len(d) == 2:
                items.append((str(d[0]), None if d[1] is None else str(d[1])))
                continue
            name, eq, value = str(d).partition("=")
            items.append((name, value if eq else None))
    for name, _ in items:
        if not _MACRO_NAME.fullmatch(name):
            raise InvalidOptionError(f"define name {name!r} is not a valid macro name: use letters, "
                                     "digits and _, not starting with a digit (NAME or NAME=value)")
    return tuple(items)


_prelude: list[str] = []


def prelude_text() -> str:
    """The nvcc prelude's text (stdinc/__kjit_prelude.h), read once."""
    if not _prelude:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "stdinc", PRELUDE)) as f:
            text = f.read()
        from ..hashing import sha256
        _prelude[:] = [text, sha256(text.encode()).hexdigest()]
    return _prelude[0]


def prelude_digest() -> str:
    prelude_text()
    return _prelude[1]


def nvrtc_flags(opts: CompileOptions, arch: str, target: str) -> list[str]:
    """The NVRTC command line for these options; the one place CompileOptions become flags."""
    flags = [f"--gpu-architecture={arch}"]
    if target == "ltoir":
        flags.append("-dlto")
    if opts.relocatable:
        flags.append("--relocatable-device-code=true")
    if opts.std:
        flags.append(f"--std={opts.std}")
    for name, value in opts.defines:
        flags.append(f"-D{name}" if value is None else f"-D{name}={value}")
    flags += [f"-I{d}" for d in opts.include_dirs]
    if opts.fast_math:
        flags.append("--use_fast_math")
    if opts.line_info:
        flags.append("--generate-line-info")
    if opts.debug:
        flags.append("--device-debug")
    if opts.max_registers is not None:
        flags.append(f"--maxrregcount={opts.max_registers}")
    if opts.nvcc_prelude:  # an in-memory header (include_path.automatic_headers), before the source
        flags.append(f"--pre-include={PRELUDE}")
    flags += list(opts.extra)
    return flags


# NVRTC options whose effect outlives the compile that passed them: once one program of a
# process is compiled with --restrict, NVRTC (13.0-13.5, measured) compiles every later
# program of that process as if all its pointers were __restrict__ (a load becomes a
# non-coherent LDG.CONSTANT): wrong code for kernels whose pointers alias, and binaries that
# differ from a fresh process's. kjit.compile runs such a compile in a worker process of its
# own, which ends after it (compiler/pool.py).
LEAKING_FLAGS = ("--restrict", "-restrict")


def leaks_state(extra: Any) -> bool:
    """Whether these extra NVRTC flags would change the process's later compiles."""
    return any(str(f).split("=")[0] in LEAKING_FLAGS for f in extra or ())
