// A small kernel library: built ahead of time into one fatbin by `kjit build`
// (see run.py), then loaded and launched with kjit.load(...).get_function(...).
#include "library.cuh"
#include <cub/block/block_reduce.cuh>  // CCCL, from the nvidia-cuda-cccl wheel: no -I needed

// y[i] = a * x[i] + b
extern "C" __global__ void scale_add(const float* __restrict__ x, float* __restrict__ y,
                                     float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = affine(a, x[i], b);
}

// out[block] = sum of the block's TILE elements of x (tree reduction in shared memory).
extern "C" __global__ void __launch_bounds__(TILE) block_sum(const float* __restrict__ x,
                                                             float* __restrict__ out, int n) {
    __shared__ float tile[TILE];
    int i = blockIdx.x * TILE + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = TILE / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) tile[threadIdx.x] += tile[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = tile[0];
}

// The same sum with CUB's BlockReduce (warp shuffles, then one shared-memory step).
extern "C" __global__ void __launch_bounds__(TILE) block_sum_cub(const float* __restrict__ x,
                                                                 float* __restrict__ out, int n) {
    using BlockReduce = cub::BlockReduce<float, TILE>;
    __shared__ typename BlockReduce::TempStorage tmp;
    int i = blockIdx.x * TILE + threadIdx.x;
    float sum = BlockReduce(tmp).Sum(i < n ? x[i] : 0.0f);
    if (threadIdx.x == 0) out[blockIdx.x] = sum;
}
