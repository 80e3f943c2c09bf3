// Tiled SGEMM in the style of the well-known "2D block tiling + vectorised loads" CUDA kernels,
// written for nvcc: C = alpha * A @ B + beta * C, all row-major. Compiled by kjit unchanged.
#include <cstdio>
#include <cstdlib>
#include <cassert>
#include <cstdint>
#include <algorithm>

#define CEIL_DIV(M, N) (((M) + (N) - 1) / (N))
#define FETCH_FLOAT4(pointer) (reinterpret_cast<const float4 *>(&(pointer))[0])

// Block tile BM x BN, K-slab BK, each thread computes a TM x TN sub-tile.
// Requires M % BM == 0, N % BN == 0, K % BK == 0 (the caller pads).
template <const int BM, const int BN, const int BK, const int TM, const int TN, bool VERBOSE = false>
__global__ void __launch_bounds__((BM * BN) / (TM * TN), 1)
    sgemm2DBlocktiling(int M, int N, int K, float alpha, const float *A, const float *B,
                       float beta, float *C) {
  const uint cRow = blockIdx.y;
  const uint cCol = blockIdx.x;
  constexpr uint numThreads = (BM * BN) / (TM * TN);
  assert(blockDim.x == numThreads);
  static_assert(BK % 4 == 0 && BN % 4 == 0 && TN % 4 == 0, "float4 loads and stores");

  const uint threadCol = threadIdx.x % (BN / TN);
  const uint threadRow = threadIdx.x / (BN / TN);

  __shared__ float As[BM * BK];  // transposed: As[k * BM + m]
  __shared__ float Bs[BK * BN];

  A += cRow * BM * K;
  B += cCol * BN;
  C += cRow * BM * N + cCol * BN;

  float threadResults[TM * TN] = {0.0f};
  float regM[TM] = {0.0f};
  float regN[TN] = {0.0f};

  for (uint bkIdx = 0; bkIdx < (uint)K; bkIdx += BK) {
    for (uint i = threadIdx.x; i < BM * BK / 4; i += numThreads) {
      const uint r = i / (BK / 4), c = i % (BK / 4);
      const float4 tmp = FETCH_FLOAT4(A[r * K + c * 4]);
      As[(c * 4 + 0) * BM + r] = tmp.x;
      As[(c * 4 + 1) * BM + r] = tmp.y;
      As[(c * 4 + 2) * BM + r] = tmp.z;
      As[(c * 4 + 3) * BM + r] = tmp.w;
    }
    for (uint i = threadIdx.x; i < BK * BN / 4; i += numThreads) {
      const uint r = i / (BN / 4), c = i % (BN / 4);
      reinterpret_cast<float4 *>(&Bs[r * BN + c * 4])[0] = FETCH_FLOAT4(B[r * N + c * 4]);
    }
    __syncthreads();
    A += BK;
    B += BK * N;

#pragma unroll
    for (uint dotIdx = 0; dotIdx < BK; ++dotIdx) {
      for (uint i = 0; i < TM; ++i) regM[i] = As[dotIdx * BM + threadRow * TM + i];
      for (uint i = 0; i < TN; ++i) regN[i] = Bs[dotIdx * BN + threadCol * TN + i];
      for (uint resIdxM = 0; resIdxM < TM; ++resIdxM)
        for (uint resIdxN = 0; resIdxN < TN; ++resIdxN)
          threadResults[resIdxM * TN + resIdxN] += regM[resIdxM] * regN[resIdxN];
    }
    __syncthreads();
  }

  for (uint resIdxM = 0; resIdxM < TM; ++resIdxM) {
    for (uint resIdxN = 0; resIdxN < TN; resIdxN += 4) {
      float *dst = &C[(threadRow * TM + resIdxM) * N + threadCol * TN + resIdxN];
      float4 tmp = reinterpret_cast<float4 *>(dst)[0];
      tmp.x = alpha * threadResults[resIdxM * TN + resIdxN + 0] + beta * tmp.x;
      tmp.y = alpha * threadResults[resIdxM * TN + resIdxN + 1] + beta * tmp.y;
      tmp.z = alpha * threadResults[resIdxM * TN + resIdxN + 2] + beta * tmp.z;
      tmp.w = alpha * threadResults[resIdxM * TN + resIdxN + 3] + beta * tmp.w;
      reinterpret_cast<float4 *>(dst)[0] = tmp;
    }
  }
  if (VERBOSE && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0)
    printf("sgemm: M=%d N=%d K=%d tiles=%dx%d\n", M, N, K, CEIL_DIV(M, BM), CEIL_DIV(N, BN));
}

// The naive kernel people start from: one thread per output, edges clamped with std::min.
__global__ void sgemm_naive(int M, int N, int K, float alpha, const float *A, const float *B,
                            float beta, float *C) {
  const uint x = blockIdx.x * blockDim.x + threadIdx.x;
  const uint y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < (uint)M && y < (uint)N) {
    float tmp = 0.0;
    const int kEnd = std::min(K, INT32_MAX);
    for (int i = 0; i < kEnd; ++i) tmp += A[x * K + i] * B[i * N + y];
    C[x * N + y] = alpha * tmp + beta * C[x * N + y];
  }
}
