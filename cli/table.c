/* SPDX-License-Identifier: MIT
 *
 * Aligned text tables (table.h): cells are copied as they come; printing
 * measures every column first. Widths count bytes, with UTF-8 continuation
 * bytes left out, so "µs" or "×" in a cell does not skew the column. Not a
 * terminal library: no colours, no wrapping, no truncation.
 */
#include "config.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/table.h"
#include "common/mem.h"

struct dt_table {
    int ncol;
    char **head; /* [ncol], without the '-' */
    int *left;   /* [ncol] */
    char **cell; /* [nrow * ncol] */
    size_t nrow, cap;
    int pending; /* cells of the row being built by dt_table_cell */
};

/* Display width: bytes that start a character. */
static size_t width(const char *s)
{
    size_t n = 0;

    for (; *s != '\0'; s++)
        n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

dt_table_t *dt_table_new(int ncol, const char *const *headers)
{
    dt_table_t *t;

    assert(ncol > 0 && headers != NULL);
    t = dt_xcalloc(1, sizeof(*t));
    t->ncol = ncol;
    t->head = dt_xcalloc((size_t)ncol, sizeof(*t->head));
    t->left = dt_xcalloc((size_t)ncol, sizeof(*t->left));
    for (int i = 0; i < ncol; i++) {
        t->left[i] = headers[i][0] == '-';
        t->head[i] = dt_xstrdup(headers[i] + t->left[i]);
    }
    return t;
}

/* Room for one more cell at the end. */
static char **next_cell(dt_table_t *t)
{
    size_t used = t->nrow * (size_t)t->ncol + (size_t)t->pending;

    if (used == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 16 * (size_t)t->ncol;
        t->cell = dt_xrealloc(t->cell, t->cap * sizeof(*t->cell));
    }
    if (++t->pending == t->ncol) {
        t->pending = 0;
        t->nrow++;
    }
    return &t->cell[used];
}

void dt_table_add(dt_table_t *t, const char *const *cells)
{
    assert(t->pending == 0); /* not in the middle of a dt_table_cell row */
    for (int i = 0; i < t->ncol; i++)
        *next_cell(t) = dt_xstrdup(cells[i] ? cells[i] : "");
}

void dt_table_cell(dt_table_t *t, const char *fmt, ...)
{
    char *s;
    va_list ap;

    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        s = dt_xstrdup("?");
    va_end(ap);
    *next_cell(t) = s;
}

static void print_row(const dt_table_t *t, char *const *row, const size_t *w, FILE *f)
{
    int last = t->ncol - 1;

    /* a left-aligned last column gets no trailing padding */
    while (last > 0 && t->left[last] && row[last][0] == '\0')
        last--;
    for (int i = 0; i <= last; i++) {
        size_t pad = w[i] - width(row[i]);

        if (i > 0)
            fputs("  ", f);
        if (!t->left[i])
            fprintf(f, "%*s", (int)pad, "");
        fputs(row[i], f);
        if (t->left[i] && i < last)
            fprintf(f, "%*s", (int)pad, "");
    }
    fputc('\n', f);
}

void dt_table_print(const dt_table_t *t, FILE *f)
{
    size_t *w = dt_xcalloc((size_t)t->ncol, sizeof(*w));

    for (int i = 0; i < t->ncol; i++)
        w[i] = width(t->head[i]);
    for (size_t r = 0; r < t->nrow; r++)
        for (int i = 0; i < t->ncol; i++) {
            size_t n = width(t->cell[r * (size_t)t->ncol + (size_t)i]);
            w[i] = n > w[i] ? n : w[i];
        }
    print_row(t, t->head, w, f);
    for (size_t r = 0; r < t->nrow; r++)
        print_row(t, &t->cell[r * (size_t)t->ncol], w, f);
    free(w);
}

void dt_table_free(dt_table_t *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->nrow * (size_t)t->ncol + (size_t)t->pending; i++)
        free(t->cell[i]);
    for (int i = 0; i < t->ncol; i++)
        free(t->head[i]);
    free(t->cell);
    free(t->left);
    free(t->head);
    free(t);
}
