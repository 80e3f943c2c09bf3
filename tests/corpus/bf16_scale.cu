// bfloat16 elementwise: out = x * a + b, in float, rounded back to bfloat16 (nearest even).
#include <cuda_bf16.h>

extern "C" __global__ void bf16_scale(const __nv_bfloat16* __restrict__ x,
                                      __nv_bfloat16* __restrict__ out, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(__bfloat162float(x[i]) * a + b);
}
