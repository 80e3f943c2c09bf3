#include "_path.h"
#include "_tables.h"
#include <stddef.h>

/* k[grid, block] and f[grid, block] without a Python frame: the README's idiom pays one
 * dict lookup in C before its Launcher runs. Kernel and KernelFunction (kjit/runtime/kernel.py,
 * kjit/decorator.py) subclass these bases; a miss, or anything unusual, goes to their Python
 * methods `_configure(config)` and `_getitem_slow(config)`, which also raise every error. */
static PyTypeObject KernelBaseType;
static PyObject* s_configure = NULL;
static PyObject* s_getitem_slow = NULL;
static kjit_ctx_current_fn ctx_current = NULL;   /* libcuda's cuCtxGetCurrent, once bound */

void kjit_tables_bind(kjit_ctx_current_fn fn) { ctx_current = fn; }

typedef struct {
    PyObject_HEAD
    PyObject* table;   /* KernelBase: config -> Launcher; KernelFunctionBase: context -> Kernel */
    /* KernelBase: the last config the table answered and its answer. A config whose items
     * are those very objects gets the same answer without hashing it again, which for a
     * stream object can run Python (torch.cuda.Stream.__hash__ builds a torch.device).
     * Replacing the table (`_configs = {}`, the only way kjit changes it but by adding a
     * config it lacked) forgets them; so for KernelFunctionBase's `_by_current`. */
    PyObject* last_config;
    PyObject* last_hit;
    void* last_context;   /* KernelFunctionBase: the context last_hit (its Kernel) was found for */
} TableBase;

static int table_traverse(PyObject* op, visitproc visit, void* arg) {
    TableBase* t = (TableBase*)op;
    Py_VISIT(t->table); Py_VISIT(t->last_config); Py_VISIT(t->last_hit);
    return 0;
}

static int table_clear(PyObject* op) {
    TableBase* t = (TableBase*)op;
    Py_CLEAR(t->table); Py_CLEAR(t->last_config); Py_CLEAR(t->last_hit);
    return 0;
}

static void table_dealloc(PyObject* op) {
    PyObject_GC_UnTrack(op);
    table_clear(op);
    Py_TYPE(op)->tp_free(op);
}

/* A config the memo may answer for: a tuple (or namedtuple) hashed and compared as a tuple,
 * so one whose items are the same objects is equal and hashes alike. */
static int memo_config(PyObject* c) {
    return PyTuple_Check(c) && Py_TYPE(c)->tp_hash == PyTuple_Type.tp_hash &&
           Py_TYPE(c)->tp_richcompare == PyTuple_Type.tp_richcompare;
}

static int same_items(PyObject* a, PyObject* b) {
    if (a == b) return 1;
    if (!a || Py_TYPE(a) != Py_TYPE(b)) return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(b);
    if (PyTuple_GET_SIZE(a) != n) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyTuple_GET_ITEM(a, i) != PyTuple_GET_ITEM(b, i)) return 0;
    return 1;
}

/* k[config] where the memo does not answer: the table, else Kernel._configure. The lookups
 * run Python (the config's __hash__ and __eq__, a stream object's among them), which may
 * replace or empty the table, or drop the Kernel it held: each object a lookup goes on using
 * is held across it. */
static OFF_PATH PyObject* kernel_lookup(PyObject* self, PyObject* config, int memo) {
    TableBase* tb = (TableBase*)self;
    PyObject* table = tb->table;
    if (table && PyDict_CheckExact(table)) {
        Py_INCREF(table);
        PyObject* hit = Py_XNewRef(PyDict_GetItemWithError(table, config));
        /* remembered only while the table that answered is still the kernel's */
        if (hit && memo && tb->table == table) {
            Py_XSETREF(tb->last_config, Py_NewRef(config));
            Py_XSETREF(tb->last_hit, Py_NewRef(hit));
        }
        Py_DECREF(table);
        if (hit) return hit;
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
            PyErr_Clear();   /* k[[2, 1], 32]: a list is a fine config, just not a key */
        }
    }
    return PyObject_CallMethodOneArg(self, s_configure, config);
}

static PyObject* kernel_subscript(PyObject* self, PyObject* config) {
    TableBase* tb = (TableBase*)self;
    /* the very config answered last (a constant tuple in a loop): only a memo config is kept */
    if (likely(config == tb->last_config && tb->last_hit)) return Py_NewRef(tb->last_hit);
    int memo = memo_config(config);
    if (memo && tb->last_hit && same_items(tb->last_config, config)) return Py_NewRef(tb->last_hit);
    return kernel_lookup(self, config, memo);
}

