// Shared helpers of the example library. Included by kernels.cu through -I include.
#pragma once

#ifndef TILE
#define TILE 256  // threads per block of block_sum; override with -D TILE=...
#endif

// a * x + b, written once and used by the kernels.
__device__ __forceinline__ float affine(float a, float x, float b) { return fmaf(a, x, b); }
