/* SPDX-License-Identifier: MIT
 *
 * Token shards in the llm.c / nanoGPT `.bin` layout: read (a header checked
 * field by field, tokens by pread in bounded chunks, widened to int32) and
 * written (atomically). The loader over them is engine/data/loader.h.
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
 * Not here: tokenisation, memory-mapping, big-endian hosts, llm.c's eval
 * files (magic 20240522).
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
};

/* "uint16" or "uint32". */
const char *dt_tok_format_name(enum dt_tok_format f);

/*-- one shard ----------------------------------------------------------------*/

typedef struct dt_tok_shard dt_tok_shard_t;

/* Open and validate the shard at PATH (the file stays open until free).
 * Returns 0; DT_ENOENT/DT_EACCES/DT_EIO when it cannot be opened or read;
 * DT_EFORMAT for a short header, a bad magic, version or count, or a size
 * that does not match the count. *out is NULL on failure. */
int dt_tok_shard_new(const char *path, dt_tok_shard_t **out, dt_emsg_t *em);
/* The header checks alone: head holds the first n bytes of a file of
 * file_size bytes (name is used in messages). 0 with *fmt and *ntok set,
 * or DT_EFORMAT as dt_tok_shard_new. A pure function, for the fuzzer
 * (tests/fuzz/fuzz_tokshard.c). */
int dt_tok_parse_header(const char *name, const void *head, size_t n, int64_t file_size,
                        enum dt_tok_format *fmt, int64_t *ntok, dt_emsg_t *em);
void dt_tok_shard_free(dt_tok_shard_t *s);

int64_t dt_tok_shard_ntok(const dt_tok_shard_t *s);
enum dt_tok_format dt_tok_shard_format(const dt_tok_shard_t *s);
/* Borrowed; valid until free. */
const char *dt_tok_shard_path(const dt_tok_shard_t *s);

/* Tokens [first, first + n) into dst (n int32). DT_EINVAL for a window
 * outside [0, ntok); DT_EFORMAT if the file shrank since it was opened or a
 * uint32 token exceeds INT32_MAX (the message names the token's index). */
int dt_tok_shard_read(const dt_tok_shard_t *s, int64_t first, int64_t n, int32_t *dst,
                      dt_emsg_t *em);

/* Write n tokens to PATH atomically (a temporary file beside it, fsynced,
 * renamed over PATH, directory fsynced). Tokens must fit the format (0 to
 * 65535, or 0 to INT32_MAX) and n < 2^31; otherwise DT_EINVAL and no file is
 * created. On any failure an existing PATH is untouched and no temporary
 * file is left. The file is created with mode 0600. For tests and tools. */
int dt_tok_save(const char *path, enum dt_tok_format fmt, const int32_t *tok, int64_t n,
                dt_emsg_t *em);

#endif /* DT_IO_TOKSHARD_H */
