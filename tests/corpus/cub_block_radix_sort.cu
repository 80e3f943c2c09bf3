// CUB's block-sort example: each block loads BLOCK_THREADS * ITEMS_PER_THREAD items
// (BlockLoad, transposed through shared memory), sorts them with BlockRadixSort and stores
// them back (BlockStore); the three share one TempStorage union. Keys only, and key-value pairs.
#include <cub/block/block_load.cuh>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_store.cuh>

template <typename Key, int BLOCK_THREADS, int ITEMS_PER_THREAD>
__launch_bounds__(BLOCK_THREADS) __global__
void BlockSortKernel(const Key* d_in, Key* d_out) {
    using BlockLoadT = cub::BlockLoad<Key, BLOCK_THREADS, ITEMS_PER_THREAD, cub::BLOCK_LOAD_TRANSPOSE>;
    using BlockStoreT = cub::BlockStore<Key, BLOCK_THREADS, ITEMS_PER_THREAD, cub::BLOCK_STORE_TRANSPOSE>;
    using BlockRadixSortT = cub::BlockRadixSort<Key, BLOCK_THREADS, ITEMS_PER_THREAD>;

    __shared__ union {
        typename BlockLoadT::TempStorage load;
        typename BlockStoreT::TempStorage store;
        typename BlockRadixSortT::TempStorage sort;
    } temp_storage;

    int block_offset = blockIdx.x * (BLOCK_THREADS * ITEMS_PER_THREAD);
    Key thread_keys[ITEMS_PER_THREAD];
    BlockLoadT(temp_storage.load).Load(d_in + block_offset, thread_keys);
    __syncthreads();
    BlockRadixSortT(temp_storage.sort).Sort(thread_keys);
    __syncthreads();
    BlockStoreT(temp_storage.store).Store(d_out + block_offset, thread_keys);
}

// Sorts (key, value) pairs by key; the pairs come back in striped order, stored directly.
template <int BLOCK_THREADS, int ITEMS_PER_THREAD>
__launch_bounds__(BLOCK_THREADS) __global__
void BlockSortPairsKernel(const float* keys_in, const int* values_in,
                          float* keys_out, int* values_out) {
    using BlockRadixSortT = cub::BlockRadixSort<float, BLOCK_THREADS, ITEMS_PER_THREAD, int>;
    __shared__ typename BlockRadixSortT::TempStorage temp_storage;

    int block_offset = blockIdx.x * (BLOCK_THREADS * ITEMS_PER_THREAD);
    float keys[ITEMS_PER_THREAD];
    int values[ITEMS_PER_THREAD];
    cub::LoadDirectBlocked(threadIdx.x, keys_in + block_offset, keys);
    cub::LoadDirectBlocked(threadIdx.x, values_in + block_offset, values);
    BlockRadixSortT(temp_storage).SortBlockedToStriped(keys, values);
    cub::StoreDirectStriped<BLOCK_THREADS>(threadIdx.x, keys_out + block_offset, keys);
    cub::StoreDirectStriped<BLOCK_THREADS>(threadIdx.x, values_out + block_offset, values);
}
