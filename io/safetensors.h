/* SPDX-License-Identifier: MIT
 *
 * safetensors files, the checkpoint shard format of dtengine: an 8-byte
 * little-endian header length N, N bytes of JSON naming each tensor's dtype,
 * shape and byte range ("data_offsets", relative to the first data byte),
 * an optional "__metadata__" object of string values, then the data. The
 * layout is the one of Hugging Face's safetensors library, so shards open in
 * PyTorch, JAX and NumPy without dt.
 *
 * Reading is for untrusted files: the header length is capped before
 * anything is allocated, the JSON is parsed strictly (duplicate keys, unknown
 * dtypes, unknown fields, a shape that disagrees with its byte range,
 * overlapping or gapped ranges, a file shorter or longer than its header
 * says are all refused with a message naming the file and the problem).
 *
 * Writing is atomic (temp file beside the target, created with mode 0600
 * unless told otherwise, fsync, rename, fsync of the directory) and yields
 * the SHA-256 of the whole file, computed while the bytes go out, for
 * checkpoint manifests.
 *
 * Not here: memory-mapping, dtype conversion, byte swapping (every target of
 * dt is little-endian, as the format is), dtypes other than the six below.
 */
#ifndef DT_SAFETENSORS_H
#define DT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "common/sha256.h" /* dt_sha256_file: a shard's hash, as dt_st_write gives it */
#include "spec/dtype.h"

#define DT_ST_MAXDIM 8
/* Headers longer than this are refused before allocating (the reference
 * implementation uses the same 100 MiB limit). */
#define DT_ST_HEADER_MAX (100u << 20)

/* safetensors tensors hold DT_F32 ("F32"), DT_F16 ("F16"), DT_BF16
 * ("BF16"), DT_I64 ("I64"), DT_I32 ("I32") and DT_U8 ("U8"); spec/dtype.h. */

/* "F32", ...; "?" for a value outside the enum. */
const char *dt_st_dtype_name(dt_dtype_t t);
/* Bytes per element; 0 for a value outside the enum. */
size_t dt_st_dtype_size(dt_dtype_t t);
/* The dtype named s; DT_EDTYPE if s names none of the six. */
int dt_st_dtype_parse(const char *s, dt_dtype_t *out);

/* One tensor of a file. name is borrowed from the reader. */
typedef struct dt_st_tensor {
    const char *name;
    dt_dtype_t dtype;
    int ndim;
    int64_t shape[DT_ST_MAXDIM];
    uint64_t begin, end; /* byte range relative to the start of the data */
} dt_st_tensor_t;

/*-- writer ---------------------------------------------------------------*/

/* Collects tensors and metadata, then writes them in one go. Tensors go to
 * the file in the order they were added; the header lists "__metadata__"
 * first, then the tensors in that order, as compact JSON padded with spaces
 * to a multiple of 8 bytes (so every tensor's data starts 8-byte aligned
 * when its offset is). Not thread-safe; one writer per thread. */
typedef struct dt_st_writer dt_st_writer_t;

dt_st_writer_t *dt_st_writer_new(void);
/* No-op on NULL. Does not touch any file. */
void dt_st_writer_free(dt_st_writer_t *w);

/* Add a tensor. data points at prod(shape) * dt_st_dtype_size(dtype) bytes
 * and is borrowed: it must stay valid and unchanged until dt_st_write
 * returns (NULL is allowed for an empty tensor). Names are non-empty UTF-8,
 * unique, and not "__metadata__". Returns 0, DT_EINVAL (bad name, duplicate,
 * negative dimension, more than DT_ST_MAXDIM dimensions, size overflow),
 * DT_EDTYPE. */
int dt_st_writer_add(dt_st_writer_t *w, const char *name, dt_dtype_t dtype, int ndim,
                     const int64_t *shape, const void *data, dt_emsg_t *em);

/* Add a metadata entry (both strings are copied; UTF-8; keys unique).
 * Returns 0 or DT_EINVAL. */
int dt_st_writer_meta(dt_st_writer_t *w, const char *key, const char *value, dt_emsg_t *em);

