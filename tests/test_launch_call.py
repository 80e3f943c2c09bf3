"""The compiled launch call (kjit/runtime/_launch.c) and its fallback to cuda.bindings."""
import pytest

from kjit import driver
from kjit.runtime.kernel import c_launch


def test_fallback_when_asked(monkeypatch):
    monkeypatch.setenv("KJIT_LAUNCH", "bindings")
    assert c_launch() is None


def test_without_a_driver_kjit_falls_back_and_the_extension_says_why():
    if driver.available():
        pytest.skip("a CUDA driver is present: the GPU tests launch through the C call")
    assert c_launch() is None
    _launch = pytest.importorskip("kjit.runtime._launch", reason="C launch call not built here")
    with pytest.raises(OSError, match="libcuda"):
        _launch.bind()
    with pytest.raises(RuntimeError, match="bind"):
        _launch.launch(*([0] * 10))


@pytest.mark.gpu
def test_gpu_kernels_launch_through_the_c_call_when_built():
    import numpy as np

    import kjit
    pytest.importorskip("kjit.runtime._launch", reason="C launch call not built here")
    k = kjit.load(kjit.compile('extern "C" __global__ void f(int* p) { p[threadIdx.x] = threadIdx.x; }')
                  ).get_function("f")
    assert k._c_launch is not None
    out = kjit.zeros(32, np.int32)
    k[1, 32](out)
    assert out.get().tolist() == list(range(32))
