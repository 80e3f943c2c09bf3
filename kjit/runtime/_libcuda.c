/* kjit's libcuda functions, resolved once from the driver cuda.bindings loaded (bind), and the
 * direct calls Python makes through them (kjit/runtime/libcuda.py): cuLaunchKernel with a
 * prebuilt void** array in one C call (cuda.bindings' wrapper converts each argument through
 * helper objects, as costly as the rest of a launch); the current context, which kjit's Python
 * path asks before each launch; the device owning a foreign pointer, which cuda.bindings
 * 13.3-13.5 answer wrongly for every device but 0; and a kjit graph's replay. Results return
 * as ints, checked by the caller. */
#include "_foreign.h"
#include "_gil.h"
#include "_libcuda.h"
#include "_pyint.h"
#include "_tables.h"
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

KjitLibcuda kjit_cu = {NULL, NULL, NULL, NULL, NULL, NULL};

PyObject* kjit_bind(PyObject* self, PyObject* noargs) {
    if (kjit_cu.launch) Py_RETURN_NONE;
    /* the driver cuda.bindings already loaded: RTLD_NOLOAD finds that same copy */
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        PyErr_Format(PyExc_OSError, "libcuda.so.1 could not be loaded: %s", dlerror());
        return NULL;
    }
    void* launch_sym = dlsym(h, "cuLaunchKernel");
    void* current_sym = dlsym(h, "cuCtxGetCurrent");
    void* attrs_sym = dlsym(h, "cuPointerGetAttributes");
    void* push_sym = dlsym(h, "cuCtxPushCurrent_v2");
    void* pop_sym = dlsym(h, "cuCtxPopCurrent_v2");
    if (!launch_sym || !current_sym || !attrs_sym || !push_sym || !pop_sym) {
        PyErr_SetString(PyExc_OSError, "libcuda.so.1 lacks cuLaunchKernel, cuCtxGetCurrent, "
                        "cuPointerGetAttributes or cuCtxPush/PopCurrent");
        return NULL;
    }
    kjit_cu.graph_launch = (int (*)(void*, void*))dlsym(h, "cuGraphLaunch");   /* optional: kjit graphs */
    kjit_cu.ctx_push = (int (*)(void*))push_sym;
    kjit_cu.ctx_pop = (int (*)(void**))pop_sym;
    kjit_cu.ctx_current = (kjit_ctx_current_fn)current_sym;
    kjit_tables_bind(kjit_cu.ctx_current);
    kjit_cu.pointer_attrs = (int (*)(unsigned, int*, void**, unsigned long long))attrs_sym;
    kjit_foreign_bind((int (*)(int*))dlsym(h, "cuDeviceGetCount"));
    kjit_cu.launch = (kjit_launch_fn)launch_sym;   /* last: its being set means all are */
    Py_RETURN_NONE;
}

static int require_bound(void) {
    if (kjit_cu.launch) return 1;
    PyErr_SetString(PyExc_RuntimeError, "kjit._launch.bind() was not called");
    return 0;
}

PyObject* kjit_current_context(PyObject* self, PyObject* noargs) {
    if (!require_bound()) return NULL;
    void* ctx = NULL;
    if (kjit_cu.ctx_current(&ctx) != 0) ctx = NULL;
    return PyLong_FromVoidPtr(ctx);
}

/* pointer_device(address) -> ordinal of the device whose memory it is; -1 for host, managed
 * and unknown memory. Zeroed 8-byte cells: the driver writes 4 bytes (enums, the ordinal)
 * or fewer (the managed flag). */
enum { ATTR_MEMORY_TYPE = 2, ATTR_IS_MANAGED = 8, ATTR_DEVICE_ORDINAL = 9, MEMORYTYPE_DEVICE = 2 };
PyObject* kjit_pointer_device(PyObject* self, PyObject* arg) {
    if (!require_bound()) return NULL;
    unsigned long long addr = kjit_as_u64(arg);
    if (addr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int attrs[3] = {ATTR_MEMORY_TYPE, ATTR_DEVICE_ORDINAL, ATTR_IS_MANAGED};
    uint64_t mem_type = 0, ordinal = 0, managed = 0;
    void* data[3] = {&mem_type, &ordinal, &managed};
    int r;
    Py_BEGIN_ALLOW_THREADS  /* the driver takes a lock other threads may hold */
    r = kjit_cu.pointer_attrs(3, attrs, data, addr);
    Py_END_ALLOW_THREADS
    if (r != 0 || (uint32_t)mem_type != MEMORYTYPE_DEVICE || managed) return PyLong_FromLong(-1);
    int32_t ord;
    memcpy(&ord, &ordinal, 4);   /* little-endian: the int the driver wrote */
    return PyLong_FromLong(ord);
}

/* launch(func, gx, gy, gz, bx, by, bz, shared_mem, stream, params) -> CUresult as int */
PyObject* kjit_launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    unsigned long long v[10];
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "launch takes 10 ints");
        return NULL;
    }
    if (!require_bound()) return NULL;
    for (int i = 0; i < 10; i++) {
        v[i] = kjit_as_u64(args[i]);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    PyThreadState* ts = kjit_gil_release();
    int r = kjit_cu.launch((void*)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4],
                           (unsigned)v[5], (unsigned)v[6], (unsigned)v[7], (void*)v[8], (void**)v[9], NULL);
    if (ts) PyEval_RestoreThread(ts);
    return PyLong_FromLong(r);
}

/* graph_launch(exec, stream) -> CUresult as int: a kjit Graph's replay, one host call */
PyObject* kjit_graph_launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "graph_launch takes 2 ints");
        return NULL;
    }
    if (!require_bound()) return NULL;
    if (!kjit_cu.graph_launch) return PyErr_Format(PyExc_OSError, "libcuda.so.1 lacks cuGraphLaunch");
    unsigned long long exec = kjit_as_u64(args[0]);
    unsigned long long stream = kjit_as_u64(args[1]);
    if (PyErr_Occurred()) return NULL;
    PyThreadState* ts = kjit_gil_release();
    int r = kjit_cu.graph_launch((void*)(uintptr_t)exec, (void*)(uintptr_t)stream);
    if (ts) PyEval_RestoreThread(ts);
    return PyLong_FromLong(r);
}
