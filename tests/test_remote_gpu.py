"""On a GPU: a binary another node compiled, read from the shared Redis tier, loads and runs
exactly like a fresh compile (and its symbol map came along)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kjit
from kjit.cache import remote

pytestmark = pytest.mark.gpu

TEMPLATE = r'''
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''


def test_a_binary_from_another_node_via_redis_loads_and_runs(remote_env, tmp_path, monkeypatch):
    monkeypatch.setenv(remote.ENV_KEY, "gpu test secret")
    arch = kjit.Device(0).arch
    src = TEMPLATE + f"// {tmp_path.name}\n"
    code = (f"import kjit; o = kjit.compile({src!r}, arch={arch!r}, name_expressions=['axpy<float>']);"
            "print(o.cache_hit)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "KJIT_CACHE_DIR": str(tmp_path / "node-a"),
                              "PYTHONPATH": os.pathsep.join([str(Path(kjit.__file__).parents[1]),
                                                             os.environ.get("PYTHONPATH", "")])})
    assert out.stdout.strip() == "False", out.stderr      # the other node compiled it
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "node-b"))
    events: list = []
    listener = kjit.cache.add_listener(events.append)
    try:
        obj = kjit.compile(src, arch=arch, name_expressions=["axpy<float>"])
    finally:
        kjit.cache.remove_listener(listener)
    assert [e.event for e in events] == ["remote_hit"]
    assert obj.cache_hit is True and obj.kind == "cubin"
    k = kjit.load(obj).get_function("axpy<float>")        # symbol map came from Redis
    n = 1000
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dx, dy = kjit.to_device(x), kjit.to_device(y)
    k[kjit.cdiv(n, 128), 128](2.5, dx, dy, n)
    np.testing.assert_allclose(dy.get(), 2.5 * x.astype(np.float64) + y, rtol=1e-6, atol=1e-7)
