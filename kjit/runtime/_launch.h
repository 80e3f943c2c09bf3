/* Shared between kjit's C launch extension's files (_launch.c, _foreign.c, _tables.c). */
#ifndef KJIT_LAUNCH_H
#define KJIT_LAUNCH_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*ctx_current_fn)(void**);
extern ctx_current_fn kjit_cu_ctx_current;   /* cuCtxGetCurrent, once bind() resolved it */

/* _foreign.c: PyTorch / CuPy arrays packed in C */
int kjit_foreign_init(void);
PyObject* kjit_register_foreign(PyObject* self, PyObject* const* a, Py_ssize_t nargs);
enum { FOREIGN_TORCH = 1, FOREIGN_CUPY = 2 };
PyObject* kjit_register_stream(PyObject* self, PyObject* const* a, Py_ssize_t nargs);
int kjit_foreign_array(PyObject* v, PyObject* token, unsigned long long* addr, int grad_ok);
int kjit_framework_stream(int seen, PyObject* device, void** out);

/* _tables.c: KernelBase and KernelFunctionBase, added to the module */
int kjit_tables_init(PyObject* module);

#endif
