"""The corpus on a GPU: each kernel, compiled with no -I for this device, run on random
inputs (fixed seeds) and compared with numpy (the grid-wide sum through a cooperative launch).
Tolerances: fp32 kernels to float32 rounding of their sums; bf16 / fp16 outputs to one
rounding of the storage type; tensor-core GEMMs (fp16/bf16 inputs, fp32 accumulation) against
float64 products of the same rounded inputs."""
from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest

import kjit
from kjit import driver
from corpus import entries, source

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(0)
BY_FILE = {e["file"]: e for e in entries()}


@pytest.fixture(autouse=True)
def _seeded_rng(request):
    """Each test draws from its own seed, so its inputs do not depend on which tests ran first."""
    global rng
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))


@functools.cache
def _module(file: str):
    """One compile and load per file, shared by the tests of its kernels."""
    entry = BY_FILE[file]
    obj = kjit.compile(source(entry), name=file, name_expressions=entry.get("name_expressions", ()))
    return kjit.load(obj)


def kernel(file: str, name: str | None = None):
    entry = BY_FILE[file]
    major, minor = driver.compute_capability(0)
    if major * 10 + minor < entry["min_sm"]:
        pytest.skip(f"{file} needs sm_{entry['min_sm']}+, this GPU is sm_{major}{minor}")
    return _module(file).get_function(name or entry["kernels"][0])


def test_every_corpus_entry_has_a_gpu_test():
    tested = {name[len("test_"):] for name in globals() if name.startswith("test_")}
    assert all(any(t == e["file"][:-3] or t.startswith(e["file"][:-3] + "_") for t in tested)
               for e in entries())


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
    x[:6] = [0.0, 448.0, 1000.0, -1000.0, -124.0, 19.0]        # exact, max, saturated both ways, ties
    back, bits = kjit.zeros(n, np.float32), kjit.zeros(n, np.uint8)
    k[kjit.cdiv(n, 256), 256](kjit.to_device(x), back, bits, n)
    values, codes = _e4m3_table()
    mag = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    dist = np.abs(mag[:, None] - values[None, :])
    nearest = dist == dist.min(axis=1, keepdims=True)
    even = nearest & (codes[None, :] % 2 == 0)                  # a tie goes to the even code
    idx = np.where(even.any(axis=1), even.argmax(axis=1), nearest.argmax(axis=1))
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


# --- llm.c-style kernels (cooperative groups, bf16) --------------------------------------

def _layernorm_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray):
    mean = x.mean(axis=1)
    rstd = 1.0 / np.sqrt(((x - mean[:, None]) ** 2).mean(axis=1) + 1e-5)
    return (x - mean[:, None]) * rstd[:, None] * w + b, mean, rstd


