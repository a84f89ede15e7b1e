/* SPDX-License-Identifier: MIT
 *
 * The attention spec: sequence length, heads, head dimension, causality,
 * the dilated branches (segment w, dilation r) and the layout over ranks,
 * with its validation, parsing and the branch/chunk arithmetic every binary
 * shares (the planner sizes jobs with it, the engine runs it). What the
 * branches mean is described in engine/attn/attn.h, which computes them.
 * No transport and no kernels here.
 */
#ifndef DT_ATTN_SPEC_H
#define DT_ATTN_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "spec/layout.h"

struct dt_mask;

#define DT_ATTN_MAXBRANCH 16

typedef struct dt_attn_spec {
    int64_t T;  /* sequence length */
    int H;      /* query heads */
    int Hkv;    /* key/value heads, divides H */
    int D;      /* head dimension */
    bool causal;
    int nbranch;                        /* 0: dense attention */
    int64_t seg[DT_ATTN_MAXBRANCH];     /* segment lengths w_i */
    int64_t dil[DT_ATTN_MAXBRANCH];     /* dilation rates r_i, r_i divides w_i */
    enum dt_layout layout;
    float scale; /* 0: 1 / sqrt(D) */
    /* the GPU backward may take nondeterministic kernels (spec key
     * deterministic = no); false (the zero value): deterministic */
    bool nondet;
    /* NULL, or the mask (spec/mask.h) over the T positions that every
     * branch applies (its causal and T equal the spec's); not owned */
    const struct dt_mask *mask;
    /* a model's alternating layers (sliding_window_layers = every:K, K =
     * mask_every >= 2): layer l uses mask when l mod K = 0, else
     * mask_rest (NULL: none); mask_every 0 or 1: every layer uses mask */
    const struct dt_mask *mask_rest;
    int64_t mask_every;
} dt_attn_spec_t;

/* The spec layer l of a model runs: s itself, or (alternating masks) a
 * copy in *tmp with layer l's mask. */
const dt_attn_spec_t *dt_attn_layer_spec(const dt_attn_spec_t *s, int64_t l,
                                         dt_attn_spec_t *tmp);

/* Validate a spec for R ranks: positive sizes, Hkv divides H, layout
 * divisibility, branch lists, w a multiple of r, distributed support.
 * DT_EINVAL / DT_ESHAPE / DT_ELAYOUT with a message naming the problem. */
int dt_attn_check(const dt_attn_spec_t *s, int R, dt_emsg_t *em);

/* Parse "w1,w2,..." and "r1,r2,..." into the spec's branch lists. */
int dt_attn_parse_branches(dt_attn_spec_t *s, const char *segs, const char *dils,
                           dt_emsg_t *em);

/* A branch: segment w, dilation r (dense is branch -1: w = T, r = 1), hc
 * query heads per chunk (ceil(H / r)), nchunk chunks that have heads. */
typedef struct dt_attn_branch {
    int64_t w, r;
    int hc;
    int nchunk;
} dt_attn_branch_t;

/* Head chunk k of a branch: query heads [hlo, hlo + nh), reading kv heads
 * [kvlo, kvlo + nkv). */
typedef struct dt_attn_chunk {
    int hlo, nh;
    int kvlo, nkv;
} dt_attn_chunk_t;

dt_attn_branch_t dt_attn_branch(const dt_attn_spec_t *s, int b);
dt_attn_chunk_t dt_attn_chunk(const dt_attn_spec_t *s, const dt_attn_branch_t *br, int k);

/* Floating-point operations of the forward (multiply-adds count 2) over all
 * ranks, counting only visible (query, key) pairs (for dense attention
 * with a mask, the pairs the mask allows, exactly; dilated branches count
 * their pairs without it). Backward costs 2.5x. */
double dt_attn_flops(const dt_attn_spec_t *s);

/* GPU attention blocks through cuDNN (engine/attn/attn_block.h): cuDNN 9
 * before 9.25 keeps a deterministic backward's scores (h tq tk bf16), so a
 * backward block is cut into query chunks of at most this many bytes of
 * them. */
#define DT_CUDNN_DET_CHUNK_BYTES ((size_t)512 << 20)
/* ... and every call into query chunks of at most this many bytes of o or
 * dq in the input type (the scratch they pass through). */
#define DT_CUDNN_ROW_CHUNK_BYTES ((size_t)256 << 20)

/* A deterministic backward whose chunks would be fewer rows than this
 * (long blocks: the scores of 128 rows over 512K keys of 32 heads are
 * 4 GiB) runs on dt's kernels, deterministic too, instead. */
#define DT_CUDNN_DET_MIN_ROWS 512

/* The query rows of one cuDNN call for blocks of nk keys of h heads of d,
 * elements of esz bytes: a multiple of 128 (or n), bounded as above; 0
 * for a deterministic backward below DT_CUDNN_DET_MIN_ROWS (dt's
 * kernels). */
int64_t dt_attn_cudnn_rows(int64_t n, int64_t nk, int h, int d, size_t esz, int bwd, int det);

/* The device scratch one rank's blocks through cuDNN take, for blocks of up
 * to n query and n key rows of h heads (hkv kv heads) of size d, elements
 * of esz bytes, backward or forward, deterministic or not: what the planner counts (the engine sizes
 * it from cuDNN's own plans, which this bounds for the shapes measured). */
double dt_attn_cudnn_bytes(int64_t n, int h, int hkv, int d, size_t esz, int bwd, int det);

#endif /* DT_ATTN_SPEC_H */
