"""What the installed compilers can target: a question for the compiler, not for arch names."""
from __future__ import annotations

import functools

from ..arch import Arch
from ..errors import InvalidOptionError


@functools.lru_cache(maxsize=None)
def nvrtc_supported() -> tuple[int, ...]:
    """The SM numbers the installed NVRTC can target (nvrtcGetSupportedArchs), remembered
    across processes so a warm cache hit never loads libnvrtc."""
    from . import facts
    return tuple(facts.nvrtc()["archs"])


def supported_archs(backend: str = "cuda") -> tuple[str, ...]:
    """The architectures the installed compiler can target, oldest first: ('sm_75', ...,
    'sm_121') from NVRTC, the gfx processors from hiprtc."""
    if backend == "hip":
        from . import hiprtc
        return hiprtc.supported_archs()
    if backend != "cuda":
        raise InvalidOptionError(f"backend must be 'cuda' or 'hip', not {backend!r}")
    return tuple(f"sm_{n}" for n in nvrtc_supported())


def check_supported(arch: Arch) -> None:
    """Raise if the installed compiler cannot target `arch`; the message lists what it can."""
    if arch.backend == "hip":
        from . import hiprtc
        hiprtc.check_arch(arch.name)  # before the cache lookup: hiprtc 5.2 crashes on unknown targets
        return
    supported = nvrtc_supported()
    if arch.number not in supported:
        listed = ", ".join(f"sm_{n}" for n in supported)
        raise InvalidOptionError(
            f"arch {arch.name!r} is not supported by the installed NVRTC; it supports: {listed}")
