/* SPDX-License-Identifier: MIT
 *
 * What one call of GPU ring attention needs whichever schedule runs it
 * (engine/attn/ring_call.h): the plan of one rank's workspace, dense or
 * dilated, and its size for the planner (dt_ring_attn_bytes of
 * engine/attn/ring_cuda.h); the end of a call, every stream idle, and its
 * statistics.
 *
 * Not here: the dense ring and the entry points (ring_cuda.c), dilated
 * attention (dilated_cuda.c), the transports and the watchdog
 * (comm_nccl.c).
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/mem.h"
#include "spec/layout.h"
#include "spec/mask.h"
#include "engine/attn/ring_call.h"
#include "kernels/cuda/cuda_err.h"

#define WS_ALIGN ((size_t)256)

/* ---- workspace plan ------------------------------------------------------- */

static size_t carve(size_t *cur, size_t bytes)
{
    size_t off = (*cur + WS_ALIGN - 1) & ~(WS_ALIGN - 1);

    *cur = off + bytes;
    return off;
}

/* A mask beyond causality (dense attention: the kernels get its
 * intervals). */
int dt_ring_call_masked(const dt_attn_spec_t *s)
{
    return s->nbranch == 0 && s->mask != NULL && !dt_mask_is_plain(s->mask);
}

/* Positions travel with K/V (and kernels get position arrays) only where
 * a rank's rows are not one run: zigzag with R > 1, and only when causal
 * or masked (otherwise positions do not matter). */
int dt_ring_call_travel(const dt_attn_spec_t *s, int R)
{
    return (s->causal || dt_ring_call_masked(s)) && s->layout == DT_LAYOUT_ZIGZAG && R > 1;
}

int64_t dt_ring_call_rows(const dt_attn_spec_t *s, int R)
{
    const int64_t c = s->T / R;
    int64_t most = 1;

    if (s->nbranch == 0)
        return c;
    for (int b = 0; b < s->nbranch; b++) {
        dt_attn_branch_t br = dt_attn_branch(s, b);
        int64_t span = br.w < c ? br.w : c, n = span / br.r + DT_LAYOUT_MAXRUNS;
        most = n > most ? n : most;
    }
    return most;
}

void dt_ring_call_plan(const dt_attn_spec_t *s, dt_dtype_t dtype, int R, int bwd, size_t blk,
                       plan_t *pl)
{
    const size_t esz = dt_dtype_size(dtype), D = (size_t)s->D;
    const size_t c = (size_t)(s->T / R), hkv = (size_t)s->Hkv, H = (size_t)s->H;
    size_t cur = 0;

    memset(pl, 0, sizeof(*pl));
    pl->kvbytes = 2 * c * hkv * D * esz;
    pl->packbytes = pl->kvbytes + (dt_ring_call_travel(s, R) ? c * sizeof(int64_t) : 0);
    pl->gbytes = 2 * c * hkv * D * sizeof(float);
    if (s->nbranch == 0) {
        if (R > 1) {
            pl->kv[0] = carve(&cur, pl->packbytes);
            pl->kv[1] = carve(&cur, pl->packbytes);
        }
        if (dt_ring_call_travel(s, R))
            pl->qpos = carve(&cur, c * sizeof(int64_t));
        if (dt_ring_call_masked(s))
            pl->ilo = carve(&cur, 2 * c * sizeof(int64_t));
        if (bwd) {
            pl->delta = carve(&cur, H * c * sizeof(float));
            if (R > 1)
                for (int i = 0; i < 3; i++)
                    pl->g[i] = carve(&cur, pl->gbytes);
        }
        if (blk > 0) {
            pl->blkbytes = blk;
            pl->blk = carve(&cur, blk);
            if (bwd)
                pl->ohalf = carve(&cur, c * H * D * esz);
        }
        pl->total = cur;
        return;
    }

    /* Bounds over the branches for one member of one segment: at most
     * min(w, c) of its rows lie in the segment, in at most
     * DT_LAYOUT_MAXRUNS pieces, so a head chunk takes at most
     * min(w, c) / r + DT_LAYOUT_MAXRUNS of them. */
    size_t pe = 1, qe = 1, le = 1; /* pack elements, query elements, lse floats */
    for (int b = 0; b < s->nbranch; b++) {
        dt_attn_branch_t br = dt_attn_branch(s, b);
        size_t span = (size_t)(br.w < (int64_t)c ? br.w : (int64_t)c);
        size_t nrow = span / (size_t)br.r + DT_LAYOUT_MAXRUNS, p = 0, q = 0, l = 0;
        for (int k = 0; k < br.nchunk; k++) {
            dt_attn_chunk_t ck = dt_attn_chunk(s, &br, k);
            p += 2 * nrow * (size_t)ck.nkv * D;
            q += nrow * (size_t)ck.nh * D;
            l += nrow * (size_t)ck.nh;
        }
        pe = p > pe ? p : pe;
        qe = q > qe ? q : qe;
        le = l > le ? l : le;
    }
    pl->packbytes = pe * esz;
    pl->gbytes = pe * sizeof(float);
    pl->kv[0] = carve(&cur, pl->packbytes);
    pl->kv[1] = carve(&cur, pl->packbytes);
    pl->qg = carve(&cur, qe * esz);
    if (!bwd) {
        pl->o2 = carve(&cur, qe * sizeof(float));
        pl->lse2 = carve(&cur, le * sizeof(float));
    } else {
        pl->dog = carve(&cur, qe * esz);
        pl->dq2 = carve(&cur, qe * sizeof(float));
        pl->lseg = carve(&cur, le * sizeof(float));
        pl->deltag = carve(&cur, le * sizeof(float));
        for (int i = 0; i < 3; i++)
            pl->g[i] = carve(&cur, pl->gbytes);
        pl->delta = carve(&cur, H * c * sizeof(float));
    }
    if (blk > 0) {
        pl->blkbytes = blk;
        pl->blk = carve(&cur, blk);
        if (bwd) {
            pl->ohalf = carve(&cur, c * H * D * esz);
            pl->ohg = carve(&cur, qe * esz);
        }
    }
    pl->total = cur;
}

