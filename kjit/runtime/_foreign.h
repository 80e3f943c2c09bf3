/* _foreign.c: PyTorch tensors and CuPy arrays read in C, and their frameworks' current
 * streams. Below _launch.c, which packs with it; nothing here calls into the other files. */
#ifndef KJIT_FOREIGN_H
#define KJIT_FOREIGN_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { FOREIGN_TORCH = 1, FOREIGN_CUPY = 2 };
int kjit_foreign_init(PyObject* module);   /* adds the constants Python mirrors to `module` */
PyObject* kjit_register_foreign(PyObject* self, PyObject* const* a, Py_ssize_t nargs);
PyObject* kjit_register_torch_shim(PyObject* self, PyObject* const* a, Py_ssize_t nargs);
PyObject* kjit_register_torch_facts(PyObject* self, PyObject* arg);
PyObject* kjit_register_stream(PyObject* self, PyObject* const* a, Py_ssize_t nargs);
PyObject* kjit_current_stream(PyObject* self, PyObject* const* a, Py_ssize_t nargs);
PyObject* kjit_register_cupy_layout(PyObject* self, PyObject* const* a, Py_ssize_t nargs);
int kjit_foreign_array(PyObject* v, PyObject* token, unsigned long long* addr, int grad_ok);
int kjit_framework_stream(int seen, PyObject* device, void** out);
void kjit_foreign_bind(int (*count_fn)(int*));

#endif
