/* _args.c: one argument written into a launch's parameter buffer, and the Python launcher's
 * packer. Below _launch.c; it calls _foreign.c for framework arrays. */
#ifndef KJIT_ARGS_H
#define KJIT_ARGS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Kinds of the pack spec (kjit/runtime/params.py, Packer.c_spec, uses the same numbers: the
 * module exposes these, and tests/test_c_constants.py checks one against the other). */
enum { K_PYTHON = 0, K_I8 = 1, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_U64,
       K_F32 = 10, K_F64 = 11, K_ARRAY = 20, K_ARRAY_BITS = 21 };   /* 21: token (type, bits) */

/* What launches read beside their launcher's own fields, in one cache line: a kjit array's slot
 * offsets and the `ptr` int read last (held) with its value (_args.c's array_address, and
 * kjit_array_as_last below), and the stream of the thread that launched last with no stream
 * given (_launch.c's own_stream). */
struct kjit_hot {
    PyTypeObject* slots_type;
    Py_ssize_t key_offset, ptr_offset;
    PyObject* last_ptr;
    unsigned long long last_addr;
    PyThreadState* stream_thread;   /* NULL: none remembered */
    uint64_t stream_thread_id;
    void* stream;
};
extern struct kjit_hot kjit_hot __attribute__((visibility("hidden")));

/* Write one argument of `kind` to dst: 1 when written, 0 where the Python path must handle it
 * (anything unusual, every error: its message names the parameter), -1 with an exception set.
 * `seen`: the foreign arrays' frameworks. */
int kjit_put_arg(int kind, PyObject* token, PyObject* v, char* dst, PyTypeObject* array_type, int* seen,
                 int grad_ok) __attribute__((visibility("hidden")));

/* A kjit array whose slots are where kjit_put_arg last found them, its launch key the token and
 * its `ptr` the int read last: its address, without a call (kjit_put_arg does the rest) */
static inline int kjit_array_as_last(PyObject* v, PyObject* token, unsigned long long* addr) {
    if (Py_TYPE(v) != kjit_hot.slots_type || kjit_hot.key_offset <= 0 || kjit_hot.ptr_offset <= 0) return 0;
    PyObject* p = *(PyObject**)((char*)v + kjit_hot.ptr_offset);
    if (*(PyObject**)((char*)v + kjit_hot.key_offset) != token || p != kjit_hot.last_ptr || !p) return 0;
    *addr = kjit_hot.last_addr;
    return 1;
}

/* pack(spec, tokens, args, buffer_address, array_type) -> int (see _args.c) */
PyObject* kjit_pack(PyObject* self, PyObject* const* a, Py_ssize_t nargs);
int kjit_args_init(void);   /* the interned slot names; -1 with an exception set */

#endif
