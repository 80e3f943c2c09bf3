"""A kjit kernel as a JAX function on the GPU: eager and under jax.jit, outputs like an input
and by shape, scalars, a grid function, jax.vmap's two rules, a backward through
jax.custom_vjp trained with jax.grad, the second GPU, XLA's command buffers (CUDA graphs)
replaying the call, kjit's cache serving a second process, and a failed launch returned as
XLA's error rather than a crash."""
from __future__ import annotations

import functools
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kjit
from kjit.errors import ArgumentError

pytestmark = pytest.mark.gpu
jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'kjit[jax]')")
import jax.numpy as jnp  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCALE = r'''
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}'''


@functools.lru_cache(maxsize=None)
def _gpus() -> tuple:
    """JAX's GPUs, asked once a test runs (never while tests are collected). JAX's first use
    makes every GPU's context and leaves the last one current in this thread: what was current
    is put back, so PyTorch and kjit in later tests see the device they would have."""
    from kjit import driver
    before = driver.current_context()
    try:
        return tuple(jax.devices("gpu"))
    except RuntimeError:
        return ()
    finally:
        driver.call(driver.bindings().cuCtxSetCurrent, before if before is not None else 0)


@pytest.fixture(autouse=True)
def _jax_has_a_gpu():
    if not _gpus():
        pytest.skip("JAX has no GPU backend here (jax[cuda13] not installed)")


@kjit.kernel
def scale():
    return SCALE


@kjit.kernel
def split():
    return r'''
    extern "C" __global__ void split(const float* x, float* lo, float* hi, int n, float cut) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) { lo[i] = fminf(x[i], cut); hi[i] = fmaxf(x[i], cut); }
    }'''


def size_grid(x, y, a, n):
    return (kjit.cdiv(n, 128),)


def test_versions(capsys):
    """Not a check: what the run was made with (jax, jaxlib, the FFI API version, GPUs)."""
    import jaxlib
    from kjit.runtime import jax_ffi
    with capsys.disabled():
        print(f"\n[jax {jax.__version__}, jaxlib {jaxlib.__version__}, XLA FFI API "
              f"{jax_ffi.framework_api_version()}, devices {_gpus()}]")


def test_eager_and_jit_give_the_kernels_result():
    f = scale.as_jax_op(grid=size_grid, block=128, outputs={"y": "x"})
    x = jnp.arange(1000, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(f(x, 2.0, 1000)), 2 * np.arange(1000))
    g = jax.jit(lambda x: f(x, 3.0, 1000) + 1)
    np.testing.assert_array_equal(np.asarray(g(x)), 3 * np.arange(1000) + 1)
    np.testing.assert_array_equal(np.asarray(f(x=x, a=-1.0, n=1000)), -np.arange(1000))


def test_outputs_by_shape_and_several_results_and_a_loaded_kernel():
    k = kjit.load(kjit.compile(SCALE)).get_function("scale")   # a Kernel, not a decorated function
    f = k.as_jax_op(grid=(1,), block=128, outputs={"y": ((100,), jnp.float32)})
    out = f(jnp.ones(500, jnp.float32), 4.0, 100)
    assert out.shape == (100,)
    np.testing.assert_array_equal(np.asarray(out), 4.0)
    g = split.as_jax_op(grid=lambda x, lo, hi, n, cut: (kjit.cdiv(n, 64),), block=64,
                        outputs={"lo": "x", "hi": "x"})
    lo, hi = jax.jit(lambda x: g(x, 300, 0.5))(jnp.linspace(0, 1, 300, dtype=jnp.float32))
    assert float(lo.max()) == 0.5 and float(hi.min()) == 0.5


def test_vmap_sequential_and_broadcast():
    xb = jnp.arange(3 * 1000, dtype=jnp.float32).reshape(3, 1000)
    seq = scale.as_jax_op(grid=size_grid, block=128, outputs={"y": "x"})
    out = jax.jit(jax.vmap(lambda x: seq(x, 2.0, 1000)))(xb)
    np.testing.assert_array_equal(np.asarray(out), 2 * np.asarray(xb))
    whole = scale.as_jax_op(grid=lambda x, y, a, n: (kjit.cdiv(x.size, 128),), block=128,
                            outputs={"y": "x"}, vmap="broadcast")
    out = jax.vmap(lambda x: whole(x, 2.0, 3000))(xb)
    np.testing.assert_array_equal(np.asarray(out), 2 * np.asarray(xb))


