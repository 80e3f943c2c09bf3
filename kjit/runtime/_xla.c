/* kjit's XLA FFI handler: the C function `jax.ffi.register_ffi_target` registers for every kjit
 * JAX operator (kjit/runtime/jax_op.py), so a JAX user builds nothing. XLA calls it with a call
 * frame: the operator's arrays (inputs, then outputs), and three attributes kjit sets when the
 * call is traced: `kjit_plan` (an index into the plans below: the kernel's CUfunction per
 * context and where each kernel parameter comes from), `kjit_dims` (grid xyz, block xyz,
 * dynamic shared memory) and `kjit_scalars` (the scalar arguments' bytes, laid out by kjit).
 * The handler builds the kernel's void** array, pointing at the buffers' data fields and into
 * the scalar bytes, and calls cuLaunchKernel on the stream XLA gives the call. No Python runs
 * here: XLA calls it from its own threads, and while capturing a command buffer.
 *
 * The structs are kjit's own declarations of XLA's FFI C ABI (API major 0), only the fields
 * used; tests/test_jax.py compiles jaxlib's c_api.h where installed and checks every offset
 * and size against abi(). XLA asks a handler its API version and traits through the metadata
 * extension: it answers with the framework's version (set from Python, read from jaxlib's
 * header) and "command buffer compatible": a call launches exactly one kernel on XLA's stream,
 * with no allocation, sync or module load, so a CUDA-graph capture records it whole. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* --- XLA FFI ABI, API 0.x (declared here: jaxlib's headers are not there at build time) --- */
typedef struct kx_ext { size_t struct_size; int type; struct kx_ext* next; } kx_ext;
enum { KX_EXT_METADATA = 1 };
typedef struct { size_t struct_size; kx_ext* ext; int major; int minor; } kx_version;
typedef struct { size_t struct_size; kx_ext* ext; const char* message; int errc; } kx_error_args;
typedef struct { size_t struct_size; kx_ext* ext; void* ctx; void* stream; } kx_stream_args;
typedef void* (*kx_error_create_fn)(kx_error_args*);
typedef void* (*kx_stream_get_fn)(kx_stream_args*);
typedef struct {
    size_t struct_size; kx_ext* ext; kx_version api_version; const void* internal_api;
    kx_error_create_fn error_create;
    void* error_get_message; void* error_destroy; void* handler_register;
    kx_stream_get_fn stream_get;
} kx_api;
typedef struct { size_t struct_size; kx_ext* ext; int dtype; void* data; int64_t rank; int64_t* dims; } kx_buffer;
typedef struct { size_t struct_size; kx_ext* ext; int64_t size; int* types; void** items; } kx_list;
typedef struct { size_t struct_size; kx_ext* ext; int64_t size; int* types; void** names; void** attrs; } kx_attrs;
typedef struct { const char* ptr; size_t len; } kx_span;
typedef struct { int dtype; void* value; } kx_scalar;
typedef struct { int dtype; size_t size; void* data; } kx_array;
typedef struct {
    size_t struct_size; kx_ext* ext; const kx_api* api; void* ctx; int stage;
    kx_list args; kx_list rets; kx_attrs attrs;
} kx_frame;
typedef struct { size_t struct_size; kx_version api_version; uint32_t traits; } kx_metadata;
typedef struct { kx_ext base; kx_metadata* metadata; } kx_metadata_ext;
enum { KX_BUFFER = 1, KX_ATTR_ARRAY = 1, KX_ATTR_SCALAR = 3, KX_STAGE_EXECUTE = 3,
       KX_S64 = 5, KX_U8 = 6, KX_INVALID_ARGUMENT = 3, KX_NOT_FOUND = 5,
       KX_FAILED_PRECONDITION = 9, KX_INTERNAL = 13, KX_UNIMPLEMENTED = 12,
       KX_COMMAND_BUFFER_COMPATIBLE = 1 };

/* the framework's API version, answered to the metadata query (XLA refuses another) */
static int api_major = 0, api_minor = 1;

/* --- plans: one per (kernel, parameter roles); filled from Python, read by XLA's threads ---- */
enum { P_ARG = 0, P_RET = 1, P_SCALAR = 2, MAX_PARAMS = 128, MAX_CONTEXTS = 64, MAX_PLANS = 1 << 16 };
typedef struct {
    char name[96];                 /* the kernel's, for error messages */
    int nparams, nargs, nrets;
    int32_t kind[MAX_PARAMS], where[MAX_PARAMS];   /* P_ARG/P_RET: buffer index; P_SCALAR: offset */
    uint64_t ctx[MAX_CONTEXTS];    /* published after func[i] (release), read acquire */
    void* func[MAX_CONTEXTS];
} plan_t;
static plan_t* plans[MAX_PLANS];
static int nplans = 0;

