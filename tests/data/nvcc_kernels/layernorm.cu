// LayerNorm forward over the last dimension, one warp per row, float4 loads; written for nvcc.
// out = (x - mean) / sqrt(var + eps) * weight + bias; mean and rstd are saved for a backward.
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <cassert>
#include <type_traits>

template <typename T>
__device__ inline T warp_sum(T v) {
  static_assert(std::is_floating_point<T>::value, "accumulate in floating point");
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return __shfl_sync(0xffffffffu, v, 0);
}

template <typename T, int ROWS_PER_BLOCK>
__global__ void __launch_bounds__(32 * ROWS_PER_BLOCK)
    layernorm_forward(T *__restrict__ out, float *__restrict__ mean, float *__restrict__ rstd,
                      const T *__restrict__ inp, const T *__restrict__ weight,
                      const T *__restrict__ bias, int N, int C, float eps) {
  static_assert(std::is_same<T, float>::value, "float4 path");
  assert(C % 4 == 0);
  const uint lane = threadIdx.x % 32;
  const int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N) return;
  const float4 *x4 = reinterpret_cast<const float4 *>(inp + row * C);
  const int C4 = C / 4;

  float sum = 0.0f;
  for (int i = lane; i < C4; i += 32) {
    const float4 v = x4[i];
    sum += v.x + v.y + v.z + v.w;
  }
  const float m = warp_sum(sum) / C;

  float sq = 0.0f;
  for (int i = lane; i < C4; i += 32) {
    const float4 v = x4[i];
    sq += (v.x - m) * (v.x - m) + (v.y - m) * (v.y - m) + (v.z - m) * (v.z - m) + (v.w - m) * (v.w - m);
  }
  const float s = 1.0f / std::sqrt(warp_sum(sq) / C + eps);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
    if (!std::isfinite(s)) printf("layernorm: row %lld has a non-finite rstd\n", (long long)row);
  }
  float4 *o4 = reinterpret_cast<float4 *>(out + row * C);
  const float4 *w4 = reinterpret_cast<const float4 *>(weight);
  const float4 *b4 = reinterpret_cast<const float4 *>(bias);
  for (int i = lane; i < C4; i += 32) {
    const float4 v = x4[i], w = w4[i], b = b4[i];
    o4[i] = make_float4((v.x - m) * s * w.x + b.x, (v.y - m) * s * w.y + b.y,
                        (v.z - m) * s * w.z + b.z, (v.w - m) * s * w.w + b.w);
  }
}
