/* Patching a loaded library's imports: its dynamic section's relocations name the GOT slot
of each imported function; pointing a slot at a wrapper reroutes that library's calls (and
only its calls). RELRO pages are made writable for the write and read-only again. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "_observe.h"

#if defined(__x86_64__)
#define R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define R_GLOB_DAT R_AARCH64_GLOB_DAT
#else
#error "kjit._observe: unsupported architecture"
#endif

#if defined(__x86_64__)
#define COMPAT_VERSION "GLIBC_2.2.5"
#else
#define COMPAT_VERSION "GLIBC_2.17"
#endif

void observe_resolve(Hook *hooks, size_t nhooks) {
    for (size_t i = 0; i < nhooks; i++) {
        void *f = dlsym(RTLD_DEFAULT, hooks[i].name);
        if (!f) f = dlvsym(RTLD_DEFAULT, hooks[i].name, COMPAT_VERSION);
        *hooks[i].real = f;
    }
}

typedef struct {
    const char *const *names;
    size_t nnames;
    const Hook *hooks;
    size_t nhooks;
    int (*found)(void *, const char *, int);
    void *ctx;
    int error;
} Walk;

static uintptr_t rebase(uintptr_t p, uintptr_t base) { return p < base ? p + base : p; }

/* 1 when the slot holds `value` afterwards (already hooked counts: a second install, from
 * another thread or a retry, must see its library as hooked), -1 on failure */
static int patch_slot(void **slot, void *value, uintptr_t relro_lo, uintptr_t relro_hi) {
    if (*slot == value) return 1;
    uintptr_t a = (uintptr_t)slot;
    int in_relro = a >= relro_lo && a < relro_hi;
    long page = sysconf(_SC_PAGESIZE);
    void *pg = (void *)(a & ~(uintptr_t)(page - 1));
    if (in_relro && mprotect(pg, (size_t)page, PROT_READ | PROT_WRITE) != 0) return -1;
    __atomic_store_n(slot, value, __ATOMIC_SEQ_CST);
    if (in_relro) mprotect(pg, (size_t)page, PROT_READ);
    return 1;
}

static int matches(const char *path, Walk *w) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (size_t i = 0; i < w->nnames; i++)
        if (strncmp(base, w->names[i], strlen(w->names[i])) == 0) return 1;
    return 0;
}

static int patch_object(struct dl_phdr_info *info, Walk *w) {
    uintptr_t base = info->dlpi_addr;
    const ElfW(Dyn) *dyn = NULL;
    uintptr_t relro_lo = 0, relro_hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO) {
            relro_lo = base + ph->p_vaddr;
            relro_hi = relro_lo + ph->p_memsz;
        }
    }
    if (!dyn) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmpsz = 0, relasz = 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)rebase(d->d_un.d_ptr, base); break;
        case DT_STRTAB: strtab = (const char *)rebase(d->d_un.d_ptr, base); break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)rebase(d->d_un.d_ptr, base); break;
        case DT_PLTRELSZ: jmpsz = d->d_un.d_val; break;
        case DT_RELA: rela = (const ElfW(Rela) *)rebase(d->d_un.d_ptr, base); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        case DT_PLTREL: if (d->d_un.d_val != DT_RELA) return 0; break;  /* REL: not on x86_64/aarch64 */
        }
    }
    if (!symtab || !strtab) return 0;
    int count = 0;
    const ElfW(Rela) *tables[2] = {jmprel, rela};
    size_t sizes[2] = {jmpsz, relasz};
    for (int t = 0; t < 2; t++) {
        if (!tables[t]) continue;
        for (size_t i = 0; i < sizes[t] / sizeof(ElfW(Rela)); i++) {
            const ElfW(Rela) *r = &tables[t][i];
            unsigned type = (unsigned)ELF64_R_TYPE(r->r_info);
            if (type != R_JUMP_SLOT && type != R_GLOB_DAT) continue;
            size_t si = ELF64_R_SYM(r->r_info);
            if (!si) continue;
            const char *name = strtab + symtab[si].st_name;
            for (size_t h = 0; h < w->nhooks; h++) {
                const Hook *hk = &w->hooks[h];
                if (strcmp(name, hk->name) != 0 || !*hk->real) continue;
                int p = patch_slot((void **)(base + r->r_offset), hk->wrapper, relro_lo, relro_hi);
                if (p < 0) { w->error = errno; return -1; }
                count += p;
                break;
            }
        }
    }
    return count;
}

static int walk_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    Walk *w = data;
    if (!info->dlpi_name || !*info->dlpi_name || !matches(info->dlpi_name, w)) return 0;
    int n = patch_object(info, w);
    if (n < 0) return 1;
    if (w->found(w->ctx, info->dlpi_name, n) < 0) { w->error = -1; return 1; }
    return 0;
}

int observe_patch(const char *const *prefixes, size_t nprefixes, const Hook *hooks,
                  size_t nhooks, int (*found)(void *ctx, const char *path, int count), void *ctx) {
    Walk w = {prefixes, nprefixes, hooks, nhooks, found, ctx, 0};
    dl_iterate_phdr(walk_cb, &w);
    return w.error;
}
