"""LinkOptions: one validated dataclass; each linker turns it into its own flags in one function."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

from ..errors import InvalidOptionError
from ..jit_options import DEFAULT_LOG_BYTES

# Flags kjit sets from link() arguments; passing them through `extra` would make the result
# disagree with its cache key and with what kjit reports.
_RESERVED = ("-arch", "-lto")


@dataclass(frozen=True)
class LinkOptions:
    """Options for kjit.link.

    max_registers: cap registers per thread; optimization_level: 0-4 (ptxas / driver JIT
    level; 0 also turns LTO optimisation off); line_info; debug (-g); verbose: the linker
    writes what it did to the info log; fast_math: -ftz=1 -prec-div=0 -prec-sqrt=0 -fma=1
    for LTO links; device_runtime: link libcudadevrt.a (None: when the code needs it);
    extra: raw nvJitLink flags (choose nvJitLink); log_bytes: the driver linker's first log
    buffer size (grown and the link retried when a log fills it).
    """

    max_registers: int | None = None
    optimization_level: int | None = None
    line_info: bool = False
    debug: bool = False
    verbose: bool = False
    fast_math: bool = False
    device_runtime: bool | None = None
    extra: Sequence[str] = ()
    log_bytes: int = DEFAULT_LOG_BYTES

    def __post_init__(self) -> None:
        _int_in("max_registers", self.max_registers, 1, 255)
        _int_in("optimization_level", self.optimization_level, 0, 4)
        _int_in("log_bytes", self.log_bytes, 256, 1 << 28)
        for flag in ("line_info", "debug", "verbose", "fast_math"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidOptionError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if self.device_runtime not in (None, True, False):
            raise InvalidOptionError(
                f"device_runtime must be None (when needed), True or False, got {self.device_runtime!r}")
        if isinstance(self.extra, str):
            raise InvalidOptionError("extra must be a list of nvJitLink flags, e.g. ['-Xptxas=-v']")
        extra = tuple(str(x) for x in self.extra)
        for flag in extra:
            if not flag.startswith("-"):
                raise InvalidOptionError(f"extra flag {flag!r} is not a flag (they start with '-')")
            if flag.split("=", 1)[0] in _RESERVED:
                raise InvalidOptionError(
                    f"extra flag {flag!r} is set by kjit itself: use link(arch=..., lto=...)")
        object.__setattr__(self, "extra", extra)

    def replace(self, **changes: Any) -> "LinkOptions":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return LinkOptions(**values)

    def describe(self) -> dict[str, Any]:
        """A canonical JSON-able description (cache keys, `kjit cache show`); log_bytes is
        left out because it does not change the output."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "log_bytes"}
        out["extra"] = list(self.extra)
        return out

    def jit_options(self, target: str | None):
        """These options as the driver linker's JitOptions (target None: the context's device)."""
        from ..jit_options import JitOptions
        return JitOptions(max_registers=self.max_registers,
                          optimization_level=self.optimization_level,
                          target=target, target_from_context=target is None,
                          generate_line_info=self.line_info, generate_debug_info=self.debug,
                          log_verbose=self.verbose, log_bytes=self.log_bytes)


def _int_in(name: str, value: Any, lo: int, hi: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidOptionError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
