#include "_foreign.h"
#include "_pyint.h"
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* PyTorch tensors and CuPy arrays in C. kjit's Python path learns each foreign array type
 * and element type the first time it converts one (register_foreign); from then on an array of
 * that type is written here when its element type and device match the parameter's token and
 * it is C-contiguous. Anything else, and every error, goes to the Python path.
 *
 * A torch.Tensor or Parameter is read through PyTorch's C shim (torch_by_shim, below), a plain
 * C call per question. Other arrays are read through their type's own C accessors (torch:
 * dtype, requires_grad, is_contiguous(), get_device() or is_cuda, data_ptr()): when a type is
 * learned, each one is looked up on the type once, and where it is a C getter or C method
 * (torch._C.TensorBase's) the packer calls that directly instead of looking the name up on
 * every launch. The type's version tag, which CPython changes whenever the type or a base is
 * modified, guards the cache: a patched method is looked up again. Types with their own
 * __getattribute__ or __getattr__, and accessors written in Python, are read through the
 * ordinary attribute API.
 *
 * A launch given no stream runs on the current stream of the framework whose arrays it
 * receives: PyTorch's shim where it has one, else the getter the Python path registers for
 * each framework (register_stream) when it learns its array type, asked here with no Python
 * frame. */

enum { A_DTYPE, A_REQUIRES_GRAD, A_IS_CONTIGUOUS, A_GET_DEVICE, A_IS_CUDA, A_DATA_PTR,   /* torch */
       A_CDATA, A_IS_NESTED, A_C_CONTIGUOUS, A_DATA, N_ACCESSORS };                       /* cupy */
static const char* const accessor_names[N_ACCESSORS] = {
    "dtype", "requires_grad", "is_contiguous", "get_device", "is_cuda", "data_ptr", "_cdata",
    "is_nested", "_c_contiguous", "data"};
static const int accessor_is_call[N_ACCESSORS] = {0, 0, 1, 1, 0, 1, 0, 0, 0, 0};
/* With one CUDA device in the process, a tensor on CUDA is on device 0: the `is_cuda` getter
 * answers that for a fraction of get_device()'s argument parsing. */
static int (*device_count)(int*) = NULL;   /* libcuda's cuDeviceGetCount, from _launch.c's bind */
static int single_device = -1;             /* -1: not known yet (asked until the driver answers) */
void kjit_foreign_bind(int (*count_fn)(int*)) { device_count = count_fn; }

static int one_device(void) {
    int count = 0;
    if (single_device < 0 && device_count && device_count(&count) == 0)
        single_device = count == 1;   /* before cuInit the call fails: asked again next time */
    return single_device == 1;
}
static PyObject* accessor_strs[N_ACCESSORS];

#define MAX_TYPES 32     /* more learned array types than this stay on the Python path */
#define MAX_DTYPES 64
typedef struct {
    PyTypeObject* type;
    int kind;
    int by_shim;                          /* torch.Tensor and Parameter: read through PyTorch's C shim */
    unsigned int version;                 /* tp_version_tag the accessors were read at; 0: none */
    PyObject* accessors[N_ACCESSORS];     /* C descriptors, NULL: through the attribute API */
} ForeignType;
static ForeignType types[MAX_TYPES];
static int n_types = 0;
static struct { PyObject* dtype; PyObject* typestr; } dtypes[MAX_DTYPES];   /* -> kjit typestr */
static int n_dtypes = 0;

static PyObject* stream_getters[3] = {NULL, NULL, NULL};   /* by kind, each getter(device) */
/* CuPy's C reader of a device's current stream (cupy_backends.cuda.stream's get_stream_ptr,
 * from its __pyx_capi__; kjit/runtime/cupy_capi.py checks it against CuPy's Python answer):
 * one C call where the getter makes a Stream object. NULL: the getter. */
#define CUPY_STREAM_SIGNATURE "intptr_t (int)"
typedef intptr_t (*cupy_stream_fn)(int);
static cupy_stream_fn cupy_stream_reader = NULL;

/* PyTorch's C shim: the plain C functions AOTInductor's compiled code reads tensors and the
 * current stream with (torch/csrc/inductor/aoti_torch/c/shim.h). A handle is an at::Tensor*,
 * and an at::Tensor is one pointer to its TensorImpl. The tensor object holds its at::Tensor
 * at `offset` (PyTorch's THPVariable puts it right after the object header); where that was
 * not observed, the `_cdata` getter gives the TensorImpl and the handle points at a copy of
 * it, taking no reference (the tensor object holds one throughout the launch).
 * kjit/runtime/torch_shim.py finds the functions and checks their answers, and the offset,
 * against PyTorch's Python ones for live tensors before handing them here; the device type
 * and layout codes come from a CUDA tensor too. Tensor subclasses keep the accessors, which
 * honour __torch_function__. */
typedef int32_t (*shim_ptr_fn)(void*, void**);
typedef int32_t (*shim_i32_fn)(void*, int32_t*);
typedef int32_t (*shim_i64_fn)(void*, int64_t*);
typedef int32_t (*shim_bool_fn)(void*, bool*);
typedef int32_t (*shim_stream_fn)(int32_t, void**);
/* the readers, in torch_shim._READERS's order: their names, exposed as SHIM_READERS, let a
 * test check that order */
enum { S_DATA_PTR, S_DTYPE, S_DEVICE_TYPE, S_DEVICE_INDEX, S_LAYOUT, S_IS_CONTIGUOUS, S_NUMEL,
       S_STORAGE_SIZE, S_STORAGE_OFFSET, N_READERS };
static const char* const reader_names[N_READERS] = {
    "get_data_ptr", "get_dtype", "get_device_type", "get_device_index", "get_layout",
    "is_contiguous", "get_numel", "get_storage_size", "get_storage_offset"};
/* torch_facts.cpp's one-call reader (KjitTensorFacts there, torch_facts.Facts in Python): used
 * in the shim's place once kjit/runtime/torch_facts.py has built it against this PyTorch and
 * checked its answers against PyTorch's and the shim's */
typedef struct {
    int32_t device_type, device_index, layout, dtype;
    int32_t nested, contiguous, requires_grad, has_storage;
    int64_t numel, storage_nbytes, storage_offset;
    void* data;
} TensorFacts;
typedef int (*facts_fn)(const void*, TensorFacts*);
static struct {
    void* fn[N_READERS];
    facts_fn facts;          /* NULL: the shim's calls */
    shim_stream_fn stream;   /* NULL: the registered Python getter */
    int32_t cuda, strided;
    Py_ssize_t offset;       /* of the at::Tensor in a tensor object; 0: ask `_cdata` */
    int ready;
} shim;
#define ASK(i, type, h, out) (((type)shim.fn[i])((h), (out)) == 0)
#define MAX_CODES 64
static PyObject* code_typestr[MAX_CODES];   /* torch ScalarType code -> kjit typestr */
static int64_t code_itemsize[MAX_CODES];
static PyObject *s_device_id, *s_ptr, *empty_tuple;

/* Look each accessor up on the type, keeping the C ones, and note the version they hold at. */
static void resolve_accessors(ForeignType* ft) {
    PyTypeObject* t = ft->type;
    for (int i = 0; i < N_ACCESSORS; i++) Py_CLEAR(ft->accessors[i]);
    ft->version = 0;
    if (t->tp_getattro != PyObject_GenericGetAttr) return;   /* its own lookup decides */
    for (int i = 0; i < N_ACCESSORS; i++) {
        PyObject* d = PyObject_GetAttr((PyObject*)t, accessor_strs[i]);   /* the descriptor */
        if (!d) { PyErr_Clear(); continue; }
        int usable = accessor_is_call[i] ? Py_IS_TYPE(d, &PyMethodDescr_Type)
                                         : Py_IS_TYPE(d, &PyGetSetDescr_Type);
        if (usable) ft->accessors[i] = d;
        else Py_DECREF(d);
    }
    ft->version = t->tp_version_tag;   /* 0 (none yet, or just modified): not used */
}

static ForeignType* foreign_type(PyTypeObject* t) {
    for (int i = 0; i < n_types; i++)
        if (types[i].type == t) return &types[i];
    return NULL;
}

/* a C method of v's type called with no arguments, as its calling convention wants */
static PyObject* call_method(PyMethodDef* m, PyObject* descr, PyObject* v) {
    switch (m->ml_flags & (METH_VARARGS | METH_FASTCALL | METH_NOARGS | METH_O | METH_KEYWORDS | METH_METHOD)) {
    case METH_NOARGS:
        return m->ml_meth(v, NULL);
    case METH_VARARGS:
        return m->ml_meth(v, empty_tuple);
    case METH_VARARGS | METH_KEYWORDS:
        return ((PyCFunctionWithKeywords)(void (*)(void))m->ml_meth)(v, empty_tuple, NULL);
    default:
        return PyObject_Vectorcall(descr, &v, 1, NULL);
    }
}

/* a C getter's or C method's descriptor called on v, held across the call: code it runs may
 * look the accessors up again */
static PyObject* call_descriptor(PyObject* d, PyObject* v) {
    Py_INCREF(d);
    PyObject* r;
    if (Py_IS_TYPE(d, &PyGetSetDescr_Type)) {
        PyGetSetDef* gs = ((PyGetSetDescrObject*)d)->d_getset;
        r = gs->get(v, gs->closure);
    } else r = call_method(((PyMethodDescrObject*)d)->d_method, d, v);
    Py_DECREF(d);
    return r;
}

/* whether ft's accessors hold for type t as it is now: a type or base changed since they were
 * looked up (CPython then gives it a new version tag, 0 until asked) has them looked up again */
static int accessors_fresh(ForeignType* ft, PyTypeObject* t) {
    unsigned int version = t->tp_version_tag;
    if (version && version != ft->version) resolve_accessors(ft);
    return version && version == ft->version;
}

/* accessor `i` of `v` (a new reference), or NULL with an exception set */
static PyObject* read_accessor(ForeignType* ft, int i, PyObject* v) {
    PyObject* d = accessors_fresh(ft, Py_TYPE(v)) ? ft->accessors[i] : NULL;
    if (d) return call_descriptor(d, v);
    return accessor_is_call[i] ? PyObject_CallMethodNoArgs(v, accessor_strs[i])
                               : PyObject_GetAttr(v, accessor_strs[i]);
}

/* A CuPy array's `data` (a MemoryPointer): its `device_id` and `ptr` getters, looked up on its
 * type and called directly as the arrays' accessors are, under the same version-tag guard (one
 * type remembered: another one is looked up afresh). */
enum { P_DEVICE_ID, P_PTR, N_POINTER_ATTRS };
static struct {
    PyTypeObject* type;
    unsigned int version;
    PyObject* get[N_POINTER_ATTRS];   /* getset descriptors; NULL: the attribute API */
} pointer_type;

static PyObject* read_pointer_attr(PyObject* data, int i) {
    PyTypeObject* t = Py_TYPE(data);
    PyObject* name = i == P_PTR ? s_ptr : s_device_id;
    if (t != pointer_type.type || !t->tp_version_tag || t->tp_version_tag != pointer_type.version) {
        for (int j = 0; j < N_POINTER_ATTRS; j++) Py_CLEAR(pointer_type.get[j]);
        Py_XSETREF(pointer_type.type, (PyTypeObject*)Py_NewRef(t));
        pointer_type.version = 0;
        if (t->tp_getattro == PyObject_GenericGetAttr) {
            for (int j = 0; j < N_POINTER_ATTRS; j++) {
                PyObject* d = PyObject_GetAttr((PyObject*)t, j == P_PTR ? s_ptr : s_device_id);
                if (!d) { PyErr_Clear(); continue; }
                if (Py_IS_TYPE(d, &PyGetSetDescr_Type) && ((PyGetSetDescrObject*)d)->d_getset->get)
                    pointer_type.get[j] = d;
                else Py_DECREF(d);
            }
            pointer_type.version = t->tp_version_tag;
        }
    }
    PyObject* d = pointer_type.version && pointer_type.version == t->tp_version_tag ?
        pointer_type.get[i] : NULL;
    return d ? call_descriptor(d, data) : PyObject_GetAttr(data, name);
}

/* A CuPy array's fields read in place (kjit/runtime/cupy_capi.py observes where its type holds
 * them, checking each against CuPy's getter): while the array's type still has CuPy's own
 * getters for dtype, _c_contiguous and data, and its data is a MemoryPointer, those fields are
 * what the getters would answer, with no call into CuPy per field. */
enum { C_DTYPE, C_CONTIGUOUS, C_DATA, N_CUPY_FIELDS };
static const int cupy_field_accessor[N_CUPY_FIELDS] = {A_DTYPE, A_C_CONTIGUOUS, A_DATA};
static struct {
    PyObject* getter[N_CUPY_FIELDS];   /* CuPy's getset descriptors */
    Py_ssize_t at[N_CUPY_FIELDS];      /* their fields' offsets in the array */
    Py_ssize_t end;                    /* the array object holds them all below this */
    PyTypeObject* pointer_type;        /* cupy.cuda.memory.MemoryPointer */
    Py_ssize_t ptr_at, device_at;      /* its `ptr` and `device_id` fields */
} cupy_layout;

/* register_cupy_layout(dtype, contiguous, data getters, MemoryPointer, dtype, contiguous,
 * data offsets, ptr and device_id offsets) */
PyObject* kjit_register_cupy_layout(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    Py_ssize_t at[N_CUPY_FIELDS + 2];
    if (nargs != 2 * N_CUPY_FIELDS + 3 || !PyType_Check(a[N_CUPY_FIELDS])) goto usage;
    for (int i = 0; i < N_CUPY_FIELDS; i++)
        if (!Py_IS_TYPE(a[i], &PyGetSetDescr_Type)) goto usage;
    for (int i = 0; i < N_CUPY_FIELDS + 2; i++) {
        at[i] = PyLong_AsSsize_t(a[N_CUPY_FIELDS + 1 + i]);
        if (at[i] == -1 && PyErr_Occurred()) return NULL;
        if (at[i] < (Py_ssize_t)sizeof(PyObject) || at[i] > 4096) goto usage;
    }
    PyTypeObject* pointer_type = (PyTypeObject*)a[N_CUPY_FIELDS];
    if (at[N_CUPY_FIELDS] + (Py_ssize_t)sizeof(intptr_t) > pointer_type->tp_basicsize ||
            at[N_CUPY_FIELDS + 1] + (Py_ssize_t)sizeof(int) > pointer_type->tp_basicsize)
        goto usage;
    for (int i = 0; i < N_CUPY_FIELDS; i++) Py_XSETREF(cupy_layout.getter[i], Py_NewRef(a[i]));
    cupy_layout.end = 0;
    for (int i = 0; i < N_CUPY_FIELDS; i++) {
        cupy_layout.at[i] = at[i];
        Py_ssize_t end = at[i] + (i == C_CONTIGUOUS ? (Py_ssize_t)sizeof(int) : (Py_ssize_t)sizeof(PyObject*));
        if (end > cupy_layout.end) cupy_layout.end = end;
    }
    Py_XSETREF(cupy_layout.pointer_type, (PyTypeObject*)Py_NewRef(pointer_type));
    cupy_layout.ptr_at = at[N_CUPY_FIELDS];
    cupy_layout.device_at = at[N_CUPY_FIELDS + 1];
    Py_RETURN_NONE;
usage:
    PyErr_SetString(PyExc_TypeError, "register_cupy_layout(dtype getter, _c_contiguous getter, data getter, "
                    "MemoryPointer type, dtype offset, _c_contiguous offset, data offset, ptr offset, device_id offset)");
    return NULL;
}

/* register_torch_shim(readers, stream, cuda, strided, offset): the readers' addresses (a
 * tuple, N_READERS long), the current-stream reader's (0: none), the device type and layout
 * codes of a CUDA tensor, and where a tensor object holds its at::Tensor (0: not known) */
PyObject* kjit_register_torch_shim(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    void* fn[N_READERS];
    if (nargs != 5 || !PyTuple_Check(a[0]) || PyTuple_GET_SIZE(a[0]) != N_READERS) goto usage;
    for (int i = 0; i < N_READERS; i++) {
        fn[i] = PyLong_Check(PyTuple_GET_ITEM(a[0], i)) ? PyLong_AsVoidPtr(PyTuple_GET_ITEM(a[0], i)) : NULL;
        if (!fn[i]) goto usage;
    }
    if (!PyLong_Check(a[1])) goto usage;
    void* stream = PyLong_AsVoidPtr(a[1]);
    if (PyErr_Occurred()) goto usage;
    long cuda = PyLong_AsLong(a[2]);
    if (PyErr_Occurred()) goto usage;
    long strided = PyLong_AsLong(a[3]);
    if (PyErr_Occurred()) goto usage;
    Py_ssize_t offset = PyLong_AsSsize_t(a[4]);
    if (PyErr_Occurred() || (offset != 0 && (offset < (Py_ssize_t)sizeof(PyObject) || offset > 4096)))
        goto usage;
    shim.ready = 0;
    memcpy(shim.fn, fn, sizeof fn);
    shim.stream = (shim_stream_fn)stream;
    shim.cuda = (int32_t)cuda;
    shim.strided = (int32_t)strided;
    shim.offset = offset;
    shim.ready = 1;
    Py_RETURN_NONE;
usage:
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "register_torch_shim(%d reader addresses, stream reader "
                     "address or 0, cuda code, strided code, tensor offset or 0)", N_READERS);
    return NULL;
}

