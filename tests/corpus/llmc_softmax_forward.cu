// Softmax forward in llm.c's style (dev/cuda/softmax_forward.cu): an online softmax with one
// warp per row (max and sum in one pass, merged across the warp with __shfl_xor_sync), and a
// block-per-row kernel with shared-memory reductions across warps. Written for nvcc: INFINITY
// and FLT_MAX come from nvcc's implicit includes.
#include <cuda_runtime.h>
#include <assert.h>

__device__ float warpReduceMax(float val) {
    for (int offset = 16; offset > 0; offset /= 2) {
        val = fmaxf(val, __shfl_xor_sync(0xFFFFFFFF, val, offset));
    }
    return val;
}

__device__ float warpReduceSum(float val) {
    for (int offset = 16; offset > 0; offset /= 2) {
        val += __shfl_xor_sync(0xFFFFFFFF, val, offset);
    }
    return val;
}

__global__ void softmax_forward_online_kernel(float* out, const float* inp, int N, int C) {
    // online softmax paper: http://arxiv.org/abs/1805.02867
    const int warpsPerBlock = blockDim.x / warpSize;
    int warpId = threadIdx.x / warpSize;
    int laneId = threadIdx.x % warpSize;
    // one warp one row
    int row = blockIdx.x * warpsPerBlock + warpId;
    if (row >= N) {
        return;
    }
    const float* x = inp + row * C;
    float* const y = out + row * C;

    // the running max and the sum of exp(x - max), rescaled whenever the max grows
    float maxval = -INFINITY, sumval = 0.0f;
    for (int i = laneId; i < C; i += warpSize) {
        float bigger = fmaxf(maxval, x[i]);
        sumval = sumval * expf(maxval - bigger) + expf(x[i] - bigger);
        maxval = bigger;
    }

    // merge the lanes' (max, sum) pairs; after the butterfly every lane holds the row's
    for (int offset = warpSize / 2; offset > 0; offset >>= 1) {
        float offsetMaxval = __shfl_xor_sync(0xFFFFFFFF, maxval, offset);
        float offsetSumval = __shfl_xor_sync(0xFFFFFFFF, sumval, offset);
        float newMaxval = fmaxf(maxval, offsetMaxval);
        sumval = sumval * expf(maxval - newMaxval) + offsetSumval * expf(offsetMaxval - newMaxval);
        maxval = newMaxval;
    }

    for (int i = laneId; i < C; i += warpSize) {
        y[i] = expf(x[i] - maxval) / sumval;
    }
}

__global__ void softmax_forward_kernel4(float* out, const float* inp, int N, int C) {
    // one block per row; dynamic shared memory holds one max and one sum per warp
    extern __shared__ float shared[];
    int idx = blockIdx.x;
    int tid = threadIdx.x;
    int warpId = threadIdx.x / 32;
    int laneId = threadIdx.x % 32;
    int warpsPerBlock = blockDim.x / 32;
    assert(blockDim.x % 32 == 0);
    float* maxvals = shared;
    float* sumvals = &shared[warpsPerBlock];
    const float* x = inp + idx * C;

    float maxval = -FLT_MAX;
    for (int i = tid; i < C; i += blockDim.x) {
        maxval = fmaxf(maxval, x[i]);
    }
    maxval = warpReduceMax(maxval);
    if (laneId == 0) maxvals[warpId] = maxval;
    __syncthreads();
    if (tid == 0) {
        float val = maxvals[tid];
        for (int i = 1; i < warpsPerBlock; i++) {
            val = fmaxf(val, maxvals[i]);
        }
        maxvals[0] = val;
    }
    __syncthreads();
    float offset = maxvals[0];

    for (int i = tid; i < C; i += blockDim.x) {
        out[idx * C + i] = expf(x[i] - offset);
    }

    x = out + idx * C;
    float sumval = 0.0f;
    for (int i = tid; i < C; i += blockDim.x) {
        sumval += x[i];
    }
    sumval = warpReduceSum(sumval);
    if (laneId == 0) sumvals[warpId] = sumval;
    __syncthreads();
    if (tid == 0) {
        float val = sumvals[tid];
        for (int i = 1; i < warpsPerBlock; ++i) {
            val += sumvals[i];
        }
        sumvals[0] = val;
    }
    __syncthreads();
    float sum = sumvals[0];
    for (int i = tid; i < C; i += blockDim.x) {
        out[idx * C + i] = x[i] / sum;
    }
}
