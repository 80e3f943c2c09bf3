/* When a launch lets go of the GIL around the driver call (kjit/runtime/_gil.c). */
#ifndef KJIT_GIL_H
#define KJIT_GIL_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* 0 release only where another thread exists, 1 always keep, 2 always release (gil_mode) */
extern int kjit_gil_policy __attribute__((visibility("hidden")));

/* Before a driver call that is quick unless the GPU's queue is full, by the thread whose state
 * is `me`: the thread state to restore after it (the GIL released), or NULL (the GIL kept: no
 * other thread could use it). Inline, for a launcher that has its thread state already: the
 * interpreter's thread states are a list, and the only one has neither neighbour (read in
 * place: the accessor calls cost more than the rest of the check). */
static inline PyThreadState* kjit_gil_release_for(PyThreadState* me) {
    if (kjit_gil_policy == 1 || (kjit_gil_policy == 0 && !me->prev && !me->next)) return NULL;
    return PyEval_SaveThread();
}

/* the same for the calling thread */
static inline PyThreadState* kjit_gil_release(void) {
    return kjit_gil_policy == 1 ? NULL : kjit_gil_release_for(PyThreadState_Get());
}
/* gil_mode(m): 0 release only where another thread exists, 1 always keep, 2 always release
 * (a benchmark's comparison) */
PyObject* kjit_gil_mode(PyObject* self, PyObject* arg);
#endif
