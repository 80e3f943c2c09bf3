"""The corpus on a GPU: each kernel, compiled with no -I for this device, run on random
inputs and compared with numpy (the grid-wide sum through a cooperative launch)."""
from __future__ import annotations

import numpy as np
import pytest

import kjit
from kjit import driver
from corpus import entries, source

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()
BY_FILE = {e["file"]: e for e in entries()}


def kernel(file: str, name: str | None = None):
    entry = BY_FILE[file]
    major, minor = driver.compute_capability(0)
    if major * 10 + minor < entry["min_sm"]:
        pytest.skip(f"{file} needs sm_{entry['min_sm']}+, this GPU is sm_{major}{minor}")
    obj = kjit.compile(source(entry), name=file, name_expressions=entry.get("name_expressions", ()))
    return kjit.load(obj).get_function(name or entry["kernels"][0])


def test_every_corpus_entry_has_a_gpu_test():
    tested = {name[len("test_"):] for name in globals() if name.startswith("test_")}
    assert {e["file"][:-3] for e in entries()} <= tested


def test_fp16_axpy():
    k = kernel("fp16_axpy.cu")
    n = 10_000
    x = rng.standard_normal(n).astype(np.float16)
    y = rng.standard_normal(n).astype(np.float16)
    dy = kjit.to_device(y)
    k[kjit.cdiv(n, 256), 256](kjit.to_device(x), dy, 2.5, n)
    expected = (2.5 * x.astype(np.float64) + y.astype(np.float64)).astype(np.float16)  # one rounding
    np.testing.assert_allclose(dy.get().astype(np.float32), expected.astype(np.float32),
                               rtol=1e-3, atol=1e-3)


def _to_bf16_bits(f: np.ndarray) -> np.ndarray:
    b = f.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)   # nearest even


def _from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def test_bf16_scale():
    k = kernel("bf16_scale.cu")
    n = 10_000
    x = _to_bf16_bits(rng.standard_normal(n).astype(np.float32) * 10)
    out = kjit.zeros(n, np.uint16)
    k[kjit.cdiv(n, 256), 256](kjit.to_device(x), out, 1.5, -0.25, n)
    expected = _from_bf16_bits(_to_bf16_bits(_from_bf16_bits(x).astype(np.float64) * 1.5 - 0.25))
    np.testing.assert_allclose(_from_bf16_bits(out.get()), expected, rtol=2 ** -7, atol=1e-6)


def _e4m3_table() -> tuple[np.ndarray, np.ndarray]:
    """Every finite non-negative e4m3 value (bias 7, no infinities, 0x7f is NaN) and code."""
    codes = np.arange(0x7F)
    e, m = codes >> 3, codes & 7
    values = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    return values, codes


def test_fp8_roundtrip():
    k = kernel("fp8_roundtrip.cu")
    n = 4096
    x = (rng.standard_normal(n) * 60).astype(np.float32)
    x[:4] = [0.0, 448.0, 1000.0, -1000.0]                     # exact, max, saturated both ways
    back, bits = kjit.zeros(n, np.float32), kjit.zeros(n, np.uint8)
    k[kjit.cdiv(n, 256), 256](kjit.to_device(x), back, bits, n)
    values, codes = _e4m3_table()
    mag = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    idx = np.abs(mag[:, None] - values[None, :]).argmin(axis=1)   # no ties among random inputs
    expected = np.sign(x) * values[idx]
    np.testing.assert_array_equal(back.get(), expected.astype(np.float32))
    got_bits = bits.get()
    np.testing.assert_array_equal(got_bits & 0x7F, codes[idx])
    assert ((got_bits >> 7) == (x < 0)).all()


def test_wmma_gemm():
    k = kernel("wmma_gemm.cu")
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    c = kjit.zeros(256, np.float32)
    k[1, 32](kjit.to_device(a.ravel()), kjit.to_device(b.T.copy().ravel()), c)  # B column-major
    expected = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(c.get().reshape(16, 16), expected, rtol=1e-3, atol=1e-3)


def test_cub_block_reduce():
    k = kernel("cub_block_reduce.cu")
    n = 10_000
    x = rng.standard_normal(n).astype(np.float32)
    blocks = kjit.cdiv(n, 128)
    out = kjit.zeros(blocks, np.float32)
    k[blocks, 128](kjit.to_device(x), out, n)
    np.testing.assert_allclose(out.get(), np.add.reduceat(x.astype(np.float64), np.arange(0, n, 128)),
                               rtol=1e-5, atol=1e-5)


def test_cub_block_scan():
    k = kernel("cub_block_scan.cu", "block_scan<128>")
    n = 10_000
    x = rng.integers(-100, 100, n).astype(np.int32)
    out = kjit.zeros(n, np.int32)
    k[kjit.cdiv(n, 128), 128](kjit.to_device(x), out, n)
    expected = np.concatenate([np.cumsum(x[i:i + 128]) for i in range(0, n, 128)])
    np.testing.assert_array_equal(out.get(), expected)


def test_cg_warp_reduce():
    k = kernel("cg_warp_reduce.cu")
    n = 32 * 400
    x = rng.standard_normal(n).astype(np.float32)
    out = kjit.zeros(n // 32, np.float32)
    k[kjit.cdiv(n, 256), 256](kjit.to_device(x), out, n)
    np.testing.assert_allclose(out.get(), x.astype(np.float64).reshape(-1, 32).sum(axis=1),
                               rtol=1e-5, atol=1e-5)


def test_grid_sync_sum():
    k = kernel("grid_sync_sum.cu")
    n = 1 << 20
    x = rng.random(n).astype(np.float32)        # all positive: a lost block shows (1/64 of it)
    drv = driver.bindings()
    sms = driver.call(drv.cuDeviceGetAttribute,
                      drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                      driver.call(drv.cuDeviceGet, 0))
    blocks = min(k.max_active_blocks(256) * sms, 64)   # all resident at once, as sync needs
    partial, total = kjit.zeros(blocks, np.float32), kjit.zeros(1, np.float32)
    k.launch(blocks, 256, kjit.to_device(x), partial, total, n, cooperative=True)
    kjit.synchronize()
    np.testing.assert_allclose(total.get()[0], x.astype(np.float64).sum(), rtol=1e-4)


def test_atomic_ref():
    k = kernel("atomic_ref.cu")
    n, nbins = 100_000, 16
    values = rng.integers(0, 1000, n).astype(np.int32)
    bins = kjit.zeros(nbins, np.uint32)
    k[kjit.cdiv(n, 256), 256](kjit.to_device(values), bins, nbins, n)
    np.testing.assert_array_equal(bins.get(), np.bincount(values % nbins, minlength=nbins))


def test_std_complex():
    k = kernel("std_complex.cu")
    n = 5000
    a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    b = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    out = kjit.zeros(n, np.complex64)
    k[kjit.cdiv(n, 256), 256](kjit.to_device(a), kjit.to_device(b), out, n)
    np.testing.assert_allclose(out.get(), a * b + np.conj(a), rtol=1e-5, atol=1e-5)


def test_memcpy_async_barrier():
    k = kernel("memcpy_async_barrier.cu")
    blocks = 40
    x = rng.standard_normal(blocks * 256).astype(np.float32)
    out = kjit.zeros(blocks * 256, np.float32)
    k[blocks, 256](kjit.to_device(x), out)
    np.testing.assert_allclose(out.get(), 2 * x + 1, rtol=1e-6)
