// A tensor-core GEMM through inline PTX, as hand-written HGEMM kernels do it: tiles of A and
// B staged in (padded) shared memory, fragments loaded with ldmatrix (B with .trans), and
// mma.sync.aligned.m16n8k16 with float accumulators. A (M x K) and B (K x N) are row-major,
// bf16 or fp16; C (M x N) is float. A block of 4 warps (2 x 2) computes a 32 x 32 tile of C,
// each warp 16 x 16 (two m16n8 tiles). M, N multiples of 32, K a multiple of 16.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#define WARP_SIZE 32
#define BM 32
#define BN 32
#define BK 16
#define PAD 8   // halves of padding per shared-memory row: spreads ldmatrix rows over banks

#define LDMATRIX_X4(R0, R1, R2, R3, addr)                                              \
  asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];\n"   \
               : "=r"(R0), "=r"(R1), "=r"(R2), "=r"(R3)                                \
               : "r"(addr))
#define LDMATRIX_X4_T(R0, R1, R2, R3, addr)                                            \
  asm volatile("ldmatrix.sync.aligned.x4.trans.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];\n" \
               : "=r"(R0), "=r"(R1), "=r"(R2), "=r"(R3)                                \
               : "r"(addr))

template <typename T> struct MmaOp;

template <> struct MmaOp<__nv_bfloat16> {
  __device__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <> struct MmaOp<half> {
  __device__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <typename T>
__global__ void __launch_bounds__(128) mma_gemm_m16n8k16(const T* __restrict__ A,
                                                          const T* __restrict__ B,
                                                          float* __restrict__ C,
                                                          int M, int N, int K) {
  __shared__ __align__(16) T s_a[BM][BK + PAD];
  __shared__ __align__(16) T s_b[BK][BN + PAD];

  const int tid = threadIdx.x;
  const int warp_id = tid / WARP_SIZE;
  const int lane_id = tid % WARP_SIZE;
  const int warp_m = warp_id / 2;   // 0..1: rows [16 * warp_m, +16) of the block tile
  const int warp_n = warp_id % 2;   // 0..1: cols [16 * warp_n, +16)
  const int block_row = blockIdx.y * BM;
  const int block_col = blockIdx.x * BN;

  float acc[2][4] = {};   // two m16n8 tiles, four floats per thread each

  for (int k0 = 0; k0 < K; k0 += BK) {
    // 128 threads stage 32 x 16 of A and 16 x 32 of B, 4 elements each
    for (int i = tid; i < BM * BK; i += blockDim.x) {
      int r = i / BK, c = i % BK;
      s_a[r][c] = A[(block_row + r) * K + k0 + c];
    }
    for (int i = tid; i < BK * BN; i += blockDim.x) {
      int r = i / BN, c = i % BN;
      s_b[r][c] = B[(k0 + r) * N + block_col + c];
    }
    __syncthreads();

    // A fragment (16 x 16, row-major): lanes 0-15 address rows 0-15 at column 0,
    // lanes 16-31 the same rows at column 8, giving a0..a3 in mma's order
    uint32_t ra[4];
    uint32_t a_addr = static_cast<uint32_t>(
        __cvta_generic_to_shared(&s_a[warp_m * 16 + lane_id % 16][(lane_id / 16) * 8]));
    LDMATRIX_X4(ra[0], ra[1], ra[2], ra[3], a_addr);

    // B fragments (16 x 16 of K x N, row-major, so transposed on load): lanes 0-15 address
    // k rows 0-15 at n 0 (first n8 tile: b0, b1), lanes 16-31 the same rows at n 8
    uint32_t rb[4];
    uint32_t b_addr = static_cast<uint32_t>(
        __cvta_generic_to_shared(&s_b[lane_id % 16][warp_n * 16 + (lane_id / 16) * 8]));
    LDMATRIX_X4_T(rb[0], rb[1], rb[2], rb[3], b_addr);

    MmaOp<T>::run(acc[0], ra, rb[0], rb[1]);
    MmaOp<T>::run(acc[1], ra, rb[2], rb[3]);
    __syncthreads();
  }

  // accumulator layout: c0, c1 at row lane/4, cols 2 * (lane % 4) + {0, 1}; c2, c3 eight rows down
  const int row = block_row + warp_m * 16 + lane_id / 4;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int col = block_col + warp_n * 16 + j * 8 + (lane_id % 4) * 2;
    C[row * N + col] = acc[j][0];
    C[row * N + col + 1] = acc[j][1];
    C[(row + 8) * N + col] = acc[j][2];
    C[(row + 8) * N + col + 1] = acc[j][3];
  }
}
