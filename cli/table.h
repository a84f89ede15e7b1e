/* SPDX-License-Identifier: MIT
 *
 * Aligned text tables for people: add a header row and rows of cells, then
 * print with every column as wide as its widest cell (numbers right-
 * aligned, text left-aligned when the column's header says so).
 */
#ifndef DT_TABLE_H
#define DT_TABLE_H

#include <stdio.h>

typedef struct dt_table dt_table_t;

/* Columns from a header list: a name starting with '-' is left-aligned
 * (the '-' is not printed), others are right-aligned. */
dt_table_t *dt_table_new(int ncol, const char *const *headers);
/* Add a row of ncol cells (copied). */
void dt_table_add(dt_table_t *t, const char *const *cells);
/* printf-style cell helpers: add cells one by one; a row ends when ncol
 * cells have been added. */
void dt_table_cell(dt_table_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_table_print(const dt_table_t *t, FILE *f);
void dt_table_free(dt_table_t *t);

#endif /* DT_TABLE_H */
