/* kjit's launch call: the Launcher, one kernel launch configuration as a C callable that
 * packs its arguments into a buffer of its own and calls cuLaunchKernel, and the module.
 * Optional: kjit falls back to cuda.bindings when it is not built. The other files sit below
 * this one: _args.c writes an argument (and is the Python launcher's packer), _libcuda.c
 * resolves libcuda's functions and makes the direct calls, _foreign.c reads framework arrays,
 * _tables.c serves k[config]. */
#include "_args.h"
#include "_foreign.h"
#include "_gil.h"
#include "_libcuda.h"
#include "_path.h"
#include "_pyint.h"
#include "_tables.h"
#include <pthread.h>
#include <math.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Timestamps at the steps of a C launch, for benchmarks/launch_marks.py, which builds this file
 * with its header forced in first (benchmarks/c/launch_marks.h); nothing otherwise. */
#ifndef KJIT_MARK
#define KJIT_MARK(step) ((void)0)
#endif

/* The stream of a launch given none and no framework array: the legacy stream, or, while this
 * thread captures a kjit graph (kjit/runtime/graph.py), the capture stream. Thread-local, and
 * remembered in `kjit_hot` for the thread that asked last, known by its thread state and that
 * state's id (a later thread may get the same memory): a launch loop then reads no thread-local
 * storage, which from a shared library is a call into the dynamic loader. */
static _Thread_local void* thread_stream = NULL;

static inline void* own_stream(PyThreadState* me) {
    if (me != kjit_hot.stream_thread || me->id != kjit_hot.stream_thread_id) {
        kjit_hot.stream_thread = me;
        kjit_hot.stream_thread_id = me->id;
        kjit_hot.stream = thread_stream;
    }
    return kjit_hot.stream;
}

static PyObject* set_thread_stream(PyObject* self, PyObject* arg) {
    unsigned long long h = kjit_as_u64(arg);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    thread_stream = (void*)(uintptr_t)h;
    kjit_hot.stream_thread = NULL;
    Py_RETURN_NONE;
}

static PyObject* s_module = NULL;   /* a launcher's __module__ (what torch.compile's warning names) */

/* Launcher: one kernel launch configuration as a callable, `k[grid, block]`. Its call packs
 * and launches in C; anything else (another thread, an argument the C packer declines, a
 * wrong count, keywords) goes to `fallback`, the Python launcher for the same configuration,
 * which routes the launch to its arrays' device and raises kjit's errors; a failed launch
 * goes to `on_error`, which raises its error. A configuration given no stream (L_AUTO_STREAM)
 * launches on the current stream of its arrays' framework (kjit_framework_stream).
 * While another context is current, a kernel with array parameters (L_HAS_ARRAYS) whose
 * arrays all matched their tokens, so all live on this kernel's device, launches here with
 * its context pushed for the call, as a PyTorch operator runs on its tensors' device.
 *
 * A launch costs what it touches: between two launches the driver's own work (microseconds)
 * leaves this code's cache lines and branch history cold, so a launcher keeps what a launch
 * reads in one allocation (its fields, a slot per parameter, its own parameter buffer) and
 * writes only what changed: it holds, per parameter, the int or float it wrote last, and the
 * same object again (an int or float never changes) finds its bytes already in place. Those
 * held objects lie together, right after the fields, so a launch whose scalars are unchanged
 * reads one or two cache lines for them. The buffer is this launcher's alone, so nothing else
 * overwrites them; arrays are read on every launch. */
enum { L_AUTO_STREAM = 1, L_GRAD_OK = 2, L_HAS_ARRAYS = 4 };   /* kernel.py's, checked as above */
#define NO_CONTEXT UINT64_MAX   /* a destroyed context's cell (kernel.py's NO_CONTEXT) */
typedef struct {
    int32_t kind, offset;
    PyObject* token;        /* borrowed from `tokens` */
} Slot;

