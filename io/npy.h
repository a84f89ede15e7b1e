/* SPDX-License-Identifier: MIT
 *
 * NumPy .npy files (format versions 1.0, 2.0 and 3.0), the tensor exchange
 * format of dtengine. Reading accepts little-endian float32 ('<f4'),
 * float16 ('<f2') and float64 ('<f8': reference values, such as golden
 * logits) in C order and converts to float32; int64 ('<i8') is read for
 * position arrays; int32 ('<i4') and int64 headers are parsed for token id
 * arrays, whose data io/tokshard.c reads. Anything else (other dtypes, big-endian, Fortran
 * order, a header that does not parse, a file shorter than its header says)
 * is refused with a message naming the file and the problem; so is a file
 * longer than its header and data (trailing bytes).
 *
 * Writing is atomic: data goes to a temporary file beside the target, which
 * is fsynced and renamed over the target only on commit; an aborted or failed
 * write leaves no file behind and does not touch an existing target. The
 * file is created with mode 0600 (the owner's alone, whatever the umask).
 *
 * Not here: memory-mapping, object arrays, structured dtypes.
 */
#ifndef DT_NPY_H
#define DT_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "spec/dtype.h"

#define DT_NPY_MAXDIM 8

/* .npy files hold DT_F32 ('<f4'), DT_F16 ('<f2'), DT_F64 ('<f8'), DT_I32
 * ('<i4'), DT_I64 ('<i8'), DT_U8 ('|u1') and DT_BOOL ('|b1')
 * (spec/dtype.h). */

/* "float32", "float16", "float64", "int32", "int64", "uint8", "bool". */
const char *dt_npy_dtype_name(dt_dtype_t t);
size_t dt_npy_dtype_size(dt_dtype_t t);

typedef struct dt_npy_info {
    dt_dtype_t dtype;
    int ndim;
    int64_t shape[DT_NPY_MAXDIM];
    int64_t count;      /* product of shape */
    size_t data_offset; /* bytes from the start of the file */
} dt_npy_info_t;

/* Parse the header of PATH. Returns 0, DT_ENOENT/DT_EACCES/DT_EIO when the
 * file cannot be read, DT_EFORMAT for a malformed header or a file shorter
 * than the header promises, DT_EDTYPE for an unsupported dtype or Fortran
 * order. */
int dt_npy_read_header(const char *path, dt_npy_info_t *info, dt_emsg_t *em);
/* The same checks over a whole file already in memory (n bytes; name is
 * used in messages): the header, and the size against the shape. A pure
 * function, for the fuzzer (tests/fuzz/fuzz_npy.c). */
int dt_npy_parse_header(const char *name, const void *file, size_t n, dt_npy_info_t *info,
                        dt_emsg_t *em);
/* The same checks when only the file's first n bytes are in memory: head
 * must hold the whole header (magic to the end of the dict), file_size is
 * the size of the whole file, checked against the shape. Bytes of head
 * beyond file_size are ignored. DT_EFORMAT also when head stops inside
 * the header. Pure, like dt_npy_parse_header. */
int dt_npy_parse_head(const char *name, const void *head, size_t n, int64_t file_size,
                      dt_npy_info_t *info, dt_emsg_t *em);
/* How many bytes that header is (*len, from the magic to where the data
 * starts), from the first n bytes of a file of file_size bytes (the first
 * 12 are enough): 0, or DT_EFORMAT for no .npy magic, an unknown format
 * version, a header over the length limit or longer than the file. For a
 * reader that reads the header alone before dt_npy_parse_head. */
int dt_npy_header_len(const char *name, const void *head, size_t n, int64_t file_size,
                      size_t *len, dt_emsg_t *em);

/* Read elements [first, first + count) (flat C-order index) of a float32,
 * float16 or float64 file into dst as float32 (float64 rounded to
 * nearest). dst holds count floats. */
int dt_npy_read_f32(const char *path, const dt_npy_info_t *info, int64_t first,
                    int64_t count, float *dst, dt_emsg_t *em);

/* Read all elements of an int64 file into dst (info->count values). */
int dt_npy_read_i64(const char *path, const dt_npy_info_t *info, int64_t *dst,
                    dt_emsg_t *em);

/* Read all elements of an int32 or int64 file into dst as int64
 * (info->count values). */
int dt_npy_read_ints(const char *path, const dt_npy_info_t *info, int64_t *dst, dt_emsg_t *em);

/* Read all elements of a bool ('|b1', each 0 or 1) or uint8 ('|u1') file
 * into dst (info->count bytes). */
int dt_npy_read_bytes(const char *path, const dt_npy_info_t *info, uint8_t *dst, dt_emsg_t *em);

/* Atomic writer. open creates "<dir>/.<name>.tmp.<pid>" and writes the
 * header; pwrite places `count` elements (given in the writer's dtype; for
 * DT_F16 pass float32 values, they are rounded to nearest even) at flat
 * element offset `first`, in any order (elements never written read as 0);
 * commit fsyncs, renames over PATH and fsyncs the directory, then frees the
 * writer; abort unlinks the temporary file and frees the writer. Exactly one
 * of commit or abort must be called. A commit after any failed pwrite
 * refuses and aborts. After a failed commit the writer is freed; the target
 * is untouched unless only the final directory fsync failed, in which case
 * the new file is in place and the message says so. */
typedef struct dt_npy_writer dt_npy_writer_t;

int dt_npy_writer_open(const char *path, dt_dtype_t dtype, int ndim,
                       const int64_t *shape, dt_npy_writer_t **out, dt_emsg_t *em);
int dt_npy_writer_pwrite(dt_npy_writer_t *w, int64_t first, int64_t count,
                         const void *data, dt_emsg_t *em);
int dt_npy_writer_commit(dt_npy_writer_t *w, dt_emsg_t *em);
void dt_npy_writer_abort(dt_npy_writer_t *w);

/* Whole-array convenience: open, one pwrite of info count elements, commit. */
int dt_npy_save(const char *path, dt_dtype_t dtype, int ndim, const int64_t *shape,
                const void *data, dt_emsg_t *em);

#endif /* DT_NPY_H */
