"""JitOptions: the driver's JIT options (cuModuleLoadDataEx, cuLinkCreate) as a dataclass.

Lives below runtime/ and linker/ because both the module loader and the driver linker use it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InvalidOptionError

DEFAULT_LOG_BYTES = 1 << 16   # grown and retried when the driver fills it, so logs are never cut
_FALLBACKS = ("prefer_ptx", "prefer_binary")


@dataclass(frozen=True)
class JitOptions:
    """Options for the driver's JIT compiler and linker.

    max_registers; optimization_level (0-4); target_from_context (compile for the current
    context's device, the driver's default); target ("sm_90", instead of the context's);
    fallback_strategy ("prefer_ptx" / "prefer_binary"); generate_line_info;
    generate_debug_info; log_verbose; threads_per_block; binary_loader_threads (where the
    driver has CU_JIT_BINARY_LOADER_THREAD_COUNT; 0 = one per CPU).
    """

    max_registers: int | None = None
    optimization_level: int | None = None
    target_from_context: bool = False
    target: str | None = None
    fallback_strategy: str | None = None
    generate_line_info: bool = False
    generate_debug_info: bool = False
    log_verbose: bool = False
    threads_per_block: int | None = None
    binary_loader_threads: int | None = None
    log_bytes: int = DEFAULT_LOG_BYTES

    def __post_init__(self) -> None:
        _int_in("max_registers", self.max_registers, 1, 255)
        _int_in("optimization_level", self.optimization_level, 0, 4)
        _int_in("threads_per_block", self.threads_per_block, 1, 1024)
        _int_in("binary_loader_threads", self.binary_loader_threads, 0, 4096)
        _int_in("log_bytes", self.log_bytes, 256, 1 << 30)
        if self.fallback_strategy is not None and self.fallback_strategy not in _FALLBACKS:
            raise InvalidOptionError(
                f"fallback_strategy={self.fallback_strategy!r} is not one of {', '.join(_FALLBACKS)}")
        if self.target is not None:
            from .arch import parse
            a = parse(self.target)
            if a.suffix:
                raise InvalidOptionError(f"JIT target {self.target!r}: the driver JIT takes plain sm_XY")
            object.__setattr__(self, "target", a.sm)
            if self.target_from_context:
                raise InvalidOptionError("give either target or target_from_context, not both")

    def driver_options(self, info_log: bytearray, error_log: bytearray) -> tuple[list, list]:
        """(option keys, option values) for cuModuleLoadDataEx / cuLinkCreate.

        The log bytearrays must stay alive until the driver call (or cuLinkDestroy) is done.
        """
        from cuda.bindings import driver as drv
        J = drv.CUjit_option
        keys: list[Any] = [J.CU_JIT_INFO_LOG_BUFFER, J.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                           J.CU_JIT_ERROR_LOG_BUFFER, J.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES]
        values: list[Any] = [info_log, len(info_log), error_log, len(error_log)]

        def add(key: str, value: Any) -> None:
            keys.append(getattr(J, key))
            values.append(value)

        if self.max_registers is not None:
            add("CU_JIT_MAX_REGISTERS", self.max_registers)
        if self.optimization_level is not None:
            add("CU_JIT_OPTIMIZATION_LEVEL", self.optimization_level)
        if self.target_from_context:
            add("CU_JIT_TARGET_FROM_CUCONTEXT", 0)
        if self.target is not None:
            add("CU_JIT_TARGET", getattr(drv.CUjit_target, "CU_TARGET_COMPUTE_" + self.target[3:]))
        if self.fallback_strategy is not None:
            name = "CU_PREFER_PTX" if self.fallback_strategy == "prefer_ptx" else "CU_PREFER_BINARY"
            add("CU_JIT_FALLBACK_STRATEGY", getattr(drv.CUjit_fallback, name))
        if self.generate_line_info:
            add("CU_JIT_GENERATE_LINE_INFO", 1)
        if self.generate_debug_info:
            add("CU_JIT_GENERATE_DEBUG_INFO", 1)
        if self.log_verbose:
            add("CU_JIT_LOG_VERBOSE", 1)
        if self.threads_per_block is not None:
            add("CU_JIT_THREADS_PER_BLOCK", self.threads_per_block)
        if self.binary_loader_threads is not None and hasattr(J, "CU_JIT_BINARY_LOADER_THREAD_COUNT"):
            add("CU_JIT_BINARY_LOADER_THREAD_COUNT", self.binary_loader_threads)
        return keys, values

    def describe(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "log_bytes"}


def log_text(buf: bytearray) -> str:
    """The text the driver wrote into a log buffer."""
    end = buf.find(b"\0")
    return bytes(buf[: end if end >= 0 else len(buf)]).decode("utf-8", "replace")


def log_full(buf: bytearray) -> bool:
    """True if the driver may have cut the log (it filled the buffer)."""
    end = buf.find(b"\0")
    return end < 0 or end >= len(buf) - 1


def _int_in(name: str, value: Any, lo: int, hi: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidOptionError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