/* Write everything to PATH atomically. On success hex (may be NULL) holds
 * the lowercase SHA-256 of the whole file and *bytes (may be NULL) its size.
 * On failure no temporary file is left and an existing PATH is untouched,
 * except when only the final fsync of the directory failed: then the file is
 * in place and the message says so. The writer stays usable either way. */
int dt_st_write(dt_st_writer_t *w, const char *path, char hex[65], int64_t *bytes, dt_emsg_t *em);
/* dt_st_write with the file created with mode (less the umask) instead of
 * 0600: for files meant to be shared (a Hugging Face export, 0644), where
 * dt_st_write's mode is for checkpoint shards, the owner's alone. */
int dt_st_write_mode(dt_st_writer_t *w, const char *path, mode_t mode, char hex[65],
                     int64_t *bytes, dt_emsg_t *em);

/* Write everything into the open file fd from offset 0 and cut it there
 * (memory that outlives the writer: a memfd; no fsync, no rename), with
 * hex and *bytes as dt_st_write's; hex NULL: not hashed (the caller
 * hashes the file later, off its critical path). name is for messages. On
 * failure the file's contents are undefined. */
int dt_st_write_fd(dt_st_writer_t *w, int fd, const char *name, char hex[65], int64_t *bytes,
                   dt_emsg_t *em);

/*-- reader ---------------------------------------------------------------*/

/* An open, validated file. Holds a file descriptor for dt_st_read. One
 * reader may be used from several threads at once for dt_st_read only. */
typedef struct dt_st_reader dt_st_reader_t;

/* Open and validate PATH. Returns 0, DT_ENOENT/DT_EACCES/DT_EIO when it
 * cannot be read, DT_EFORMAT for any malformed header or size, DT_EDTYPE for
 * an unknown dtype. *out is NULL on failure. */
int dt_st_open(const char *path, dt_st_reader_t **out, dt_emsg_t *em);
/* dt_st_open, but a symbolic link at PATH is refused (DT_EINVAL): for
 * checkpoint shards, whose directory a job's owner controls. */
int dt_st_open_nofollow(const char *path, dt_st_reader_t **out, dt_emsg_t *em);
/* The same checks over a whole file already in memory (size bytes; name is
 * used in messages): a pure function, for the fuzzer
 * (tests/fuzz/fuzz_safetensors.c) and for tests. The reader lists tensors
 * and metadata; dt_st_read on it fails (DT_EINVAL: no data). */
int dt_st_parse(const char *name, const void *file, size_t size, dt_st_reader_t **out,
                dt_emsg_t *em);
/* No-op on NULL. */
void dt_st_close(dt_st_reader_t *r);

const char *dt_st_path(const dt_st_reader_t *r);
/* Number of tensors; dt_st_tensor(r, i) for 0 <= i < count, in file order
 * (ascending data_offsets). */
size_t dt_st_count(const dt_st_reader_t *r);
const dt_st_tensor_t *dt_st_tensor(const dt_st_reader_t *r, size_t i);
/* The tensor called name, or NULL. */
const dt_st_tensor_t *dt_st_find(const dt_st_reader_t *r, const char *name);

/* Read tensor NAME into dst, which holds exactly dst_bytes == end - begin
 * bytes. Returns 0, DT_ENOENT (no such tensor), DT_ESHAPE (dst_bytes is not
 * the tensor's size), DT_EFORMAT (the file shrank since it was opened),
 * DT_EIO. */
int dt_st_read(const dt_st_reader_t *r, const char *name, void *dst, size_t dst_bytes,
               dt_emsg_t *em);

/* Bytes [from, from + bytes) of tensor NAME into dst: DT_ESHAPE when they
 * are not inside the tensor; otherwise as dt_st_read. */
int dt_st_read_range(const dt_st_reader_t *r, const char *name, uint64_t from, void *dst,
                     size_t bytes, dt_emsg_t *em);

/* Metadata: the value for key (borrowed) or NULL; and by index, in header
 * order, for 0 <= i < dt_st_meta_count(r). */
const char *dt_st_meta(const dt_st_reader_t *r, const char *key);
size_t dt_st_meta_count(const dt_st_reader_t *r);
void dt_st_meta_at(const dt_st_reader_t *r, size_t i, const char **key, const char **value);

#endif /* DT_SAFETENSORS_H */
