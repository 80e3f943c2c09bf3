/* When a launch lets go of the GIL around the driver call (kjit/runtime/_gil.c). */
#ifndef KJIT_GIL_H
#define KJIT_GIL_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Before a driver call that is quick unless the GPU's queue is full: the thread state to
 * restore after it (the GIL released), or NULL (the GIL kept: no other thread could use it). */
PyThreadState* kjit_gil_release(void);
/* gil_mode(m): 0 release only where another thread exists, 1 always keep, 2 always release
 * (a benchmark's comparison) */
PyObject* kjit_gil_mode(PyObject* self, PyObject* arg);
#endif