/* f[config] with `kernel` the table's answer for the current context: the Kernel's own C
 * lookup (its class may have a Python __getitem__ for torch.compile's sake,
 * kjit/runtime/torch_compile.py, which a launch need not pay). Consumes `kernel`. */
static inline PyObject* kernel_config(PyObject* kernel, PyObject* config) {
    PyObject* r = likely(PyObject_TypeCheck(kernel, &KernelBaseType)) ? kernel_subscript(kernel, config)
                                                                    : PyObject_GetItem(kernel, config);
    Py_DECREF(kernel);
    return r;
}

/* f[config] where the last answer is not the current context's: the table, else
 * KernelFunction._getitem_slow (no context yet, a destroyed one, first use) */
static OFF_PATH PyObject* function_lookup(PyObject* self, PyObject* config, void* ctx) {
    TableBase* tb = (TableBase*)self;
    if (ctx) {
        PyObject* key = PyLong_FromVoidPtr(ctx);
        if (!key) return NULL;
        PyObject* kernel = Py_XNewRef(PyDict_GetItemWithError(tb->table, key));   /* an int's hash runs no Python */
        Py_DECREF(key);
        if (kernel) {
            Py_XSETREF(tb->last_hit, Py_NewRef(kernel));
            tb->last_context = ctx;
            return kernel_config(kernel, config);
        }
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_CallMethodOneArg(self, s_getitem_slow, config);
}

static PyObject* function_subscript(PyObject* self, PyObject* config) {
    TableBase* tb = (TableBase*)self;
    PyObject* table = tb->table;
    void* ctx = NULL;
    if (!(table && PyDict_CheckExact(table) && ctx_current && ctx_current(&ctx) == 0)) ctx = NULL;
    if (likely(ctx && tb->last_hit && ctx == tb->last_context))   /* the table's answer for this context */
        return kernel_config(Py_NewRef(tb->last_hit), config);
    return function_lookup(self, config, ctx);
}

static PyObject* get_configs(PyObject* self, void* closure) {
    PyObject* t = ((TableBase*)self)->table;
    return Py_NewRef(t ? t : Py_None);
}

/* a new table: the memo answered for the old one */
static int set_configs(PyObject* self, PyObject* value, void* closure) {
    TableBase* tb = (TableBase*)self;
    Py_CLEAR(tb->last_config);
    Py_CLEAR(tb->last_hit);
    tb->last_context = NULL;
    Py_XSETREF(tb->table, Py_XNewRef(value));
    return 0;
}

static PyGetSetDef kernel_getset[] = {
    {"_configs", get_configs, set_configs, "config -> launcher (assign a new dict to change it)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyGetSetDef function_getset[] = {
    {"_by_current", get_configs, set_configs, "current context -> Kernel (assign a new dict to change it)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMappingMethods kernel_mapping = {.mp_subscript = kernel_subscript};
static PyMappingMethods function_mapping = {.mp_subscript = function_subscript};

static PyTypeObject KernelBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kjit.runtime._launch.KernelBase",
    .tp_basicsize = sizeof(TableBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = table_traverse,
    .tp_clear = table_clear,
    .tp_dealloc = table_dealloc,
    .tp_as_mapping = &kernel_mapping,
    .tp_getset = kernel_getset,
    .tp_doc = "k[config] from the _configs table in C; a miss calls self._configure(config).",
};

static PyTypeObject KernelFunctionBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kjit.runtime._launch.KernelFunctionBase",
    .tp_basicsize = sizeof(TableBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = table_traverse,
    .tp_clear = table_clear,
    .tp_dealloc = table_dealloc,
    .tp_as_mapping = &function_mapping,
    .tp_getset = function_getset,
    .tp_doc = "f[config]: the current context's Kernel from _by_current, then its [config], in C; "
              "anything else calls self._getitem_slow(config).",
};

int kjit_tables_init(PyObject* m) {
    s_configure = PyUnicode_InternFromString("_configure");
    s_getitem_slow = PyUnicode_InternFromString("_getitem_slow");
    if (!s_configure || !s_getitem_slow) return -1;
    if (PyType_Ready(&KernelBaseType) < 0 || PyType_Ready(&KernelFunctionBaseType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "KernelBase", (PyObject*)&KernelBaseType) < 0 ||
            PyModule_AddObjectRef(m, "KernelFunctionBase", (PyObject*)&KernelFunctionBaseType) < 0)
        return -1;
    return 0;
}
