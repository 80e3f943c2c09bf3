/* Python ints read as 64-bit C values on the launch path. PyLong_AsUnsignedLongLong and
 * PyLong_AsLongLong convert an int of more than one digit (every device address) through a byte
 * array, about 200 instructions; PyLong_AsUnsignedLong and PyLong_AsLong loop over its digits.
 * Where long is 64 bits they convert the same values with the same errors. */
#ifndef KJIT_PYINT_H
#define KJIT_PYINT_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>

static inline unsigned long long kjit_as_u64(PyObject* v) {
#if ULONG_MAX == 0xFFFFFFFFFFFFFFFFULL
    return PyLong_AsUnsignedLong(v);
#else
    return PyLong_AsUnsignedLongLong(v);
#endif
}

static inline long long kjit_as_i64(PyObject* v) {
#if LONG_MAX == 0x7FFFFFFFFFFFFFFFLL
    return PyLong_AsLong(v);
#else
    return PyLong_AsLongLong(v);
#endif
}

#endif
