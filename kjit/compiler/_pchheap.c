/* kjit.compiler._pchheap: pin NVRTC's precompiled-header heap at one address in every process.

NVRTC 13 uses a PCH file only in a process whose PCH heap starts where the heap of the
process that wrote it started ("heap allocation address ... not created by the same dynamic
instance"); where libnvrtc itself is loaded does not matter. The heap is one anonymous
mapping, mmap(NULL, heap_size, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0), made
at the process's first PCH compile, into which NVRTC then maps pieces of its files with
MAP_FIXED. mmap is an import of libnvrtc.so (a PLT call through its GOT), so pointing
libnvrtc's GOT slot for mmap at a wrapper (found through dl_iterate_phdr, as
compiler/_observe_got.c does for the file calls) lets that one call, and no other, ask for a
fixed address with MAP_FIXED_NOREPLACE. Where the range is taken the wrapper maps as NVRTC
asked (the PCHs of other processes are then refused: compiler/pch.py counts that and
compiles without one). Nothing else of libnvrtc's calls changes.

pin(addr, heap_size) -> the path of the libnvrtc it patched ("" where none is loaded);
set_size(heap_size): the heap size the next heap mapping has (after nvrtcSetPCHHeapSize);
placed() -> (address the last heap mapping got, errno of the pinned attempt or 0, or -1
where no heap was mapped yet).
*/
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

static volatile uintptr_t want_addr;
static volatile size_t want_len;
static volatile uintptr_t last_addr;
static volatile int last_errno = -1;
static mmap_fn real_mmap;

static void *pinned_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (want_addr && addr == NULL && fd == -1 && len == want_len &&
        flags == (MAP_PRIVATE | MAP_ANONYMOUS) && prot == (PROT_READ | PROT_WRITE)) {
        void *p = real_mmap((void *)want_addr, len, prot, flags | MAP_FIXED_NOREPLACE, fd, off);
        if (p == (void *)want_addr) {
            last_errno = 0;
            last_addr = (uintptr_t)p;
            return p;
        }
        last_errno = p == MAP_FAILED ? errno : EEXIST;
        if (p != MAP_FAILED)
            munmap(p, len);   /* a kernel before 4.17 takes the flag as a hint */
        p = real_mmap(addr, len, prot, flags, fd, off);
        last_addr = p == MAP_FAILED ? 0 : (uintptr_t)p;
        return p;
    }
    return real_mmap(addr, len, prot, flags, fd, off);
}

struct walk {
    int patched;
    char path[4096];
};

static int patch_one(struct dl_phdr_info *info, size_t size, void *data)
{
    struct walk *w = data;
    (void)size;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libnvrtc.so"))
        return 0;
    ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn)
        return 0;
    ElfW(Rela) *jmprel = NULL;
    size_t relsz = 0;
    ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {   /* glibc has relocated these to absolute addresses */
        case DT_JMPREL: jmprel = (ElfW(Rela) *)dyn->d_un.d_ptr; break;
        case DT_PLTRELSZ: relsz = dyn->d_un.d_val; break;
        case DT_SYMTAB: symtab = (ElfW(Sym) *)dyn->d_un.d_ptr; break;
        case DT_STRTAB: strtab = (const char *)dyn->d_un.d_ptr; break;
        }
    }
    if (!jmprel || !symtab || !strtab)
        return 0;
    long pg = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < relsz / sizeof(ElfW(Rela)); i++) {
#if defined(__x86_64__)
        if (ELF64_R_TYPE(jmprel[i].r_info) != R_X86_64_JUMP_SLOT)
            continue;
#elif defined(__aarch64__)
        if (ELF64_R_TYPE(jmprel[i].r_info) != R_AARCH64_JUMP_SLOT)
            continue;
#else
        continue;
#endif
        if (strcmp(strtab + symtab[ELF64_R_SYM(jmprel[i].r_info)].st_name, "mmap"))
            continue;
        void **slot = (void **)(info->dlpi_addr + jmprel[i].r_offset);
        if (*slot == (void *)pinned_mmap) {
            w->patched++;
            continue;
        }
        uintptr_t page = (uintptr_t)slot & ~(uintptr_t)(pg - 1);
        /* full RELRO leaves the GOT read-only: made writable again, as _observe_got.c does */
        if (mprotect((void *)page, (size_t)pg, PROT_READ | PROT_WRITE))
            continue;
        __atomic_store_n(slot, (void *)pinned_mmap, __ATOMIC_SEQ_CST);
        w->patched++;
        snprintf(w->path, sizeof w->path, "%s", info->dlpi_name);
    }
    if (w->patched && !w->path[0])
        snprintf(w->path, sizeof w->path, "%s", info->dlpi_name);
    return 0;
}

static PyObject *pin(PyObject *self, PyObject *args)
{
    unsigned long long addr, len;
    (void)self;
    if (!PyArg_ParseTuple(args, "KK", &addr, &len))
        return NULL;
    real_mmap = mmap;
    want_len = (size_t)len;
    want_addr = (uintptr_t)addr;
    struct walk w = {0};
    w.path[0] = 0;
    dl_iterate_phdr(patch_one, &w);
    return PyUnicode_DecodeFSDefault(w.patched ? w.path : "");
}

static PyObject *set_size(PyObject *self, PyObject *args)
{
    unsigned long long len;
    (void)self;
    if (!PyArg_ParseTuple(args, "K", &len))
        return NULL;
    want_len = (size_t)len;
    Py_RETURN_NONE;
}

static PyObject *placed(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return Py_BuildValue("(Ki)", (unsigned long long)last_addr, last_errno);
}

static PyMethodDef methods[] = {
    {"pin", pin, METH_VARARGS, "pin(addr, heap_size) -> path of the libnvrtc patched, or ''"},
    {"set_size", set_size, METH_VARARGS, "set_size(heap_size): the next heap mapping's size"},
    {"placed", placed, METH_NOARGS, "placed() -> (address of the last heap, errno or -1)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pchheap",
                                    "NVRTC's PCH heap pinned at one address", -1, methods};

PyMODINIT_FUNC PyInit__pchheap(void) { return PyModule_Create(&module); }