/* register_torch_facts(address): the reader's address; 0 goes back to the shim's calls */
PyObject* kjit_register_torch_facts(PyObject* self, PyObject* arg) {
    unsigned long long addr = kjit_as_u64(arg);
    if (addr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (addr && !shim.ready)
        return PyErr_Format(PyExc_RuntimeError, "register_torch_facts: the shim is not registered");
    shim.facts = (facts_fn)(uintptr_t)addr;
    Py_RETURN_NONE;
}

/* register_foreign(type, kind, dtype, typestr[, code, itemsize]): `code`, a torch.Tensor's
 * or Parameter's ScalarType code for `dtype` (of `itemsize` bytes), puts the type on the shim */
PyObject* kjit_register_foreign(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    if ((nargs != 4 && nargs != 6) || !PyType_Check(a[0]) || !PyLong_Check(a[1]) ||
            !PyUnicode_Check(a[3]) || (nargs == 6 && (!PyLong_Check(a[4]) || !PyLong_Check(a[5])))) {
        PyErr_SetString(PyExc_TypeError, "register_foreign(type, kind, dtype, typestr[, code, itemsize])");
        return NULL;
    }
    long code = nargs == 6 ? PyLong_AsLong(a[4]) : -1;
    if (PyErr_Occurred()) return NULL;
    long itemsize = nargs == 6 ? PyLong_AsLong(a[5]) : 0;
    if (PyErr_Occurred()) return NULL;
    if (code >= MAX_CODES || itemsize < 1) code = -1;   /* one this table has no room for */
    long kind = PyLong_AsLong(a[1]);
    if (kind != FOREIGN_TORCH && kind != FOREIGN_CUPY) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "register_foreign: kind is 1 (torch) or 2 (cupy)");
        return NULL;
    }
    PyTypeObject* t = (PyTypeObject*)a[0];
    if (!foreign_type(t) && n_types < MAX_TYPES) {
        ForeignType* ft = &types[n_types];
        memset(ft, 0, sizeof *ft);
        ft->type = (PyTypeObject*)Py_NewRef(t);
        ft->kind = (int)kind;
        resolve_accessors(ft);
        n_types++;
    }
    /* interned, as the tokens' typestrs are (memory.launch_key): the packer's comparison is
     * then one pointer test */
    PyObject* typestr = Py_NewRef(a[3]);
    PyUnicode_InternInPlace(&typestr);
    ForeignType* ft = foreign_type(t);
    if (ft && code >= 0 && kind == FOREIGN_TORCH && shim.ready) {
        ft->by_shim = 1;
        if (!code_typestr[code]) {
            code_itemsize[code] = itemsize;
            code_typestr[code] = Py_NewRef(typestr);
        }
    }
    int known = 0;
    for (int i = 0; i < n_dtypes; i++) known |= dtypes[i].dtype == a[2];
    if (!known && n_dtypes < MAX_DTYPES) {
        dtypes[n_dtypes].dtype = Py_NewRef(a[2]);
        dtypes[n_dtypes].typestr = Py_NewRef(typestr);
        n_dtypes++;
    }
    Py_DECREF(typestr);
    Py_RETURN_NONE;
}

