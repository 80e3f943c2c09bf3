// Row-wise softmax, one block per row, written for nvcc: a max pass and a sum pass, each a
// warp-shuffle reduction followed by a shared-memory reduction across warps.
#include <cmath>
#include <cfloat>
#include <algorithm>
#include <cstdint>
#include <cassert>

#define WARP_SIZE 32

__device__ __forceinline__ float warpReduceMax(float val) {
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
    val = std::max(val, __shfl_xor_sync(0xffffffff, val, offset));
  return val;
}

__device__ __forceinline__ float warpReduceSum(float val) {
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
    val += __shfl_xor_sync(0xffffffff, val, offset);
  return val;
}

template <int BLOCK_SIZE>
__global__ void __launch_bounds__(BLOCK_SIZE)
    softmax_forward(float *__restrict__ out, const float *__restrict__ inp, int rows, int cols) {
  static_assert(BLOCK_SIZE % WARP_SIZE == 0, "whole warps");
  assert(blockDim.x == BLOCK_SIZE);
  __shared__ float shared[BLOCK_SIZE / WARP_SIZE];
  const uint row = blockIdx.x;
  const uint tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
  if (row >= (uint)rows) return;
  const float *x = inp + (int64_t)row * cols;
  float *y = out + (int64_t)row * cols;

  float maxval = -FLT_MAX;
  for (int i = tid; i < cols; i += BLOCK_SIZE) maxval = std::max(maxval, x[i]);
  maxval = warpReduceMax(maxval);
  if (lane == 0) shared[warp] = maxval;
  __syncthreads();
  if (tid < WARP_SIZE) {
    float v = tid < BLOCK_SIZE / WARP_SIZE ? shared[tid] : -INFINITY;
    v = warpReduceMax(v);
    if (tid == 0) shared[0] = v;
  }
  __syncthreads();
  const float offset = shared[0];
  __syncthreads();

  float sumval = 0.0f;
  for (int i = tid; i < cols; i += BLOCK_SIZE) {
    const float e = std::exp(x[i] - offset);
    y[i] = e;
    sumval += e;
  }
  sumval = warpReduceSum(sumval);
  if (lane == 0) shared[warp] = sumval;
  __syncthreads();
  if (tid < WARP_SIZE) {
    float v = tid < BLOCK_SIZE / WARP_SIZE ? shared[tid] : 0.0f;
    v = warpReduceSum(v);
    if (tid == 0) shared[0] = v;
  }
  __syncthreads();
  const float inv = 1.0f / shared[0];
  for (int i = tid; i < cols; i += BLOCK_SIZE) y[i] *= inv;
}
