/* SPDX-License-Identifier: MIT
 *
 * `dtengine train --device cuda`'s step, the backend dt_train_gpu
 * (engine/cmd/train.h), compiled only in a CUDA build (and in the
 * simulator's, tests/gpu/dtengine-sim): the ring and the training model
 * (engine/model/train_cuda.h) on this rank's GPU, which holds the
 * parameters, gradient and moments, whole or its slices as the shard level
 * says (gradients: the model reduce-scatters each unit's; parameters: it
 * gathers each unit's weights). The gradient is summed over the ranks by
 * NCCL (its norm over sliced gradients summed over MPI), fp16's loss
 * scale and the clipping are folded into the update, and the host's P, M, V
 * (page-locked when the runtime gives it) are copies for checkpoints and
 * the result, refreshed by a copy that overlaps the next step. With
 * offload = optimizer the host's P, M, V are the state itself: the GPU
 * hands this rank's slice of the summed gradient to the host, AdamW runs
 * there on the host's threads (the GPU kernel's arithmetic, so the bits
 * are those of the same job without offload), every rank's slice is
 * gathered over MPI where sharded, and the parameters go back up.
 *
 * Not here: what every device's step shares (the data, the agreement, the
 * schedule, checkpoints): engine/cmd/train.c.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/mem.h"
#include "engine/cmd/agree.h"
#include "engine/cmd/train.h"
#include "engine/model/optim.h"
#include "engine/model/train_cuda.h"
#include "spec/vocab.h"

/* The backend's state (t->dev). */
typedef struct gpu {
    dt_ring_t *ring;
    dt_ring_t *rep; /* dp = N > 1: the replicas at this ring rank, else NULL */
    dt_gmodel_t *gm;
    int pinned; /* t->P, M, V are dt_gmodel_host_alloc's */
    int host;   /* offload = optimizer: the optimizer on the host */
    float *hG;  /* host: this rank's slice of the summed gradient (mlen) */
    int hG_pinned;
    size_t free0; /* the device's free bytes before the model (0: unknown) */
    int mem_said; /* the run's device memory logged (after its first step) */
} gpu_t;

/* The step's buffers are on the device (made by gpu_start); the host
 * keeps the parameters and moments, page-locked for the overlapped copy. */
static void gpu_alloc(dt_trainer_t *t)
{
    gpu_t *g = dt_xcalloc(1, sizeof(*g));

    t->dev = g;
    g->host = (t->o.offload & DT_OFFLOAD_OPTIMIZER) != 0;
    if (g->host) {
        g->hG = dt_gmodel_host_alloc(t->mlen);
        g->hG_pinned = g->hG != NULL;
        if (!g->hG_pinned)
            g->hG = dt_xcalloc((size_t)(t->mlen > 0 ? t->mlen : 1), sizeof(float));
    }
    t->P = dt_gmodel_host_alloc(t->pn); /* shard = parameters: the slice */
    t->M = dt_gmodel_host_alloc(t->mlen);
    t->V = dt_gmodel_host_alloc(t->mlen);
    g->pinned = t->P && t->M && t->V;
    if (!g->pinned) {
        dt_gmodel_host_free(t->P);
        dt_gmodel_host_free(t->M);
        dt_gmodel_host_free(t->V);
        t->P = t->M = t->V = NULL;
    }
}

/* Every rank joins its ring (its NCCL id through PMIx), and with dp = N
 * the replicas' ring at its ring rank (a second communicator: ring i is
 * the job's ranks [i R, (i + 1) R), consecutive, so on one node where the
 * node has R GPUs; the replicas cross the nodes), then its GPU takes the
 * parameters and moments. */
static int gpu_start(dt_trainer_t *t)
{
    const dt_train_opts_t *o = &t->o;
    gpu_t *g = t->dev;
    const dt_ring_group_t ring = { .color = t->i, .rank = t->r, .size = t->R,
                                   .leader = t->i * t->R };
    const dt_ring_group_t rep = { .color = t->r, .rank = t->i, .size = t->N, .leader = t->r };
    int rc = t->R == 1 ? dt_ring_local_new(1, 0, &g->ring, &t->em)
                       : dt_ring_nccl_pmix_new(0, t->N > 1 ? &ring : NULL, &g->ring, &t->em);
    if (rc == 0 && t->N > 1)
        rc = dt_ring_nccl_pmix_new(0, &rep, &g->rep, &t->em);
    size_t total = 0;
    if (rc == 0 && dt_gmodel_mem_info(&g->free0, &total, &t->em) < 0)
        g->free0 = 0; /* not said, then */

    const dt_gtrain_opts_t go = {
        .recompute = o->recompute,
        .host_optimizer = g->host,
        .offload_act = (o->offload & DT_OFFLOAD_ACTIVATIONS) != 0,
        .ckpt_bf16 = o->ckpt_dtype == DT_CKPT_BF16,
        .shard_gradients = o->shard >= DT_SHARD_GRADIENTS,
        .shard_parameters = o->shard == DT_SHARD_PARAMETERS,
        .host_grad = g->hG,
        .rep = g->rep,
    };
    if (rc == 0)
        rc = dt_gtrain_new(&o->model, &t->lo, t->c, o->dtype, &go, g->ring, t->P, t->M, t->V,
                           t->moff, t->mlen, t->rpos, &g->gm, &t->em);
    /* a device failure is this rank's alone (agree.h) */
    return dt_agree_report(t->comm, rc, "dtengine train", t->em.s, NULL);
}

/* Every rank holds the whole sequence: the count of its targets needs no
 * communication; the loss's share and the hits are summed over the
 * ranks in the step's agreement (loss_shared). */
static int gpu_seq(dt_trainer_t *t, int64_t b, double *loss, dt_train_ctl_t *ctl)
{
    const dt_train_opts_t *o = &t->o;
    gpu_t *g = t->dev;
    int64_t count = 0, hits = 0;
    double sum = 0;
    int rc;

    for (int64_t i = 0; i < o->T; i++)
        count += t->ys[i] >= 0;
    /* dp = N: each ring's gradient and loss share divided by N here (a
     * power of two exactly), so that the sums over the ring and across
     * the replicas make the replicas' mean */
    const double w =
        count > 0 ? 1.0 / ((double)count * (double)o->batch * (double)t->N) : 0.0;
    /* doc_positions = reset: this sequence's positions */
    if (o->masks.reset && (rc = dt_gtrain_set_pos(g->gm, t->rpos, &t->em)) < 0)
        return rc;
    /* fp16: the loss's gradient scaled (a power of two: exact) */
    if ((rc = dt_gtrain_fwd_bwd(g->gm, &t->attn, t->x, t->y, (float)(w * t->ls.scale), b == 0,
                                &sum, &hits, &t->em)) < 0)
        return rc;
    *loss += sum * w;
    ctl->hits += (double)hits;
    for (int64_t i = 0; i < t->c; i++)
        ctl->targets += t->y[i] >= 0;
    return 0;
}

/* The gradient summed over the ranks (NCCL), its norm (sharded: the
 * slices' squares summed over the ranks, as the CPU does); the clipping
 * as dt_grad_clip does it, folded into the update. */
static int gpu_clip(dt_trainer_t *t, int64_t step, double *norm, float *gscale)
{
    const dt_train_opts_t *o = &t->o;
    gpu_t *g = t->dev;
    int rc;

    double ss;
    if ((rc = dt_gtrain_reduce(g->gm, &ss, &t->em)) < 0)
        return rc;
    if (dt_gtrain_grad_sharded(g->gm) && (rc = dt_comm_allreduce_sum_f64(t->comm, &ss, 1)) < 0)
        return dt_emsg_set(&t->em, rc, "step %lld: summing the gradient's norm failed",
                           (long long)step);
    /* the loss's own gradient: the scaled one's norm divided by the scale
     * (a power of two), and the update's factor with 1 / scale in it */
    const double S = t->ls.scale;
    *norm = sqrt(ss) / S;
    double f = 1.0;
    if (o->clip > 0.0 && isfinite(*norm) && *norm > o->clip)
        f = o->clip / *norm;
    *gscale = (float)(f / S);
    return 0;
}

/* The optimizer in host memory: the slice's gradient down, AdamW on the
 * host, the slices gathered (shard = optimizer: the same bits on every
 * rank, as the device's all-gather gives), the parameters up. */
static int host_update(dt_trainer_t *t, gpu_t *g, int64_t step, double lr, float gscale)
{
    int rc;

    if ((rc = dt_gtrain_grad_get(g->gm, g->hG, &t->em)) < 0)
        return rc;
    /* shard = parameters: P is the slice, and the device gathers it */
    dt_adamw_step_scaled(&t->acfg, step + 1, lr, t->o.wd, t->mlen,
                         t->pn == t->n ? t->P + t->moff : t->P, g->hG, gscale, t->M, t->V);
    if (t->mlen != t->n && t->pn == t->n) {
        if ((rc = dt_trainer_gather(t, t->P)) < 0)
            return dt_emsg_set(&t->em, rc, "step %lld: gathering the updated parameters failed",
                               (long long)step);
    }
    return dt_gtrain_params_set(g->gm, t->P, &t->em);
}

/* After the run's first step, what it holds on the device (every rank:
 * the bytes its model and step took since before the model, which the
 * planner's device total less its fixed part should cover; dtengine(1)
 * OUTPUT), once. */
static void say_memory(gpu_t *g, int64_t step)
{
    size_t free_b = 0, total = 0;
    dt_emsg_t em;

    g->mem_said = 1;
    if (g->free0 == 0 || dt_gmodel_mem_info(&free_b, &total, &em) < 0)
        return;
    dt_log_info("gpu memory held_bytes=%zu after step %lld (the device: %zu of %zu bytes free)",
                g->free0 > free_b ? g->free0 - free_b : (size_t)0, (long long)step, free_b,
                total);
}

static int gpu_update(dt_trainer_t *t, int64_t step, double lr, float gscale)
{
    gpu_t *g = t->dev;
    int rc = g->host ? host_update(t, g, step, lr, gscale)
                     : dt_gtrain_adamw(g->gm, &t->acfg, step + 1, lr, t->o.wd, gscale, &t->em);

    if (rc == 0 && !g->mem_said)
        say_memory(g, step);
    return rc;
}

/* With the optimizer on the host, P, M and V are the state: nothing to
 * copy (the wait then finds nothing in flight). */
static int gpu_copy_start(dt_trainer_t *t, float *P, float *M, float *V)
{
    gpu_t *g = t->dev;

    if (g->host)
        return 0;
    return dt_gtrain_copy_start(g->gm, P, M, V, &t->em);
}

static int gpu_copy_wait(dt_trainer_t *t, double *stall_s)
{
    gpu_t *g = t->dev;

    return dt_gmodel_copy_wait(g->gm, stall_s, &t->em);
}

static int gpu_updates_host(const dt_trainer_t *t)
{
    const gpu_t *g = t->dev;

    return g != NULL && g->host;
}

static void gpu_close(dt_trainer_t *t)
{
    gpu_t *g = t->dev;

    if (g == NULL)
        return;
    dt_gmodel_free(g->gm);
    dt_ring_free(g->rep);
    dt_ring_free(g->ring);
    if (g->hG_pinned)
        dt_gmodel_host_free(g->hG);
    else
        free(g->hG);
    if (g->pinned) {
        dt_gmodel_host_free(t->P);
        dt_gmodel_host_free(t->M);
        dt_gmodel_host_free(t->V);
        t->P = t->M = t->V = NULL;
    }
    free(g);
    t->dev = NULL;
}

const dt_train_backend_t dt_train_gpu = {
    .loss_shared = 1,
    .alloc = gpu_alloc,
    .print_header = NULL,
    .start = gpu_start,
    .seq = gpu_seq,
    .clip = gpu_clip,
    .update = gpu_update,
    .copy_start = gpu_copy_start,
    .copy_wait = gpu_copy_wait,
    .updates_host = gpu_updates_host,
    .close = gpu_close,
};