typedef struct {
    PyObject_VAR_HEAD       /* the size: of what follows the fields, in bytes */
    /* what every launch reads, together */
    kjit_launch_fn launch;  /* libcuda's, from kjit_cu: read here, beside the rest */
    PyObject** held;        /* per parameter: the scalar whose bytes are in the buffer; NULL: none */
    Py_ssize_t nargs;
    PyThreadState* owner_state;   /* the owner's thread state, once it launched here (the
                             * launch checks this, one comparison, and `owner` only on a miss) */
    const uint64_t* ctx;    /* the kernel's context: pushed for a launch while another is
                             * current (see `ask`) */
    int flags;              /* L_AUTO_STREAM, L_GRAD_OK, L_HAS_ARRAYS */
    int packing;            /* while its arguments are read: Python code they run (a getter, a
                             * stream getter) may call this launcher again */
    int ask;                /* another context was current at its last launch: ask first */
    unsigned dims[7];       /* grid xyz, block xyz, dynamic shared memory */
    void* func;
    void* stream;
    void** params;          /* kernelParams: a pointer per parameter into `buf`, or NULL */
    void** extra;           /* else the buffer as one block: points at `block` */
    PyObject* last;         /* list: last[0] = name (the kernel an async error is blamed on) */
    PyObject* name;
    /* what a launch reads for an argument that changed */
    char* buf;
    Slot* slots;
    PyTypeObject* array_type;
    void* block[5];         /* read by the driver */
    size_t block_size;
    /* the rest */
    vectorcallfunc vectorcall;
    PyObject* fallback;     /* Python launcher: fallback(*args) */
    PyObject* on_error;     /* on_error(CUresult): raises the launch's error */
    PyObject* tokens;       /* tuple */
    PyObject* ctx_cell;     /* owns *ctx: the kernel's cell, set to all ones once its context
                             * is destroyed (no context is there: every launch hands over) */
    PyObject* device;       /* the kernel's device ordinal, for torch's current stream */
    unsigned long owner;    /* the thread launching in C (the kernel's first): another one could
                             * rewrite the buffer while the driver reads it, the GIL released */
    /* then: the held objects, the slots, the buffer, the kernelParams array */
} Launcher;


/* the Python launcher takes this launch (it raises kjit's errors, routes other devices...) */
static OFF_PATH PyObject* hand_over(Launcher* L, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    return PyObject_Vectorcall(L->fallback, args, nargsf, kwnames);
}

/* Argument i (v), which is not the object held for it, written by kjit_put_arg: 0 when written,
 * 1 + i where the Python path must handle it, -2 with an exception set. */
static OFF_PATH Py_ssize_t pack_one(Launcher* L, Py_ssize_t i, PyObject* v, int* seen) {
    const Slot* s = &L->slots[i];
    int r = kjit_put_arg(s->kind, s->token, v, L->buf + s->offset, L->array_type, seen,
                         L->flags & L_GRAD_OK);
    if (r <= 0) {
        Py_CLEAR(L->held[i]);
        return r < 0 ? -2 : i + 1;
    }
    if (s->kind < K_ARRAY) Py_XSETREF(L->held[i], Py_NewRef(v));   /* arrays: never held */
    return 0;
}

/* 0: every argument written; 1 + the index of the first the Python path must handle; -2 with
 * an exception set */
static inline Py_ssize_t launcher_pack(Launcher* L, PyObject* const* args, int* seen) {
    PyObject** held = L->held;
    for (Py_ssize_t i = 0; i < L->nargs; i++) {
        PyObject* v = args[i];
        if (v == held[i]) continue;   /* the very int or float written last: already in place */
        const Slot* s = &L->slots[i];
        unsigned long long addr;
        if (s->kind == K_ARRAY && kjit_array_as_last(v, s->token, &addr)) {
            memcpy(L->buf + s->offset, &addr, 8);
            continue;
        }
        Py_ssize_t r = pack_one(L, i, v, seen);
        if (unlikely(r)) return r;
    }
    return 0;
}

/* cuLaunchKernel with this launcher's configuration and buffer, on `stream` */
static inline int launch_now(Launcher* L, void* stream) {
    return L->launch(L->func, L->dims[0], L->dims[1], L->dims[2], L->dims[3], L->dims[4],
                     L->dims[5], L->dims[6], stream, L->params, L->extra);
}

/* not a CUresult: the launch goes to the Python path, which decides and names what is wrong */
enum { HAND_OVER = -1 };

