/* SPDX-License-Identifier: MIT
 *
 * Training data for the engine: token shards in the llm.c / nanoGPT `.bin`
 * layout, a deterministic loader over one or several shards whose position is
 * a plain struct (saved in checkpoints, restored exactly), and the generated
 * associative-recall task of the demo, whose accuracy rises above chance
 * only when attention reaches across rank boundaries.
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
#ifndef DT_DATA_H
#define DT_DATA_H

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

/*-- loader -------------------------------------------------------------------*/

/* The loader walks shards in a fixed order and hands out sequences of T + 1
 * tokens split as x = tok[0..T), y = tok[1..T]. Sequence j of a shard covers
 * tokens [j*T, j*T + T + 1) (consecutive sequences share one token, as in
 * llm.c), so a shard of n tokens holds nseq = (n - 1) / T sequences; the
 * remainder is not used. Every shard must hold at least one sequence.
 *
 * Order: shards sorted by path (strcmp, so every node agrees), sequences in
 * file order. With shuffle, each epoch permutes the shard order and, inside
 * each shard, the sequence order (Fisher-Yates driven by dt_gen_uniform
 * under `seed`, streams (epoch << 32 | shard) for sequences and
 * (epoch << 32 | 0xffffffff) for shards): the order is a function of (seed,
 * epoch, shard list, T) only, identical on every rank and after a restart.
 *
 * Data parallel: with dp_size > 1, each call to next consumes dp_size
 * consecutive sequences of that order and returns the dp_rank-th; the
 * cursor is the same on every replica. (Ring ranks of one sequence use
 * dp_size 1 and all read the same sequence.) */
typedef struct dt_loader_opts {
    int64_t T;     /* tokens per sequence (x and y each hold T) */
    int shuffle;   /* 0: file order; 1: permute every epoch */
    uint64_t seed; /* shuffle seed */
    int dp_rank;   /* 0 <= dp_rank < dp_size */
    int dp_size;   /* 0 means 1 */
    int64_t vocab; /* > 0: a token >= vocab is refused (names file and index) */
} dt_loader_opts_t;

/* Where the loader stands: the next sequence is number `seq` (in the
 * epoch's order) of the shard at position `shard` in the epoch's shard
 * order. A plain value: store it in a checkpoint and give it back to
 * set_cursor with the same shard list and options to continue exactly. */
typedef struct dt_loader_cursor {
    uint64_t epoch; /* full passes over all shards completed */
    int64_t shard;  /* position in this epoch's shard order, 0 <= shard < nshards */
    int64_t seq;    /* position in that shard's sequence order, 0 <= seq < nseq */
} dt_loader_cursor_t;

typedef struct dt_loader dt_loader_t;

/* A loader over npaths shard files (validated now, each opened and
 * closed; only the current shard is held open later) or over the files
 * matching a glob pattern. DT_ENOENT when the glob matches nothing,
 * DT_EINVAL for bad options or a shard too short for one sequence, else
 * what dt_tok_shard_new returns. The cursor starts at {0, 0, 0}. */
int dt_loader_new(const char *const *paths, int npaths, const dt_loader_opts_t *o,
                  dt_loader_t **out, dt_emsg_t *em);
int dt_loader_new_glob(const char *pattern, const dt_loader_opts_t *o, dt_loader_t **out,
                       dt_emsg_t *em);
void dt_loader_free(dt_loader_t *l);

int dt_loader_nshards(const dt_loader_t *l);
/* Total tokens in all shards; sequences per epoch (before dp_size). */
int64_t dt_loader_ntok(const dt_loader_t *l);
int64_t dt_loader_nseq(const dt_loader_t *l);

/* The next sequence into x and y (T int32 each) and advance the cursor
 * (wrapping to the next epoch after the last shard). On failure the cursor
 * does not move. */
int dt_loader_next(dt_loader_t *l, int32_t *x, int32_t *y, dt_emsg_t *em);

void dt_loader_get_cursor(const dt_loader_t *l, dt_loader_cursor_t *c);
/* DT_EINVAL (the loader unchanged) when shard or seq is out of range. */
int dt_loader_set_cursor(dt_loader_t *l, const dt_loader_cursor_t *c, dt_emsg_t *em);

/*-- generated associative recall -------------------------------------------*/

