/* SPDX-License-Identifier: MIT
 *
 * The masks a model job's keys ask for (dt-spec(5): doc_mask, eot_token,
 * doc_positions, sliding_window, sliding_window_layers, block_pattern,
 * block_size), parsed once, and the per-sequence masks (spec/mask.h) and
 * positions they make. The planner, dtctl and the engine read the keys
 * through here, so one word means one thing everywhere.
 *
 *   doc_mask = eot      a document starts at position 0 and at each
 *                       position whose input token is eot_token (llm.c
 *                       shards put one before each document); a query
 *                       attends keys of its own document only, and a
 *                       target that is eot_token (the next document's
 *                       first token) is not scored;
 *   doc_positions       continue: RoPE positions are sequence positions
 *                       (plus pos_offset); reset: they restart at 0 at
 *                       each document's start;
 *   sliding_window = W  causal: i - j < W; not causal: |i - j| < W, on
 *                       the layers sliding_window_layers names: all, or
 *                       every:K, the layers l with l mod K = 0 (0, K,
 *                       2K, ...: Gemma 2's and gpt-oss's alternation for
 *                       K = 2);
 *   block_pattern       over blocks of block_size tokens (query block a,
 *                       key block b), a union of parts, each once:
 *                         local:W    |a - b| < W
 *                         strided:S  a - b is a multiple of S
 *                         global:G   a < G or b < G (the first G blocks
 *                                    attend and are attended by all)
 *                       e.g. "global:1,local:4"; with causal attention
 *                       the blocks after a are dropped.
 * Every part present narrows the attended pairs (spec/mask.h: a pair is
 * attended when every part allows it).
 *
 * Not here: the key table and its defaults (spec/spec.c), the block mask
 * arithmetic (spec/mask.c).
 */
#ifndef DT_MASK_RULES_H
#define DT_MASK_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "spec/mask.h"

/* llm.c's GPT-2 shards' <|endoftext|>: eot_token's default without an
 * init_from whose config.json names an eos_token_id */
#define DT_EOT_DEFAULT 50256

typedef struct dt_mask_rules {
    bool docs;            /* doc_mask = eot */
    int64_t eot;          /* eot_token */
    bool reset;           /* doc_positions = reset */
    int64_t window;       /* sliding_window W; 0: none */
    int64_t window_every; /* sliding_window_layers: 1 all, K every K-th (from layer 0) */
    int64_t block;        /* block_size B (the key's, or its default) */
    int64_t local;        /* local:W in blocks; 0: no local part */
    int64_t stride;       /* strided:S; 0: none */
    int64_t global;       /* global:G; 0: none */
} dt_mask_rules_t;

/* sliding_window_layers' value: "all" (1) or "every:K", K >= 1. what
 * names the key or flag in the message. */
int dt_mask_parse_layers(const char *what, const char *v, int64_t *every, dt_emsg_t *em);
/* block_pattern's value into r's local, stride and global. */
int dt_mask_parse_pattern(const char *what, const char *v, dt_mask_rules_t *r, dt_emsg_t *em);

/* True when a block pattern is given (a part of it). */
bool dt_mask_rules_pattern(const dt_mask_rules_t *r);
/* True when the rules mask anything (causality aside). */
bool dt_mask_rules_any(const dt_mask_rules_t *r);
/* The first part given, as a key names it ("doc_mask = eot",
 * "sliding_window", "block_pattern"), for messages; "" for none. */
const char *dt_mask_rules_what(const dt_mask_rules_t *r);
/* Whether layer l has the sliding window. */
bool dt_mask_rules_windowed(const dt_mask_rules_t *r, int64_t l);
/* Whether some layers have the window and others not. */
bool dt_mask_rules_alternate(const dt_mask_rules_t *r, int64_t layers);

/* block_pattern's canonical value ("global:1,local:4": global, local,
 * strided in that order; "none"). */
void dt_mask_pattern_format(char *buf, size_t n, const dt_mask_rules_t *r);

/* The rules as one canonical line ("doc_mask=eot eot_token=50256
 * doc_positions=reset sliding_window=64 sliding_window_layers=every:2
 * block_pattern=global:1,local:4 block_size=64", the parts given only;
 * "none" for no mask), what a checkpoint records and a resume compares. */
void dt_mask_rules_format(char *buf, size_t n, const dt_mask_rules_t *r);

/* The parts of a sequence's mask that do not depend on its tokens, into
 * m (initialised here; dt_mask_close it): the block pattern, and the
 * window when windowed. DT_EINVAL when block_size does not divide T. */
int dt_mask_rules_mask(const dt_mask_rules_t *r, int64_t T, bool causal, bool windowed,
                       dt_mask_t *m, dt_emsg_t *em);
/* The documents of the sequence whose input tokens are x (T of m->T) into
 * m (replacing any); none (one document) without doc_mask. */
void dt_mask_rules_docs(const dt_mask_rules_t *r, const int32_t *x, dt_mask_t *m);
/* The targets y (n) that are not scored under the rules (eot_token with
 * doc_mask = eot) set to ignore. */
void dt_mask_rules_targets(const dt_mask_rules_t *r, int32_t *y, int64_t n, int32_t ignore);
/* RoPE positions of the rows at sequence positions pos (c): pos +
 * pos_offset, or with doc_positions = reset pos minus its document's
 * start in m. */
void dt_mask_rules_rope(const dt_mask_rules_t *r, const dt_mask_t *m, const int64_t *pos,
                        int64_t c, int64_t pos_offset, int64_t *rope);

#endif /* DT_MASK_RULES_H */