/* the same with the kernel's context pushed for the call; HAND_OVER where it cannot be */
static OFF_PATH int launch_pushed(Launcher* L, void* ctx, void* stream) {
    if (kjit_cu.ctx_push(ctx) != 0) return HAND_OVER;
    int err = launch_now(L, stream);
    void* popped = NULL;
    kjit_cu.ctx_pop(&popped);
    return err;
}

/* whether the thread whose state is `me` owns L: a thread state lives as long as its thread,
 * so once the owner has launched here its state stands for it (the first comparison) */
static OFF_PATH int owned_by(Launcher* L, PyThreadState* me) {
    if ((unsigned long)pthread_self() != L->owner) return 0;
    L->owner_state = me;
    return 1;
}

/* L->ask is set: 0 with *elsewhere set to whether another context is current (L->ask cleared
 * once its own is), -1 where the launch goes to the Python path */
static OFF_PATH int ask_current(Launcher* L, void* ctx, int* elsewhere) {
    void* current = NULL;
    if (kjit_cu.ctx_current(&current) != 0) return -1;
    *elsewhere = current != ctx;
    if (!*elsewhere) L->ask = 0;
    else if (!(L->flags & L_HAS_ARRAYS)) return -1;
    return 0;
}

/* the stream of a launch given none whose arrays are a framework's: 0 declines */
static OFF_PATH int framework_stream(Launcher* L, int seen, void** stream) {
    return kjit_framework_stream(seen, L->device, stream);
}

/* Note L's kernel as the one an asynchronous error is blamed on (where it is not already): the
 * list is kjit's and one item long, but a list can be emptied from Python. -1 with an exception. */
static OFF_PATH int note_name(Launcher* L) {
    if (PyList_GET_SIZE(L->last) < 1) return PyList_Append(L->last, L->name);
    Py_INCREF(L->name);
    return PyList_SetItem(L->last, 0, L->name);
}

/* The driver refused the launch (err) with no context pushed: which context is current? Another
 * one: ask first from now on, and launch again with the kernel's context pushed where its
 * arrays tie the launch to this device, else hand it over. Runs with the GIL possibly released:
 * no Python here. */
static OFF_PATH int after_refusal(Launcher* L, int err, void* ctx, void* stream) {
    void* current = NULL;
    if (kjit_cu.ctx_current(&current) != 0) current = NULL;
    if (current == ctx) return err;
    L->ask = 1;   /* only this thread (the owner) reads or writes it */
    return (L->flags & L_HAS_ARRAYS) ? launch_pushed(L, ctx, stream) : HAND_OVER;
}

/* the launch failed (err): the Python path takes it, or on_error raises its error */
static OFF_PATH PyObject* failed(Launcher* L, int err, PyObject* const* args, size_t nargsf, void* stream) {
    if (err == HAND_OVER) return PyObject_Vectorcall(L->fallback, args, nargsf, NULL);
    return PyObject_CallFunction(L->on_error, "iK", err, (unsigned long long)(uintptr_t)stream);
}

/* The launch itself. The kernel's context need not be asked for first: the driver refuses a
 * function of another context (CUDA_ERROR_INVALID_HANDLE, or INVALID_CONTEXT with none
 * current) on any stream not of the function's context, before anything runs, without a sticky
 * error or harm to a capture in progress; on a stream of the function's context it launches
 * there, whatever is current, which is where the launch belongs. So the context is asked only
 * after a refusal, and then first at each launch until the kernel's context is current again
 * (`ask`): a refused launch costs microseconds, the question tens of nanoseconds.
 * While another context is current, a launch whose arrays all matched their tokens, so all
 * live on this kernel's device, runs here with its context pushed for the call, as a PyTorch
 * operator runs on its tensors' device; any other goes to the Python path, which routes it to
 * the current context's twin of this kernel. */
