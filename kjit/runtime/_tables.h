/* _tables.c: KernelBase and KernelFunctionBase, the k[config] / f[config] lookups in C. Below
 * _launch.c, which adds them to its module and hands over libcuda's cuCtxGetCurrent once
 * resolved; nothing here calls into the other files. */
#ifndef KJIT_TABLES_H
#define KJIT_TABLES_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*kjit_ctx_current_fn)(void**);
int kjit_tables_init(PyObject* module);                 /* adds the two types to `module` */
void kjit_tables_bind(kjit_ctx_current_fn ctx_current);  /* f[config] asks it in C from then on */

#endif
