/* The compile observer's two halves share the hook table's shape. */
#ifndef KJIT_OBSERVE_H
#define KJIT_OBSERVE_H
#include <stddef.h>

typedef struct { const char *name; void *wrapper; void **real; } Hook;

/* Find each hook's libc function (dlsym, else its oldest version: glibc >= 2.33 keeps
   __xstat only as a compatibility symbol). */
void observe_resolve(Hook *hooks, size_t nhooks);

/* Point the GOT entries (JUMP_SLOT, GLOB_DAT) of every loaded object whose file name starts
   with one of `prefixes` at the hooks' wrappers, and call found(ctx, path, slots patched) for
   each. Returns 0, -1 when found() failed, or the errno of a failed mprotect. */
int observe_patch(const char *const *prefixes, size_t nprefixes, const Hook *hooks,
                  size_t nhooks, int (*found)(void *ctx, const char *path, int count), void *ctx);
#endif
