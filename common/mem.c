/* SPDX-License-Identifier: MIT
 *
 * Allocation wrappers that abort on exhaustion and on size overflow.
 */
#include "config.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

static void oom(size_t n)
{
    fprintf(stderr, "dt: out of memory allocating %zu bytes\n", n);
    abort();
}

static size_t mul(size_t a, size_t b)
{
    if (b != 0 && a > SIZE_MAX / b) {
        fprintf(stderr, "dt: allocation size overflow (%zu x %zu)\n", a, b);
        abort();
    }
    return a * b;
}

void *dt_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        oom(n);
    return p;
}

void *dt_xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL)
        oom(mul(count, size));
    return p;
}

void *dt_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL)
        oom(n);
    return q;
}

void *dt_xmallocarray(size_t count, size_t size)
{
    return dt_xmalloc(mul(count, size));
}

void *dt_xaligned(size_t count, size_t size)
{
    size_t n = mul(count, size);
    void *p = NULL;
    /* round up so aligned_alloc's size rule holds */
    n = (n + 63) & ~(size_t)63;
    if (n == 0)
        n = 64;
    if (posix_memalign(&p, 64, n) != 0)
        oom(n);
    return p;
}

char *dt_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = dt_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

char *dt_xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;

    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        oom(strlen(fmt));
    va_end(ap);
    return s;
}
