/* kjit's launch call: cuLaunchKernel with a prebuilt void** array, called from Python with
 * ten plain ints. cuda.bindings' own cuLaunchKernel wrapper converts each argument through
 * helper objects, which costs as much as the rest of a kjit launch together; this keeps the
 * hot path to one C call. Optional: kjit falls back to cuda.bindings when it is not built.
 * The result code is returned as an int and checked by the caller like any driver result. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

typedef int (*launch_fn)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);
static launch_fn cu_launch = NULL;

static PyObject* bind(PyObject* self, PyObject* noargs) {
    if (cu_launch) Py_RETURN_NONE;
    /* the driver cuda.bindings already loaded: RTLD_NOLOAD finds that same copy */
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        PyErr_Format(PyExc_OSError, "libcuda.so.1 could not be loaded: %s", dlerror());
        return NULL;
    }
    cu_launch = (launch_fn)dlsym(h, "cuLaunchKernel");
    if (!cu_launch) {
        PyErr_SetString(PyExc_OSError, "libcuda.so.1 has no cuLaunchKernel");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* launch(func, gx, gy, gz, bx, by, bz, shared_mem, stream, params) -> CUresult as int */
static PyObject* launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    unsigned long long v[10];
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "launch takes 10 ints");
        return NULL;
    }
    if (!cu_launch) {
        PyErr_SetString(PyExc_RuntimeError, "kjit._launch.bind() was not called");
        return NULL;
    }
    for (int i = 0; i < 10; i++) {
        v[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    int r;
    Py_BEGIN_ALLOW_THREADS  /* the driver may block when its queue is full */
    r = cu_launch((void*)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4],
                  (unsigned)v[5], (unsigned)v[6], (unsigned)v[7], (void*)v[8], (void**)v[9], NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)bind, METH_NOARGS, "Resolve cuLaunchKernel in libcuda."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "cuLaunchKernel(...) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }
