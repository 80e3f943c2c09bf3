/* What a compiler library reads: its file-system calls, recorded while a compile runs.

NVRTC and hiprtc (through LLVM) resolve every #include with libc calls: stat / open / fopen
of each candidate path, ENOENT for the directories that do not hold it. install() finds the
named libraries among the loaded objects (dl_iterate_phdr) and points their GOT entries for
those calls (JUMP_SLOT and GLOB_DAT relocations) at wrappers that call libc and, while the
calling thread records (start()/stop()), note the path, whether it was found (a regular file
with its stat, a directory, absent) and whether it was opened for writing. Calls from any other
library, or from threads not recording, only pay one thread-local test. The GOT patching
itself is in _observe_got.c. */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "_observe.h"


/* K_SPECIAL: a device, FIFO or socket (contents that no stat describes); K_ENV: an
   environment variable read (path: "NAME=VALUE"; size: -1 when unset, else the value's
   length) */
enum { K_ABSENT = 0, K_FILE = 1, K_DIR = 2, K_OTHER = 3, K_ERROR = 4, K_WRITE = 5, K_SPECIAL = 6,
       K_ENV = 7 };

typedef struct {
    char op;
    char kind;
    char *path;
    long long dev, ino, size, mtime_ns, ctime_ns;
} Rec;

typedef struct {
    Rec *recs;
    size_t n, cap;
    int overflow;
} Buf;

static __thread Buf *tl_buf;
static __thread int tl_busy;  /* inside a wrapper: calls libc makes for us are not the compiler's */

static void add(char op, const char *path, int dirfd, int kind, const struct stat *st) {
    Buf *b = tl_buf;
    if (!b || tl_busy || !path) return;
    tl_busy = 1;
    char buf[8192];
    const char *p = path;
    if (path[0] != '/' && dirfd != AT_FDCWD && dirfd >= 0) {
        char link[64], dir[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, dir, sizeof dir - 1);
        if (n > 0) {
            dir[n] = 0;
            snprintf(buf, sizeof buf, "%s/%s", dir, path);
            p = buf;
        }
    }
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        Rec *r = realloc(b->recs, cap * sizeof(Rec));
        if (!r) { b->overflow = 1; tl_busy = 0; return; }
        b->recs = r;
        b->cap = cap;
    }
    Rec *r = &b->recs[b->n];
    memset(r, 0, sizeof *r);
    r->path = strdup(p);
    if (!r->path) { b->overflow = 1; tl_busy = 0; return; }
    r->op = op;
    r->kind = (char)kind;
    if (st) {
        r->dev = (long long)st->st_dev;
        r->ino = (long long)st->st_ino;
        r->size = (long long)st->st_size;
        r->mtime_ns = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
        r->ctime_ns = (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
    }
    b->n++;
    tl_busy = 0;
}

static int kind_of_errno(int e) { return (e == ENOENT || e == ENOTDIR) ? K_ABSENT : K_ERROR; }

static int kind_of_mode(mode_t m) {
    return S_ISREG(m) ? K_FILE : S_ISDIR(m) ? K_DIR
        : (S_ISCHR(m) || S_ISBLK(m) || S_ISFIFO(m) || S_ISSOCK(m)) ? K_SPECIAL : K_OTHER;
}

/* after a call that returned a stat (0) or failed (-1) */
static void note_stat(char op, const char *path, int dirfd, int ret, const struct stat *st) {
    if (!tl_buf || tl_busy) return;
    int e = errno;
    if (ret == 0) add(op, path, dirfd, kind_of_mode(st->st_mode), st);
    else add(op, path, dirfd, kind_of_errno(e), NULL);
    errno = e;
}

/* The note_* calls run right after the real call, on this thread's compile only, and leave
 * errno as the real call set it. */
static void note_open(char op, const char *path, int dirfd, int fd, int writing) {
    if (!tl_buf || tl_busy) return;
    int e = errno;
    struct stat st;
    if (fd < 0) add(op, path, dirfd, kind_of_errno(e), NULL);
    else if (writing) add(op, path, dirfd, K_WRITE, NULL);
    else if (fstat(fd, &st) == 0) add(op, path, dirfd, kind_of_mode(st.st_mode), &st);
    else add(op, path, dirfd, K_OTHER, NULL);
    errno = e;
}

#define REAL(name, ret, params) static ret (*real_##name) params
REAL(open, int, (const char *, int, ...));
REAL(open64, int, (const char *, int, ...));
REAL(openat, int, (int, const char *, int, ...));
REAL(openat64, int, (int, const char *, int, ...));
REAL(__open_2, int, (const char *, int));
REAL(__open64_2, int, (const char *, int));
REAL(fopen, FILE *, (const char *, const char *));
REAL(fopen64, FILE *, (const char *, const char *));
REAL(__xstat, int, (int, const char *, struct stat *));
REAL(__xstat64, int, (int, const char *, struct stat *));
REAL(__lxstat, int, (int, const char *, struct stat *));
REAL(__lxstat64, int, (int, const char *, struct stat *));
REAL(__fxstatat, int, (int, int, const char *, struct stat *, int));
REAL(__fxstatat64, int, (int, int, const char *, struct stat *, int));
REAL(stat, int, (const char *, struct stat *));
REAL(stat64, int, (const char *, struct stat *));
REAL(lstat, int, (const char *, struct stat *));
REAL(lstat64, int, (const char *, struct stat *));
REAL(fstatat, int, (int, const char *, struct stat *, int));
REAL(fstatat64, int, (int, const char *, struct stat *, int));
REAL(access, int, (const char *, int));
REAL(faccessat, int, (int, const char *, int, int));
REAL(realpath, char *, (const char *, char *));
REAL(readlink, ssize_t, (const char *, char *, size_t));
REAL(opendir, DIR *, (const char *));
REAL(getenv, char *, (const char *));
REAL(secure_getenv, char *, (const char *));
REAL(mkdir, int, (const char *, mode_t));
REAL(mkdirat, int, (int, const char *, mode_t));
REAL(mkdtemp, char *, (char *));

static int writes(int flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0; }

static mode_t va_mode(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

#define OPEN_WRAPPER(name)                                                    \
    static int w_##name(const char *path, int flags, ...) {                   \
        va_list ap; va_start(ap, flags); mode_t m = va_mode(flags, ap); va_end(ap); \
        int fd = real_##name(path, flags, m);                                 \
        note_open('o', path, AT_FDCWD, fd, writes(flags));                   \
        return fd;                                                            \
    }
OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)

#define OPENAT_WRAPPER(name)                                                  \
    static int w_##name(int dirfd, const char *path, int flags, ...) {        \
        va_list ap; va_start(ap, flags); mode_t m = va_mode(flags, ap); va_end(ap); \
        int fd = real_##name(dirfd, path, flags, m);                          \
        note_open('o', path, dirfd, fd, writes(flags));                      \
        return fd;                                                            \
    }
OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)

#define OPEN2_WRAPPER(name)                                                   \
    static int w_##name(const char *path, int flags) {                        \
        int fd = real_##name(path, flags);                                    \
        note_open('o', path, AT_FDCWD, fd, writes(flags));                   \
        return fd;                                                            \
    }
OPEN2_WRAPPER(__open_2)
OPEN2_WRAPPER(__open64_2)

#define FOPEN_WRAPPER(name)                                                   \
    static FILE *w_##name(const char *path, const char *mode) {               \
        FILE *f = real_##name(path, mode);                                    \
        note_open('o', path, AT_FDCWD, f ? fileno(f) : -1, mode && strpbrk(mode, "wa+") != NULL); \
        return f;                                                             \
    }
FOPEN_WRAPPER(fopen)
FOPEN_WRAPPER(fopen64)

#define XSTAT_WRAPPER(name, op)                                               \
    static int w_##name(int ver, const char *path, struct stat *st) {         \
        int r = real_##name(ver, path, st);                                   \
        note_stat(op, path, AT_FDCWD, r, st);                                 \
        return r;                                                             \
    }
XSTAT_WRAPPER(__xstat, 's')
XSTAT_WRAPPER(__xstat64, 's')
XSTAT_WRAPPER(__lxstat, 'l')
XSTAT_WRAPPER(__lxstat64, 'l')

#define FXSTATAT_WRAPPER(name)                                                \
    static int w_##name(int ver, int dirfd, const char *path, struct stat *st, int fl) { \
        int r = real_##name(ver, dirfd, path, st, fl);                        \
        note_stat((fl & AT_SYMLINK_NOFOLLOW) ? 'l' : 's', path, dirfd, r, st); \
        return r;                                                             \
    }
FXSTATAT_WRAPPER(__fxstatat)
FXSTATAT_WRAPPER(__fxstatat64)

#define STAT_WRAPPER(name, op)                                                \
    static int w_##name(const char *path, struct stat *st) {                  \
        int r = real_##name(path, st);                                        \
        note_stat(op, path, AT_FDCWD, r, st);                                 \
        return r;                                                             \
    }
STAT_WRAPPER(stat, 's')
STAT_WRAPPER(stat64, 's')
STAT_WRAPPER(lstat, 'l')
STAT_WRAPPER(lstat64, 'l')

#define FSTATAT_WRAPPER(name)                                                 \
    static int w_##name(int dirfd, const char *path, struct stat *st, int fl) { \
        int r = real_##name(dirfd, path, st, fl);                             \
        if (!(fl & AT_EMPTY_PATH && path && !*path))                          \
            note_stat((fl & AT_SYMLINK_NOFOLLOW) ? 'l' : 's', path, dirfd, r, st); \
        return r;                                                             \
    }
FSTATAT_WRAPPER(fstatat)
FSTATAT_WRAPPER(fstatat64)

/* Calls that answer from a path without a stat for us: stat it (with the real call) to
   learn what it names. */
static void add_probe(char op, const char *path, int dirfd, int ok, int e, int follow) {
    if (!tl_buf || tl_busy || !path) return;
    struct stat st;
    tl_busy = 1;
    int r = fstatat(dirfd, path, &st, follow ? 0 : AT_SYMLINK_NOFOLLOW);
    tl_busy = 0;
    if (r == 0) add(op, path, dirfd, kind_of_mode(st.st_mode), &st);
    else add(op, path, dirfd, ok ? K_OTHER : kind_of_errno(e), NULL);
}

static int w_access(const char *path, int mode) {
    int r = real_access(path, mode);
    int e = errno;
    add_probe('a', path, AT_FDCWD, r == 0, e, 1);
    errno = e;
    return r;
}

static int w_faccessat(int dirfd, const char *path, int mode, int fl) {
    int r = real_faccessat(dirfd, path, mode, fl);
    int e = errno;
    add_probe('a', path, dirfd, r == 0, e, !(fl & AT_SYMLINK_NOFOLLOW));
    errno = e;
    return r;
}

static char *w_realpath(const char *path, char *resolved) {
    char *r = real_realpath(path, resolved);
    int e = errno;
    add_probe('r', path, AT_FDCWD, r != NULL, e, 1);
    if (r && tl_buf && !tl_busy) add('R', r, AT_FDCWD, K_OTHER, NULL);  /* what it resolved to */
    errno = e;
    return r;
}

static ssize_t w_readlink(const char *path, char *out, size_t size) {
    ssize_t r = real_readlink(path, out, size);
    int e = errno;
    add_probe('k', path, AT_FDCWD, r >= 0, e, 0);
    errno = e;
    return r;
}

static DIR *w_opendir(const char *path) {
    DIR *d = real_opendir(path);
    int e = errno;
    add_probe('d', path, AT_FDCWD, d != NULL, e, 1);
    errno = e;
    return d;
}

/* A variable the compiler reads may change its output (FINALIZER_USE_LEGACY_ELF_BUILDER the
   cubin's bytes): its name and value, or its absence, are part of what the compile read. */
static void note_env(const char *name, const char *value) {
    if (!tl_buf || tl_busy || !name) return;
    int e = errno;
    size_t n = strlen(name), v = value ? strlen(value) : 0;
    char *both = malloc(n + 1 + v + 1);
    if (!both) { tl_buf->overflow = 1; errno = e; return; }
    memcpy(both, name, n);
    both[n] = '=';
    if (value) memcpy(both + n + 1, value, v);
    both[n + 1 + v] = 0;
    struct stat st;
    memset(&st, 0, sizeof st);
    st.st_size = value ? (off_t)v : -1;
    add('e', both, AT_FDCWD, K_ENV, &st);
    free(both);
    errno = e;
}

static char *w_getenv(const char *name) {
    char *r = real_getenv(name);
    note_env(name, r);
    return r;
}

static char *w_secure_getenv(const char *name) {
    char *r = real_secure_getenv(name);
    note_env(name, r);
    return r;
}

/* Directories the compiler creates are its own scratch space (comgr's work directories):
   what it reads back from them is its output, not an input. */
static int w_mkdir(const char *path, mode_t mode) {
    int r = real_mkdir(path, mode);
    int e = errno;
    if (r == 0) add('m', path, AT_FDCWD, K_WRITE, NULL);
    errno = e;
    return r;
}

static int w_mkdirat(int dirfd, const char *path, mode_t mode) {
    int r = real_mkdirat(dirfd, path, mode);
    int e = errno;
    if (r == 0) add('m', path, dirfd, K_WRITE, NULL);
    errno = e;
    return r;
}

static char *w_mkdtemp(char *tmpl) {
    char *r = real_mkdtemp(tmpl);
    int e = errno;
    if (r) add('m', r, AT_FDCWD, K_WRITE, NULL);
    errno = e;
    return r;
}

