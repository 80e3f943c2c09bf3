"""Version skew (DESIGN.md): PTX from NVRTC 13.5 (.version 9.5) on a CUDA 13.0 driver.
The driver refuses that PTX; kjit must still load and run it, through nvJitLink.

The data was made by tests/data/skew/make.py with NVRTC 13.5. Run with an nvJitLink that
reads PTX 9.5 (scripts/gpu-check --skew carries nvJitLink 13.5 to the GPU machine)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kjit
from kjit import driver

pytestmark = pytest.mark.gpu
DATA = Path(__file__).parent / "data" / "skew"


def _need_skew() -> tuple[int, int]:
    from cuda.bindings import nvjitlink

    from kjit.linker.choice import cuda_version_for_ptx, ptx_too_new
    ptx = kjit.ObjectCode.from_file(DATA / "cube.ptx")
    if not ptx_too_new(ptx.ptx_version, driver.driver_version()):
        pytest.skip("this driver accepts PTX 9.5: no skew to test here")
    have = nvjitlink.version()
    if 1000 * have[0] + 10 * have[1] < cuda_version_for_ptx(ptx.ptx_version):
        pytest.skip(f"nvJitLink {have[0]}.{have[1]} cannot read PTX 9.5: run scripts/gpu-check --skew")
    return ptx.ptx_version


def _check_cube(mod: kjit.Module) -> None:
    n = 4099
    xh = np.random.default_rng().standard_normal(n).astype(np.float32)
    y = kjit.empty(n, np.float32)
    mod.get_function("cube")[kjit.cdiv(n, 256), 256](kjit.to_device(xh), y, n)
    np.testing.assert_allclose(y.get(), xh.astype(np.float64) ** 3, rtol=1e-5, atol=1e-6)


def test_driver_itself_refuses_the_new_ptx():
    _need_skew()
    drv = driver.bindings()
    driver.ensure_context()
    err, _ = drv.cuModuleLoadData((DATA / "cube.ptx").read_bytes())
    assert err == drv.CUresult.CUDA_ERROR_UNSUPPORTED_PTX_VERSION


def test_new_ptx_loads_and_runs_through_nvjitlink():
    _need_skew()
    mod = kjit.load(DATA / "cube.ptx")
    assert "nvJitLink" in mod.info_log
    _check_cube(mod)


def test_ptx_only_fatbin_with_new_ptx_loads_and_runs():
    _need_skew()
    mod = kjit.load(DATA / "cube-ptx-only.fatbin")
    assert "nvJitLink" in mod.info_log
    _check_cube(mod)
