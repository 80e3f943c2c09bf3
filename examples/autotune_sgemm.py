"""Autotuning a register-blocked SGEMM written the nvcc way.

The kernel is ordinary CUDA C++: a template over the block tile (BM x BN, BK deep) and the
thread tile (TM x TN), with A stored transposed in shared memory, float4 loads and stores,
and two shared-memory stages so the next tile's global loads overlap this tile's math.
`@kjit.autotune` compiles every configuration (in parallel), skips those that do not
compile or do not fit the device, times the rest on the real arguments and keeps the
timings in kjit's cache: the next run (or another node sharing the Redis tier) times nothing.

    python examples/autotune_sgemm.py            # 2048 x 2048
"""
import itertools
import sys

import kjit
from kjit import cdiv
Config = kjit.autotune.Config

SGEMM = r'''
template <int Bm, int Bn, int Bk, int Tm, int Tn>
__device__ __forceinline__ void sgemm_tile(int M, int N, int K, const float* __restrict__ A,
                                           const float* __restrict__ B, float* __restrict__ C) {
    constexpr int TX = Bn / Tn, TY = Bm / Tm, NT = TX * TY;   // threads along N, M; in all
    static_assert(Tm % 4 == 0 && Tn % 4 == 0 && Bk % 4 == 0, "tiles are float4 wide");
    static_assert((Bm * Bk) % (4 * NT) == 0 && (Bk * Bn) % (4 * NT) == 0,
                  "every thread loads whole float4s of the A and B tiles");
    constexpr int A_LOADS = Bm * Bk / (4 * NT), B_LOADS = Bk * Bn / (4 * NT);
    __shared__ __align__(16) float As[2][Bk][Bm];   // A transposed: a column of A is a row here
    __shared__ __align__(16) float Bs[2][Bk][Bn];
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    A += (size_t)blockIdx.y * Bm * K;
    B += (size_t)blockIdx.x * Bn;
    C += (size_t)blockIdx.y * Bm * N + (size_t)blockIdx.x * Bn;

    float4 ra[A_LOADS], rb[B_LOADS];
    float acc[Tm][Tn];
    #pragma unroll
    for (int i = 0; i < Tm; ++i)
        #pragma unroll
        for (int j = 0; j < Tn; ++j) acc[i][j] = 0.0f;

    auto load = [&](int k0) {
        #pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const int f = tid + l * NT, row = f / (Bk / 4), col = (f % (Bk / 4)) * 4;
            ra[l] = *reinterpret_cast<const float4*>(&A[(size_t)row * K + k0 + col]);
        }
        #pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const int f = tid + l * NT, row = f / (Bn / 4), col = (f % (Bn / 4)) * 4;
            rb[l] = *reinterpret_cast<const float4*>(&B[(size_t)(k0 + row) * N + col]);
        }
    };
    auto store = [&](int s) {
        #pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const int f = tid + l * NT, row = f / (Bk / 4), col = (f % (Bk / 4)) * 4;
            As[s][col + 0][row] = ra[l].x;
            As[s][col + 1][row] = ra[l].y;
            As[s][col + 2][row] = ra[l].z;
            As[s][col + 3][row] = ra[l].w;
        }
        #pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const int f = tid + l * NT, row = f / (Bn / 4), col = (f % (Bn / 4)) * 4;
            *reinterpret_cast<float4*>(&Bs[s][row][col]) = rb[l];
        }
    };

    load(0);
    store(0);
    __syncthreads();
    int s = 0;
    for (int k0 = 0; k0 < K; k0 += Bk) {
        const bool more = k0 + Bk < K;
        if (more) load(k0 + Bk);          // in flight while this tile is multiplied
        #pragma unroll
        for (int k = 0; k < Bk; ++k) {
            // thread tiles in float4 strips spaced a warp's width apart: conflict-free reads
            float a[Tm], b[Tn];
            #pragma unroll
            for (int i = 0; i < Tm / 4; ++i) {
                const float4 v = *reinterpret_cast<const float4*>(&As[s][k][(i * TY + ty) * 4]);
                a[i * 4 + 0] = v.x; a[i * 4 + 1] = v.y; a[i * 4 + 2] = v.z; a[i * 4 + 3] = v.w;
            }
            #pragma unroll
            for (int j = 0; j < Tn / 4; ++j) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[s][k][(j * TX + tx) * 4]);
                b[j * 4 + 0] = v.x; b[j * 4 + 1] = v.y; b[j * 4 + 2] = v.z; b[j * 4 + 3] = v.w;
            }
            #pragma unroll
            for (int i = 0; i < Tm; ++i)
                #pragma unroll
                for (int j = 0; j < Tn; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) store(s ^ 1);           // the other stage: nobody reads it until the barrier
        __syncthreads();
        s ^= 1;
    }

    #pragma unroll
    for (int i = 0; i < Tm / 4; ++i)
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int row = (i * TY + ty) * 4 + r;
            #pragma unroll
            for (int j = 0; j < Tn / 4; ++j) {
                const int col = (j * TX + tx) * 4;
                *reinterpret_cast<float4*>(&C[(size_t)row * N + col]) =
                    make_float4(acc[i * 4 + r][j * 4 + 0], acc[i * 4 + r][j * 4 + 1],
                                acc[i * 4 + r][j * 4 + 2], acc[i * 4 + r][j * 4 + 3]);
            }
        }
}

// C = A @ B, row-major, M % BM == N % BN == K % BK == 0
#define SGEMM_THREADS ((BM / TM) * (BN / TN))
extern "C" __global__ void __launch_bounds__(SGEMM_THREADS)
sgemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
      int M, int N, int K) {
    sgemm_tile<BM, BN, BK, TM, TN>(M, N, K, A, B, C);
}
'''


