/* The Python floor of a launch: a CPython extension function (METH_FASTCALL) that takes the
 * launch's arguments, reads none of them, and calls cuLaunchKernel with a prebuilt void** array.
 * What any Python launcher pays before doing anything of its own: the loop, the call, the
 * launch. Built by benchmarks/launch.py with the running Python's headers. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cuda.h>
#include <string.h>

static CUfunction func;
static void** params;
static void* extra[5];   /* the parameters as one block (prepare_block), as kjit's launcher hands them */
static size_t block_size;

/* prepare(function, params_address) */
static PyObject* prepare(PyObject* self, PyObject* const* a, Py_ssize_t n) {
    if (n != 2) return PyErr_Format(PyExc_TypeError, "prepare(function, params_address)");
    func = (CUfunction)PyLong_AsVoidPtr(a[0]);
    params = (void**)PyLong_AsVoidPtr(a[1]);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* prepare_block(function, block_address, block_size) */
static PyObject* prepare_block(PyObject* self, PyObject* const* a, Py_ssize_t n) {
    if (n != 3) return PyErr_Format(PyExc_TypeError, "prepare_block(function, block_address, block_size)");
    func = (CUfunction)PyLong_AsVoidPtr(a[0]);
    void* block = PyLong_AsVoidPtr(a[1]);
    block_size = PyLong_AsSize_t(a[2]);
    if (PyErr_Occurred()) return NULL;
    void* e[5] = {CU_LAUNCH_PARAM_BUFFER_POINTER, block, CU_LAUNCH_PARAM_BUFFER_SIZE, &block_size,
                  CU_LAUNCH_PARAM_END};
    memcpy(extra, e, sizeof e);
    Py_RETURN_NONE;
}

/* launch_block(*args): the same with the prepared block */
static PyObject* launch_block(PyObject* self, PyObject* const* a, Py_ssize_t n) {
    CUresult r = cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra);
    if (r != CUDA_SUCCESS) return PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel: CUresult %d", (int)r);
    Py_RETURN_NONE;
}

/* launch(*args): the prepared launch on the legacy stream; the arguments are not read */
static PyObject* launch(PyObject* self, PyObject* const* a, Py_ssize_t n) {
    CUresult r = cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    if (r != CUDA_SUCCESS) return PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel: CUresult %d", (int)r);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"prepare", (PyCFunction)(void (*)(void))prepare, METH_FASTCALL, "prepare(function, params_address)"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch(*args): cuLaunchKernel"},
    {"prepare_block", (PyCFunction)(void (*)(void))prepare_block, METH_FASTCALL,
     "prepare_block(function, block_address, block_size)"},
    {"launch_block", (PyCFunction)(void (*)(void))launch_block, METH_FASTCALL,
     "launch_block(*args): cuLaunchKernel with the block"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "py_floor", NULL, -1, methods};

PyMODINIT_FUNC PyInit_py_floor(void) { return PyModule_Create(&module); }