/* Vocabulary, in this order (vocab = 4 + K + V + F):
 *   0 BOS, 1 SEP, 2 QUERY, 3 ANSWER
 *   keys    4 .. 4+K            (key k is token 4 + k)
 *   values  4+K .. 4+K+V        (value v is token 4 + K + v)
 *   filler  4+K+V .. 4+K+V+F    (noise between the pairs and the queries)
 *
 * A sequence of L = T + 1 tokens, a function of (seed, sequence index):
 *   [0]                 BOS
 *   [1, p0)             filler, uniform over the F filler tokens
 *   [p0, p0 + 3P)       P pairs "k v SEP", keys distinct, values uniform;
 *                       p0 = floor(4 L / 10), 40% into the sequence
 *   [p0 + 3P, L - 4Q)   filler
 *   [L - 4Q, L)         Q queries "QUERY k ANSWER v", Q distinct planted keys
 *                       in random order, v the value planted with k
 * The pairs take at most 10% of the sequence (10 * (1 + 3P) <= L), so they
 * lie in [0.4 L, 0.5 L): with the sequence over R >= 2 ranks, contiguous
 * (rank floor(0.4 R)) or zigzag (chunks floor(0.8 R) .. R - 1 of 2R, held by
 * ranks other than 0), they are on other ranks than the queries at the end
 * (the last rank, or rank 0 under zigzag), so every answer needs attention
 * across rank boundaries.
 *
 * Targets: y[i] = tok[i + 1] at the Q answer slots (x[i] == ANSWER,
 * i = T - 4Q + 4q + 3 for q = 0..Q-1, the last being T - 1), -1
 * (ignored) elsewhere; with all_targets, y = tok[1..T] everywhere. Recall
 * accuracy is measured at the answer slots only; chance is 1 / V.
 *
 * Random draws: dt_gen_uniform(seed, 4 * index + d, counter) with d = 0
 * filler (counter = position), 1 keys, 2 values, 3 query order; sequence
 * indices below 2^62. */
#define DT_RECALL_BOS 0
#define DT_RECALL_SEP 1
#define DT_RECALL_QUERY 2
#define DT_RECALL_ANSWER 3
#define DT_RECALL_NSPECIAL 4

typedef struct dt_recall_opts {
    int64_t T;       /* x and y hold T tokens; default 1024 (256 per rank on 4) */
    int n_keys;      /* K, default 128 */
    int n_values;    /* V, default 128 (chance 1/128) */
    int n_filler;    /* F, default 252 (so vocab = 512, the tiny model's) */
    int n_pairs;     /* P, default 16: 49 tokens, within 102 = 10% of 1025 */
    int n_queries;   /* Q <= P, default 8 */
    int all_targets; /* default 0: only the answer slots have targets */
    uint64_t seed;   /* default 1 */
} dt_recall_opts_t;

/* Fill o with the defaults above. */
void dt_recall_opts_default(dt_recall_opts_t *o);

/* DT_EINVAL with a message when the options cannot make a sequence. */
int dt_recall_check(const dt_recall_opts_t *o, dt_emsg_t *em);

/* 4 + K + V + F. */
int64_t dt_recall_vocab(const dt_recall_opts_t *o);

/* Position of the first planted key: floor(4 (T + 1) / 10). */
int64_t dt_recall_pairs_start(const dt_recall_opts_t *o);

/* Index into y of the answer slot of query q (0 <= q < Q). */
int64_t dt_recall_answer_pos(const dt_recall_opts_t *o, int q);

/* Sequence `index` as T + 1 tokens. Checks o first. */
int dt_recall_make(const dt_recall_opts_t *o, uint64_t index, int32_t *tok, dt_emsg_t *em);

/* Sequence `index` as x and y (T each), targets as described above. */
int dt_recall_xy(const dt_recall_opts_t *o, uint64_t index, int32_t *x, int32_t *y, dt_emsg_t *em);

/* Recall accuracy of B sequences: pred and y are (B, T) (pred the argmax
 * token at each position); counts the answer slots where pred equals y.
 * Returns correct / (B * Q) and stores the count in *correct when not
 * NULL; 0 when B is 0. */
double dt_recall_score(const dt_recall_opts_t *o, int64_t B, const int32_t *y, const int32_t *pred,
                       int64_t *correct);

#endif /* DT_DATA_H */
