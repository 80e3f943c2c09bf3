/* Whether a launch releases the GIL around cuLaunchKernel. Releasing lets another Python
 * thread run while the driver works (and while it waits on a full queue), but costs a hand-off
 * on every launch, which nobody gains from while the process has no other Python thread: the
 * GIL is then kept (benchmarks/gil.py measures both in one thread). A thread started while a
 * launch runs waits for that one launch. */
#include "_gil.h"

int kjit_gil_policy = 0;   /* _gil.h */

PyObject* kjit_gil_mode(PyObject* self, PyObject* arg) {
    long m = PyLong_AsLong(arg);
    if (m == -1 && PyErr_Occurred()) return NULL;
    if (m < 0 || m > 2) return PyErr_Format(PyExc_ValueError, "gil_mode: 0, 1 or 2, got %ld", m);
    kjit_gil_policy = (int)m;
    Py_RETURN_NONE;
}