static inline __attribute__((always_inline)) PyObject* launcher_call(PyObject* op, PyObject* const* args,
                                                                     size_t nargsf, PyObject* kwnames) {
    KJIT_MARK(0);
    Launcher* L = (Launcher*)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyThreadState* me = PyThreadState_Get();
    /* called again from Python code its own packing ran: that launch goes through the Python
     * path, which packs into the kernel's buffer, not into the one this launch is filling */
    if (unlikely(kwnames || (me != L->owner_state && !owned_by(L, me)) || nargs != L->nargs ||
                 !L->launch || L->packing || *L->ctx == NO_CONTEXT))
        return hand_over(L, args, nargsf, kwnames);
    void* ctx = (void*)(uintptr_t)*L->ctx;
    int elsewhere = 0;
    if (unlikely(L->ask) && ask_current(L, ctx, &elsewhere) < 0) return hand_over(L, args, nargsf, NULL);
    KJIT_MARK(1);
    int seen = 0;
    L->packing = 1;
    Py_ssize_t r = launcher_pack(L, args, &seen);
    KJIT_MARK(2);
    void* stream = L->stream;
    int declined = r != 0;
    if ((L->flags & L_AUTO_STREAM) && !declined) {
        if (likely(!seen)) stream = own_stream(me);
        else declined = !framework_stream(L, seen, &stream);
    }
    L->packing = 0;
    if (unlikely(r == -2)) return NULL;
    if (unlikely(declined)) return hand_over(L, args, nargsf, NULL);
    if (unlikely(PyList_GET_SIZE(L->last) < 1 || PyList_GET_ITEM(L->last, 0) != L->name) &&
            note_name(L) < 0)
        return NULL;
    PyThreadState* ts = kjit_gil_release_for(me);   /* only where another thread can run */
    KJIT_MARK(3);
    int err = unlikely(elsewhere) ? launch_pushed(L, ctx, stream) : launch_now(L, stream);
    KJIT_MARK(4);
    if (unlikely(err) && !elsewhere) err = after_refusal(L, err, ctx, stream);
    if (unlikely(ts != NULL)) PyEval_RestoreThread(ts);
    if (unlikely(err)) return failed(L, err, args, nargsf, stream);
    KJIT_MARK(5);
    Py_RETURN_NONE;
}

/* What make_launcher hands out: a builtin function whose self is the Launcher. CPython's CALL
 * specializes for a builtin function taking a vector of arguments, not for an instance of
 * another callable type, which costs a launch 1-2% more (benchmarks/launch.py's bound row). */
static PyObject* launcher_fast(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    return launcher_call(self, args, (size_t)nargs, kwnames);   /* inline: one function's lines */
}
/* the Launcher called itself */
static PyObject* launcher_vectorcall(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    return launcher_fast(op, args, PyVectorcall_NARGS(nargsf), kwnames);
}
static PyMethodDef launcher_call_def = {"launch", (PyCFunction)(void (*)(void))launcher_fast,
                                        METH_FASTCALL | METH_KEYWORDS, "launch(*args): the kernel's launch"};

static int launcher_traverse(PyObject* op, visitproc visit, void* arg) {
    Launcher* L = (Launcher*)op;
    Py_VISIT(L->fallback); Py_VISIT(L->on_error); Py_VISIT(L->tokens); Py_VISIT(L->array_type);
    Py_VISIT(L->last); Py_VISIT(L->name); Py_VISIT(L->device); Py_VISIT(L->ctx_cell);
    for (Py_ssize_t i = 0; i < L->nargs; i++) Py_VISIT(L->held[i]);
    return 0;
}

static int launcher_clear(PyObject* op) {
    Launcher* L = (Launcher*)op;
    Py_CLEAR(L->fallback); Py_CLEAR(L->on_error); Py_CLEAR(L->tokens);
    Py_CLEAR(L->array_type); Py_CLEAR(L->last); Py_CLEAR(L->name); Py_CLEAR(L->device);
    Py_CLEAR(L->ctx_cell);
    for (Py_ssize_t i = 0; i < L->nargs; i++) {
        L->slots[i].token = NULL;   /* was `tokens`' */
        Py_CLEAR(L->held[i]);
    }
    return 0;
}

