"""Finding ROCm's shared libraries by name: the loader's path, then $ROCM_PATH, $HIP_PATH
and /opt/rocm. Shared by the hiprtc compiler binding and the HIP runtime binding."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Sequence

# libamdhip64 holds the runtime (and hiprtc up to ROCm 5.x); ROCm 6 moved hiprtc to libhiprtc.
RUNTIME_NAMES = ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5")
HIPRTC_NAMES = ("libhiprtc.so", "libhiprtc.so.6", *RUNTIME_NAMES)
COMGR_NAMES = ("libamd_comgr.so", "libamd_comgr.so.3", "libamd_comgr.so.2")

INSTALL_HINT = (
    "on Debian 12 `apt-get install libamdhip64-5 libhiprtc-builtins5`; with ROCm, the "
    "`hip-runtime-amd` package (libamdhip64.so / libhiprtc.so under /opt/rocm/lib, or set "
    "$ROCM_PATH)")


def candidates(name: str) -> list[str]:
    paths = [name]
    for root in (os.environ.get("ROCM_PATH"), os.environ.get("HIP_PATH"), "/opt/rocm"):
        if root:
            paths.append(str(Path(root) / "lib" / name))
    return paths


def load_first(names: Sequence[str], symbol: str) -> ctypes.CDLL | None:
    """The first library among `names` that loads and exports `symbol`, or None."""
    for name in names:
        for path in candidates(name):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            if hasattr(lib, symbol):
                return lib
    return None
