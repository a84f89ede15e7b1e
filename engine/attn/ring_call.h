/* SPDX-License-Identifier: MIT
 *
 * Inside one call of GPU ring attention: the plan of one rank's workspace,
 * the call's state (per local rank and whole) and the call's end, shared
 * by the dense ring and the entry points (engine/attn/ring_cuda.c) and
 * dilated attention (engine/attn/dilated_cuda.c); defined in
 * engine/attn/ring_call.c. Nothing here is part of the API of
 * engine/attn/ring_cuda.h. Calls go down only: ring_cuda.c calls
 * dilated_cuda.c and ring_call.c, dilated_cuda.c calls ring_call.c.
 *
 * Thread: a call runs on the one host thread that uses its ring.
 */
#ifndef DT_ENGINE_RING_CALL_H
#define DT_ENGINE_RING_CALL_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/attn/attn_block.h"
#include "engine/attn/ring_cuda.h"
#include "engine/comm/ring_impl.h"

/* Byte offsets into one rank's workspace. */
typedef struct plan {
    /* dense */
    size_t kv[2];  /* K/V packs, packbytes each (R > 1) */
    size_t qpos;   /* (c) int64 positions of my rows (positions travel) */
    size_t ilo;    /* (2c) int64: a mask's key intervals [lo, hi) of my rows, the c
                    * lo then the c hi (dense with a mask) */
    size_t delta;  /* (H, c) fp32 rowsum(dout * o) (backward) */
    size_t g[3];   /* dK/dV packs (2c, Hkv, D) fp32: in, and two that alternate */
    /* dilated, one segment at a time: kv[] hold member packs, g[] their
     * dK/dV (fp32, same layout); per (head chunk, piece) of my rows: */
    size_t qg, dog;            /* (n, nh, D) dtype: gathered q, dout */
    size_t o2, dq2;            /* (n, nh, D) fp32 */
    size_t lse2, lseg, deltag; /* (nh, n) fp32 */
    /* blocks through cuDNN (engine/attn/attn_block.h): */
    size_t blk;   /* the block scratch, blkbytes */
    size_t ohalf; /* (c, H, D) dtype: the forward's final o (backward) */
    size_t ohg;   /* (n, nh, D) dtype: ohalf's rows of a head chunk (dilated backward) */
    size_t blkbytes;
    size_t total;
    size_t kvbytes;   /* K and V of one rank: 2 c Hkv D esz */
    size_t packbytes; /* kvbytes, plus c int64 positions when they travel */
    size_t gbytes;    /* dK and dV of one rank: 2 c Hkv D fp32 */
} plan_t;

/* One local rank's part of a call; qb (struct qblk) is dilated_cuda.c's. */
typedef struct lrank {
    char *ws;            /* workspace (plan offsets) */
    int64_t *hpos;       /* (c) host positions while positions travel */
    int64_t *hiv;        /* (2c) host intervals while a mask's are uploaded */
    int64_t pmin, pmax;  /* my first and last position */
    int any;             /* forward: a block has been accumulated */
    dt_attn_blk_t blk;   /* how this rank's blocks run (cuDNN or dt's kernels) */
    int did[2];          /* step of parity p ran a kernel: its timing pair is valid */
    float *gin;          /* backward, R > 1: the dK/dV pack received */
    float *gcur, *gout;  /* ... the one computed into, the one being sent */
    double compute_s;    /* attention kernels on this rank */
    struct qblk *qb;     /* dilated: my query blocks of the segment, nqb */
    int nqb;
} lrank_t;

/* One call: its arguments, plan, local ranks and statistics. */
typedef struct call {
    dt_ring_t *r;
    const dt_attn_spec_t *s;
    const dt_ring_io_t *io;
    dt_dtype_t dtype;
    size_t esz;
    int R, nl, bwd;
    int travel; /* positions travel in the K/V packs */
    int blocks; /* dense with a block pattern: a launch per allowed piece (ring_cuda.c) */
    int64_t c;
    plan_t pl;
    lrank_t *lr;        /* [nl] */
    void **send, **recv; /* [nl] exchange arguments */
    float *hinf;        /* (c) -inf on the host (dt_ring_call_empty) */
    dt_ring_xfer_t *xf; /* [nl] dilated exchanges */
    dt_attn_stats_t st;
    char what[128];
} call_t;

/* Whether positions travel with K/V (and kernels get position arrays):
 * only where a rank's rows are not one run (zigzag, R > 1) and positions
 * matter (causal, or a mask). */
int dt_ring_call_travel(const dt_attn_spec_t *s, int R);
/* Whether dense attention has a mask beyond causality (its intervals go
 * to the kernels, kernels/cuda/attn_cuda.h). */
int dt_ring_call_masked(const dt_attn_spec_t *s);

/* The workspace of one rank of R for spec s (dense or dilated), forward or
 * backward (bwd): byte offsets and total into *pl. blk: the bytes of the
 * scratch of blocks through cuDNN (dt_attn_block_bytes; 0: dt's kernels,
 * and no half copy of o). */
void dt_ring_call_plan(const dt_attn_spec_t *s, dt_dtype_t dtype, int R, int bwd, size_t blk,
                       plan_t *pl);

/* The most query (and key) rows of one block: c dense, a dilated head
 * chunk's piece otherwise (what dt_attn_block_bytes is asked for). */
int64_t dt_ring_call_rows(const dt_attn_spec_t *s, int R);

/* Local rank l's o = 0 and lse = -inf (every row empty) on its compute
 * stream, for a forward whose launches each cover only some rows (dilated
 * branches, block patterns); x->hinf is made on the first call and freed
 * with the call. */
int dt_ring_call_empty(call_t *x, int l, dt_emsg_t *em);

/* End of the call: every stream idle (the watchdog's wait); statistics
 * into x->st. last: the step whose timing pair is still unread (-1: none;
 * the dilated path times the whole compute span as compute). */
int dt_ring_call_finish(call_t *x, int last, dt_emsg_t *em);

#endif /* DT_ENGINE_RING_CALL_H */