static void launcher_dealloc(PyObject* op) {
    PyObject_GC_UnTrack(op);
    launcher_clear(op);
    Py_TYPE(op)->tp_free(op);
}

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kjit.runtime._launch.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_itemsize = 1,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = launcher_traverse,
    .tp_clear = launcher_clear,
    .tp_dealloc = launcher_dealloc,
    .tp_doc = "A kernel's launch configuration: call it with the kernel's arguments.",
};

static size_t kind_size(int kind) {
    switch (kind) {
    case K_I8: case K_U8: return 1;
    case K_I16: case K_U16: return 2;
    case K_I32: case K_U32: case K_F32: return 4;
    default: return 8;
    }
}

/* launcher(fallback, on_error, spec, tokens, array_type, last, name, func, stream, gx, gy, gz,
 *          bx, by, bz, shared_mem, owner, context_cell, flags, device, block_size)
 * -> the Launcher's call as a builtin function (launcher_call_def, above; its __self__ is the
 * Launcher); context_cell: an 8-byte buffer (ctypes.c_uint64) holding the kernel's context,
 * read on every launch. block_size > 0: the spec's offsets are the kernel's parameter block as
 * the driver lays it out (cuFuncGetParamInfo), handed over whole
 * (CU_LAUNCH_PARAM_BUFFER_POINTER), which the driver copies in one piece instead of a piece per
 * parameter; 0: a kernelParams array, a pointer per parameter. */
