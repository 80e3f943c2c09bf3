// cuda::atomic_ref: a histogram of values into `bins` counters with device-scope atomics.
#include <cuda/atomic>

extern "C" __global__ void histogram(const int* __restrict__ values, unsigned* bins, int nbins,
                                     int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int b = values[i] % nbins;
        cuda::atomic_ref<unsigned, cuda::thread_scope_device> bin(bins[b]);
        bin.fetch_add(1u, cuda::std::memory_order_relaxed);
    }
}
