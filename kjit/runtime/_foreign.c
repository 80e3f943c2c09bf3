#include "_launch.h"

/* PyTorch tensors and CuPy arrays in C. kjit's Python path learns each foreign array type
 * and element type the first time it converts one (register_foreign); from then on an array of
 * that type is written here when its element type and device match the parameter's token and
 * it is C-contiguous. Anything else, and every error, goes to the Python path.
 *
 * A launch given no stream runs on the current stream of the framework whose arrays it
 * receives: the Python path registers each framework's getter (register_stream) when it
 * learns its array type, and kjit_framework_stream asks it here, with no Python frame. */
static PyObject* foreign_kinds = NULL;    /* type -> FOREIGN_TORCH | FOREIGN_CUPY */
static PyObject* stream_getters[3] = {NULL, NULL, NULL};   /* by kind: torch(device), cupy() */
static PyObject* s_stream_ptr = NULL;
static PyObject* dtype_typestrs = NULL;   /* a framework's dtype object -> kjit typestr */
static PyObject *s_dtype, *s_is_contiguous, *s_get_device, *s_data_ptr, *s_requires_grad,
                *s_c_contiguous, *s_data, *s_device_id, *s_ptr;

PyObject* kjit_register_foreign(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    if (nargs != 4 || !PyType_Check(a[0]) || !PyLong_Check(a[1]) || !PyUnicode_Check(a[3])) {
        PyErr_SetString(PyExc_TypeError, "register_foreign(type, kind, dtype, typestr)");
        return NULL;
    }
    if (PyDict_SetItem(foreign_kinds, a[0], a[1]) < 0 || PyDict_SetItem(dtype_typestrs, a[2], a[3]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* register_stream(kind, getter): torch's getter takes the device index and returns the raw
 * stream (torch._C._cuda_getCurrentRawStream); CuPy's takes nothing and returns a Stream whose
 * .ptr is the handle (cupy.cuda.get_current_stream). */
PyObject* kjit_register_stream(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    long kind = nargs == 2 ? PyLong_AsLong(a[0]) : -1;
    if (kind != FOREIGN_TORCH && kind != FOREIGN_CUPY) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "register_stream(kind: 1 | 2, getter)");
        return NULL;
    }
    Py_XSETREF(stream_getters[kind], Py_NewRef(a[1]));
    Py_RETURN_NONE;
}

static int stream_of(int kind, PyObject* device, void** out) {
    PyObject* fn = stream_getters[kind];
    if (!fn) return 0;
    PyObject* r = kind == FOREIGN_TORCH ? PyObject_CallOneArg(fn, device) : PyObject_CallNoArgs(fn);
    if (r && kind == FOREIGN_CUPY) Py_SETREF(r, PyObject_GetAttr(r, s_stream_ptr));
    if (!r) { PyErr_Clear(); return 0; }
    void* p = PyLong_Check(r) ? PyLong_AsVoidPtr(r) : NULL;
    int ok = PyLong_Check(r) && !(p == NULL && PyErr_Occurred());
    Py_DECREF(r);
    if (!ok) { PyErr_Clear(); return 0; }
    *out = p;
    return 1;
}

/* The stream for a launch given none, from the frameworks of its arrays (`seen`, a mask of
 * kinds): none, the legacy stream; one, its current stream. 0 declines (the Python path then
 * asks again and reports what is wrong: two frameworks whose current streams differ). */
int kjit_framework_stream(int seen, PyObject* device, void** out) {
    void *torch_stream = NULL, *cupy_stream = NULL;
    if (!seen) { *out = NULL; return 1; }
    if ((seen & (1 << FOREIGN_TORCH)) && !stream_of(FOREIGN_TORCH, device, &torch_stream)) return 0;
    if ((seen & (1 << FOREIGN_CUPY)) && !stream_of(FOREIGN_CUPY, device, &cupy_stream)) return 0;
    if ((seen & (1 << FOREIGN_TORCH)) && (seen & (1 << FOREIGN_CUPY)) && torch_stream != cupy_stream)
        return 0;
    *out = (seen & (1 << FOREIGN_TORCH)) ? torch_stream : cupy_stream;
    return 1;
}

/* a call or attribute as a C value; 0 (declined) on any error, which Python will report */
static int get_long(PyObject* v, PyObject* name, int call, long long* out) {
    PyObject* r = call ? PyObject_CallMethodNoArgs(v, name) : PyObject_GetAttr(v, name);
    if (!r) { PyErr_Clear(); return 0; }
    int ok = 1;
    if (PyBool_Check(r)) *out = r == Py_True;
    else if (PyLong_Check(r)) {
        *out = PyLong_AsLongLong(r);
        if (*out == -1 && PyErr_Occurred()) { PyErr_Clear(); ok = 0; }
    } else ok = 0;
    Py_DECREF(r);
    return ok;
}

/* 0: declined; else the array's framework kind (FOREIGN_TORCH, FOREIGN_CUPY), its address in
 * *addr. A tensor that requires grad is declined unless `grad_ok` (a PyTorch operator's
 * implementation, which runs below autograd). */
int kjit_foreign_array(PyObject* v, PyObject* token, unsigned long long* addr, int grad_ok) {
    PyObject* kind_obj = PyDict_GetItemWithError(foreign_kinds, (PyObject*)Py_TYPE(v));
    if (!kind_obj) { PyErr_Clear(); return 0; }
    if (!PyTuple_Check(token) || PyTuple_GET_SIZE(token) != 2) return 0;
    PyObject* dtype = PyObject_GetAttr(v, s_dtype);
    if (!dtype) { PyErr_Clear(); return 0; }
    PyObject* typestr = PyDict_GetItemWithError(dtype_typestrs, dtype);   /* borrowed */
    Py_DECREF(dtype);
    if (!typestr) { PyErr_Clear(); return 0; }
    int same = PyUnicode_Compare(typestr, PyTuple_GET_ITEM(token, 0));
    if (same != 0) { PyErr_Clear(); return 0; }
    long long want_device = PyLong_AsLongLong(PyTuple_GET_ITEM(token, 1));
    if (want_device == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    long long contiguous = 0, device = -1, ptr = 0;
    int kind = (int)PyLong_AsLong(kind_obj);
    if (kind == FOREIGN_TORCH) {
        long long grad = 1;
        if (!grad_ok && (!get_long(v, s_requires_grad, 0, &grad) || grad)) return 0;   /* Python says why */
        if (!get_long(v, s_is_contiguous, 1, &contiguous) || !get_long(v, s_get_device, 1, &device) ||
                !get_long(v, s_data_ptr, 1, &ptr)) return 0;
    } else {
        if (!get_long(v, s_c_contiguous, 0, &contiguous)) return 0;
        PyObject* data = PyObject_GetAttr(v, s_data);
        if (!data) { PyErr_Clear(); return 0; }
        int ok = get_long(data, s_device_id, 0, &device) && get_long(data, s_ptr, 0, &ptr);
        Py_DECREF(data);
        if (!ok) return 0;
    }
    if (!contiguous || device != want_device) return 0;
    *addr = (unsigned long long)ptr;
    return kind;
}

int kjit_foreign_init(void) {
    foreign_kinds = PyDict_New();
    dtype_typestrs = PyDict_New();
    s_dtype = PyUnicode_InternFromString("dtype");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_get_device = PyUnicode_InternFromString("get_device");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_requires_grad = PyUnicode_InternFromString("requires_grad");
    s_c_contiguous = PyUnicode_InternFromString("_c_contiguous");
    s_data = PyUnicode_InternFromString("data");
    s_device_id = PyUnicode_InternFromString("device_id");
    s_ptr = PyUnicode_InternFromString("ptr");
    s_stream_ptr = s_ptr;
    return foreign_kinds && dtype_typestrs && s_dtype && s_is_contiguous && s_get_device &&
           s_data_ptr && s_requires_grad && s_c_contiguous && s_data && s_device_id && s_ptr ? 0 : -1;
}
