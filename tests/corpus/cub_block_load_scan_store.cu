// CUB's block-scan example: a tile of BLOCK_THREADS * ITEMS_PER_THREAD ints is loaded
// (BlockLoad, warp-transposed), exclusive-prefix-summed by BlockScan with the algorithm as a
// template parameter, and stored (BlockStore); thread 0 writes the tile's total.
#include <cub/block/block_load.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/block/block_store.cuh>

template <int BLOCK_THREADS, int ITEMS_PER_THREAD, cub::BlockScanAlgorithm ALGORITHM>
__global__ void BlockPrefixSumKernel(const int* d_in, int* d_out, int* d_aggregates) {
    using BlockLoadT = cub::BlockLoad<int, BLOCK_THREADS, ITEMS_PER_THREAD, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
    using BlockStoreT = cub::BlockStore<int, BLOCK_THREADS, ITEMS_PER_THREAD, cub::BLOCK_STORE_WARP_TRANSPOSE>;
    using BlockScanT = cub::BlockScan<int, BLOCK_THREADS, ALGORITHM>;

    __shared__ union TempStorage {
        typename BlockLoadT::TempStorage load;
        typename BlockStoreT::TempStorage store;
        typename BlockScanT::TempStorage scan;
    } temp_storage;

    const int tile = BLOCK_THREADS * ITEMS_PER_THREAD;
    int data[ITEMS_PER_THREAD];
    BlockLoadT(temp_storage.load).Load(d_in + blockIdx.x * tile, data);
    __syncthreads();

    int aggregate;
    BlockScanT(temp_storage.scan).ExclusiveSum(data, data, aggregate);
    __syncthreads();

    BlockStoreT(temp_storage.store).Store(d_out + blockIdx.x * tile, data);
    if (threadIdx.x == 0) {
        d_aggregates[blockIdx.x] = aggregate;
    }
}
