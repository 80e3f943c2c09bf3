/* kjit's launch call: cuLaunchKernel with a prebuilt void** array, called from Python with
 * ten plain ints. cuda.bindings' own cuLaunchKernel wrapper converts each argument through
 * helper objects, which costs as much as the rest of a kjit launch together; this keeps the
 * hot path to one C call. Optional: kjit falls back to cuda.bindings when it is not built.
 * The result code is returned as an int and checked by the caller like any driver result. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* Kinds of the pack spec (kjit/runtime/params.py, Packer.c_spec, keeps the same numbers). */
enum { K_PYTHON = 0, K_I8 = 1, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_U64,
       K_F32 = 10, K_F64 = 11, K_ARRAY = 20 };

static PyObject* s_launch_key = NULL;
static PyObject* s_ptr = NULL;

static int put_int(char* dst, int kind, PyObject* v) {
    if (!PyLong_CheckExact(v)) return 0;           /* bool, numpy ints...: the Python path */
    if (kind == K_U64) {
        unsigned long long u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        memcpy(dst, &u, 8);
        return 1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    switch (kind) {
    case K_I8:  if (x < INT8_MIN || x > INT8_MAX) return 0; { int8_t t = (int8_t)x; memcpy(dst, &t, 1); } return 1;
    case K_U8:  if (x < 0 || x > UINT8_MAX) return 0; { uint8_t t = (uint8_t)x; memcpy(dst, &t, 1); } return 1;
    case K_I16: if (x < INT16_MIN || x > INT16_MAX) return 0; { int16_t t = (int16_t)x; memcpy(dst, &t, 2); } return 1;
    case K_U16: if (x < 0 || x > UINT16_MAX) return 0; { uint16_t t = (uint16_t)x; memcpy(dst, &t, 2); } return 1;
    case K_I32: if (x < INT32_MIN || x > INT32_MAX) return 0; { int32_t t = (int32_t)x; memcpy(dst, &t, 4); } return 1;
    case K_U32: if (x < 0 || x > UINT32_MAX) return 0; { uint32_t t = (uint32_t)x; memcpy(dst, &t, 4); } return 1;
    case K_I64: memcpy(dst, &x, 8); return 1;
    }
    return 0;
}

/* pack(spec, tokens, args, buffer_address, array_type) -> 0 when every argument was
 * written, -1 for a wrong count, else 1 + the index of the first argument the Python
 * path must handle (anything unusual, and every error, is left to it so that its
 * message names the parameter). spec: bytes of (int32 kind, int32 offset) per parameter;
 * tokens: for arrays, the interned (dtype, device) token a matching array carries. */
static PyObject* pack(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    if (nargs != 5 || !PyBytes_Check(a[0]) || !PyTuple_Check(a[1]) || !PyTuple_Check(a[2])) {
        PyErr_SetString(PyExc_TypeError, "pack(spec: bytes, tokens: tuple, args: tuple, buffer, array_type)");
        return NULL;
    }
    const char* spec = PyBytes_AS_STRING(a[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(a[0]) / 8;
    PyObject* args = a[2];
    if (PyTuple_GET_SIZE(args) != n) return PyLong_FromLong(-1);
    char* buf = (char*)PyLong_AsVoidPtr(a[3]);
    if (!buf && PyErr_Occurred()) return NULL;
    PyTypeObject* array_type = (PyTypeObject*)a[4];
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t kind, offset;
        memcpy(&kind, spec + 8 * i, 4);
        memcpy(&offset, spec + 8 * i + 4, 4);
        PyObject* v = PyTuple_GET_ITEM(args, i);
        char* dst = buf + offset;
        int ok = 0;
        if (kind >= K_I8 && kind <= K_U64) {
            ok = put_int(dst, kind, v);
        } else if (kind == K_F32 || kind == K_F64) {
            if (PyFloat_CheckExact(v)) {
                double d = PyFloat_AS_DOUBLE(v);
                if (kind == K_F64) { memcpy(dst, &d, 8); ok = 1; }
                else {
                    float f = (float)d;
                    if (!isinf(f) || isinf(d)) { memcpy(dst, &f, 4); ok = 1; }  /* overflow: Python says so */
                }
            }
        } else if (kind == K_ARRAY && Py_TYPE(v) == array_type) {
            PyObject* key = PyObject_GetAttr(v, s_launch_key);
            if (!key) return NULL;
            int same = key == PyTuple_GET_ITEM(a[1], i);
            Py_DECREF(key);
            if (same) {
                PyObject* p = PyObject_GetAttr(v, s_ptr);
                if (!p) return NULL;
                unsigned long long addr = PyLong_AsUnsignedLongLong(p);
                Py_DECREF(p);
                if (addr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
                memcpy(dst, &addr, 8);
                ok = 1;
            }
        }
        if (!ok) return PyLong_FromSsize_t(i + 1);
    }
    return PyLong_FromLong(0);
}

static PyMethodDef methods[] = {
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL, "pack(spec, tokens, args, buffer, array_type) -> int"},
    {"bind", (PyCFunction)bind, METH_NOARGS, "Resolve cuLaunchKernel in libcuda."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "cuLaunchKernel(...) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__launch(void) {
    s_launch_key = PyUnicode_InternFromString("launch_key");
    s_ptr = PyUnicode_InternFromString("ptr");
    if (!s_launch_key || !s_ptr) return NULL;
    return PyModule_Create(&module);
}
