"""The nvcc-style kernels of tests/data/nvcc_kernels, compiled unchanged, run and match numpy;
a device assert that fires is reported as one (issue 19)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kjit

from test_std_headers import KERNELS, NAME_EXPRESSIONS

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()
REPO = Path(__file__).resolve().parents[1]


def _module(fname: str) -> kjit.Module:
    return kjit.load(kjit.compile((KERNELS / fname).read_text(), name=fname,
                                  name_expressions=NAME_EXPRESSIONS[fname]))


def test_sgemm_tiled_and_naive_match_numpy():
    mod = _module("sgemm.cu")
    M, N, K = 256, 384, 128
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C0 = rng.standard_normal((M, N)).astype(np.float32)
    alpha, beta = 1.5, -0.5
    expect = alpha * (A.astype(np.float64) @ B.astype(np.float64)) + beta * C0
    dA, dB = kjit.to_device(A), kjit.to_device(B)
    launches = {  # expression -> (grid, block)
        "sgemm2DBlocktiling<128, 128, 8, 8, 8>": ((N // 128, M // 128), (128 * 128) // (8 * 8)),
        "sgemm2DBlocktiling<64, 64, 8, 4, 4, true>": ((N // 64, M // 64), (64 * 64) // (4 * 4)),
        "sgemm_naive": ((kjit.cdiv(M, 16), kjit.cdiv(N, 16)), (16, 16)),
    }
    for expr, (grid, block) in launches.items():
        if "true" in expr:
            continue   # the printing instance: test_device_printf_reaches_stdout
        C = kjit.to_device(C0)
        mod.get_function(expr)[grid, block](M, N, K, alpha, dA, dB, beta, C)
        np.testing.assert_allclose(C.get(), expect, rtol=1e-4, atol=1e-3, err_msg=expr)


def test_softmax_matches_numpy():
    mod = _module("softmax.cu")
    rows, cols = 37, 1000
    x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    expect = e / e.sum(axis=1, keepdims=True)
    for block in (256, 128):
        out = kjit.zeros((rows, cols), np.float32)
        mod.get_function(f"softmax_forward<{block}>")[rows, block](out, kjit.to_device(x), rows, cols)
        got = out.get()
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)


def test_layernorm_matches_numpy():
    mod = _module("layernorm.cu")
    N, C, eps = 50, 768, 1e-5
    x = rng.standard_normal((N, C)).astype(np.float32)
    w = rng.standard_normal(C).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    out, mean, rstd = kjit.zeros((N, C), np.float32), kjit.zeros(N, np.float32), kjit.zeros(N, np.float32)
    mod.get_function("layernorm_forward<float, 4>")[kjit.cdiv(N, 4), 128](
        out, mean, rstd, kjit.to_device(x), kjit.to_device(w), kjit.to_device(b), N, C, eps)
    x64 = x.astype(np.float64)
    m = x64.mean(axis=1)
    s = 1.0 / np.sqrt(x64.var(axis=1) + eps)
    np.testing.assert_allclose(mean.get(), m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd.get(), s, rtol=1e-4)
    np.testing.assert_allclose(out.get(), (x64 - m[:, None]) * s[:, None] * w + b, rtol=1e-4, atol=1e-4)


def test_reductions_match_numpy():
    mod = _module("reduce.cu")
    cases = (("reduce_sum<float, 256>", 256, rng.standard_normal(1_000_003).astype(np.float32), 1e-4),
             ("reduce_sum<int, 256>", 256, rng.integers(-100, 100, 777_777).astype(np.int32), 0),
             ("reduce_sum<double, 128>", 128, rng.standard_normal(100_001), 1e-12))
    for expr, block, data, rtol in cases:
        out = kjit.zeros(1, data.dtype)
        mod.get_function(expr)[120, block](kjit.to_device(data), out, data.size)
        expect = data.astype(np.float64).sum() if rtol else int(data.astype(np.int64).sum())
        if rtol:
            np.testing.assert_allclose(out.get()[0], expect, rtol=rtol, atol=0.05, err_msg=expr)
        else:
            assert int(out.get()[0]) == expect, expr

    values = rng.integers(-1_000_000, 1_000_000, 5000).astype(np.int32)
    values[[1234, 4321]] = -2_000_000   # the minimum twice: the first index wins
    vmin, imin = kjit.zeros(1, np.int32), kjit.zeros(1, np.int32)
    mod.get_function("argmin_int<256>")[1, 256](kjit.to_device(values), values.size, vmin, imin)
    assert (int(vmin.get()[0]), int(imin.get()[0])) == (-2_000_000, 1234)


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(KERNELS)],
                          capture_output=True, text=True, timeout=300, env=env)


def test_device_printf_reaches_stdout():
    res = _run('''
        import sys, numpy as np, kjit
        src = open(sys.argv[1] + "/sgemm.cu").read()
        expr = "sgemm2DBlocktiling<64, 64, 8, 4, 4, true>"
        k = kjit.load(kjit.compile(src, name="sgemm.cu", name_expressions=[expr])).get_function(expr)
        M = N = 128; K = 64
        a, b, c = kjit.zeros(M * K, np.float32), kjit.zeros(K * N, np.float32), kjit.zeros(M * N, np.float32)
        k[(N // 64, M // 64), 256](M, N, K, 1.0, a, b, 0.0, c)
        kjit.synchronize()
        print("DONE")
    ''')
    assert res.returncode == 0, res.stderr
    assert "sgemm: M=128 N=128 K=64 tiles=2x2" in res.stdout and "DONE" in res.stdout, res.stdout


def test_a_failed_device_assert_is_reported_as_one():
    # softmax_forward<256> asserts blockDim.x == 256; launching it with 128 threads fires it.
    # In a child process: after a device assert every CUDA call in the process fails.
    res = _run('''
        import sys, numpy as np, kjit
        src = open(sys.argv[1] + "/softmax.cu").read()
        x, out = kjit.zeros(4 * 100, np.float32), kjit.zeros(4 * 100, np.float32)
        quiet = kjit.compile(src, name_expressions=["softmax_forward<256>"],
                             options=kjit.CompileOptions(defines={"NDEBUG": None}))
        kjit.load(quiet).get_function("softmax_forward<256>")[4, 128](out, x, 4, 100)
        kjit.synchronize()
        print("NDEBUG: no assert")
        loud = kjit.compile(src, name_expressions=["softmax_forward<256>"])
        kjit.load(loud).get_function("softmax_forward<256>")[4, 128](out, x, 4, 100)
        try:
            kjit.synchronize()
            print("NOT RAISED")
        except kjit.DriverError as e:
            print("CAUGHT", e.cuda_name, e.context_unusable)
            print(e)
        try:
            out.get()
            print("STILL USABLE")
        except kjit.DriverError as e:
            print("LATER", e.cuda_name, e.context_unusable)
    ''')
    out = res.stdout
    assert "NDEBUG: no assert" in out, res.stderr
    assert "CAUGHT CUDA_ERROR_ASSERT True" in out, out + res.stderr
    assert "A device-side assert fired" in out and "The CUDA context is now unusable" in out, out
    assert "softmax_forward" in out, out     # the kernel launched last is named
    assert "LATER CUDA_ERROR_ASSERT True" in out, out
