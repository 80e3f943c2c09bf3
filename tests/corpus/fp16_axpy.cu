// half-precision elementwise: y = a * x + y, computed with __hfma on __half values.
#include <cuda_fp16.h>

extern "C" __global__ void fp16_axpy(const __half* __restrict__ x, __half* __restrict__ y,
                                     float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __hfma(__float2half(a), x[i], y[i]);
}
