/* SPDX-License-Identifier: MIT
 *
 * Token files, the data of dtengine train and prefill: llm.c / nanoGPT
 * `.bin` shards and NumPy `.npy` arrays of token ids, opened alike as one
 * "shard" (the loader over them is engine/data/loader.h). Read: a header
 * checked field by field, then tokens by pread of the ranges asked for, in
 * bounded chunks, converted to int32 and checked (a 10 GB file is never
 * loaded whole). Written atomically, for tests and tools. The kind of a
 * file is told by its first bytes ("\x93NUMPY" is a .npy file), never by
 * its name, so one glob may mix both.
 *
 * Shard layout (what llm.c's dev/data/data_common.py writes): a header of
 * 256 little-endian int32, then header[2] tokens, nothing after them.
 *   header[0] magic, header[1] version, token type:
 *     20240520, 1: uint16 tokens (llm.c "gpt-2")
 *     20240801, 7: uint32 tokens (llm.c "llama-3")
 *   header[2] number of tokens, 0 <= n < 2^31; the file size must be exactly
 *             1024 + n * (2 or 4) bytes.
 *   header[3..255] are not read (llm.c writes zeros); dt writes zeros.
 * Any other magic, any other version for a magic, a negative count, a header
 * shorter than 1024 bytes, or a size that does not match the count is refused
 * with a message naming the file and the header field. uint32 tokens above
 * INT32_MAX are refused when read (tokens are handed out as int32).
 *
 * .npy token arrays (the header is parsed by io/npy.h, format 1.0 to 3.0):
 * dtype '<i4' (int32) or '<i8' (int64), C order, shape (n,) or (n, m). A
 * 2-D array is n * m tokens in C order: its rows are concatenated, so a
 * sequence of the loader may span two rows (rows are not sequences). The
 * file must be exactly the header and the data. Other dtypes (floats,
 * bool, unsigned, big-endian), Fortran order, 0 or more than 2 dimensions,
 * or a size that does not match the shape are refused naming the file. A
 * negative id, and an int64 id above INT32_MAX, are refused when read,
 * naming the token's flat index from 0.
 *
 * Not here: tokenisation, memory-mapping, big-endian hosts, llm.c's eval
 * files (magic 20240522), unsigned .npy dtypes ('<u2', '<u4': spec/dtype.h
 * has no such type).
 */
#ifndef DT_IO_TOKSHARD_H
#define DT_IO_TOKSHARD_H

#include <stdint.h>

#include "common/err.h"

#define DT_TOK_HEADER_INTS 256
#define DT_TOK_HEADER_BYTES (DT_TOK_HEADER_INTS * 4)
#define DT_TOK_MAGIC_U16 20240520
#define DT_TOK_VERSION_U16 1
#define DT_TOK_MAGIC_U32 20240801
#define DT_TOK_VERSION_U32 7

enum dt_tok_format {
    DT_TOK_U16 = 0, /* magic 20240520, version 1, uint16 tokens (GPT-2) */
    DT_TOK_U32,     /* magic 20240801, version 7, uint32 tokens (LLaMA-3) */
    DT_TOK_NPY_I32, /* .npy, dtype '<i4' */
    DT_TOK_NPY_I64, /* .npy, dtype '<i8' */
};

/* "uint16", "uint32", "npy int32" or "npy int64". */
const char *dt_tok_format_name(enum dt_tok_format f);

/* What a file's header says. */
typedef struct dt_tok_info {
    enum dt_tok_format fmt;
    int64_t ntok;        /* tokens in the file (for a shard, < 2^31) */
    int64_t data_offset; /* bytes before the first token (1024 for a shard) */
} dt_tok_info_t;

/*-- one shard ----------------------------------------------------------------*/

typedef struct dt_tok_shard dt_tok_shard_t;

/* Open and validate the token file at PATH, a shard or a .npy array (the
 * file stays open until free). Returns 0; DT_ENOENT/DT_EACCES/DT_EIO when
 * it cannot be opened or read, DT_EINVAL for a directory or another file
 * that is not regular; DT_EFORMAT for a short header, a bad magic, version
 * or count, a malformed .npy header, a .npy array of 0 or more than 2
 * dimensions, or a size that does not match the count or shape; DT_EDTYPE
 * for a .npy dtype other than int32 and int64, or Fortran order. *out is
 * NULL on failure. */
int dt_tok_shard_new(const char *path, dt_tok_shard_t **out, dt_emsg_t *em);
/* The header checks alone: head holds the first n bytes of a file of
 * file_size bytes (name is used in messages): for a shard at least 1024
 * (or the whole file), for a .npy file its whole header (first 1024 bytes,
 * or dt_npy_header_len's when longer). 0 with *info set, or DT_EFORMAT or
 * DT_EDTYPE as dt_tok_shard_new. A pure function, for the fuzzer
 * (tests/fuzz/fuzz_tokshard.c). */
int dt_tok_parse_header(const char *name, const void *head, size_t n, int64_t file_size,
                        dt_tok_info_t *info, dt_emsg_t *em);
void dt_tok_shard_free(dt_tok_shard_t *s);

int64_t dt_tok_shard_ntok(const dt_tok_shard_t *s);
enum dt_tok_format dt_tok_shard_format(const dt_tok_shard_t *s);
/* Borrowed; valid until free. */
const char *dt_tok_shard_path(const dt_tok_shard_t *s);

/* Tokens [first, first + n) into dst (n int32). DT_EINVAL for a window
 * outside [0, ntok); DT_EFORMAT if the file shrank since it was opened, a
 * uint32 or int64 token exceeds INT32_MAX or an int32 or int64 token is
 * negative (the message names the file and the token's index). */
int dt_tok_shard_read(const dt_tok_shard_t *s, int64_t first, int64_t n, int32_t *dst,
                      dt_emsg_t *em);

/* Write n tokens to PATH atomically (a temporary file beside it, fsynced,
 * renamed over PATH, directory fsynced): a shard, or for the npy formats a
 * 1-D .npy array (io/npy.h's writer). Tokens must fit the format (0 to
 * 65535, or 0 to INT32_MAX) and, for a shard, n < 2^31; otherwise DT_EINVAL
 * and no file is created. On any failure an existing PATH is untouched and
 * no temporary file is left. The file is created with mode 0600. For tests
 * and tools. */
int dt_tok_save(const char *path, enum dt_tok_format fmt, const int32_t *tok, int64_t n,
                dt_emsg_t *em);

#endif /* DT_IO_TOKSHARD_H */
