// fp8 e4m3: float -> __nv_fp8_e4m3 (round to nearest even, saturating) -> float, and the byte.
#include <cuda_fp8.h>

extern "C" __global__ void fp8_roundtrip(const float* __restrict__ x, float* __restrict__ back,
                                         unsigned char* __restrict__ bits, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        __nv_fp8_e4m3 v(x[i]);
        back[i] = static_cast<float>(v);
        bits[i] = v.__x;
    }
}