typedef int (*cu_launch_fn)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, void*, void**, void**);
typedef int (*cu_ctx_fn)(void**);
typedef int (*cu_push_fn)(void*);
typedef int (*cu_stream_ctx_fn)(void*, void**);
static cu_launch_fn cu_launch;
static cu_ctx_fn cu_ctx_current, cu_ctx_pop;
static cu_push_fn cu_ctx_push;
static cu_stream_ctx_fn cu_stream_ctx;

static void* fail(const kx_api* api, int errc, const char* msg) {
    kx_error_args a = {sizeof(kx_error_args), NULL, msg, errc};
    return api->error_create(&a);   /* XLA copies the message */
}

/* The metadata query (XLA's registration asks it): version and traits, nothing launched. */
static void* answer_metadata(kx_frame* f) {
    kx_metadata_ext* e = (kx_metadata_ext*)f->ext;
    if (e->base.struct_size < sizeof(kx_metadata_ext) || !e->metadata ||
            e->metadata->struct_size < offsetof(kx_metadata, traits) + sizeof(uint32_t))
        return NULL;   /* an XLA kjit does not know: it then sees version 0.0 and says so */
    e->metadata->api_version.struct_size = sizeof(kx_version);
    e->metadata->api_version.ext = NULL;
    e->metadata->api_version.major = api_major;
    e->metadata->api_version.minor = api_minor;
    e->metadata->traits = KX_COMMAND_BUFFER_COMPATIBLE;
    return NULL;
}

static int span_is(const kx_span* s, const char* name) {
    size_t n = strlen(name);
    return s->len == n && memcmp(s->ptr, name, n) == 0;
}

/* The three attributes kjit sets: 1 when found with the types kjit gives them. */
static int read_attrs(const kx_attrs* at, int64_t* plan, const int64_t** dims, const char** scalars,
                      size_t* nscalars) {
    int found = 0;
    for (int64_t i = 0; i < at->size; i++) {
        const kx_span* name = (const kx_span*)at->names[i];
        if (span_is(name, "kjit_plan") && at->types[i] == KX_ATTR_SCALAR) {
            const kx_scalar* s = (const kx_scalar*)at->attrs[i];
            if (s->dtype != KX_S64) return 0;
            memcpy(plan, s->value, 8);
            found |= 1;
        } else if (span_is(name, "kjit_dims") && at->types[i] == KX_ATTR_ARRAY) {
            const kx_array* a = (const kx_array*)at->attrs[i];
            if (a->dtype != KX_S64 || a->size != 7) return 0;
            *dims = (const int64_t*)a->data;
            found |= 2;
        } else if (span_is(name, "kjit_scalars") && at->types[i] == KX_ATTR_ARRAY) {
            const kx_array* a = (const kx_array*)at->attrs[i];
            if (a->dtype != KX_U8) return 0;
            *scalars = (const char*)a->data;
            *nscalars = a->size;
            found |= 4;
        }
    }
    return found == 7;
}

/* launches made, for launches(): a call XLA replays from a CUDA graph makes none */
static uint64_t launches;

