// A grid-wide sum in one launch: every block writes its partial sum, the whole grid waits at
// this_grid().sync() (needs a cooperative launch), then block 0 adds the partials.
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

extern "C" __global__ void grid_sum(const float* __restrict__ x, float* __restrict__ partial,
                                    float* __restrict__ total, int n) {
    __shared__ float tile[256];
    cg::grid_group grid = cg::this_grid();
    float s = 0.0f;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) s += x[i];
    tile[threadIdx.x] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) tile[threadIdx.x] += tile[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = tile[0];
    grid.sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float t = 0.0f;
        for (unsigned b = 0; b < gridDim.x; ++b) t += partial[b];
        *total = t;
    }
}
