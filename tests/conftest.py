"""Shared fixtures. GPU tests carry @pytest.mark.gpu and skip, with the reason, where no
CUDA driver or device exists."""
from __future__ import annotations

import pytest

# A real redis-server for the shared cache tier's tests (skips, with the reason, without one)
from redis_server import redis_server, remote_env  # noqa: F401  (fixtures)

SAXPY = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''

TEMPLATE = r'''
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''


def _gpu_reason() -> str | None:
    from kjit import driver
    try:
        driver.init()
    except Exception:   # one short line per skipped file: `kjit info` says why in full
        return "GPU test: no CUDA driver here"
    try:
        if driver.device_count() == 0:
            return "CUDA driver present but no device"
    except Exception as exc:
        return f"no CUDA device: {exc}"
    return None


def pytest_collection_modifyitems(config, items):
    # JAX starts threads when it first runs, after which a test's os.fork() may deadlock the
    # child (Python warns so): the tests that run JAX in this process go last
    items.sort(key=lambda i: "jax" in i.nodeid.split("::")[0])
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if not gpu_items:
        return
    reason = _gpu_reason()
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _cuda_context_restored(request):
    """A GPU test leaves the thread's current CUDA context as it found it: PyTorch and CuPy
    take their current device from it, so a test leaving device 1's current would put the
    next test's tensors there. One that does is named in a warning, and the context put back."""
    if "gpu" not in request.keywords or _gpu_reason():
        yield
        return
    from kjit import driver
    before = driver.current_context()
    yield
    after = driver.current_context()
    # no context current reads as device 0, the one kjit and the frameworks make current then
    was, now = (driver.context_device(c) if c is not None else 0 for c in (before, after))
    if now != was:
        import warnings
        warnings.warn(f"{request.node.nodeid} left device {now}'s context current (device {was} "
                      "before it)", RuntimeWarning)
        driver.call(driver.bindings().cuCtxSetCurrent, before if before is not None else 0)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own cache directory, so tests never see each other's entries."""
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path_factory.mktemp("kjit-cache")))
    monkeypatch.delenv("KJIT_ARCH", raising=False)
    yield


@pytest.fixture(autouse=True)
def _header_edits_are_settled(monkeypatch):
    """Tests write a header and compile the next instant; a user's edit comes a moment before.
    A header changed within the file system's clock tick of a compile's start is not trusted
    to key it (docs/headers.md), so here the tick is taken as zero; the tests of that rule
    (test_observe_changes.py) ask for the real one."""
    from kjit.compiler.keys import snapshot
    monkeypatch.setattr(snapshot, "timestamp_granularity", lambda: 0.0)


@pytest.fixture
def saxpy_src() -> str:
    return SAXPY


@pytest.fixture
def template_src() -> str:
    return TEMPLATE
