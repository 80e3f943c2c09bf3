"""HIP headers that hiprtc's built-ins already provide, as include names that resolve.

hiprtc pre-includes its own copy of the HIP device headers (libhiprtc-builtins), but ROCm
5.x's hiprtc does not answer `#include <hip/hip_runtime.h>` or `<hip/hip_fp16.h>` with them:
"file not found". Code written for hipcc starts with those lines, so kjit gives hiprtc an
empty in-memory header under each name whose contents the built-ins hold (listed from the
preprocessed built-ins of ROCm 5.2.3). Names hiprtc 5.2 has no copy of (hip_bfloat16.h,
hip_cooperative_groups.h, hip_complex.h, hipcub, rocprim) are left alone: they stay "not
found", with a hint in the CompileError. See docs/headers.md.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

_STUB = "// {name}: provided by hiprtc's built-in HIP headers (kjit maps the name)\n#pragma once\n"

# In ROCm 5.2.3's libhiprtc-builtins (its preprocessed file names), plus the two thin
# wrappers over built-in amd_detail headers (math_functions.h, device_functions.h).
BUILTIN_NAMES = (
    "hip/hip_runtime.h", "hip/hip_fp16.h", "hip/hip_vector_types.h", "hip/hip_common.h",
    "hip/hip_version.h", "hip/hip_texture_types.h", "hip/texture_types.h",
    "hip/surface_types.h", "hip/driver_types.h", "hip/math_functions.h",
    "hip/device_functions.h",
)
# hiprtc releases whose built-ins were checked against the list above.
CHECKED_MAJOR = (5,)
# What hiprtc 5.2 lacks, and what to do instead: for CompileError hints.
MISSING = {
    "hip/hip_bfloat16.h": "hiprtc 5.2's built-ins have no bfloat16 type",
    "hip/hip_cooperative_groups.h": "hiprtc 5.2's built-ins have no cooperative groups",
    "hip/hip_complex.h": "hiprtc 5.2's built-ins have no hipFloatComplex",
    "hipcub/hipcub.hpp": "hipCUB is not part of hiprtc",
    "rocprim/rocprim.hpp": "rocPRIM is not part of hiprtc",
}

_STUBS = MappingProxyType({name: _STUB.format(name=name) for name in BUILTIN_NAMES})


def builtin_headers(hiprtc_major: int) -> Mapping[str, str]:
    """Include name -> empty header text, for a hiprtc whose built-ins were checked."""
    return _STUBS if hiprtc_major in CHECKED_MAJOR else MappingProxyType({})


def missing_hint(log: str) -> str:
    """A hint for a 'file not found' of a HIP header hiprtc does not provide."""
    for name, why in MISSING.items():
        if f"'{name}' file not found" in log:
            return (f"{name}: {why}, and kjit cannot supply it (ROCm's own header for it is "
                    "written for hipcc, not hiprtc); see docs/headers.md for what hiprtc 5.2 has")
    return ""
