// CUB BlockScan: an inclusive prefix sum within each block, as a template instantiated by a
// name expression (block_scan<128>).
#include <cub/block/block_scan.cuh>

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK) block_scan(const int* __restrict__ x, int* __restrict__ out,
                                                    int n) {
    using BlockScan = cub::BlockScan<int, BLOCK>;
    __shared__ typename BlockScan::TempStorage tmp;
    int i = blockIdx.x * BLOCK + threadIdx.x;
    int v = i < n ? x[i] : 0;
    BlockScan(tmp).InclusiveSum(v, v);
    if (i < n) out[i] = v;
}