/* register_stream(kind, getter[, reader]): each getter takes the device index; torch's returns
 * the raw stream (torch._C._cuda_getCurrentRawStream), CuPy's a Stream whose .ptr is the handle
 * (cupy.cuda.get_current_stream). reader: for CuPy, the capsule of its C reader (above), or
 * None. */
PyObject* kjit_register_stream(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    long kind = nargs == 2 || nargs == 3 ? PyLong_AsLong(a[0]) : -1;
    if (kind != FOREIGN_TORCH && kind != FOREIGN_CUPY) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "register_stream(kind: 1 | 2, getter[, reader])");
        return NULL;
    }
    cupy_stream_fn reader = NULL;
    if (nargs == 3 && a[2] != Py_None) {
        if (kind != FOREIGN_CUPY || !PyCapsule_IsValid(a[2], CUPY_STREAM_SIGNATURE)) {
            PyErr_SetString(PyExc_TypeError, "register_stream: the reader is CuPy's, a capsule named "
                            "\"" CUPY_STREAM_SIGNATURE "\"");
            return NULL;
        }
        reader = (cupy_stream_fn)PyCapsule_GetPointer(a[2], CUPY_STREAM_SIGNATURE);
    }
    Py_XSETREF(stream_getters[kind], Py_NewRef(a[1]));
    if (kind == FOREIGN_CUPY) cupy_stream_reader = reader;
    Py_RETURN_NONE;
}

