"""On a GPU: what the cache returns loads and runs exactly like a fresh compile."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kjit
from kjit.cache import lookup

pytestmark = pytest.mark.gpu

TEMPLATE = r'''
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''


def test_disk_hit_from_another_process_loads_and_runs(tmp_path):
    arch = kjit.Device(0).arch
    src = TEMPLATE + f"// {tmp_path.name}\n"
    code = (f"import kjit; o = kjit.compile({src!r}, arch={arch!r}, name_expressions=['axpy<float>']);"
            "print(o.cache_hit)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ,
                              "PYTHONPATH": os.pathsep.join([str(Path(kjit.__file__).parents[1]),
                                                             os.environ.get("PYTHONPATH", "")])})
    assert out.stdout.strip() == "False", out.stderr      # the other process compiled it
    lookup.current().memory.clear()
    obj = kjit.compile(src, arch=arch, name_expressions=["axpy<float>"])
    assert obj.cache_hit is True and obj.kind == "cubin"  # read back from disk
    k = kjit.load(obj).get_function("axpy<float>")        # symbol map came from the cache
    n = 1000
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dx, dy = kjit.to_device(x), kjit.to_device(y)
    k[kjit.cdiv(n, 128), 128](2.5, dx, dy, n)
    np.testing.assert_allclose(dy.get(), 2.5 * x.astype(np.float64) + y, rtol=1e-6, atol=1e-7)  # GPU FMA


def test_default_arch_compile_is_keyed_on_the_device(saxpy_src):
    """arch=None means the current device: the key must use the resolved arch."""
    a = kjit.compile(saxpy_src)
    b = kjit.compile(saxpy_src, arch=kjit.Device(0).arch)
    assert a.cache_hit is False and b.cache_hit is True and a.code == b.code