size_t dt_ring_attn_bytes(const dt_attn_spec_t *s, dt_dtype_t dtype, int R, int backward)
{
    plan_t pl;

    if (s == NULL || dt_attn_check(s, R, NULL) < 0)
        return 0;
    dt_ring_call_plan(s, dtype, R, backward, 0, &pl);
    return pl.total;
}

/* ---- an empty forward state ---------------------------------------------- */

int dt_ring_call_empty(call_t *x, int l, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    const dt_ring_io_t *io = &x->io[l];
    cudaStream_t cs = x->r->p[l].compute;
    const size_t row = (size_t)x->c * sizeof(float);

    if (x->hinf == NULL) {
        x->hinf = dt_xmallocarray((size_t)x->c, sizeof(float));
        for (int64_t i = 0; i < x->c; i++)
            x->hinf[i] = -INFINITY;
    }
    DT_CUDA_TRY(em, cudaMemsetAsync(io->o, 0, (size_t)x->c * s->H * s->D * sizeof(float), cs));
    /* lse (H, c): head 0 from the host, then doubling copies */
    DT_CUDA_TRY(em, cudaMemcpyAsync(io->lse, x->hinf, row, cudaMemcpyHostToDevice, cs));
    for (int h = 1; h < s->H;) {
        int m = h < s->H - h ? h : s->H - h;
        DT_CUDA_TRY(em, cudaMemcpyAsync(io->lse + (size_t)h * x->c, io->lse, (size_t)m * row,
                                        cudaMemcpyDeviceToDevice, cs));
        h += m;
    }
    return 0;
}

/* ---- end of a call ------------------------------------------------------------ */

/* End of the call: every stream idle; statistics. last: the step whose
 * timing pair is still unread (-1: none; the dilated path times the whole
 * compute span as compute). */
int dt_ring_call_finish(call_t *x, int last, dt_emsg_t *em)
{
    static const int slots[] = { RING_EV_DONE, RING_EV_CDONE };
    dt_ring_t *r = x->r;
    int rc;

    for (int l = 0; l < x->nl; l++) {
        DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_TEND], r->p[l].compute));
        DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_DONE], r->p[l].compute));
        DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_CDONE], r->p[l].comm));
    }
    snprintf(x->what, sizeof(x->what), "end of the %s", x->bwd ? "backward" : "forward");
    if ((rc = dt_ring_wait(r, slots, 2, x->what, em)) < 0)
        return rc;
    for (int l = 0; l < x->nl; l++) {
        lrank_t *lr = &x->lr[l];
        float ms = 0;
        if (last >= 0 && lr->did[last & 1]) {
            DT_CUDA_TRY(em, cudaEventElapsedTime(&ms, r->p[l].ev[RING_EV_TSTART0 + (last & 1)],
                                                 r->p[l].ev[RING_EV_TSTOP0 + (last & 1)]));
            lr->compute_s += ms * 1e-3;
        }
        DT_CUDA_TRY(em, cudaEventElapsedTime(&ms, r->p[l].ev[RING_EV_TBEGIN],
                                             r->p[l].ev[RING_EV_TEND]));
        double span = ms * 1e-3;
        if (last < 0)
            lr->compute_s = span;
        x->st.compute_s += lr->compute_s;
        x->st.wait_s += span > lr->compute_s ? span - lr->compute_s : 0.0;
    }
    return 0;
}
