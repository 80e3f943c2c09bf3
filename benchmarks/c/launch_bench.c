/* Host-side cost of cuLaunchKernel from C, the floor the Python toolkits are measured against.
 * Usage: launch_bench <cubin> <kernel> <nargs: 1|3|16> <launches per batch> <batches>
 * Prints one JSON line: {"nargs": N, "per_launch_us_median": ..., "check": value} */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; \
    cuGetErrorName(r, &s); fprintf(stderr, "%s failed: %s\n", #x, s); exit(1); } } while (0)

static double now_us(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y);
}

int main(int argc, char** argv) {
    if (argc != 6) { fprintf(stderr, "usage: %s cubin kernel nargs per_batch batches\n", argv[0]); return 2; }
    int nargs = atoi(argv[3]), per_batch = atoi(argv[4]), batches = atoi(argv[5]);
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction f; CUdeviceptr out;
    CHECK(cuInit(0)); CHECK(cuDeviceGet(&dev, 0)); CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx)); CHECK(cuModuleLoad(&mod, argv[1]));
    CHECK(cuModuleGetFunction(&f, mod, argv[2])); CHECK(cuMemAlloc(&out, 64));
    int n = 7; float a = 2.5f; int ints[16]; float floats[16];
    void* params[16];
    params[0] = &out;
    if (nargs >= 3) { params[1] = &n; params[2] = &a; }
    for (int i = 3; i < nargs; i++) {
        if (i % 2) { ints[i] = i; params[i] = &ints[i]; } else { floats[i] = (float)i; params[i] = &floats[i]; }
    }
    double* samples = malloc(sizeof(double) * batches);
    for (int b = -3; b < batches; b++) {           /* 3 warm-up batches */
        double t0 = now_us();
        for (int i = 0; i < per_batch; i++)
            CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, params, 0));
        double t1 = now_us();
        CHECK(cuCtxSynchronize());
        if (b >= 0) samples[b] = (t1 - t0) / per_batch;
    }
    qsort(samples, batches, sizeof(double), cmp);
    float check; CHECK(cuMemcpyDtoH(&check, out, sizeof(float)));
    printf("{\"nargs\": %d, \"per_launch_us_median\": %.4f, \"check\": %.3f}\n", nargs, samples[batches / 2], check);
    return 0;
}
