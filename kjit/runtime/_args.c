/* One argument written into a launch's parameter buffer: ints and floats of each C type, kjit
 * arrays by their slots read in place, framework arrays through _foreign.c; and `pack`, the
 * packer of kjit's Python launcher, which writes every argument it can. Below _launch.c, whose
 * Launcher writes an argument through kjit_put_arg where the one it holds is not the same. */
#include "_args.h"
#include "_foreign.h"
#include "_pyint.h"
#include <math.h>
#include <structmember.h>
#include <string.h>

struct kjit_hot kjit_hot __attribute__((aligned(64))) = {NULL, -1, -1, NULL, 0, NULL, 0, NULL};

static PyObject* s_launch_key = NULL;
static PyObject* s_ptr = NULL;

/* An int of one digit (|x| < 2**30, what kernels are mostly passed) read inline, as CPython's
 * own code reads it: the API call converting any int costs more than the rest of its packing. */
static inline int compact_value(PyObject* v, long long* out) {
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject*)v)) return 0;
    *out = (long long)PyUnstable_Long_CompactValue((PyLongObject*)v);
    return 1;
#else
    Py_ssize_t size = Py_SIZE(v);
    if (size < -1 || size > 1) return 0;
    *out = size * (long long)((PyLongObject*)v)->ob_digit[0];
    return 1;
#endif
}

static int put_int(char* dst, int kind, PyObject* v) {
    if (!PyLong_CheckExact(v)) return 0;           /* bool, numpy ints...: the Python path */
    if (kind == K_U64) {
        unsigned long long u = kjit_as_u64(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        memcpy(dst, &u, 8);
        return 1;
    }
    long long x;
    if (!compact_value(v, &x)) {
        int overflow = 0;
        x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    }
    switch (kind) {
    case K_I8:  if (x < INT8_MIN || x > INT8_MAX) return 0; { int8_t t = (int8_t)x; memcpy(dst, &t, 1); } return 1;
    case K_U8:  if (x < 0 || x > UINT8_MAX) return 0; { uint8_t t = (uint8_t)x; memcpy(dst, &t, 1); } return 1;
    case K_I16: if (x < INT16_MIN || x > INT16_MAX) return 0; { int16_t t = (int16_t)x; memcpy(dst, &t, 2); } return 1;
    case K_U16: if (x < 0 || x > UINT16_MAX) return 0; { uint16_t t = (uint16_t)x; memcpy(dst, &t, 2); } return 1;
    case K_I32: if (x < INT32_MIN || x > INT32_MAX) return 0; { int32_t t = (int32_t)x; memcpy(dst, &t, 4); } return 1;
    case K_U32: if (x < 0 || x > UINT32_MAX) return 0; { uint32_t t = (uint32_t)x; memcpy(dst, &t, 4); } return 1;
    case K_I64: memcpy(dst, &x, 8); return 1;
    }
    return 0;
}

/* A kjit array's slots, read in place: `launch_key` and `ptr` are __slots__ of DeviceArray
 * (memory.py), so their offsets are fixed for the type; each is looked up once, and any other
 * layout (a slot made a property, say) goes through getattr. */

static Py_ssize_t slot_offset(PyTypeObject* t, PyObject* name) {
    PyObject* d = PyObject_GetAttr((PyObject*)t, name);
    if (!d) { PyErr_Clear(); return -1; }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject*)d)->d_member->type == T_OBJECT_EX)
        off = ((PyMemberDescrObject*)d)->d_member->offset;
    Py_DECREF(d);
    return off;
}

/* 1 with *addr set where v's launch key is `token` or `bits` (NULL: none), 0 where it is not
 * (the Python path says why), -1 with an exception set. */
