/* SPDX-License-Identifier: MIT
 *
 * One block of GPU attention through the kernel the process runs blocks
 * with: cuDNN's fused attention (kernels/cuda/attn_cudnn.h), the block cut
 * into the pieces cuDNN takes, or dt's own kernels (kernels/cuda/
 * attn_cuda.h), with the same contract as dt_attn_fwd_cuda /
 * dt_attn_bwd_cuda (forward accumulates into fp32 (o, lse), backward adds
 * into fp32 dq, dk, dv). The GPU ring (ring_cuda.c, dilated_cuda.c) calls
 * these instead of the kernels.
 *
 * Pieces. cuDNN knows no positions: a block is rows in order, and key j is
 * visible to query i iff j <= i + shift. A ring block is runs of
 * consecutive positions (spec/layout.h): zigzag's two halves, balanced's
 * eight. dt_attn_pieces cuts a block into rectangles of rows each one rule
 * covers (the whole block when one does: zigzag's diagonal is one causal
 * block, its other steps one full block of half the rows), the rows that
 * see no key trimmed, and into chunks of query rows that bound the scratch
 * (DT_CUDNN_ROW_CHUNK_BYTES of o or dq, and before cuDNN 9.25 the
 * deterministic backward's DT_CUDNN_DET_CHUNK_BYTES of scores; spec/
 * attn_spec.h). What cuDNN does not take goes to dt's kernels, a
 * piece at a time: a mask's intervals (documents, windows), a head size or
 * stride it refuses, a shape a known cuDNN bug gets wrong
 * (dt_cudnn_supports), or a piece whose workspace exceeds the scratch.
 *
 * Precision. cuDNN's partial output is in the input type: each piece's o is
 * rounded to bf16/fp16 before it is merged into the fp32 state (dt's
 * kernels keep partials in fp32); its gradients likewise before they are
 * added.
 *
 * Thread: a call runs on the one host thread of its ring; asynchronous on
 * the stream given.
 */
#ifndef DT_ENGINE_ATTN_BLOCK_H
#define DT_ENGINE_ATTN_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "spec/layout.h"
#include "kernels/cuda/attn_cuda.h"
#include "kernels/cuda/attn_cudnn.h"

/* A rectangle of a block's rows: queries [qrow, qrow + nq), keys [krow,
 * krow + nk); key j visible to query i (rows of the piece from 0) iff j <=
 * i + shift, or every key (DT_CUDNN_FULL). */
typedef struct dt_attn_piece {
    int64_t qrow, nq, krow, nk, shift;
} dt_attn_piece_t;

#define DT_ATTN_MAXPIECES (DT_LAYOUT_MAXRUNS * DT_LAYOUT_MAXRUNS)

/* Cut a block whose query rows are the runs qr[0..nq) (positions, rows
 * consecutive from 0) and key rows kr[0..nk) into pieces (causal: key
 * position <= query position; otherwise one full piece): out gets at most
 * DT_ATTN_MAXPIECES, none empty, every row of a piece seeing a key; their
 * union is exactly the visible pairs. Returns their number. */
int dt_attn_pieces(const dt_run_t *qr, int nq, const dt_run_t *kr, int nk, int causal,
                   dt_attn_piece_t *out);

/* Query rows [r0, r0 + step) of piece w, the chunk one cuDNN call takes
 * (the rule follows its rows): causal, its keys end after the last row's
 * last visible one, rounded up to a quarter of w's keys in multiples of
 * 128 (at most w's). */
dt_attn_piece_t dt_attn_piece_rows(const dt_attn_piece_t *w, int64_t r0, int64_t step);

/* One rank's way of running blocks for a call. */
typedef struct dt_attn_blk {
    int cudnn;         /* cuDNN takes the blocks it can */
    int det;           /* backward: deterministic engines (and chunks that bound their workspace) */
    char *ws;          /* device scratch of bytes (dt_attn_block_bytes) */
    size_t bytes;
    const void *ohalf; /* backward with cudnn: the forward's final o in dtype, the block's
                        * query rows at the row stride of dout (a copy: the ring's dq may
                        * overwrite o) */
    int64_t rows;      /* > 0: query rows per cuDNN call, a multiple of 128 (tests: the
                        * chunks a long block is cut into, at small shapes); 0: the
                        * bounds of dt_attn_cudnn_rows (spec/attn_spec.h) */
    int pieces_cudnn;  /* statistics: pieces run by cuDNN, by dt's kernels */
    int pieces_dt;
} dt_attn_blk_t;

/* The kernel blocks run with in this process: cuDNN when chosen (or auto)
 * and loadable, else dt's kernels; name gets "cudnn 9.19.0", "dt" or
 * "wgmma" and, when auto fell back, why (one line). */
int dt_attn_block_cudnn(char *name, size_t len);

/* The scratch a rank needs for blocks of up to tq queries and tk keys of h
 * heads (hkv kv heads, head size d, dtype), backward or not, queries and
 * outputs at row stride ldo: 0 without cuDNN. Builds cuDNN's plans for the
 * largest shapes (a GPU call). */
int dt_attn_block_bytes(const dt_attn_blk_t *b, int64_t tq, int64_t tk, int h, int hkv, int d,
                        dt_dtype_t dtype, int64_t ldo, int bwd, size_t *bytes, dt_emsg_t *em);

/* Forward of block a (dt_attn_fwd_cuda's contract), its rows the runs qr,
 * kr (NULL: one run from a->q0, a->k0). */
int dt_attn_block_fwd(dt_attn_blk_t *b, const dt_attn_cuda_t *a, const dt_run_t *qr, int nqr,
                      const dt_run_t *kr, int nkr, int accumulate, float *o, int64_t ldo,
                      float *lse, int64_t ldlse, cudaStream_t st, dt_emsg_t *em);

/* Backward of block a (dt_attn_bwd_cuda's contract). */
int dt_attn_block_bwd(dt_attn_blk_t *b, const dt_attn_cuda_t *a, const dt_run_t *qr, int nqr,
                      const dt_run_t *kr, int nkr, const dt_attn_cuda_grad_t *g,
                      cudaStream_t st, dt_emsg_t *em);

#endif /* DT_ENGINE_ATTN_BLOCK_H */
