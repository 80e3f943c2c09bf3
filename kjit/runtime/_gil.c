/* Whether a launch releases the GIL around cuLaunchKernel. Releasing lets another Python
 * thread run while the driver works (and while it waits on a full queue), but costs a hand-off
 * on every launch, which nobody gains from while the process has no other Python thread: the
 * GIL is then kept (benchmarks/gil.py measures both in one thread). A thread started while a
 * launch runs waits for that one launch. */
#include "_gil.h"

static int mode = 0;   /* 0: as above; 1: always keep the GIL; 2: always release it */

PyThreadState* kjit_gil_release(void) {
    if (mode == 1) return NULL;
    if (mode == 2) return PyEval_SaveThread();
    /* the interpreter's thread states are a list: the only one has neither neighbour (read
     * in place: the accessor calls cost more than the rest of the check) */
    PyThreadState* self = PyThreadState_Get();
    if (self->prev == NULL && self->next == NULL) return NULL;
    return PyEval_SaveThread();
}

PyObject* kjit_gil_mode(PyObject* self, PyObject* arg) {
    long m = PyLong_AsLong(arg);
    if (m == -1 && PyErr_Occurred()) return NULL;
    if (m < 0 || m > 2) return PyErr_Format(PyExc_ValueError, "gil_mode: 0, 1 or 2, got %ld", m);
    mode = (int)m;
    Py_RETURN_NONE;
}
