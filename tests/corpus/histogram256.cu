// A 256-bin byte histogram in the CUDA samples' style: per-block sub-histograms in shared
// memory built with shared-memory atomics over a grid-stride loop (each 32-bit word holds four
// bytes), merged into the global histogram with global atomics; and the naive version with
// global atomics only. Written for nvcc: `uint` comes from nvcc's implicit includes.
#include <cuda_runtime.h>

#define HISTOGRAM256_BIN_COUNT 256

__device__ inline void addByte(uint *s_Hist, uint data) {
  atomicAdd(s_Hist + data, 1);
}

__device__ inline void addWord(uint *s_Hist, uint data) {
  addByte(s_Hist, (data >> 0) & 0xFFU);
  addByte(s_Hist, (data >> 8) & 0xFFU);
  addByte(s_Hist, (data >> 16) & 0xFFU);
  addByte(s_Hist, (data >> 24) & 0xFFU);
}

__global__ void histogram256Kernel(uint *d_Histogram, const uint *d_Data, uint dataCount) {
  __shared__ uint s_Hist[HISTOGRAM256_BIN_COUNT];

  for (uint bin = threadIdx.x; bin < HISTOGRAM256_BIN_COUNT; bin += blockDim.x)
    s_Hist[bin] = 0;
  __syncthreads();

  for (uint pos = blockIdx.x * blockDim.x + threadIdx.x; pos < dataCount;
       pos += blockDim.x * gridDim.x)
    addWord(s_Hist, d_Data[pos]);
  __syncthreads();

  for (uint bin = threadIdx.x; bin < HISTOGRAM256_BIN_COUNT; bin += blockDim.x)
    if (s_Hist[bin]) atomicAdd(&d_Histogram[bin], s_Hist[bin]);
}

__global__ void histogramGlobalAtomics(uint *d_Histogram, const unsigned char *d_Data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&d_Histogram[d_Data[i]], 1u);
}
