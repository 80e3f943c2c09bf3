/* A libcuda that does nothing, for counting what kjit's launch extension runs on a machine
 * with no GPU (benchmarks/launch_lines.py): the functions the extension resolves (kjit/runtime/
 * _libcuda.c), each succeeding at once. Its only context is 0x1234. */
#include <stddef.h>

int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
    return 0;
}
int cuCtxGetCurrent(void** ctx) { *ctx = (void*)0x1234; return 0; }
int cuPointerGetAttributes(unsigned n, int* attrs, void** data, unsigned long long ptr) { return 1; }
int cuCtxPushCurrent_v2(void* ctx) { return 0; }
int cuCtxPopCurrent_v2(void** ctx) { *ctx = (void*)0x1234; return 0; }
int cuDeviceGetCount(int* n) { *n = 1; return 0; }
int cuGraphLaunch(void* exec, void* stream) { return 0; }