def test_custom_vjp_trains_with_grad():
    example = runpy.run_path(str(REPO / "examples" / "jax_train.py"))
    first, last = example["train"](steps=50)
    assert last < first * 0.05, (first, last)
    x = jnp.linspace(-1, 1, 256, dtype=jnp.float32)
    w = jnp.float32(0.3)
    g = jax.grad(lambda w: example["smooth_relu"](w * x).sum())(w)
    ref = jax.grad(lambda w: jax.nn.softplus(w * x).sum())(w)
    np.testing.assert_allclose(float(g), float(ref), rtol=1e-4)


def test_second_device_runs_where_its_arrays_are():
    if len(_gpus()) < 2:
        pytest.skip("one GPU: no second device")
    f = scale.as_jax_op(grid=size_grid, block=128, outputs={"y": "x"})
    d1 = _gpus()[1]
    x = jax.device_put(jnp.arange(1000, dtype=jnp.float32), d1)
    for out in (f(x, 2.0, 1000), jax.jit(lambda x: f(x, 5.0, 1000))(x)):
        assert out.devices() == {d1}
    np.testing.assert_array_equal(np.asarray(f(x, 2.0, 1000)), 2 * np.arange(1000))
    x0 = jax.device_put(jnp.arange(1000, dtype=jnp.float32), _gpus()[0])
    np.testing.assert_array_equal(np.asarray(f(x0, 2.0, 1000)), 2 * np.arange(1000))


COMMAND_BUFFER = r'''
import json, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, sys.argv[1])
import kjit
@kjit.kernel
def scale():
    return """extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i]; }"""
f = scale.as_jax_op(grid=lambda x, y, a, n: (kjit.cdiv(n, 128),), block=128, outputs={"y": "x"})
step = jax.jit(lambda x: jnp.sin(f(jnp.cos(x) * 2, 3.0, 4096)) + 1)
from kjit.runtime import _xla
ok = []
before = _xla.launches()
for k in range(8):   # new inputs each time: a replay must read this call's buffers
    x = jnp.full(4096, 0.1 * k, jnp.float32)
    want = np.sin(3.0 * (np.cos(np.float32(0.1 * k)) * 2)) + 1
    ok.append(bool(np.allclose(np.asarray(step(x)), want, rtol=1e-5)))
# XLA runs the handler while it records the command buffer and replays the graph after that:
# far fewer handler launches than calls
print(json.dumps({"ok": ok, "launches": _xla.launches() - before, "calls": len(ok)}))
'''


@pytest.mark.parametrize("buffers", [True, False])
def test_command_buffers_capture_the_call_and_replay_right(buffers):
    flags = ("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
             if buffers else "--xla_gpu_enable_command_buffer=")
    proc = subprocess.run([sys.executable, "-c", COMMAND_BUFFER, str(REPO)], capture_output=True,
                          text=True, env=dict(os.environ, XLA_FLAGS=flags), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert all(result["ok"]), result
    if buffers:
        assert result["launches"] <= result["calls"] // 2, f"XLA replayed no command buffer: {result}"
    else:   # without command buffers every call reaches the handler
        assert result["launches"] == result["calls"], result


SECOND_PROCESS = r'''
import sys
sys.path.insert(0, sys.argv[1])
import jax.numpy as jnp, kjit
@kjit.kernel
def scale():
    return sys.argv[2]
f = scale.as_jax_op(grid=(8,), block=128, outputs={"y": "x"})
assert float(f(jnp.ones(1000, jnp.float32), 2.0, 1000).sum()) == 2000.0
print(scale.object.cache_hit)
'''


def test_a_second_process_finds_the_code_in_kjits_cache():
    # one GPU: with two, the second device's load is a cache hit in the first process too
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    runs = [subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(REPO), SCALE], text=True,
                           capture_output=True, timeout=300, env=env) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-2000:]
    assert [r.stdout.split()[-1] for r in runs] == ["False", "True"]


def test_a_failed_launch_is_xlas_error_not_a_crash():
    f = scale.as_jax_op(grid=(1,), block=(4096,), outputs={"y": "x"})   # over 1024 threads
    with pytest.raises(Exception) as exc:
        jax.block_until_ready(f(jnp.ones(8, jnp.float32), 2.0, 8))
    assert "kernel scale: cuLaunchKernel failed" in str(exc.value)


def test_a_host_array_is_refused_naming_the_parameter():
    f = scale.as_jax_op(grid=(1,), block=128, outputs={"y": "x"})
    with pytest.raises(ArgumentError, match="parameter 0 'x'.*host"):
        f(np.ones(8, np.float32), 2.0, 8)
    cpu = jax.devices("cpu")[0] if jax.devices("cpu") else None
    if cpu is not None:
        with pytest.raises(ArgumentError, match="parameter 0 'x'.*on cpu"):
            f(jax.device_put(jnp.ones(8, jnp.float32), cpu), 2.0, 8)
