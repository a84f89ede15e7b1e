/* SPDX-License-Identifier: MIT
 *
 * Allocation that cannot fail: dt_xmalloc and friends abort with a message
 * when memory is exhausted (an allocation failure is not a recoverable error
 * anywhere in dt). Sizes are checked for multiplication overflow. Large
 * numeric buffers (tensors) use dt_xaligned, 64-byte aligned, freed with free().
 */
#ifndef DT_MEM_H
#define DT_MEM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void *dt_xmalloc(size_t n);
void *dt_xcalloc(size_t count, size_t size);
void *dt_xrealloc(void *p, size_t n);
/* count * size bytes, overflow-checked, uninitialised. */
void *dt_xmallocarray(size_t count, size_t size);
/* 64-byte aligned count * size bytes; release with free(). */
void *dt_xaligned(size_t count, size_t size);
char *dt_xstrdup(const char *s);
/* printf into a new string; the caller frees it. */
char *dt_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif

#endif /* DT_MEM_H */
