/* SPDX-License-Identifier: MIT
 *
 * The planner's cost model, for plan/ only (the library's API is
 * planner.h): one request evaluated on R ranks (dt_cost_t), the memory no
 * R shrinks, and the few readings of a request (its recompute, shard
 * level, rings, zigzag) that the model and the search both make. cost.c
 * defines it and calls nothing of the search; planner.c's search calls it.
 *
 * Not here: the formulas and what each number means (cost.c's top
 * comment, with the glossary), which R, shard level and recompute to take
 * (planner.c).
 */
#ifndef DT_PLAN_COST_H
#define DT_PLAN_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "plan/planner.h"

/* One attention branch (w, r) of the request on R ranks (dense: (T, 1)). */
typedef struct dt_cost_branch {
    int64_t w, r;
    int group;                          /* ranks of its sub-ring */
    int segs;                           /* segments a rank's rows touch (sub-rings it runs) */
    double L;                           /* a member's tokens in one segment */
    double pack;                        /* one member's K/V pack, bytes */
    double flops;                       /* one attention forward, whole job */
    double compute_s;                   /* per rank, one attention forward */
    double step_compute_s, step_comm_s; /* forward, per ring step */
    double exposed_s;                   /* per rank, one attention forward (train: fwd + bwd) */
    double exposed_fwd_s;               /* per rank, the forward's part of exposed_s */
    bool hidden;
    double buffers, work; /* bytes */
} dt_cost_branch_t;

/* The request on R ranks of c tokens: everything but the placement. */
typedef struct dt_cost {
    int64_t T, c;
    int R;
    int nb;
    dt_cost_branch_t b[DT_ATTN_MAXBRANCH];
    dt_plan_mem_t mem;
    double attn_flops, flops, seconds, bytes_per_step;
    double mask_share, imbalance; /* dt_plan_t's */
    double step_compute_s, step_comm_s;
    bool hidden;
    double shard_comm_s; /* train */
    bool shard_hidden;
    double pcie_bytes, pcie_s; /* train on GPUs with offload (dt_plan_t's) */
    bool pcie_hidden;
} dt_cost_t;

static inline int64_t imin(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static inline int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Train with recompute = layer (AUTO is planned as none; dt_plan_make
 * decides). */
static inline bool recomp(const dt_plan_req_t *q)
{
    return q->kind == DT_KIND_TRAIN && q->recompute == DT_RECOMPUTE_LAYER;
}

/* The shard level planned (AUTO as none; dt_plan_make decides), none
 * unless training. */
static inline enum dt_shard_level shard_of(const dt_plan_req_t *q)
{
    return q->kind != DT_KIND_TRAIN || q->shard == DT_SHARD_AUTO ? DT_SHARD_NONE : q->shard;
}

/* The rings (spec dp): 1 unless given. */
static inline int dp_of(const dt_plan_req_t *q)
{
    return q->dp > 1 ? q->dp : 1;
}

/* Everything but the placement, for R ranks (T % R checked by the caller). */
void dt_cost_eval(const dt_plan_req_t *q, int64_t T, int R, dt_cost_t *v);

/* Bytes per token that grow with c for sure (a lower bound of the per-token
 * memory, for where to start looking for R). */
double dt_cost_act_per_token(const dt_plan_req_t *q);

/* The memory no R shrinks (*a: the training state kept whole, or a
 * prefill's weights, and fixed; its parts in *whole) and the part that
 * shrinks as 1 / R (*b: the sharded state at R = 1, over the N ranks of
 * the dp rings). */
void dt_cost_constant_parts(const dt_plan_req_t *q, dt_plan_mem_t *whole, double *a, double *b);

#endif /* DT_PLAN_COST_H */