static int array_address(PyObject* v, PyObject* token, PyObject* bits, unsigned long long* addr) {
    PyTypeObject* t = Py_TYPE(v);
    if (t != kjit_hot.slots_type) {
        kjit_hot.key_offset = slot_offset(t, s_launch_key);
        kjit_hot.ptr_offset = slot_offset(t, s_ptr);
        kjit_hot.slots_type = t;
    }
    if (kjit_hot.key_offset > 0 && kjit_hot.ptr_offset > 0) {
        PyObject* key = *(PyObject**)((char*)v + kjit_hot.key_offset);
        PyObject* p = *(PyObject**)((char*)v + kjit_hot.ptr_offset);
        if (!key || !p || (key != token && key != bits)) return 0;
        /* an int never changes: the same object is the same address (and was an int when held,
         * so its type need not be read) */
        if (p == kjit_hot.last_ptr) {
            *addr = kjit_hot.last_addr;
            return 1;
        }
        if (!PyLong_CheckExact(p)) return 0;
        *addr = kjit_as_u64(p);
        if (*addr == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        Py_XSETREF(kjit_hot.last_ptr, Py_NewRef(p));
        kjit_hot.last_addr = *addr;
        return 1;
    }
    PyObject* key = PyObject_GetAttr(v, s_launch_key);
    if (!key) return -1;
    int same = key == token || (bits && key == bits);
    Py_DECREF(key);
    if (!same) return 0;
    PyObject* p = PyObject_GetAttr(v, s_ptr);
    if (!p) return -1;
    *addr = kjit_as_u64(p);
    Py_DECREF(p);
    return *addr == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 1;
}

/* _args.h: 1 written, 0 for the Python path, -1 with an exception set */
int kjit_put_arg(int kind, PyObject* token, PyObject* v, char* dst, PyTypeObject* array_type, int* seen,
                 int grad_ok) {
    if (kind >= K_I8 && kind <= K_U64) return put_int(dst, kind, v);
    if (kind == K_F32 || kind == K_F64) {
        if (!PyFloat_CheckExact(v)) return 0;
        double d = PyFloat_AS_DOUBLE(v);
        if (kind == K_F64) { memcpy(dst, &d, 8); return 1; }
        float f = (float)d;
        if (isinf(f) && !isinf(d)) return 0;   /* overflow: Python says so */
        memcpy(dst, &f, 4);
        return 1;
    }
    if (kind != K_ARRAY && (kind != K_ARRAY_BITS || !PyTuple_Check(token) || PyTuple_GET_SIZE(token) != 2))
        return 0;   /* an unknown kind or token: the Python path */
    unsigned long long addr;
    if (Py_TYPE(v) != array_type) {
        int framework = kjit_foreign_array(v, kind == K_ARRAY ? token : PyTuple_GET_ITEM(token, 0),
                                           &addr, grad_ok);
        if (!framework && kind == K_ARRAY_BITS)   /* an array of the element type's bits */
            framework = kjit_foreign_array(v, PyTuple_GET_ITEM(token, 1), &addr, grad_ok);
        if (!framework) return 0;
        *seen |= 1 << framework;
    } else {   /* a kjit array: its interned launch key is the token (or the bits' token) */
        int got = array_address(v, kind == K_ARRAY ? token : PyTuple_GET_ITEM(token, 0),
                                kind == K_ARRAY ? NULL : PyTuple_GET_ITEM(token, 1), &addr);
        if (got <= 0) return got;
    }
    memcpy(dst, &addr, 8);
    return 1;
}

/* pack(spec, tokens, args, buffer_address, array_type) -> 0 when every argument but those
 * of kind K_PYTHON was written, -1 for a wrong count, else 1 + the index of the first argument the Python
 * path must handle. spec: bytes of (int32 kind, int32 offset) per parameter; tokens: for
 * arrays, the interned (typestr, device) token a matching array carries. */
PyObject* kjit_pack(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    if (nargs != 5 || !PyBytes_Check(a[0]) || !PyTuple_Check(a[1]) || !PyTuple_Check(a[2])) {
        PyErr_SetString(PyExc_TypeError, "pack(spec: bytes, tokens: tuple, args: tuple, buffer, array_type)");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(a[0]) / 8;
    if (PyTuple_GET_SIZE(a[1]) < n) {
        PyErr_SetString(PyExc_ValueError, "pack: a token per parameter");
        return NULL;
    }
    if (PyTuple_GET_SIZE(a[2]) != n) return PyLong_FromLong(-1);
    char* buf = (char*)PyLong_AsVoidPtr(a[3]);
    if (!buf && PyErr_Occurred()) return NULL;
    const char* spec = PyBytes_AS_STRING(a[0]);
    int seen = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t kind, offset;
        memcpy(&kind, spec + 8 * i, 4);
        memcpy(&offset, spec + 8 * i + 4, 4);
        if (kind == K_PYTHON) continue;   /* the caller converts it */
        int r = kjit_put_arg(kind, PyTuple_GET_ITEM(a[1], i), PyTuple_GET_ITEM(a[2], i), buf + offset,
                        (PyTypeObject*)a[4], &seen, 0);
        if (r < 0) return NULL;
        if (r == 0) return PyLong_FromSsize_t(i + 1);
    }
    return PyLong_FromLong(0);
}


int kjit_args_init(void) {
    s_launch_key = PyUnicode_InternFromString("launch_key");
    s_ptr = PyUnicode_InternFromString("ptr");
    return s_launch_key && s_ptr ? 0 : -1;
}
