"""CuPy for the GPU tests, where it is built for the CUDA major of kjit's wheel family.

CuPy compiles its own kernels (reductions, elementwise) with the NVRTC it finds loaded; with
kjit[cu12] beside a CuPy built for CUDA 13 that is NVRTC 12 reading CUDA 13 headers, which
fails in CuPy, not in kjit. Users pair cupy-cuda12x with kjit[cu12], as the tests need.
"""
from __future__ import annotations

import pytest

from kjit.families import installed_family


def import_cupy():
    cp = pytest.importorskip("cupy")
    family = installed_family()
    built = cp.cuda.runtime.runtimeGetVersion() // 1000
    if family and family[0] != built:
        pytest.skip(f"CuPy is built for CUDA {built}, kjit runs the CUDA {family[0]} family: "
                    f"pair cupy-cuda{family[0]}x with kjit[cu{family[0]}]")
    return cp
