/* One batch of cuLaunchKernel calls from C, inside the benchmark's own process (loaded with
 * ctypes): the floor the Python toolkits are paired with, on the same thread, CPU, context
 * and stream as they run, batch for batch. Build: nvcc -O2 -shared -Xcompiler -fPIC -lcuda.
 * Each returns µs per call, or -(CUresult) where a call failed. */
#include <cuda.h>
#include <time.h>

double launch_batch(CUfunction f, void** params, int per_batch, CUstream stream) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < per_batch; i++) {
        CUresult r = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, params, 0);
        if (r != CUDA_SUCCESS) return -(double)r;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / per_batch;
}

/* The same loop with the parameters as one buffer (CU_LAUNCH_PARAM_BUFFER_POINTER) laid out as
 * cuFuncGetParamInfo says: how kjit's C launchers hand them over. */
double launch_block_batch(CUfunction f, void* block, size_t size, int per_batch, CUstream stream) {
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, block, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < per_batch; i++) {
        CUresult r = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, NULL, extra);
        if (r != CUDA_SUCCESS) return -(double)r;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / per_batch;
}

/* One batch of cuGraphLaunch calls of one executable graph: C's floor for a graph's replay. */
double graph_batch(CUgraphExec graph, int per_batch, CUstream stream) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < per_batch; i++) {
        CUresult r = cuGraphLaunch(graph, stream);
        if (r != CUDA_SUCCESS) return -(double)r;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / per_batch;
}
