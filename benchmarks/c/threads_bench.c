/* Launch throughput of cuLaunchKernel from C with one host thread per device: the driver's own
 * scaling, against which Python threads launching on several GPUs are measured.
 * Usage: threads_bench <cubin> <kernel k3> <threads (one per device)> <batches> <per batch>
 * Prints one JSON line: {"threads": T, "launches_per_s": ...} */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; \
    cuGetErrorName(r, &s); fprintf(stderr, "%s failed: %s\n", #x, s); exit(1); } } while (0)

static const char *cubin, *kernel;
static int batches, per_batch;
static pthread_barrier_t start;

static double now_s(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct { int device; double seconds; } Worker;

static void* work(void* arg) {
    Worker* w = (Worker*)arg;
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction f; CUdeviceptr out;
    CHECK(cuDeviceGet(&dev, w->device)); CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx)); CHECK(cuModuleLoad(&mod, cubin));
    CHECK(cuModuleGetFunction(&f, mod, kernel)); CHECK(cuMemAlloc(&out, 64));
    int n = 7; float a = 2.5f;
    void* params[3] = {&out, &n, &a};
    for (int i = 0; i < per_batch; i++) CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, params, 0));
    CHECK(cuCtxSynchronize());
    pthread_barrier_wait(&start);
    double t0 = now_s();
    for (int b = 0; b < batches; b++) {
        for (int i = 0; i < per_batch; i++) cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, params, 0);
        CHECK(cuCtxSynchronize());
    }
    w->seconds = now_s() - t0;
    float got = 0;
    CHECK(cuMemcpyDtoH(&got, out, sizeof got));
    if (got != n + a) { fprintf(stderr, "device %d left %g, expected %g\n", w->device, got, n + a); exit(1); }
    return NULL;
}

int main(int argc, char** argv) {
    if (argc != 6) { fprintf(stderr, "usage: %s cubin kernel threads batches per_batch\n", argv[0]); return 2; }
    cubin = argv[1]; kernel = argv[2];
    int threads = atoi(argv[3]); batches = atoi(argv[4]); per_batch = atoi(argv[5]);
    if (threads < 1 || threads > 64) { fprintf(stderr, "threads: 1..64\n"); return 2; }
    CHECK(cuInit(0));
    pthread_t t[64]; Worker w[64];
    pthread_barrier_init(&start, NULL, threads);
    for (int i = 0; i < threads; i++) { w[i].device = i; pthread_create(&t[i], NULL, work, &w[i]); }
    double slowest = 0;
    for (int i = 0; i < threads; i++) { pthread_join(t[i], NULL); if (w[i].seconds > slowest) slowest = w[i].seconds; }
    printf("{\"threads\": %d, \"launches_per_s\": %.1f}\n", threads, (double)threads * batches * per_batch / slowest);
    return 0;
}
