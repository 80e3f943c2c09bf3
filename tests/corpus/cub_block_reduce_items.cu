// CUB's block-reduce example, several items per thread: each block loads its tile striped
// (LoadDirectStriped) and reduces it twice with BlockReduce (the algorithm a template
// parameter): Sum() and a max through Reduce() with cuda::maximum.
#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cuda/functional>

template <int BLOCK_THREADS, int ITEMS_PER_THREAD, cub::BlockReduceAlgorithm ALGORITHM>
__global__ void BlockReduceKernel(const int* d_in, int* d_sums, int* d_maxes) {
    using BlockReduceT = cub::BlockReduce<int, BLOCK_THREADS, ALGORITHM>;
    __shared__ typename BlockReduceT::TempStorage temp_storage;

    int data[ITEMS_PER_THREAD];
    cub::LoadDirectStriped<BLOCK_THREADS>(threadIdx.x, d_in + blockIdx.x * BLOCK_THREADS * ITEMS_PER_THREAD, data);

    int sum = BlockReduceT(temp_storage).Sum(data);
    __syncthreads();   // the temporary storage is reused
    int biggest = BlockReduceT(temp_storage).Reduce(data, cuda::maximum<int>{});
    if (threadIdx.x == 0) {
        d_sums[blockIdx.x] = sum;
        d_maxes[blockIdx.x] = biggest;
    }
}