enum { PARAM_END = 0, PARAM_BUFFER_POINTER = 1, PARAM_BUFFER_SIZE = 2 };   /* cuda.h's */
#define MAX_PARAM_BYTES 32764   /* a kernel's parameters, at most (CUDA 12.1 on Volta and newer) */
static PyObject* make_launcher(PyObject* self, PyObject* const* a, Py_ssize_t nargs) {
    if (nargs != 21 || !PyBytes_Check(a[2]) || !PyTuple_Check(a[3]) || !PyType_Check(a[4]) ||
            !PyList_Check(a[5]) || PyList_GET_SIZE(a[5]) < 1 || !PyLong_Check(a[19])) {
        PyErr_SetString(PyExc_TypeError, "launcher(fallback, on_error, spec, tokens, array_type, last, "
                        "name, func, stream, gx, gy, gz, bx, by, bz, shared_mem, owner, context, flags, "
                        "device, block_size)");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(a[2]) / 8;
    if (PyTuple_GET_SIZE(a[3]) < n) {
        PyErr_SetString(PyExc_ValueError, "launcher: a token per parameter");
        return NULL;
    }
    size_t block_size = PyLong_AsSize_t(a[20]);
    if (block_size == (size_t)-1 && PyErr_Occurred()) return NULL;
    if (block_size > MAX_PARAM_BYTES) {
        PyErr_Format(PyExc_ValueError, "launcher: a parameter block of %zu bytes (at most %d)",
                     block_size, MAX_PARAM_BYTES);
        return NULL;
    }
    size_t end = 0;   /* of the last parameter's bytes */
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t kind, offset;
        memcpy(&kind, PyBytes_AS_STRING(a[2]) + 8 * i, 4);
        memcpy(&offset, PyBytes_AS_STRING(a[2]) + 8 * i + 4, 4);
        if (kind == K_PYTHON) {   /* it would launch with that slot unwritten */
            PyErr_SetString(PyExc_ValueError, "launcher: every parameter must be one the C packer writes");
            return NULL;
        }
        if (offset < 0 || offset % kind_size(kind) || offset + kind_size(kind) > MAX_PARAM_BYTES) {
            PyErr_SetString(PyExc_ValueError, "launcher: a parameter's offset is out of place");
            return NULL;
        }
        if (offset + kind_size(kind) > end) end = offset + kind_size(kind);
    }
    if (block_size && block_size < end) {
        PyErr_SetString(PyExc_ValueError, "launcher: the block is smaller than its parameters");
        return NULL;
    }
    unsigned long long v[12];
    for (int i = 0; i < 12; i++) {
        if (i == 10) continue;   /* the context cell */
        v[i] = kjit_as_u64(a[7 + i]);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    Py_buffer cell;
    if (PyObject_GetBuffer(a[17], &cell, PyBUF_SIMPLE) < 0) return NULL;
    const uint64_t* ctx = (const uint64_t*)cell.buf;
    Py_ssize_t cell_len = cell.len;
    PyBuffer_Release(&cell);   /* a ctypes object's memory stays put while it lives */
    if (cell_len != 8) {
        PyErr_SetString(PyExc_TypeError, "launcher: the context cell is 8 bytes (ctypes.c_uint64)");
        return NULL;
    }
    /* after the fields: the held objects, the slots, then the buffer (16-aligned; zeroed, as the
     * driver is handed padding too), then kernelParams */
    size_t buf_size = block_size ? block_size : end;
    size_t held_at = (sizeof(Launcher) + 7) & ~(size_t)7;
    size_t slots_at = (held_at + n * sizeof(PyObject*) + 15) & ~(size_t)15;
    size_t buf_at = (slots_at + n * sizeof(Slot) + 15) & ~(size_t)15;
    size_t params_at = (buf_at + buf_size + 15) & ~(size_t)15;
    size_t total = params_at + (block_size ? 0 : n * sizeof(void*));
    Launcher* L = PyObject_GC_NewVar(Launcher, &LauncherType, total - sizeof(Launcher) + 16);
    if (!L) return NULL;
    char* base = (char*)L;
    size_t skew = (16 - ((uintptr_t)base & 15)) & 15;   /* objects are 16-aligned where CPython allocates */
    L->held = (PyObject**)(base + held_at + skew);
    L->slots = (Slot*)(base + slots_at + skew);
    L->buf = base + buf_at + skew;
    memset(L->buf, 0, buf_size);
    L->vectorcall = launcher_vectorcall;
    L->nargs = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(&L->slots[i].kind, PyBytes_AS_STRING(a[2]) + 8 * i, 4);
        memcpy(&L->slots[i].offset, PyBytes_AS_STRING(a[2]) + 8 * i + 4, 4);
        L->slots[i].token = PyTuple_GET_ITEM(a[3], i);
        L->held[i] = NULL;
    }
    L->fallback = Py_NewRef(a[0]); L->on_error = Py_NewRef(a[1]);
    L->tokens = Py_NewRef(a[3]); L->array_type = (PyTypeObject*)Py_NewRef(a[4]);
    L->last = Py_NewRef(a[5]); L->name = Py_NewRef(a[6]);
    L->func = (void*)(uintptr_t)v[0];
    L->stream = (void*)(uintptr_t)v[1];
    for (int i = 0; i < 7; i++) L->dims[i] = (unsigned)v[2 + i];
    L->owner = (unsigned long)v[9];
    L->owner_state = NULL;
    L->ctx = ctx;
    L->ctx_cell = Py_NewRef(a[17]);
    L->flags = (int)v[11];
    L->packing = 0;
    L->ask = 0;
    L->launch = kjit_cu.launch;   /* NULL before bind(): every launch then goes to the fallback */
    L->device = Py_NewRef(a[19]);
    L->block_size = block_size;
    L->block[0] = (void*)(uintptr_t)PARAM_BUFFER_POINTER;
    L->block[1] = L->buf;
    L->block[2] = (void*)(uintptr_t)PARAM_BUFFER_SIZE;
    L->block[3] = &L->block_size;
    L->block[4] = (void*)(uintptr_t)PARAM_END;
    L->extra = block_size ? L->block : NULL;
    L->params = NULL;
    if (!block_size) {
        L->params = (void**)(base + params_at + skew);
        for (Py_ssize_t i = 0; i < n; i++) L->params[i] = L->buf + L->slots[i].offset;
    }
    PyObject_GC_Track((PyObject*)L);
    PyObject* f = PyCFunction_NewEx(&launcher_call_def, (PyObject*)L, s_module);
    Py_DECREF(L);
    return f;
}