static void* call(kx_frame* f, int on_gpu) {
    const kx_api* api = f->api;
    char msg[320];
    if (f->ext && f->ext->type == KX_EXT_METADATA) return answer_metadata(f);
    if (f->struct_size < sizeof(kx_frame) || api->struct_size < offsetof(kx_api, stream_get) + sizeof(void*))
        return fail(api, KX_FAILED_PRECONDITION, "kjit's XLA handler: this XLA's FFI call frame or API "
                    "table is older than the one kjit was written for (API 0.1); upgrade jax and jaxlib");
    if (f->stage != KX_STAGE_EXECUTE) return NULL;   /* registered for execute only */
    int64_t index = -1;
    const int64_t* dims = NULL;
    const char* scalars = NULL;
    size_t nscalars = 0;
    if (!read_attrs(&f->attrs, &index, &dims, &scalars, &nscalars) || index < 0 || index >= nplans)
        return fail(api, KX_INVALID_ARGUMENT, "kjit's XLA handler: the call lacks kjit's attributes "
                    "(kjit_plan, kjit_dims, kjit_scalars); call it only through kernel.as_jax_op");
    const plan_t* p = __atomic_load_n(&plans[index], __ATOMIC_ACQUIRE);
    if (!p) return fail(api, KX_INTERNAL, "kjit's XLA handler: unknown plan");
    if (f->args.size != p->nargs || f->rets.size != p->nrets) {
        snprintf(msg, sizeof msg, "kernel %s: XLA passed %lld arrays and %lld results; its operator "
                 "takes %d and %d", p->name, (long long)f->args.size, (long long)f->rets.size,
                 p->nargs, p->nrets);
        return fail(api, KX_INVALID_ARGUMENT, msg);
    }
    if (!on_gpu || !cu_launch) {   /* a kjit kernel runs on CUDA devices only */
        snprintf(msg, sizeof msg, "kernel %s is a CUDA kernel, but this call was placed on a device "
                 "without CUDA (the CPU); put its arrays on a GPU (jax.device_put(x, jax.devices('gpu')[0]))",
                 p->name);
        return fail(api, KX_UNIMPLEMENTED, msg);
    }
    void* params[MAX_PARAMS];
    for (int i = 0; i < p->nparams; i++) {
        int w = p->where[i];
        if (p->kind[i] == P_SCALAR) {
            if ((size_t)w >= nscalars) return fail(api, KX_INTERNAL, "kjit's XLA handler: scalar bytes short");
            params[i] = (void*)(scalars + w);
        } else {
            const kx_list* l = p->kind[i] == P_ARG ? &f->args : &f->rets;
            if (l->types[w] != KX_BUFFER) return fail(api, KX_INVALID_ARGUMENT, "kjit's XLA handler: not a buffer");
            params[i] = &((kx_buffer*)l->items[w])->data;   /* the driver reads the pointer by value */
        }
    }
    kx_stream_args sa = {sizeof(kx_stream_args), NULL, f->ctx, NULL};
    void* err = api->stream_get(&sa);
    if (err) return err;
    void* ctx = NULL;
    if (cu_stream_ctx(sa.stream, &ctx) != 0)
        return fail(api, KX_INTERNAL, "kjit's XLA handler: cuStreamGetCtx failed on XLA's stream");
    void* func = NULL;
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        uint64_t c = __atomic_load_n(&p->ctx[i], __ATOMIC_ACQUIRE);
        if (c == 0) break;
        if (c == (uint64_t)(uintptr_t)ctx) { func = p->func[i]; break; }
    }
    if (!func) {
        snprintf(msg, sizeof msg, "kernel %s is not loaded in the CUDA context of XLA's stream; kjit "
                 "loads it in every GPU's primary context JAX had when the call was traced", p->name);
        return fail(api, KX_NOT_FOUND, msg);
    }
    void* current = NULL;
    int pushed = cu_ctx_current(&current) == 0 && current != ctx && cu_ctx_push(ctx) == 0;
    int r = cu_launch(func, (unsigned)dims[0], (unsigned)dims[1], (unsigned)dims[2], (unsigned)dims[3],
                      (unsigned)dims[4], (unsigned)dims[5], (unsigned)dims[6], sa.stream, params, NULL);
    if (pushed) { void* popped; cu_ctx_pop(&popped); }
    if (r == 0) __atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
    if (r != 0) {
        snprintf(msg, sizeof msg, "kernel %s: cuLaunchKernel failed with CUresult %d (grid %lld,%lld,%lld "
                 "block %lld,%lld,%lld, %lld bytes of dynamic shared memory)", p->name, r,
                 (long long)dims[0], (long long)dims[1], (long long)dims[2], (long long)dims[3],
                 (long long)dims[4], (long long)dims[5], (long long)dims[6]);
        return fail(api, KX_INTERNAL, msg);
    }
    return NULL;
}

static void* launch_call(kx_frame* f) { return call(f, 1); }
/* registered for the CPU platform, so a call placed there says what it needs */
static void* refuse_call(kx_frame* f) { return call(f, 0); }

/* --- Python side ------------------------------------------------------------------------- */

