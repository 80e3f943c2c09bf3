"""Target architecture names: parsing, describing, and detecting the current device's.

What the installed compiler can target is the compiler's question (kjit.compiler.targets).

CUDA: sm_90 (real: cubin), sm_90a / sm_100f (arch- and family-specific), compute_90 (virtual:
PTX only). HIP: gfx90a, gfx942, gfx1100 (optionally with :xnack± / :sramecc± features).
"""
# (no `from __future__ import annotations`: NamedTuples would then compile each field's
# annotation text, and a fresh process's first compile() costs ~1.5 ms of a ~20 ms disk hit)

import re
from typing import NamedTuple

from .errors import InvalidOptionError

_CUDA_RE = re.compile(r"^(sm|compute|lto)_(\d{2,3})([af]?)$")
_HIP_RE = re.compile(r"^gfx[0-9a-f]{3,4}(:(xnack|sramecc)[+-])*$")

ENV_ARCH = "KJIT_ARCH"
_SUFFIX_FROM = {"a": 90, "f": 100}
_SUFFIX_NAME = {"a": "arch-specific", "f": "family-specific"}


class Arch(NamedTuple):
    """A parsed target architecture."""

    name: str          # as given, normalised: "sm_90a", "compute_90", "gfx90a"
    backend: str       # "cuda" or "hip"
    number: int = 0    # 90 for sm_90; 0 for HIP
    suffix: str = ""   # "", "a" (arch-specific) or "f" (family)
    virtual: bool = False

    @property
    def sm(self) -> str:
        """The real-arch spelling (sm_90a) of a CUDA arch."""
        return f"sm_{self.number}{self.suffix}"

    @property
    def compute(self) -> str:
        """The virtual-arch spelling (compute_90a) of a CUDA arch."""
        return f"compute_{self.number}{self.suffix}"

    def __str__(self) -> str:
        return self.name


_VENDOR_NAMES = {"cuda": "CUDA", "hip": "HIP"}


def parse(arch: str | int | Arch, backend: str = "cuda") -> Arch:
    """Parse an architecture name; InvalidOptionError names the accepted forms."""
    if isinstance(arch, Arch):
        if arch.backend != backend:   # a gfx target handed to NVRTC, or sm_90 to hiprtc
            theirs, ours = (_VENDOR_NAMES.get(b, b) for b in (arch.backend, backend))
            raise InvalidOptionError(
                f"arch {arch.name!r} is a {theirs} target, and this is a {ours} compile: pass "
                f"backend={arch.backend!r}, or an arch of the {ours} backend")
        return arch
    if isinstance(arch, bool) or not isinstance(arch, (str, int)):
        raise InvalidOptionError(f"arch must be a string like 'sm_90' (or an int like 90), got {arch!r}")
    text = (f"sm_{arch}" if isinstance(arch, int) else arch).strip().lower()
    if backend == "hip":
        if _HIP_RE.match(text):
            return Arch(text, "hip")
        raise InvalidOptionError(
            f"arch {arch!r} is not an AMD GPU target: use a gfx name such as 'gfx90a', "
            "'gfx942' or 'gfx1100'")
    m = _CUDA_RE.match(text)
    if not m:
        hint = " (for an AMD GPU pass backend='hip')" if _HIP_RE.match(text) else ""
        raise InvalidOptionError(
            f"arch {arch!r} is not a CUDA architecture: use sm_XY (cubin), sm_XYa / sm_XYf "
            f"(arch- or family-specific) or compute_XY (PTX), e.g. 'sm_90'{hint}")
    kind, number, suffix = m.group(1), int(m.group(2)), m.group(3)
    # Arch-specific targets start at sm_90, family targets at sm_100.
    if suffix and number < _SUFFIX_FROM[suffix]:
        raise InvalidOptionError(
            f"arch {arch!r}: {_SUFFIX_NAME[suffix]} ('{suffix}') targets exist from "
            f"sm_{_SUFFIX_FROM[suffix]} on; use sm_{number}")
    return Arch(f"{'compute' if kind != 'sm' else 'sm'}_{number}{suffix}", "cuda", number,
                suffix, virtual=kind != "sm")


def device_arch(ordinal: int | None = None) -> Arch | None:
    """The compute capability of the current (or given) device as sm_XY, or None if no GPU."""
    from . import driver
    if not driver.available():
        return None
    if ordinal is None:
        ordinal = driver.thread_device()
        driver.warm_primary_context(ordinal)   # the load that usually follows will need it
    major, minor = driver.compute_capability(ordinal)
    return parse(f"sm_{major}{minor}")


def from_env(backend: str = "cuda") -> Arch | None:
    """$KJIT_ARCH, None when unset; a SettingError naming it when it is no target."""
    from .settings import SettingError, env_text
    env = env_text(ENV_ARCH)
    if env is None:
        return None
    try:
        return parse(env, backend)
    except InvalidOptionError as exc:
        raise SettingError(f"${ENV_ARCH}={env!r} is not usable: {exc}") from None


def resolve(arch: str | int | Arch | None, backend: str = "cuda") -> Arch:
    """The architecture to compile for. None means: the current device, else $KJIT_ARCH,
    else an error that says how to choose one. Never a silent guess."""
    if arch is not None:
        return parse(arch, backend)
    if backend == "cuda":
        found = device_arch()
        if found is not None:
            return found
    found = from_env(backend)
    if found is not None:
        return found
    example = "gfx90a" if backend == "hip" else "sm_90"
    raise InvalidOptionError(
        f"no architecture given and none can be detected (no {'GPU' if backend == 'cuda' else 'AMD GPU'} "
        f"here): pass arch='{example}' (or --arch {example}), or set {ENV_ARCH}={example}")