static int stream_of(int kind, PyObject* device, void** out) {
    if (kind == FOREIGN_TORCH && shim.ready && shim.stream) {
        long index = PyLong_AsLong(device);
        if (index == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        return shim.stream((int32_t)index, out) == 0;
    }
    if (kind == FOREIGN_CUPY && cupy_stream_reader) {
        long index = PyLong_AsLong(device);
        if (index == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        intptr_t p = cupy_stream_reader((int)index);   /* Cython's: -1 with an exception on failure */
        if (p == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        *out = (void*)p;
        return 1;
    }
    PyObject* fn = Py_XNewRef(stream_getters[kind]);   /* held: the call may register another */
    if (!fn) return 0;
    PyObject* r = PyObject_CallOneArg(fn, device);
    Py_DECREF(fn);
    if (r && kind == FOREIGN_CUPY) Py_SETREF(r, PyObject_GetAttr(r, s_ptr));
    if (!r) { PyErr_Clear(); return 0; }
    void* p = PyLong_Check(r) ? PyLong_AsVoidPtr(r) : NULL;
    int ok = PyLong_Check(r) && !(p == NULL && PyErr_Occurred());
    Py_DECREF(r);
    if (!ok) { PyErr_Clear(); return 0; }
    *out = p;
    return 1;
}

/* current_stream(kind, device) -> the framework's current stream on `device` as a launch reads
 * it, or None where it cannot be read (the Python path reads it through this too) */
PyObject* kjit_current_stream(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    long kind = nargs == 2 ? PyLong_AsLong(a[0]) : -1;
    if ((kind != FOREIGN_TORCH && kind != FOREIGN_CUPY) || !PyLong_Check(a[1])) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "current_stream(kind: 1 | 2, device: int)");
        return NULL;
    }
    void* stream = NULL;
    if (!stream_of((int)kind, a[1], &stream)) Py_RETURN_NONE;
    return PyLong_FromVoidPtr(stream);
}

/* The stream for a launch given none, from the frameworks of its arrays (`seen`, a mask of
 * kinds, at least one: a launch with none takes its thread's stream, _launch.c): one, its
 * current stream. 0 declines (the Python path then asks again and reports what is wrong: two
 * frameworks whose current streams differ). */
int kjit_framework_stream(int seen, PyObject* device, void** out) {
    void *torch_stream = NULL, *cupy_stream = NULL;
    if (!seen) return 0;
    if ((seen & (1 << FOREIGN_TORCH)) && !stream_of(FOREIGN_TORCH, device, &torch_stream)) return 0;
    if ((seen & (1 << FOREIGN_CUPY)) && !stream_of(FOREIGN_CUPY, device, &cupy_stream)) return 0;
    if ((seen & (1 << FOREIGN_TORCH)) && (seen & (1 << FOREIGN_CUPY)) && torch_stream != cupy_stream)
        return 0;
    *out = (seen & (1 << FOREIGN_TORCH)) ? torch_stream : cupy_stream;
    return 1;
}

/* a Python int or bool as a C value, consuming `r`; 0 (declined) on anything else */
static int as_long(PyObject* r, long long* out) {
    if (!r) { PyErr_Clear(); return 0; }
    int ok = 1;
    if (r == Py_True || r == Py_False) *out = r == Py_True;
    else if (PyLong_Check(r)) {
        *out = kjit_as_i64(r);
        if (*out == -1 && PyErr_Occurred()) { PyErr_Clear(); ok = 0; }
    } else ok = 0;
    Py_DECREF(r);
    return ok;
}

/* whether a tensor's elements lie in its storage, and the storage has memory: a storage
 * resized to nothing has no bytes, a functionalized tensor's none at all (its address is its
 * offset from 0) */
static inline int in_storage(int64_t numel, int64_t nbytes, int64_t first, int64_t itemsize, void* data) {
    return first >= 0 && numel <= nbytes / itemsize - first &&
           (uintptr_t)data != (uintptr_t)(first * itemsize);
}

/* whether element type `got` (a kjit typestr) is the token's `want`: interned alike, so mostly
 * one pointer test */
static inline int same_typestr(PyObject* got, PyObject* want) {
    if (got == want) return 1;
    int r = PyUnicode_Compare(got, want);
    if (r == -1 && PyErr_Occurred()) PyErr_Clear();
    return r == 0;
}

/* torch_by_shim's answer from the one-call reader */
static int torch_by_facts(void* h, PyObject* want, long long want_device,
                          int grad_ok, unsigned long long* addr) {
    TensorFacts f;
    if (shim.facts(h, &f) != 0 || f.nested || f.device_type != shim.cuda || f.device_index != want_device ||
            f.layout != shim.strided || f.dtype < 0 || f.dtype >= MAX_CODES || !code_typestr[f.dtype] ||
            !f.contiguous || (!grad_ok && f.requires_grad))
        return 0;
    if (!same_typestr(code_typestr[f.dtype], want)) return 0;
    /* no storage: declined, as the shim's address query fails for it */
    if (!f.has_storage ||
            (f.numel > 0 && !in_storage(f.numel, f.storage_nbytes, f.storage_offset, code_itemsize[f.dtype], f.data)))
        return 0;
    *addr = (unsigned long long)(uintptr_t)f.data;
    return 1;
}

/* a tensor read through the shim (or its one-call reader): 1 when it is a dense CUDA tensor on
 * `want_device` holding `want` (and not requiring grad unless `grad_ok`), its elements in its
 * storage, its address in *addr; 0 declines. Whether it is nested is asked of its getter: the
 * shim answers a nested tensor's sizes with an error PyTorch logs. */
static int torch_by_shim(ForeignType* ft, PyObject* v, PyObject* want, long long want_device,
                         int grad_ok, unsigned long long* addr) {
    void* impl = NULL;
    void* h = (char*)v + shim.offset;   /* an at::Tensor* */
    if (!shim.offset) {
        PyObject* r = read_accessor(ft, A_CDATA, v);
        impl = r && PyLong_Check(r) ? PyLong_AsVoidPtr(r) : NULL;
        Py_XDECREF(r);
        if (!impl) { PyErr_Clear(); return 0; }
        h = &impl;
    } else if (shim.offset + (Py_ssize_t)sizeof(void*) > Py_TYPE(v)->tp_basicsize)
        return 0;
    if (shim.facts) return torch_by_facts(h, want, want_device, grad_ok, addr);
    int32_t type, index, layout, code;
    int64_t numel, nbytes, first;
    bool dense = false;
    void* data = NULL;
    if (!ASK(S_DEVICE_TYPE, shim_i32_fn, h, &type) || type != shim.cuda ||
            !ASK(S_DEVICE_INDEX, shim_i32_fn, h, &index) || index != want_device ||
            !ASK(S_LAYOUT, shim_i32_fn, h, &layout) || layout != shim.strided ||
            !ASK(S_DTYPE, shim_i32_fn, h, &code) || code < 0 || code >= MAX_CODES ||
            !code_typestr[code])
        return 0;
    if (!same_typestr(code_typestr[code], want)) return 0;
    long long nested = 1, grad = 1;
    if (!as_long(read_accessor(ft, A_IS_NESTED, v), &nested) || nested ||
            !ASK(S_IS_CONTIGUOUS, shim_bool_fn, h, &dense) || !dense ||
            !ASK(S_NUMEL, shim_i64_fn, h, &numel) || !ASK(S_DATA_PTR, shim_ptr_fn, h, &data))
        return 0;
    if (numel > 0 && (!ASK(S_STORAGE_SIZE, shim_i64_fn, h, &nbytes) ||
                      !ASK(S_STORAGE_OFFSET, shim_i64_fn, h, &first) ||
                      !in_storage(numel, nbytes, first, code_itemsize[code], data)))
        return 0;
    if (!grad_ok && (!as_long(read_accessor(ft, A_REQUIRES_GRAD, v), &grad) || grad)) return 0;
    *addr = (unsigned long long)(uintptr_t)data;
    return 1;
}

/* kjit's typestr for a learned dtype (borrowed), or NULL */
static PyObject* typestr_of(PyObject* dtype) {
    for (int i = 0; i < n_dtypes; i++)
        if (dtypes[i].dtype == dtype) return dtypes[i].typestr;
    /* an equal dtype that is another object, of the same type: numpy's dtype equals what it
     * would convert from (None is float64, 'float32' float32), so none of those may answer */
    for (int i = 0; i < n_dtypes; i++) {
        if (Py_TYPE(dtypes[i].dtype) != Py_TYPE(dtype)) continue;
        int eq = PyObject_RichCompareBool(dtypes[i].dtype, dtype, Py_EQ);
        if (eq < 0) PyErr_Clear();
        else if (eq) return dtypes[i].typestr;
    }
    return NULL;
}

/* A CuPy array read in place (cupy_layout, above): 1 with *addr set, 0 declined (the Python path
 * says why), -1 where the layout does not apply (its getters are asked instead). */
static int cupy_in_place(ForeignType* ft, PyObject* v, PyObject* want, long long want_device,
                         unsigned long long* addr) {
    PyTypeObject* t = Py_TYPE(v);
    if (!cupy_layout.pointer_type || t->tp_basicsize < cupy_layout.end || !accessors_fresh(ft, t)) return -1;
    for (int i = 0; i < N_CUPY_FIELDS; i++)
        if (ft->accessors[cupy_field_accessor[i]] != cupy_layout.getter[i]) return -1;
    PyObject* dtype = *(PyObject**)((char*)v + cupy_layout.at[C_DTYPE]);
    PyObject* data = *(PyObject**)((char*)v + cupy_layout.at[C_DATA]);
    if (!dtype || !data || Py_TYPE(data) != cupy_layout.pointer_type) return -1;
    if (!*(int*)((char*)v + cupy_layout.at[C_CONTIGUOUS])) return 0;
    Py_INCREF(data);   /* held: comparing an unlearned dtype runs Python */
    Py_INCREF(dtype);
    PyObject* typestr = typestr_of(dtype);
    Py_DECREF(dtype);
    int ok = typestr && same_typestr(typestr, want) &&
             *(int*)((char*)data + cupy_layout.device_at) == want_device;
    if (ok) *addr = (unsigned long long)*(intptr_t*)((char*)data + cupy_layout.ptr_at);
    Py_DECREF(data);
    return ok;
}

/* 0: declined; else the array's framework kind (FOREIGN_TORCH, FOREIGN_CUPY), its address in
 * *addr. A tensor that requires grad is declined unless `grad_ok` (a PyTorch operator's
 * implementation, which runs below autograd). */
int kjit_foreign_array(PyObject* v, PyObject* token, unsigned long long* addr, int grad_ok) {
    ForeignType* ft = foreign_type(Py_TYPE(v));
    if (!ft || !PyTuple_Check(token) || PyTuple_GET_SIZE(token) != 2) return 0;
    PyObject* want = PyTuple_GET_ITEM(token, 0);
    long long want_device = PyLong_AsLongLong(PyTuple_GET_ITEM(token, 1));
    if (want_device == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    if (ft->by_shim)
        return torch_by_shim(ft, v, want, want_device, grad_ok, addr) ? FOREIGN_TORCH : 0;
    if (ft->kind == FOREIGN_CUPY) {
        int r = cupy_in_place(ft, v, want, want_device, addr);
        if (r >= 0) return r ? FOREIGN_CUPY : 0;
    }
    PyObject* dtype = read_accessor(ft, A_DTYPE, v);
    if (!dtype) { PyErr_Clear(); return 0; }
    PyObject* typestr = typestr_of(dtype);   /* borrowed */
    Py_DECREF(dtype);
    if (!typestr || !same_typestr(typestr, want)) return 0;
    long long contiguous = 0, device = -1, ptr = 0;
    if (ft->kind == FOREIGN_TORCH) {
        long long grad = 1;
        if (!grad_ok && (!as_long(read_accessor(ft, A_REQUIRES_GRAD, v), &grad) || grad)) return 0;   /* Python says why */
        long long on_cuda = 0;
        if (!as_long(read_accessor(ft, A_IS_CONTIGUOUS, v), &contiguous) || !contiguous) return 0;
        if (one_device()) {
            if (!as_long(read_accessor(ft, A_IS_CUDA, v), &on_cuda)) return 0;
            device = on_cuda ? 0 : -1;
        } else if (!as_long(read_accessor(ft, A_GET_DEVICE, v), &device)) return 0;
        if (device != want_device ||
                !as_long(read_accessor(ft, A_DATA_PTR, v), &ptr)) return 0;
    } else {
        if (!as_long(read_accessor(ft, A_C_CONTIGUOUS, v), &contiguous) || !contiguous) return 0;
        PyObject* data = read_accessor(ft, A_DATA, v);
        if (!data) { PyErr_Clear(); return 0; }
        /* with one device in the process, every CuPy array is on device 0 (one getter less,
         * as `is_cuda` spares torch's get_device() above) */
        if (one_device()) device = 0;
        int ok = (device == 0 || as_long(read_pointer_attr(data, P_DEVICE_ID), &device)) &&
                 as_long(read_pointer_attr(data, P_PTR), &ptr);
        Py_DECREF(data);
        if (!ok || device != want_device) return 0;
    }
    *addr = (unsigned long long)ptr;
    return ft->kind;
}

int kjit_foreign_init(PyObject* module) {
    for (int i = 0; i < N_ACCESSORS; i++)
        if (!(accessor_strs[i] = PyUnicode_InternFromString(accessor_names[i]))) return -1;
    s_device_id = PyUnicode_InternFromString("device_id");
    s_ptr = PyUnicode_InternFromString("ptr");
    empty_tuple = PyTuple_New(0);
    if (!s_device_id || !s_ptr || !empty_tuple) return -1;
    /* the numbers and order Python mirrors (stream.TORCH and CUPY, torch_shim._READERS) */
    PyObject* readers = PyTuple_New(N_READERS);
    if (!readers) return -1;
    for (int i = 0; i < N_READERS; i++) {
        PyObject* name = PyUnicode_FromString(reader_names[i]);
        if (!name) { Py_DECREF(readers); return -1; }
        PyTuple_SET_ITEM(readers, i, name);
    }
    int added = PyModule_AddObjectRef(module, "SHIM_READERS", readers);
    Py_DECREF(readers);
    if (added < 0) return -1;
    return PyModule_AddIntConstant(module, "FOREIGN_TORCH", FOREIGN_TORCH) < 0 ||
           PyModule_AddIntConstant(module, "FOREIGN_CUPY", FOREIGN_CUPY) < 0 ? -1 : 0;
}
