// Asynchronous copies into shared memory, double-buffered, in the two ways the CUDA
// programming guide shows: a cuda::pipeline with two stages (producer_acquire / memcpy_async /
// producer_commit, consumer_wait / consumer_release), and cooperative groups' memcpy_async
// with wait_prior. Both overlap the copy of the next batch with the use of the current one.
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cooperative_groups/memcpy_async.h>
#include <cooperative_groups/reduce.h>
#include <cuda/pipeline>
namespace cg = cooperative_groups;

// out[t] = sum over batches b of in[b * grid.size() + t], for every thread t of the grid
// (batch b of a block is the block.size() contiguous elements at block_batch(b)).
template <size_t stages_count>
__global__ void pipeline_batch_sum(float* global_out, const float* global_in, size_t batch_sz) {
    auto grid = cg::this_grid();
    auto block = cg::this_thread_block();
    extern __shared__ float shared[];   // stages_count * block.size() floats
    size_t shared_offset[stages_count];
    for (size_t s = 0; s < stages_count; ++s) shared_offset[s] = s * block.size();

    __shared__ cuda::pipeline_shared_state<cuda::thread_scope::thread_scope_block, stages_count> shared_state;
    auto pipeline = cuda::make_pipeline(block, &shared_state);

    auto block_batch = [&](size_t batch) -> size_t {
        return block.group_index().x * block.size() + grid.size() * batch;
    };

    float acc = 0.0f;
    // compute_batch: next batch to process; fetch_batch: next batch to fetch from global memory
    for (size_t compute_batch = 0, fetch_batch = 0; compute_batch < batch_sz; ++compute_batch) {
        // keep the pipeline full: up to stages_count batches in flight
        for (; fetch_batch < batch_sz && fetch_batch < (compute_batch + stages_count); ++fetch_batch) {
            pipeline.producer_acquire();
            size_t shared_idx = fetch_batch % stages_count;
            cuda::memcpy_async(block, shared + shared_offset[shared_idx],
                               global_in + block_batch(fetch_batch),
                               sizeof(float) * block.size(), pipeline);
            pipeline.producer_commit();
        }
        pipeline.consumer_wait();
        size_t shared_idx = compute_batch % stages_count;
        acc += shared[shared_offset[shared_idx] + block.thread_rank()];
        pipeline.consumer_release();
    }
    global_out[block_batch(0) + block.thread_rank()] = acc;
}

#define TILE 256

// block_sums[b] = the sum of block b's tiles_per_block * TILE contiguous elements
__global__ void __launch_bounds__(TILE) cg_double_buffer_sum(const float* in, float* block_sums,
                                                             int tiles_per_block) {
    __shared__ float buf[2][TILE];
    __shared__ float warp_sums[TILE / 32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    const float* src = in + (size_t)blockIdx.x * tiles_per_block * TILE;

    cg::memcpy_async(block, buf[0], src, sizeof(float) * TILE);
    float acc = 0.0f;
    for (int t = 0; t < tiles_per_block; ++t) {
        if (t + 1 < tiles_per_block) {
            cg::memcpy_async(block, buf[(t + 1) & 1], src + (t + 1) * TILE, sizeof(float) * TILE);
            cg::wait_prior<1>(block);   // tile t has landed; tile t + 1 may still be in flight
        } else {
            cg::wait(block);
        }
        acc += buf[t & 1][block.thread_rank()];
        block.sync();                   // buf[t & 1] is refilled at t + 2
    }

    acc = cg::reduce(warp, acc, cg::plus<float>());
    if (warp.thread_rank() == 0) warp_sums[warp.meta_group_rank()] = acc;
    block.sync();
    if (block.thread_rank() == 0) {
        float total = 0.0f;
        for (int w = 0; w < TILE / 32; ++w) total += warp_sums[w];
        block_sums[blockIdx.x] = total;
    }
}
