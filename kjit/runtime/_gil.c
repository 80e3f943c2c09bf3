/* Whether a launch releases the GIL around cuLaunchKernel. Releasing lets another Python
 * thread run while the driver works (and while it waits on a full queue), but costs a hand-off
 * on every launch: on the H100 hosts here a kjit launch took 4.5 us releasing the GIL and
 * 2.3 us keeping it (benchmarks/multigpu.py). So the GIL is released only when the process has
 * another Python thread that could take it; with one, nothing could run meanwhile. A thread
 * started while a launch runs waits for that one launch. */
#include "_gil.h"

static int keep_gil = 0;

PyThreadState* kjit_gil_release(void) {
    if (keep_gil) return NULL;
    PyThreadState* self = PyThreadState_Get();
    PyThreadState* head = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(self));
    if (head == self && PyThreadState_Next(head) == NULL) return NULL;   /* the only thread */
    return PyEval_SaveThread();
}

PyObject* kjit_hold_gil(PyObject* self, PyObject* flag) {
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    keep_gil = on;
    Py_RETURN_NONE;
}
