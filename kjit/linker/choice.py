"""Which linker runs a link: pure functions of the inputs and the machine's facts.

The driver's JIT accepts PTX only up to the ISA version of its CUDA release; nvJitLink
(shipped with NVRTC) accepts what NVRTC emits. So PTX newer than the driver, LTO-IR and
machines without a GPU go to nvJitLink; everything else can use the driver.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..errors import CudaUnavailableError, InvalidOptionError

BACKENDS = ("auto", "driver", "nvjitlink")

# Unknown PTX ISA versions below this major are not versions any compiler emitted.
_FIRST_RULE_MAJOR = 9
_NEVER = 10 ** 9


def cuda_version_for_ptx(version: tuple[int, int]) -> int:
    """The oldest CUDA release (1000*major + 10*minor) whose driver accepts PTX ISA `version`.

    Known versions come from the PTX ISA release table in cuda.bindings; a newer one follows
    the rule the table has kept since CUDA 12 (PTX ISA M.m ships with CUDA (M+4).m).
    """
    major, minor = version
    try:
        from cuda.bindings.utils import get_minimal_required_cuda_ver_from_ptx_ver
        return int(get_minimal_required_cuda_ver_from_ptx_ver(f"{major}.{minor}"))
    except (ImportError, ValueError):
        pass
    if major >= _FIRST_RULE_MAJOR:
        return 1000 * (major + 4) + 10 * minor
    return _NEVER


def max_ptx_for_driver(driver_version: int) -> tuple[int, int]:
    """The newest PTX ISA version a driver (cuDriverGetVersion(), e.g. 13000) accepts."""
    best = (0, 0)
    for major in range(1, 20):
        for minor in range(10):
            if cuda_version_for_ptx((major, minor)) <= driver_version:
                best = max(best, (major, minor))
    return best


def ptx_too_new(version: tuple[int, int], driver_version: int) -> bool:
    return cuda_version_for_ptx(version) > driver_version


def cuda_version_text(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


@dataclass(frozen=True)
class Choice:
    backend: str   # "driver" or "nvjitlink"
    reason: str    # why, in words (kept in the result and shown by `kjit link`)


def choose_backend(requested: str, *, kinds: Iterable[str],
                   ptx_versions: Iterable[tuple[int, int]] = (),
                   cubin_versions: Iterable[int] = (), lto: bool = False,
                   gpu_present: bool, driver_version: int | None,
                   nvjitlink_only_options: bool = False,
                   device_runtime: bool = False, arch_specific: bool = False) -> Choice:
    """Pick the linker. Raises InvalidOptionError / CudaUnavailableError for impossible requests.

    kinds: the input kinds; ptx_versions: the `.version` of each PTX input; cubin_versions:
    the CUDA release (13050) that built each cubin, where it says; gpu_present /
    driver_version: the machine (driver_version None when there is no driver);
    nvjitlink_only_options: raw nvJitLink flags were given; device_runtime: libcudadevrt.a
    (from the NVIDIA wheels, which match nvJitLink, not necessarily the driver) is linked in;
    arch_specific: the target is sm_XYa / sm_XYf, which the driver's JIT target cannot name.
    """
    if requested not in BACKENDS:
        raise InvalidOptionError(f"backend={requested!r} is not one of {', '.join(BACKENDS)}")
    kinds = set(kinds)
    ptx_versions = list(ptx_versions)
    if requested == "nvjitlink":
        return Choice("nvjitlink", "requested")
    if requested == "driver":
        if "ltoir" in kinds or lto:
            raise InvalidOptionError(
                "the driver linker cannot link LTO-IR: use backend='nvjitlink' or 'auto'")
        if nvjitlink_only_options:
            raise InvalidOptionError(
                "LinkOptions.extra holds nvJitLink flags; the driver linker takes none: "
                "use backend='nvjitlink' or drop extra")
        if arch_specific:
            raise InvalidOptionError(
                "the driver linker targets plain sm_XY; link for sm_XYa / sm_XYf with "
                "backend='nvjitlink'")
        if not gpu_present:
            raise CudaUnavailableError(
                "backend='driver' needs a CUDA driver and GPU, and none is present here: "
                "use backend='nvjitlink' (or 'auto') with an explicit arch")
        return Choice("driver", "requested")
    # auto
    if "ltoir" in kinds or lto:
        return Choice("nvjitlink", "LTO-IR input needs nvJitLink")
    if nvjitlink_only_options:
        return Choice("nvjitlink", "raw nvJitLink flags given")
    if arch_specific:
        return Choice("nvjitlink", "arch-specific target (sm_XYa / sm_XYf)")
    if not gpu_present or driver_version is None:
        return Choice("nvjitlink", "no GPU here")
    newest = max(ptx_versions, default=None)
    if newest is not None and ptx_too_new(newest, driver_version):
        limit = max_ptx_for_driver(driver_version)
        return Choice("nvjitlink",
                      f"PTX .version {newest[0]}.{newest[1]} is newer than the driver "
                      f"(CUDA {cuda_version_text(driver_version)}) accepts "
                      f"(up to {limit[0]}.{limit[1]})")
    built = max(cubin_versions, default=None)
    if built is not None and built > driver_version:
        return Choice("nvjitlink",
                      f"a cubin was built by CUDA {cuda_version_text(built)}, newer than the "
                      f"driver (CUDA {cuda_version_text(driver_version)})")
    if device_runtime:
        return Choice("nvjitlink", "device runtime from the NVIDIA wheels links with nvJitLink")
    return Choice("driver", "GPU present and the driver accepts every input")
