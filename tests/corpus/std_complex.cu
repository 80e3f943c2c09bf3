// cuda::std::complex<float>: out = a * b + conj(a), elementwise.
#include <cuda/std/complex>

extern "C" __global__ void complex_fma(const cuda::std::complex<float>* __restrict__ a,
                                       const cuda::std::complex<float>* __restrict__ b,
                                       cuda::std::complex<float>* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * b[i] + cuda::std::conj(a[i]);
}