/* bind() -> None: libcuda's entry points; without it the handler refuses to launch (CPU) */
static PyObject* bind(PyObject* self, PyObject* noargs) {
    if (cu_launch) Py_RETURN_NONE;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return PyErr_Format(PyExc_OSError, "libcuda.so.1 could not be loaded: %s", dlerror());
    cu_ctx_current = (cu_ctx_fn)dlsym(h, "cuCtxGetCurrent");
    cu_ctx_pop = (cu_ctx_fn)dlsym(h, "cuCtxPopCurrent_v2");
    cu_ctx_push = (cu_push_fn)dlsym(h, "cuCtxPushCurrent_v2");
    cu_stream_ctx = (cu_stream_ctx_fn)dlsym(h, "cuStreamGetCtx");
    void* launch = dlsym(h, "cuLaunchKernel");
    if (!cu_ctx_current || !cu_ctx_pop || !cu_ctx_push || !cu_stream_ctx || !launch)
        return PyErr_Format(PyExc_OSError, "libcuda.so.1 lacks cuLaunchKernel, cuStreamGetCtx or "
                            "cuCtxGetCurrent/PushCurrent/PopCurrent");
    __atomic_store_n(&cu_launch, (cu_launch_fn)launch, __ATOMIC_RELEASE);   /* last: all are set */
    Py_RETURN_NONE;
}

/* handler(gpu: bool) -> PyCapsule of the XLA_FFI_Handler, for jax.ffi.register_ffi_target:
 * the launching one (CUDA), or the one refusing a call placed on the CPU */
static PyObject* handler(PyObject* self, PyObject* arg) {
    int gpu = PyObject_IsTrue(arg);
    if (gpu < 0) return NULL;
    return PyCapsule_New(gpu ? (void*)&launch_call : (void*)&refuse_call, NULL, NULL);
}

/* set_api_version(major, minor): the framework's, answered to XLA's metadata query */
static PyObject* set_api_version(PyObject* self, PyObject* args) {
    if (!PyArg_ParseTuple(args, "ii", &api_major, &api_minor)) return NULL;
    Py_RETURN_NONE;
}

/* add_plan(name, kinds: bytes of int32, wheres: bytes of int32, nargs, nrets) -> index */
static PyObject* add_plan(PyObject* self, PyObject* args) {
    const char* name;
    Py_buffer kinds, wheres;
    int nargs, nrets;
    if (!PyArg_ParseTuple(args, "sy*y*ii", &name, &kinds, &wheres, &nargs, &nrets)) return NULL;
    Py_ssize_t n = kinds.len / 4;
    PyObject* result = NULL;
    if (kinds.len != wheres.len || kinds.len % 4 || n > MAX_PARAMS)
        PyErr_Format(PyExc_ValueError, "add_plan: at most %d parameters, an int32 kind and place each", MAX_PARAMS);
    else if (nplans >= MAX_PLANS)
        PyErr_SetString(PyExc_RuntimeError, "kjit's XLA handler: too many JAX operators in one process");
    else {
        plan_t* p = (plan_t*)calloc(1, sizeof(plan_t));
        if (!p) { PyErr_NoMemory(); goto done; }
        snprintf(p->name, sizeof p->name, "%s", name);
        p->nparams = (int)n; p->nargs = nargs; p->nrets = nrets;
        memcpy(p->kind, kinds.buf, kinds.len);
        memcpy(p->where, wheres.buf, wheres.len);
        __atomic_store_n(&plans[nplans], p, __ATOMIC_RELEASE);   /* the GIL orders Python's writers */
        result = PyLong_FromLong(nplans++);
    }
done:
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&wheres);
    return result;
}

/* set_function(index, context, function): the plan's CUfunction in that context */
static PyObject* set_function(PyObject* self, PyObject* args) {
    int index;
    unsigned long long ctx, func;
    if (!PyArg_ParseTuple(args, "iKK", &index, &ctx, &func)) return NULL;
    if (index < 0 || index >= nplans || !ctx)
        return PyErr_Format(PyExc_ValueError, "set_function: no plan %d, or no context", index);
    plan_t* p = plans[index];
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        uint64_t c = p->ctx[i];
        if (c == ctx) { p->func[i] = (void*)(uintptr_t)func; Py_RETURN_NONE; }
        if (c == 0) {
            p->func[i] = (void*)(uintptr_t)func;
            __atomic_store_n(&p->ctx[i], (uint64_t)ctx, __ATOMIC_RELEASE);
            Py_RETURN_NONE;
        }
    }
    return PyErr_Format(PyExc_RuntimeError, "kjit's XLA handler: more than %d contexts", MAX_CONTEXTS);
}

/* abi() -> {"Struct.field": offset, "Struct": size}: the layout tests/test_jax.py checks
 * against jaxlib's c_api.h */
