/* _libcuda.c: kjit's libcuda functions, resolved once (bind), and the direct calls Python makes
 * through them. Below _launch.c, which adds the calls to its module and launches through
 * kjit_cu; above _tables.c and _foreign.c, which it hands the functions they ask in C. */
#ifndef KJIT_LIBCUDA_H
#define KJIT_LIBCUDA_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_tables.h"   /* kjit_ctx_current_fn */

typedef int (*kjit_launch_fn)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, void*, void**, void**);
typedef struct {
    kjit_launch_fn launch;                 /* cuLaunchKernel: set last, so set means all are */
    kjit_ctx_current_fn ctx_current;       /* cuCtxGetCurrent */
    int (*ctx_push)(void*);                /* cuCtxPushCurrent_v2 */
    int (*ctx_pop)(void**);                /* cuCtxPopCurrent_v2 */
    int (*graph_launch)(void*, void*);     /* cuGraphLaunch; NULL in a driver without it */
    int (*pointer_attrs)(unsigned, int*, void**, unsigned long long);   /* cuPointerGetAttributes */
} KjitLibcuda;
extern KjitLibcuda kjit_cu;   /* all NULL until bind() */

PyObject* kjit_bind(PyObject* self, PyObject* noargs);            /* bind() */
PyObject* kjit_current_context(PyObject* self, PyObject* noargs); /* current_context() -> int */
PyObject* kjit_pointer_device(PyObject* self, PyObject* arg);     /* pointer_device(address) */
PyObject* kjit_launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs);        /* launch(...) */
PyObject* kjit_graph_launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs);  /* graph_launch(...) */

#endif