@kjit.kernel
def sgemm(BM=128, BN=128, BK=8, TM=8, TN=8):
    """The kernel with one tile configuration (macros, as `nvcc -DBM=...` would set them)."""
    return f"#define BM {BM}\n#define BN {BN}\n#define BK {BK}\n#define TM {TM}\n#define TN {TN}\n" + SGEMM


def space(min_threads=64, max_threads=512):
    """Block tiles 64..256 (square and not), 8 or 16 deep; thread tiles 4x8..16x8. Each thread
    loads whole float4s of both tiles. The few whose two stages need more than 48 KiB of
    static shared memory stay in: ptxas refuses them and the tuner skips them, reason kept."""
    out = []
    for BM, BN, BK, (TM, TN) in itertools.product(
            (64, 128, 256), (64, 128, 256), (8, 16), ((4, 8), (8, 4), (8, 8), (16, 8), (8, 16))):
        nt = (BM // TM) * (BN // TN)
        if not min_threads <= nt <= max_threads or BM * BK < 4 * nt or BK * BN < 4 * nt:
            continue
        if 2 * BK * (BM + BN) * 4 > 64 * 1024:
            continue
        out.append(Config(dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN),
                          block=nt, grid=lambda m: (cdiv(m["N"], m["BN"]), cdiv(m["M"], m["BM"]))))
    return out


def tuned(configs=None, **options):
    """sgemm with a tuning space, keyed by the problem size."""
    return kjit.autotune(configs=configs or space(), key=["M", "N", "K"], **options)(sgemm)


def main(n=2048):
    import numpy as np
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    A, B, C = kjit.to_device(a), kjit.to_device(b), kjit.empty((n, n), "float32")
    mm = tuned(configs=space()[::4])    # a quarter of the space: a quick demonstration
    result = mm.tune(A, B, C, n, n, n)
    print(f"chose {result.config.label()}: {result.ms:.3f} ms, {2 * n ** 3 / result.ms / 1e9:.0f} "
          f"GFLOP/s ({result.measured} timed now)")
    mm(A, B, C, n, n, n)
    kjit.synchronize()
    err = np.abs(C.get() - a @ b).max() / np.abs(a @ b).max()
    assert err < 1e-4, err
    print("ok")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2048)