def test_llmc_layernorm_forward_fp32():
    k = kernel("llmc_layernorm_forward.cu", "layernorm_forward_kernel3<float>")
    N, C = 64, 300                                   # C not a multiple of the warp
    x = (rng.standard_normal((N, C)) * 2 + 0.5).astype(np.float32)
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    out, mean, rstd = kjit.zeros(N * C, np.float32), kjit.zeros(N, np.float32), kjit.zeros(N, np.float32)
    k[kjit.cdiv(N * 32, 128), 128](out, mean, rstd, kjit.to_device(x.ravel()),
                                    kjit.to_device(w), kjit.to_device(b), N, C)
    y, m, s = _layernorm_reference(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(mean.get(), m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd.get(), s, rtol=1e-5)
    np.testing.assert_allclose(out.get().reshape(N, C), y, rtol=1e-4, atol=1e-4)


def test_llmc_layernorm_forward_bf16():
    k = kernel("llmc_layernorm_forward.cu", "layernorm_forward_kernel3<__nv_bfloat16>")
    N, C = 64, 256
    x = _to_bf16_bits(rng.standard_normal((N, C)).astype(np.float32) * 3 - 1).ravel()
    w = _to_bf16_bits(rng.standard_normal(C).astype(np.float32))
    b = _to_bf16_bits(rng.standard_normal(C).astype(np.float32))
    out, mean, rstd = kjit.zeros(N * C, np.uint16), kjit.zeros(N, np.float32), kjit.zeros(N, np.float32)
    k[kjit.cdiv(N * 32, 128), 128](out, mean, rstd, kjit.to_device(x), kjit.to_device(w),
                                    kjit.to_device(b), N, C)
    y, m, s = _layernorm_reference(*(_from_bf16_bits(a).astype(np.float64) for a in
                                     (x.reshape(N, C), w, b)))
    np.testing.assert_allclose(mean.get(), m, rtol=1e-5, atol=1e-6)   # statistics stay float
    np.testing.assert_allclose(rstd.get(), s, rtol=1e-5)
    expected = _from_bf16_bits(_to_bf16_bits(y))                       # one bf16 rounding
    np.testing.assert_allclose(_from_bf16_bits(out.get()).reshape(N, C), expected,
                               rtol=2 ** -7, atol=1e-5)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_llmc_softmax_forward_online():
    k = kernel("llmc_softmax_forward.cu", "softmax_forward_online_kernel")
    N, C = 64, 300
    x = (rng.standard_normal((N, C)) * 4).astype(np.float32)
    x[0, :] = -50.0                                  # a flat row: every lane starts equal
    out = kjit.zeros(N * C, np.float32)
    k[kjit.cdiv(N, 4), 128](out, kjit.to_device(x.ravel()), N, C)   # one warp per row
    np.testing.assert_allclose(out.get().reshape(N, C), _softmax(x.astype(np.float64)),
                               rtol=1e-4, atol=1e-8)


def test_llmc_softmax_forward_block():
    k = kernel("llmc_softmax_forward.cu", "softmax_forward_kernel4")
    N, C, threads = 48, 1000, 256
    x = (rng.standard_normal((N, C)) * 4).astype(np.float32)
    out = kjit.zeros(N * C, np.float32)
    k.launch(N, threads, out, kjit.to_device(x.ravel()), N, C,
             shared_mem=2 * (threads // 32) * 4)     # one max and one sum per warp
    got = out.get().reshape(N, C)
    np.testing.assert_allclose(got, _softmax(x.astype(np.float64)), rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def test_llmc_gelu_forward_fp32():
    k = kernel("llmc_gelu_forward.cu", "gelu_forward_kernel1")
    n = 10_000
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    out = kjit.zeros(n, np.float32)
    k[kjit.cdiv(n, 256), 256](out, kjit.to_device(x), n)
    np.testing.assert_allclose(out.get(), _gelu(x.astype(np.float64)), rtol=1e-4, atol=1e-6)


def test_llmc_gelu_forward_bf16_packed():
    k = kernel("llmc_gelu_forward.cu", "gelu_forward_kernel2")
    n = 8192                                          # 8 bf16 per thread, one int4 each way
    x = _to_bf16_bits(rng.standard_normal(n).astype(np.float32) * 3)
    out = kjit.zeros(n, np.uint16)
    k[kjit.cdiv(n, 128 * 8), 128](out, kjit.to_device(x), n)
    expected = _from_bf16_bits(_to_bf16_bits(_gelu(_from_bf16_bits(x).astype(np.float64))))
    np.testing.assert_allclose(_from_bf16_bits(out.get()), expected, rtol=2 ** -7, atol=1e-5)


def test_flash_attention_minimal():
    k = kernel("flash_attention_minimal.cu")
    B, nh, N, d, Bc, Br = 2, 2, 64, 32, 32, 32
    q, kk, v = (rng.standard_normal((B, nh, N, d)).astype(np.float32) for _ in range(3))
    scale = float(1.0 / np.sqrt(d))
    l = kjit.zeros(B * nh * N, np.float32)
    m = kjit.to_device(np.full(B * nh * N, -np.inf, np.float32))
    o = kjit.zeros(B * nh * N * d, np.float32)
    sram = (3 * Bc * d + Bc * Br) * 4
    k.launch((B, nh), Bc, kjit.to_device(q.ravel()), kjit.to_device(kk.ravel()),
             kjit.to_device(v.ravel()), N, d, N // Bc, N // Br, Bc, Br, scale, l, m, o,
             shared_mem=sram)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk.astype(np.float64)) * scale
    expected = np.einsum("bhqk,bhkd->bhqd", _softmax(s.reshape(-1, N)).reshape(s.shape),
                         v.astype(np.float64))
    np.testing.assert_allclose(o.get().reshape(B, nh, N, d), expected, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(m.get().reshape(B, nh, N), s.max(axis=-1), rtol=1e-5, atol=1e-5)


# --- SGEMM tutorial stages (C = alpha * A @ B + beta * C) -----------------------------------

SGEMM = {   # name expression -> (grid, block) for M, N
    "sgemm_naive": (lambda M, N: (kjit.cdiv(M, 32), kjit.cdiv(N, 32)), (32, 32)),
    "sgemm_global_mem_coalesce<32>": (lambda M, N: (kjit.cdiv(M, 32), kjit.cdiv(N, 32)), 1024),
    "sgemm_shared_mem_block<32>": (lambda M, N: (kjit.cdiv(M, 32), kjit.cdiv(N, 32)), 1024),
    "sgemmVectorize<128, 128, 8, 8, 8>": (lambda M, N: (kjit.cdiv(N, 128), kjit.cdiv(M, 128)), 256),
}


@pytest.mark.parametrize("name", list(SGEMM), ids=lambda n: n.split("<")[0])
def test_sgemm_tutorial(name):
    k = kernel("sgemm_tutorial.cu", name)
    M, N, K, alpha, beta = 256, 384, 128, 0.5, -1.5     # multiples of every stage's tiles
    a, b, c = (rng.standard_normal(shape).astype(np.float32) for shape in ((M, K), (K, N), (M, N)))
    dc = kjit.to_device(c.ravel())
    grid, block = SGEMM[name]
    k[grid(M, N), block](M, N, K, alpha, kjit.to_device(a.ravel()), kjit.to_device(b.ravel()), beta, dc)
    expected = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c
    np.testing.assert_allclose(dc.get().reshape(M, N), expected, rtol=1e-4, atol=1e-3)


# --- CUB block algorithms ----------------------------------------------------------------

def test_cub_block_radix_sort_keys():
    k = kernel("cub_block_radix_sort.cu", "BlockSortKernel<int, 128, 4>")
    tile, blocks = 128 * 4, 8
    x = rng.integers(-2 ** 31, 2 ** 31, tile * blocks, dtype=np.int64).astype(np.int32)
    out = kjit.zeros(tile * blocks, np.int32)
    k[blocks, 128](kjit.to_device(x), out)
    np.testing.assert_array_equal(out.get().reshape(blocks, tile), np.sort(x.reshape(blocks, tile), axis=1))


def test_cub_block_radix_sort_pairs():
    k = kernel("cub_block_radix_sort.cu", "BlockSortPairsKernel<128, 4>")
    tile, blocks = 128 * 4, 8
    keys = rng.standard_normal(tile * blocks).astype(np.float32)
    values = np.arange(tile * blocks, dtype=np.int32)
    keys_out, values_out = kjit.zeros(tile * blocks, np.float32), kjit.zeros(tile * blocks, np.int32)
    k[blocks, 128](kjit.to_device(keys), kjit.to_device(values), keys_out, values_out)
    order = np.argsort(keys.reshape(blocks, tile), axis=1, kind="stable")
    np.testing.assert_array_equal(keys_out.get().reshape(blocks, tile),
                                  np.take_along_axis(keys.reshape(blocks, tile), order, axis=1))
    np.testing.assert_array_equal(values_out.get().reshape(blocks, tile),
                                  np.take_along_axis(values.reshape(blocks, tile), order, axis=1))


@pytest.mark.parametrize("algorithm", ["BLOCK_SCAN_RAKING", "BLOCK_SCAN_WARP_SCANS"])
def test_cub_block_load_scan_store(algorithm):
    k = kernel("cub_block_load_scan_store.cu", f"BlockPrefixSumKernel<128, 4, cub::{algorithm}>")
    tile, blocks = 128 * 4, 10
    x = rng.integers(-100, 100, tile * blocks).astype(np.int32)
    out, aggregates = kjit.zeros(tile * blocks, np.int32), kjit.zeros(blocks, np.int32)
    k[blocks, 128](kjit.to_device(x), out, aggregates)
    tiles = x.reshape(blocks, tile)
    np.testing.assert_array_equal(out.get().reshape(blocks, tile), np.cumsum(tiles, axis=1) - tiles)
    np.testing.assert_array_equal(aggregates.get(), tiles.sum(axis=1))


@pytest.mark.parametrize("algorithm", ["BLOCK_REDUCE_WARP_REDUCTIONS", "BLOCK_REDUCE_RAKING"])
def test_cub_block_reduce_items(algorithm):
    k = kernel("cub_block_reduce_items.cu", f"BlockReduceKernel<128, 4, cub::{algorithm}>")
    tile, blocks = 128 * 4, 10
    x = rng.integers(-10_000, 10_000, tile * blocks).astype(np.int32)
    sums, maxes = kjit.zeros(blocks, np.int32), kjit.zeros(blocks, np.int32)
    k[blocks, 128](kjit.to_device(x), sums, maxes)
    np.testing.assert_array_equal(sums.get(), x.reshape(blocks, tile).sum(axis=1))
    np.testing.assert_array_equal(maxes.get(), x.reshape(blocks, tile).max(axis=1))


# --- tensor cores ----------------------------------------------------------------------------

def test_wmma_gemm_tiled():
    k = kernel("wmma_gemm_tiled.cu")
    M, N, K, alpha, beta = 128, 192, 64, 2.0, 0.5
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = rng.standard_normal((M, N)).astype(np.float32)
    dc = kjit.to_device(c.ravel())
    k[(M // 64, N // 64), (128, 4)](kjit.to_device(a.ravel()), kjit.to_device(b.ravel()), dc,
                                     M, N, K, alpha, beta)
    expected = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c
    np.testing.assert_allclose(dc.get().reshape(M, N), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_mma_sync_gemm(dtype):
    name = "mma_gemm_m16n8k16<__nv_bfloat16>" if dtype == "bf16" else "mma_gemm_m16n8k16<half>"
    k = kernel("mma_sync_gemm.cu", name)
    M, N, K = 64, 96, 80                              # M, N multiples of 32, K of 16
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    if dtype == "bf16":
        a_dev, b_dev = _to_bf16_bits(a), _to_bf16_bits(b)
        a64, b64 = _from_bf16_bits(a_dev).astype(np.float64), _from_bf16_bits(b_dev).astype(np.float64)
    else:
        a_dev, b_dev = a.astype(np.float16), b.astype(np.float16)
        a64, b64 = a_dev.astype(np.float64), b_dev.astype(np.float64)
    c = kjit.zeros(M * N, np.float32)
    k[(N // 32, M // 32), 128](kjit.to_device(a_dev.ravel()), kjit.to_device(b_dev.ravel()), c, M, N, K)
    np.testing.assert_allclose(c.get().reshape(M, N), a64 @ b64, rtol=1e-3, atol=1e-3)


# --- asynchronous copies, transpose, histogram -----------------------------------------------

def test_memcpy_async_pipeline_two_stages():
    k = kernel("memcpy_async_pipeline.cu", "pipeline_batch_sum<2>")
    blocks, threads, batches = 8, 128, 6
    x = rng.standard_normal(blocks * threads * batches).astype(np.float32)
    out = kjit.zeros(blocks * threads, np.float32)
    k.launch(blocks, threads, out, kjit.to_device(x), batches, shared_mem=2 * threads * 4)
    np.testing.assert_allclose(out.get(), x.astype(np.float64).reshape(batches, -1).sum(axis=0),
                               rtol=1e-5, atol=1e-5)


def test_memcpy_async_pipeline_cg_double_buffer():
    k = kernel("memcpy_async_pipeline.cu", "cg_double_buffer_sum")
    blocks, tiles = 20, 5
    x = rng.random(blocks * tiles * 256).astype(np.float32)   # positive: a lost tile shows
    sums = kjit.zeros(blocks, np.float32)
    k[blocks, 256](kjit.to_device(x), sums, tiles)
    np.testing.assert_allclose(sums.get(), x.astype(np.float64).reshape(blocks, -1).sum(axis=1),
                               rtol=1e-5)


@pytest.mark.parametrize("name", ["transposeNaive", "transposeNoBankConflicts"])
def test_transpose_smem(name):
    k = kernel("transpose_smem.cu", name)
    height, width = 70, 100                             # neither a multiple of the tile
    x = rng.standard_normal((height, width)).astype(np.float32)
    out = kjit.zeros(width * height, np.float32)
    k[(kjit.cdiv(width, 32), kjit.cdiv(height, 32)), (32, 8)](out, kjit.to_device(x.ravel()),
                                                              width, height)
    np.testing.assert_array_equal(out.get().reshape(width, height), x.T)


def test_histogram256_shared_atomics():
    k = kernel("histogram256.cu", "histogram256Kernel")
    words = 100_000
    data = rng.binomial(255, 0.3, words * 4).astype(np.uint8)    # skewed: contended bins
    hist = kjit.zeros(256, np.uint32)
    k[64, 256](hist, kjit.to_device(data.view(np.uint32)), words)
    np.testing.assert_array_equal(hist.get(), np.bincount(data, minlength=256))


def test_histogram256_global_atomics():
    k = kernel("histogram256.cu", "histogramGlobalAtomics")
    n = 50_000
    data = rng.integers(0, 256, n).astype(np.uint8)
    hist = kjit.zeros(256, np.uint32)
    k[kjit.cdiv(n, 256), 256](hist, kjit.to_device(data), n)
    np.testing.assert_array_equal(hist.get(), np.bincount(data, minlength=256))
