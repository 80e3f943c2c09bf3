// Block reductions written for nvcc: a templated sum (grid-stride, shared-memory tree, then one
// atomicAdd per block), and a min/argmin over ints that starts from INT_MAX.
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cassert>
#include <limits>
#include <type_traits>
#include <utility>
#include <tuple>
#include <array>
#include <algorithm>

template <typename T>
struct SumOp {
  static_assert(std::is_arithmetic<T>::value, "numbers only");
  __device__ static constexpr T identity() { return T(0); }
  __device__ T operator()(T a, T b) const { return a + b; }
};

template <typename T, unsigned int BLOCK, typename Op = SumOp<T>>
__global__ void __launch_bounds__(BLOCK) reduce_sum(const T *__restrict__ in, T *out, uint64_t n) {
  __shared__ T sdata[BLOCK];
  const uint tid = threadIdx.x;
  Op op;
  // four independent accumulators per thread, as unrolled reductions do
  std::array<T, 4> acc;
  acc.fill(Op::identity());
  uint64_t i = (uint64_t)blockIdx.x * BLOCK + tid;
  const uint64_t stride = (uint64_t)gridDim.x * BLOCK;
  for (int lane = 0; i < n; i += stride, lane = (lane + 1) & 3) acc[lane] = op(acc[lane], in[i]);
  sdata[tid] = op(op(acc[0], acc[1]), op(acc[2], acc[3]));
  __syncthreads();
  for (uint s = BLOCK / 2; s > 0; s >>= 1) {
    if (tid < s) sdata[tid] = op(sdata[tid], sdata[tid + s]);
    __syncthreads();
  }
  if (tid == 0) atomicAdd(out, sdata[0]);
}

// One block; writes (min value, first index holding it).
template <unsigned int BLOCK>
__global__ void argmin_int(const int *in, int n, int *min_out, int *idx_out) {
  assert(gridDim.x == 1);
  __shared__ int svals[BLOCK];
  __shared__ int sidx[BLOCK];
  std::pair<int, int> best = std::make_pair(INT_MAX, INT_MAX);
  static_assert(INT_MAX == std::numeric_limits<int>::max(), "");
  for (int i = threadIdx.x; i < n; i += BLOCK) {
    const std::pair<int, int> cand(in[i], i);
    if (cand < best) best = cand;
  }
  svals[threadIdx.x] = best.first;
  sidx[threadIdx.x] = best.second;
  __syncthreads();
  for (uint s = BLOCK / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      auto mine = std::make_tuple(svals[threadIdx.x], sidx[threadIdx.x]);
      auto other = std::make_tuple(svals[threadIdx.x + s], sidx[threadIdx.x + s]);
      if (other < mine) std::swap(mine, other);
      auto [v, j] = mine;
      svals[threadIdx.x] = v;
      sidx[threadIdx.x] = j;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *min_out = std::min(svals[0], INT_MAX);
    *idx_out = std::get<1>(std::make_tuple(svals[0], sidx[0]));
    if (sidx[0] == INT_MAX) printf("argmin_int: empty input (n=%d)\n", n);
  }
}
