/* SPDX-License-Identifier: MIT
 *
 * `dtengine train`'s step on the CPU, the backend dt_train_cpu
 * (engine/cmd/train.h): the training model of engine/model/model.h on
 * this rank's cores (dt_model_step, its attention around the ring's
 * transport), the parameters, gradient and moments in host memory, each
 * sliced as the shard level says; global-norm clipping and AdamW on the
 * host, element by element, so that a sharded run is bit-identical to an
 * unsharded one.
 *
 * Not here: what every device's step shares (the data, the agreement, the
 * schedule, checkpoints): engine/cmd/train.c.
 */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/mem.h"
#include "engine/cmd/train.h"
#include "kernels/cpu/attn_cpu.h"

/* The model (sharded as o.shard says) and the gradient: the step's, and
 * with batch > 1 one sequence's beside it; the parameters and moments
 * are train.c's. */
static void cpu_alloc(dt_trainer_t *t)
{
    const dt_train_opts_t *o = &t->o;
    int ms = o->shard == DT_SHARD_GRADIENTS    ? DT_MODEL_SHARD_GRADIENTS
             : o->shard == DT_SHARD_PARAMETERS ? DT_MODEL_SHARD_PARAMETERS
                                               : DT_MODEL_SHARD_NONE;

    t->m = dt_model_new_train(&o->model, t->c, o->recompute, ms, t->crep);
    t->G = dt_xcalloc((size_t)(t->gn > 0 ? t->gn : 1), sizeof(float));
    if (o->batch > 1)
        t->Gb = dt_xcalloc((size_t)(t->gn > 0 ? t->gn : 1), sizeof(float));
}

/* what the CPU runs (dtengine(1) OUTPUT) */
static void cpu_print_header(const dt_trainer_t *t)
{
    printf(" kernel=%s blas_core=%s", dt_attn_cpu_kernel(dt_model_head_dim(&t->o.model)),
           openblas_get_corename());
}

static int cpu_seq(dt_trainer_t *t, int64_t b, double *loss, dt_train_ctl_t *ctl)
{
    const dt_train_opts_t *o = &t->o;
    double lb;
    int rc;

    if ((rc = dt_model_step(t->m, t->cring, &t->attn, t->P, t->x, t->y, t->rpos,
                            o->batch > 1 ? t->Gb : t->G, &lb, &t->em)) < 0)
        return rc;
    *loss += lb / (double)o->batch;
    if (o->batch > 1)
        for (int64_t i = 0; i < t->gn; i++)
            t->G[i] = (b == 0 ? 0.0f : t->G[i]) + t->Gb[i] / (float)o->batch;
    /* accuracy at this rank's counted targets, summed over ranks after */
    const float *lg = dt_model_logits(t->m);
    for (int64_t i = 0; i < t->c; i++) {
        if (t->y[i] < 0)
            continue;
        const float *row = lg + i * o->model.vocab;
        int best = 0;
        for (int v = 1; v < o->model.vocab; v++)
            best = row[v] > row[best] ? v : best;
        ctl->hits += best == t->y[i];
        ctl->targets += 1;
    }
    return 0;
}

/* dt_model_step left the gradient complete over the ranks (whole, or
 * this rank's slice of it): clipped here, in place. */
static int cpu_clip(dt_trainer_t *t, int64_t step, double *norm, float *gscale)
{
    const dt_train_opts_t *o = &t->o;
    int rc;

    (void)gscale;
    if (t->gn == t->n) {
        *norm = dt_grad_clip(t->n, t->G, o->clip);
        return 0;
    }
    /* each rank holds its slice of the gradient: the norm's square
     * summed over the slices, then dt_grad_clip's rule on each */
    double ss = dt_grad_sumsq(t->gn, t->G);
    if ((rc = dt_comm_allreduce_sum_f64(t->comm, &ss, 1)) < 0)
        return dt_emsg_set(&t->em, rc, "step %lld: summing the gradient's norm failed",
                           (long long)step);
    *norm = sqrt(ss);
    if (o->clip > 0.0 && isfinite(*norm) && *norm > o->clip)
        dt_grad_scale(t->gn, t->G, o->clip / *norm);
    return 0;
}

static int cpu_update(dt_trainer_t *t, int64_t step, double lr, float gscale)
{
    const dt_train_opts_t *o = &t->o;
    int rc;

    (void)gscale; /* cpu_clip scaled the gradient itself */
    /* element by element: a slice updates as the whole would, and the
     * gather copies the bits, so shard = optimizer is bit-identical */
    float *p = t->pn == t->n ? t->P + t->moff : t->P;
    float *g = t->gn == t->n ? t->G + t->moff : t->G;
    dt_adamw_step(&t->acfg, step + 1, lr, o->wd, t->mlen, p, g, t->M, t->V);
    if (o->shard != DT_SHARD_NONE && t->pn == t->n && (rc = dt_trainer_gather(t, t->P)) < 0)
        return dt_emsg_set(&t->em, rc, "gathering the updated parameters failed");
    return 0;
}

static void cpu_close(dt_trainer_t *t)
{
    dt_model_free(t->m);
    free(t->G);
    free(t->Gb);
    t->m = NULL;
    t->G = t->Gb = NULL;
}

const dt_train_backend_t dt_train_cpu = {
    .loss_shared = 0,
    .alloc = cpu_alloc,
    .print_header = cpu_print_header,
    .start = NULL,
    .seq = cpu_seq,
    .clip = cpu_clip,
    .update = cpu_update,
    .copy_start = NULL,
    .copy_wait = NULL,
    .updates_host = NULL,
    .close = cpu_close,
};
