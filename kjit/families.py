"""kjit's two CUDA wheel families, kjit[cu13] and kjit[cu12] (pyproject.toml's extras): the
driver each needs, whether the driver can run what the installed family makes, and what to
install when a family's library is missing."""
from __future__ import annotations

import functools
from typing import Any

from .locations import package_version

# The oldest driver of each CUDA major (Linux), for the message below and the README's table.
FAMILY_DRIVERS = {12: "525.60.13", 13: "580.65.06"}
# Where each family's runtime wheel puts its files below site-packages/nvidia/ (include/, lib/).
RUNTIME_WHEEL_DIRS = {13: ("cu13",), 12: ("cuda_runtime", "cu12")}


def installed_family() -> tuple[int, str] | None:
    """(CUDA major, version) of the installed cuda-bindings: the family kjit is using (it
    loads only that major's NVRTC and nvJitLink), or None."""
    found = package_version(("cuda-bindings",))
    major = found[1].split(".")[0] if found else ""
    return (int(major), found[1]) if major.isdigit() else None  # type: ignore[index]


def family_mismatch(driver_version: int, bindings_version: str) -> str | None:
    """Why this driver cannot run what kjit's CUDA wheels make, or None. A driver runs code
    from its own CUDA major and older (minor versions are bridged: PTX newer than the driver
    is linked to cubin by nvJitLink), never from a newer major, and cuda.bindings' major is
    the family's: it loads only that major's NVRTC and nvJitLink."""
    try:
        wheels = int(bindings_version.split(".")[0])
    except ValueError:
        return None
    have = driver_version // 1000
    if driver_version <= 0 or wheels <= have:
        return None
    family = f"cu{have}" if have in FAMILY_DRIVERS else None
    fix = (f"install the CUDA {have} family instead: pip install 'kjit[{family}]' (it replaces "
           f"kjit[cu{wheels}]'s wheels)" if family else "no kjit family supports it")
    return (f"this machine's driver supports CUDA {have}.{(driver_version % 1000) // 10}, older "
            f"than the CUDA {wheels} wheels kjit is installed with (cuda-bindings "
            f"{bindings_version}), and a driver cannot run what a newer CUDA major compiles: "
            f"{fix}, or update the driver to {FAMILY_DRIVERS.get(wheels, 'a CUDA %d one' % wheels)} "
            "or newer. Compiling for a named arch and building fatbins still work.")


def older_driver(drv: Any) -> str | None:
    """family_mismatch for this machine's driver (cuda.bindings' driver module `drv`)."""
    try:
        import cuda.bindings
        err, version = drv.cuDriverGetVersion()
        return family_mismatch(int(version), cuda.bindings.__version__) if not err else None
    except Exception:   # a check that cannot be made is no reason to refuse the driver
        return None


def family_install_hint() -> str:
    """What to install when a CUDA library of kjit's family (NVRTC, nvJitLink, nvFatbin) is
    missing: the family matching the cuda-bindings already installed, else both."""
    family = installed_family()
    if family and family[0] in FAMILY_DRIVERS:
        return (f"install kjit's CUDA {family[0]} family: pip install 'kjit[cu{family[0]}]' "
                f"(cuda-bindings {family[1]} is of that family)")
    return ("install one of kjit's CUDA families: pip install 'kjit[cu13]' (drivers 580 and "
            "newer) or 'kjit[cu12]' (drivers 525 and newer)")


def other_family_loaded(lib: str, version: tuple[int, int]) -> str | None:
    """Why a library of another CUDA major than cuda.bindings' is a problem, or None.
    cuda.pathfinder loads the newest it finds (libnvrtc.so.13 before .so.12), so an environment
    holding both families' wheels gives cuda-bindings 12 the CUDA 13 NVRTC, whose output a
    CUDA 12 driver cannot run."""
    family = installed_family()
    if family is None or version[0] == family[0]:
        return None
    have = family[0]
    return (f"cuda-bindings {family[1]} (kjit's CUDA {have} family) loaded {lib} "
            f"{version[0]}.{version[1]}, of the CUDA {version[0]} family, from another wheel in "
            f"this environment: what it makes needs a CUDA {version[0]} driver. Keep one family: "
            f"uninstall the other's wheels, or pip install 'kjit[cu{version[0]}]'")


# The CUDA 12 family's libraries, where its wheels put them below a sys.path entry.
_CU12_LIBS = {"nvrtc": "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
              "nvjitlink": "nvidia/nvjitlink/lib/libnvJitLink.so.12",
              "nvfatbin": "nvidia/nvfatbin/lib/libnvfatbin.so.12"}


@functools.lru_cache(maxsize=None)   # once per library and process
def load_family_library(lib: str) -> None:
    """Load the CUDA 12 family's `lib` ("nvrtc", "nvjitlink", "nvfatbin") before cuda.bindings
    does, where cuda-bindings is of that family: cuda.pathfinder takes a library already
    loaded, and would otherwise prefer a CUDA 13 wheel's libnvrtc.so.13 left in the same
    environment (one moved from kjit[cu13] to kjit[cu12] keeps it). Does nothing for the CUDA
    13 family, or where no CUDA 12 wheel holds the library."""
    import ctypes
    import os
    import sys
    family = installed_family()
    rel = _CU12_LIBS.get(lib)
    if not rel or not family or family[0] != 12:
        return
    try:
        ctypes.CDLL(os.path.basename(rel), mode=os.RTLD_NOLOAD)
        return   # loaded already
    except OSError:
        pass
    for entry in sys.path:
        path = os.path.join(entry or ".", rel)
        if os.path.isfile(path):
            try:
                ctypes.CDLL(path)
            except OSError:   # cuda.bindings will say what it finds, or that it finds none
                pass
            return