#define HOOK(n) {#n, (void *)w_##n, (void **)&real_##n}
static Hook hooks[] = {
    HOOK(open), HOOK(open64), HOOK(openat), HOOK(openat64), HOOK(__open_2), HOOK(__open64_2),
    HOOK(fopen), HOOK(fopen64), HOOK(__xstat), HOOK(__xstat64), HOOK(__lxstat),
    HOOK(__lxstat64), HOOK(__fxstatat), HOOK(__fxstatat64), HOOK(stat), HOOK(stat64),
    HOOK(lstat), HOOK(lstat64), HOOK(fstatat), HOOK(fstatat64), HOOK(access),
    HOOK(faccessat), HOOK(realpath), HOOK(readlink), HOOK(opendir), HOOK(getenv),
    HOOK(secure_getenv), HOOK(mkdir), HOOK(mkdirat), HOOK(mkdtemp),
};
#define NHOOKS (sizeof hooks / sizeof hooks[0])

/* ---- installing: point the GOT entries of the named libraries at the wrappers ---------- */

static int append_found(void *ctx, const char *path, int count) {
    PyObject *t = Py_BuildValue("(si)", path, count);
    int r = t ? PyList_Append((PyObject *)ctx, t) : -1;
    Py_XDECREF(t);
    return r;
}

static PyObject *install(PyObject *self, PyObject *args) {
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "install() takes a sequence of library name prefixes");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    const char **names = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    PyObject *patched = names ? PyList_New(0) : NULL;
    int err = patched ? 0 : -1;
    for (Py_ssize_t i = 0; !err && i < n; i++) {
        names[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
        if (!names[i]) err = -1;
    }
    if (!err) {
        observe_resolve(hooks, NHOOKS);
        err = observe_patch(names, (size_t)n, hooks, NHOOKS, append_found, patched);
    }
    PyMem_Free(names);
    Py_DECREF(fast);
    if (err) {
        Py_XDECREF(patched);
        if (err > 0) { errno = err; return PyErr_SetFromErrno(PyExc_OSError); }
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    return patched;
}

static void free_buf(Buf *b) {
    for (size_t i = 0; i < b->n; i++) free(b->recs[i].path);
    free(b->recs);
    free(b);
}

static PyObject *start(PyObject *self, PyObject *noargs) {
    if (tl_buf) { PyErr_SetString(PyExc_RuntimeError, "this thread is already recording"); return NULL; }
    Buf *b = calloc(1, sizeof(Buf));
    if (!b) return PyErr_NoMemory();
    tl_buf = b;
    Py_RETURN_NONE;
}

static PyObject *stop(PyObject *self, PyObject *noargs) {
    Buf *b = tl_buf;
    if (!b) { PyErr_SetString(PyExc_RuntimeError, "this thread is not recording"); return NULL; }
    tl_buf = NULL;
    PyObject *out = b->overflow ? Py_None : PyList_New((Py_ssize_t)b->n);
    if (b->overflow) Py_INCREF(out);
    for (size_t i = 0; out && out != Py_None && i < b->n; i++) {
        Rec *r = &b->recs[i];
        PyObject *path = PyUnicode_DecodeFSDefault(r->path);
        PyObject *t = path ? Py_BuildValue("(CiNLLLLL)", r->op, r->kind, path, r->dev, r->ino,
                                           r->size, r->mtime_ns, r->ctime_ns) : NULL;
        if (!t) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    free_buf(b);
    return out;
}

static PyObject *recording(PyObject *self, PyObject *noargs) { return PyBool_FromLong(tl_buf != NULL); }

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS,
     "install(prefixes) -> [(library path, slots patched)]: hook the file calls of every loaded "
     "library whose file name starts with one of `prefixes`."},
    {"start", start, METH_NOARGS, "Start recording this thread's file calls from hooked libraries."},
    {"stop", stop, METH_NOARGS,
     "Stop recording; [(op, kind, path, dev, ino, size, mtime_ns, ctime_ns)] or None if "
     "memory ran out. kind: 0 absent, 1 file, 2 directory, 3 other, 4 error, 5 written or created "
     "(op m: a directory made), 6 a device, FIFO or socket, 7 an environment variable read (op e, "
     "path NAME=VALUE, size -1 when unset)."},
    {"recording", recording, METH_NOARGS, "True while this thread records."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_observe",
                                    "What a compiler library reads (kjit.compiler.keys.observe).", -1, methods};

PyMODINIT_FUNC PyInit__observe(void) { return PyModule_Create(&module); }