static PyObject* abi(PyObject* self, PyObject* noargs) {
#define O(key, t, f) #key, (long)offsetof(t, f)
    return Py_BuildValue(
        "{" "sl sl sl sl sl sl sl sl sl sl sl sl sl sl sl sl sl" /* 34 entries */
        "sl sl sl sl sl sl sl sl sl sl sl sl sl sl sl sl sl" "}",
        O(XLA_FFI_CallFrame.api, kx_frame, api), O(XLA_FFI_CallFrame.ctx, kx_frame, ctx),
        O(XLA_FFI_CallFrame.stage, kx_frame, stage), O(XLA_FFI_CallFrame.args, kx_frame, args),
        O(XLA_FFI_CallFrame.rets, kx_frame, rets), O(XLA_FFI_CallFrame.attrs, kx_frame, attrs),
        "XLA_FFI_CallFrame_STRUCT_SIZE", (long)sizeof(kx_frame),
        O(XLA_FFI_Args.size, kx_list, size), O(XLA_FFI_Args.types, kx_list, types),
        O(XLA_FFI_Args.args, kx_list, items), "XLA_FFI_Args", (long)sizeof(kx_list),
        O(XLA_FFI_Attrs.size, kx_attrs, size), O(XLA_FFI_Attrs.types, kx_attrs, types),
        O(XLA_FFI_Attrs.names, kx_attrs, names), O(XLA_FFI_Attrs.attrs, kx_attrs, attrs),
        O(XLA_FFI_Buffer.dtype, kx_buffer, dtype), O(XLA_FFI_Buffer.data, kx_buffer, data),
        O(XLA_FFI_Buffer.rank, kx_buffer, rank), O(XLA_FFI_Buffer.dims, kx_buffer, dims),
        O(XLA_FFI_Scalar.value, kx_scalar, value), O(XLA_FFI_Array.size, kx_array, size),
        O(XLA_FFI_Array.data, kx_array, data), O(XLA_FFI_ByteSpan.len, kx_span, len),
        O(XLA_FFI_Api.api_version, kx_api, api_version),
        O(XLA_FFI_Api.XLA_FFI_Error_Create, kx_api, error_create),
        O(XLA_FFI_Api.XLA_FFI_Stream_Get, kx_api, stream_get),
        O(XLA_FFI_Error_Create_Args.message, kx_error_args, message),
        O(XLA_FFI_Error_Create_Args.errc, kx_error_args, errc),
        O(XLA_FFI_Stream_Get_Args.ctx, kx_stream_args, ctx),
        O(XLA_FFI_Stream_Get_Args.stream, kx_stream_args, stream),
        O(XLA_FFI_Metadata.api_version, kx_metadata, api_version),
        O(XLA_FFI_Metadata.traits, kx_metadata, traits),
        O(XLA_FFI_Metadata_Extension.metadata, kx_metadata_ext, metadata),
        O(XLA_FFI_Api_Version.minor_version, kx_version, minor));
#undef O
}

/* launches() -> int: cuLaunchKernel calls the handler has made in this process */
static PyObject* launches_made(PyObject* self, PyObject* noargs) {
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&launches, __ATOMIC_RELAXED));
}

static PyMethodDef methods[] = {
    {"launches", launches_made, METH_NOARGS, "Launches the handler has made (replays make none)."},
    {"bind", bind, METH_NOARGS, "Bind libcuda's entry points (the handler launches once bound)."},
    {"handler", handler, METH_O, "The XLA FFI handler as a PyCapsule."},
    {"set_api_version", set_api_version, METH_VARARGS, "The framework's FFI API version."},
    {"add_plan", add_plan, METH_VARARGS, "Add a kernel's plan; returns its index."},
    {"set_function", set_function, METH_VARARGS, "Set a plan's CUfunction for a context."},
    {"abi", abi, METH_NOARGS, "Offsets and sizes of kjit's declarations of XLA's FFI ABI."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kjit.runtime._xla",
                                    "kjit's XLA FFI handler for JAX operators.", -1, methods};

PyMODINIT_FUNC PyInit__xla(void) {
    PyObject* m = PyModule_Create(&module);
    /* the plan table's bound, for jax_ffi to refuse a wider kernel by name; the plan's kinds,
     * which jax_ffi mirrors (tests/test_c_constants.py checks them) */
    if (m && (PyModule_AddIntConstant(m, "MAX_PARAMS", MAX_PARAMS) < 0 ||
              PyModule_AddIntConstant(m, "P_ARG", P_ARG) < 0 ||
              PyModule_AddIntConstant(m, "P_RET", P_RET) < 0 ||
              PyModule_AddIntConstant(m, "P_SCALAR", P_SCALAR) < 0)) { Py_DECREF(m); return NULL; }
    return m;
}