static PyMethodDef methods[] = {
    {"pack", (PyCFunction)(void (*)(void))kjit_pack, METH_FASTCALL, "pack(spec, tokens, args, buffer, array_type) -> int"},
    {"register_foreign", (PyCFunction)(void (*)(void))kjit_register_foreign, METH_FASTCALL,
     "register_foreign(type, kind, dtype, typestr[, code, itemsize]): arrays of `type` with `dtype` are packed in C"},
    {"register_torch_shim", (PyCFunction)(void (*)(void))kjit_register_torch_shim, METH_FASTCALL,
     "register_torch_shim(...): PyTorch's C shim functions, for tensors and the current stream"},
    {"register_torch_facts", (PyCFunction)kjit_register_torch_facts, METH_O,
     "register_torch_facts(address): a one-call tensor reader (kjit/runtime/torch_facts.py); 0: none"},
    {"register_cupy_layout", (PyCFunction)(void (*)(void))kjit_register_cupy_layout, METH_FASTCALL,
     "register_cupy_layout(getters..., MemoryPointer, offsets...): where CuPy's arrays hold their fields"},
    {"register_stream", (PyCFunction)(void (*)(void))kjit_register_stream, METH_FASTCALL,
     "register_stream(kind, getter[, reader]): how to read a framework's current stream"},
    {"current_stream", (PyCFunction)(void (*)(void))kjit_current_stream, METH_FASTCALL,
     "current_stream(kind, device): a framework's current stream as a launch reads it, or None"},
    {"set_thread_stream", (PyCFunction)set_thread_stream, METH_O,
     "set_thread_stream(handle): this thread's stream for launches given none and no framework array"},
    {"gil_mode", (PyCFunction)kjit_gil_mode, METH_O, "gil_mode(0|1|2): release the GIL where another thread exists / never / always"},
    {"bind", (PyCFunction)kjit_bind, METH_NOARGS, "Resolve kjit's libcuda functions."},
    {"current_context", (PyCFunction)kjit_current_context, METH_NOARGS, "cuCtxGetCurrent() -> int (0: none)"},
    {"pointer_device", (PyCFunction)kjit_pointer_device, METH_O, "The device owning a pointer, -1 if none/unknown."},
    {"launch", (PyCFunction)(void (*)(void))kjit_launch, METH_FASTCALL, "cuLaunchKernel(...) -> int"},
    {"graph_launch", (PyCFunction)(void (*)(void))kjit_graph_launch, METH_FASTCALL, "cuGraphLaunch(exec, stream) -> int"},
    {"launcher", (PyCFunction)(void (*)(void))make_launcher, METH_FASTCALL, "A Launcher for one configuration."},
#ifdef KJIT_MARKS_METHODS
    KJIT_MARKS_METHODS
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", NULL, -1, methods};

/* The numbers Python writes for this file to read, as module constants: a CPU test
 * (tests/test_c_constants.py) checks each against the Python name that mirrors it. */
static int add_constants(PyObject* m) {
    static const struct { const char* name; long value; } numbers[] = {
        {"K_PYTHON", K_PYTHON}, {"K_I8", K_I8}, {"K_U8", K_U8}, {"K_I16", K_I16}, {"K_U16", K_U16},
        {"K_I32", K_I32}, {"K_U32", K_U32}, {"K_I64", K_I64}, {"K_U64", K_U64}, {"K_F32", K_F32},
        {"K_F64", K_F64}, {"K_ARRAY", K_ARRAY}, {"K_ARRAY_BITS", K_ARRAY_BITS},
        {"L_AUTO_STREAM", L_AUTO_STREAM}, {"L_GRAD_OK", L_GRAD_OK}, {"L_HAS_ARRAYS", L_HAS_ARRAYS},
    };
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++)
        if (PyModule_AddIntConstant(m, numbers[i].name, numbers[i].value) < 0) return -1;
    PyObject* none = PyLong_FromUnsignedLongLong(NO_CONTEXT);
    int r = none ? PyModule_AddObjectRef(m, "NO_CONTEXT", none) : -1;
    Py_XDECREF(none);
    return r;
}

PyMODINIT_FUNC PyInit__launch(void) {
    s_module = PyUnicode_InternFromString("kjit.runtime._launch");
    if (!s_module || kjit_args_init() < 0) return NULL;
    if (PyType_Ready(&LauncherType) < 0) return NULL;
    PyObject* m = PyModule_Create(&module);
    if (!m) return NULL;
    if (kjit_foreign_init(m) < 0 || kjit_tables_init(m) < 0 || add_constants(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
