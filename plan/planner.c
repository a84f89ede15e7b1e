/* SPDX-License-Identifier: MIT
 *
 * The ring-layout planner's search (planner.h): the request checked, the
 * fewest ranks that fit, the shard level and recompute setting tried when
 * the spec leaves them open, the refusals with their reasons and the note
 * that says why the planner chose, the plan filled in with its placement,
 * and the plan as JSON. Pure computation, no I/O.
 *
 * Not here: what one choice costs (cost.c: memory per rank, FLOPs, ring
 * steps, time, and the glossary of T, R, c, W the comments here use); the
 * presets and the request from a spec (request.c).
 *
 * The planner's pick, when the spec leaves shard or recompute unset (the
 * user's values are always honoured, fitting or not). The planner has
 * always taken the fewest ranks that fit, and recomputed only when nothing
 * fits without; sharding is a third way to fit, the one that saves ranks
 * where the state kept whole is what fills a rank. So: at recompute none,
 * each shard level is planned at its fewest ranks and the level with the
 * fewest is taken, the least sharding among equals (at the user's R: the
 * least sharding that fits there); only when no level fits without
 * recompute for want of memory (at the user's R, or at every R the cluster
 * has that divides T) the same with layer. In the order of least change:
 * (none, none), optimizer, gradients, parameters at recompute none, then
 * the four with layer, a later one taken only for fewer ranks. Sharding
 * comes before recomputation because it costs communication, a gather and
 * a reduce per unit that mostly hide behind a layer's compute (reported),
 * where recompute costs a third more compute every step; and fewest ranks
 * before least sharding because a less sharded level whose state kept
 * whole nearly fills a rank fits only at absurd R (llama3-8b on H100s at
 * shard = optimizer keeps 74.8 GiB whole, 75.8 of 76 GiB with the fixed
 * part). A level at which the state kept whole fills a rank is not tried
 * with recompute, which cannot help there. The note says why: the state
 * none would need per rank, or the ranks the least sharding that fits
 * needs; the activations without recompute. When nothing fits, the plan is
 * the last tried (the most sharding and recomputation the request leaves
 * open), refused, and the note says so; a refusal for another cause than
 * memory stays as it is.
 *
 * Placement: ranks in contiguous blocks of gpus_per_node, so consecutive
 * ring hops stay inside a node; with dp the W ranks so, ring after ring,
 * and intra_node_frac is over the hops of every ring.
 */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macros.h"
#include "common/mem.h"
#include "plan/cost.h"
#include "plan/planner.h"

#define GiB (1024.0 * 1024.0 * 1024.0)
#define MAX_RANKS 1000000
#define PLACEMENT_LIST_MAX 4096
#define TOKENS_MAX ((int64_t)1 << 50)

static int64_t imax2(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/*-- checks -------------------------------------------------------------------------*/

static int fail(dt_plan_t *p, dt_emsg_t *em, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The reason in both places; p->fits false. */
static int fail(dt_plan_t *p, dt_emsg_t *em, int rc, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(p->reason, sizeof(p->reason), fmt, ap);
    va_end(ap);
    p->fits = false;
    return dt_emsg_set(em, rc, "%s", p->reason);
}

static int check_req(const dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    const dt_model_cfg_t *m = &q->model;
    const dt_cluster_t *cl = &q->cluster;

    if (q->kind != DT_KIND_TRAIN && q->shard > DT_SHARD_NONE)
        return fail(p, em, DT_EINVAL,
                    "shard = %s is for train jobs: kind %s keeps no gradients or optimizer "
                    "state, and its weights are not sharded",
                    dt_shard_name(q->shard), dt_kind_name(q->kind));

    if (q->dp < 0 || q->dp > 65536)
        return fail(p, em, DT_EINVAL, "dp=%d: the rings must be 1 to 65536", q->dp);
    if (q->kind != DT_KIND_TRAIN && q->dp > 1)
        return fail(p, em, DT_EINVAL,
                    "dp = %d is for train jobs: kind %s has no gradient to reduce across "
                    "rings (run more jobs instead)",
                    q->dp, dt_kind_name(q->kind));
    /* what the device's engine runs: the one answer (spec/vocab.h) */
    dt_emsg_t why = { "" };
    if (q->dp <= 65536 && dt_vocab_runs(q->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, q->kind,
                                        q->shard, q->dp > 0 ? q->dp : 1, &why) < 0)
        return fail(p, em, DT_ENOTSUP, "%s", why.s);
    if (dt_vocab_offload_runs(q->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, q->kind, q->offload,
                              &why) < 0)
        return fail(p, em, DT_ENOTSUP, "%s", why.s);
    if (dt_vocab_layout_runs(q->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, q->layout, &why) < 0)
        return fail(p, em, DT_ENOTSUP, "%s", why.s);
    if (dt_mask_rules_any(&q->masks) &&
        dt_vocab_masks_run(q->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, q->kind,
                           dt_mask_rules_pattern(&q->masks), q->nbranch > 0, &why) < 0)
        return fail(p, em, DT_ENOTSUP, "%s", why.s);
    /* the GPU's kept layer inputs are recompute = layer's (auto: layer) */
    if (q->kind == DT_KIND_TRAIN && q->cuda && q->recompute == DT_RECOMPUTE_NONE &&
        ((q->offload & DT_OFFLOAD_ACTIVATIONS) || q->ckpt_dtype != DT_CKPT_FP32))
        return fail(p, em, DT_EINVAL,
                    "%s concerns the layer inputs recompute = layer keeps, and recompute = "
                    "none keeps none",
                    q->offload & DT_OFFLOAD_ACTIVATIONS ? "offload = activations"
                                                        : "ckpt_dtype = bf16");

    if (q->tokens <= 0 || q->tokens > TOKENS_MAX)
        return fail(p, em, DT_EINVAL, "tokens=%lld: the sequence length must be 1 to 2^50",
                    (long long)q->tokens);
    if (m->heads <= 0 || m->heads > 65536 || m->kv_heads <= 0 || m->dim <= 0)
        return fail(p, em, DT_EINVAL,
                    "model %s: dim=%lld heads=%lld kv_heads=%lld must be "
                    "positive (heads at most 65536)",
                    m->name, (long long)m->dim, (long long)m->heads, (long long)m->kv_heads);
    if (m->heads % m->kv_heads != 0)
        return fail(p, em, DT_EINVAL,
                    "model %s: kv_heads=%lld must divide heads=%lld "
                    "(grouped-query attention)",
                    m->name, (long long)m->kv_heads, (long long)m->heads);
    if ((m->head_dim <= 0 && m->dim % m->heads != 0) || dt_model_head_dim(m) > 65536 ||
        dt_model_head_dim(m) < 1)
        return fail(p, em, DT_EINVAL,
                    "model %s: dim=%lld must be a multiple of heads=%lld "
                    "(head dimension D = dim / heads), or give head_dim",
                    m->name, (long long)m->dim, (long long)m->heads);
    if (q->kind != DT_KIND_ATTN && (m->layers <= 0 || m->ffn <= 0 || m->vocab <= 0))
        return fail(p, em, DT_EINVAL,
                    "model %s: layers=%lld ffn=%lld vocab=%lld must be "
                    "positive for kind %s",
                    m->name, (long long)m->layers, (long long)m->ffn, (long long)m->vocab,
                    dt_kind_name(q->kind));
    if (q->nbranch < 0 || q->nbranch > DT_ATTN_MAXBRANCH)
        return fail(p, em, DT_EINVAL, "%d dilated branches: at most %d", q->nbranch,
                    DT_ATTN_MAXBRANCH);
    for (int b = 0; b < q->nbranch; b++) {
        if (q->seg[b] <= 0 || q->dil[b] <= 0)
            return fail(p, em, DT_EINVAL,
                        "branch %d: segment %lld and dilation %lld must be "
                        "positive",
                        b + 1, (long long)q->seg[b], (long long)q->dil[b]);
        if (q->seg[b] % q->dil[b] != 0)
            return fail(p, em, DT_EINVAL,
                        "branch %d: segment length w=%lld is not a multiple "
                        "of its dilation r=%lld",
                        b + 1, (long long)q->seg[b], (long long)q->dil[b]);
    }
    if (cl->gpus_per_node <= 0 || cl->nodes < 0 || !(cl->mem_bytes > 0) || !(cl->peak_flops > 0) ||
        !(cl->efficiency > 0 && cl->efficiency <= 1) || !(cl->nvlink_bps > 0) ||
        !(cl->net_bps > 0) || cl->fixed_bytes < 0)
        return fail(p, em, DT_EINVAL,
                    "cluster %s: gpus_per_node, memory, peak FLOP/s and "
                    "bandwidths must be positive and efficiency in (0, 1]",
                    cl->name);
    if (q->ranks < 0 || q->spares < 0)
        return fail(p, em, DT_EINVAL, "ranks=%d spares=%d must not be negative", q->ranks,
                    q->spares);
    return 0;
}

/* 0 when T tokens split over R ranks in the layout, else why not. */
static int divides(const dt_plan_req_t *q, int64_t T, int R, char *why, size_t n)
{
    if (R > T) {
        snprintf(why, n,
                 "tokens T=%lld cannot be split over R=%d ranks (fewer tokens than "
                 "ranks)",
                 (long long)T, R);
        return DT_ELAYOUT;
    }
    int pc = dt_layout_pieces(q->layout, R);
    if (pc > 1 && T % (pc * (int64_t)R) != 0) {
        snprintf(why, n,
                 "tokens T=%lld is not divisible by %dR=%lld (%s: each of the %d "
                 "ranks holds %d chunks of c/%d tokens)",
                 (long long)T, pc, pc * (long long)R, dt_layout_name(q->layout), R, pc, pc);
        return DT_ELAYOUT;
    }
    if (T % R != 0) {
        snprintf(why, n, "tokens T=%lld is not divisible by R=%d ranks", (long long)T, R);
        return DT_ELAYOUT;
    }
    return 0;
}

static int capacity(const dt_plan_req_t *q)
{
    const dt_cluster_t *cl = &q->cluster;
    int64_t cap = cl->nodes > 0 ? (int64_t)cl->nodes * cl->gpus_per_node - q->spares : MAX_RANKS;
    return (int)(cap < 0 ? 0 : imin(cap, MAX_RANKS));
}

/* "optimizer 64.0 GiB" for the largest component. */
static void largest(const dt_plan_mem_t *m, char *buf, size_t n)
{
    const struct {
        const char *name;
        double v;
    } parts[] = {
        { "weights", m->weights },       { "grads", m->grads },
        { "optimizer", m->optimizer },   { "activations", m->activations },
        { "kv_buffers", m->kv_buffers }, { "workspace", m->workspace },
        { "fixed", m->fixed },
    };
    size_t best = 0;

    for (size_t i = 1; i < DT_ARRAY_SIZE(parts); i++)
        if (parts[i].v > parts[best].v)
            best = i;
    snprintf(buf, n, "%s %.2f GiB", parts[best].name, parts[best].v / GiB);
}

static int fail_memory(const dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    char big[64];

    largest(&p->mem, big, sizeof(big));
    return fail(p, em, DT_ENOSPC,
                "memory: %.2f GiB per rank at R=%d (c=%lld), %.2f GiB "
                "available per %s rank; largest: %s (weights %.2f, grads %.2f, optimizer %.2f, "
                "activations %.2f, kv_buffers %.2f, workspace %.2f, fixed %.2f GiB)",
                p->mem.total / GiB, p->ranks, (long long)p->tokens_per_rank,
                q->cluster.mem_bytes / GiB, q->cluster.name, big, p->mem.weights / GiB,
                p->mem.grads / GiB, p->mem.optimizer / GiB, p->mem.activations / GiB,
                p->mem.kv_buffers / GiB, p->mem.workspace / GiB, p->mem.fixed / GiB);
}

/*-- the plan -------------------------------------------------------------------------*/

/* Smallest c (R fixed) at which every branch's transfers hide; 0 if none
 * up to 2^50 tokens. */
static int64_t min_c_hidden(const dt_plan_req_t *q, int R)
{
    int64_t gran = dt_layout_pieces(q->layout, R), lo, hi;
    dt_cost_t v;

    dt_cost_eval(q, gran * R, R, &v);
    if (v.hidden)
        return gran;
    for (hi = 2 * gran;; hi *= 2) {
        if (hi * R > TOKENS_MAX)
            return 0;
        dt_cost_eval(q, hi * R, R, &v);
        if (v.hidden)
            break;
    }
    lo = hi / 2; /* not hidden at lo, hidden at hi; both multiples of gran */
    while (hi - lo > gran) {
        int64_t mid = lo + (hi - lo) / 2 / gran * gran;
        dt_cost_eval(q, mid * R, R, &v);
        if (v.hidden)
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}

/* Fill p from the evaluation at v->R, with the placement of every worker
 * (N v->R, checked against MAX_RANKS by the caller). */
static void fill(const dt_plan_req_t *q, const dt_cost_t *v, dt_plan_t *p)
{
    int gpn = q->cluster.gpus_per_node, inside = 0, N = dp_of(q), R = v->R, W = N * R;
    double layers = q->kind == DT_KIND_ATTN ? 1 : (double)q->model.layers;

    p->ranks = R;
    p->dp = N;
    p->workers = W;
    p->nodes = (int)ceil_div((int64_t)W + q->spares, gpn);
    p->tokens_per_rank = v->c;
    p->nbranch = v->nb;
    for (int b = 0; b < v->nb; b++) {
        p->branch[b].w = v->b[b].w;
        p->branch[b].r = v->b[b].r;
        p->branch[b].group = v->b[b].group;
        p->branch[b].bytes_per_step = v->b[b].group > 1 ? v->b[b].pack : 0;
        p->branch[b].flops = layers * v->b[b].flops;
    }
    p->mem = v->mem;
    p->flops = v->flops;
    p->flops_per_token =
        v->flops / ((double)N * (q->batch > 1 ? (double)q->batch : 1.0) * (double)v->T);
    p->bytes_per_step = v->bytes_per_step;
    p->mask_share = v->mask_share;
    p->imbalance = v->imbalance;
    p->step_compute_s = v->step_compute_s;
    p->step_comm_s = v->step_comm_s;
    p->comm_hidden = v->hidden;
    p->shard_comm_s = v->shard_comm_s;
    p->shard_hidden = v->shard_hidden;
    p->pcie_bytes = v->pcie_bytes;
    p->pcie_s = v->pcie_s;
    p->pcie_hidden = v->pcie_hidden;
    p->seconds = v->seconds;
    free(p->placement);
    p->placement = dt_xmallocarray((size_t)W, sizeof(int));
    for (int i = 0; i < W; i++)
        p->placement[i] = i / gpn;
    /* each ring's hops: ring i is ranks [i R, (i + 1) R) */
    for (int i = 0; i < W; i++)
        inside += p->placement[i] == p->placement[i / R * R + (i % R + 1) % R];
    p->intra_node_frac = (double)inside / W;
    p->min_c_hidden = min_c_hidden(q, v->R);
}

/* What a refusal of plan_one is about. */
enum bound {
    BOUND_NONE = 0,  /* it fits, or the refusal is not about memory */
    BOUND_PER_TOKEN, /* no rank count the planner may use holds the per-token part */
    BOUND_WHOLE,     /* the parts no R shrinks (the state kept whole, fixed) fill a rank */
};

/* What every rank still holds whole at the request's shard level. */
static const char *held_whole(const dt_plan_req_t *q)
{
    switch (shard_of(q)) {
    case DT_SHARD_OPTIMIZER:
        return "with shard = optimizer every rank still holds the whole weights and gradients";
    case DT_SHARD_GRADIENTS:
        return "with shard = gradients every rank still holds the whole weights";
    case DT_SHARD_PARAMETERS:
        return "with shard = parameters every rank still holds its largest units whole";
    default:
        return "every rank holds the whole model";
    }
}

/* Whether a GPU node's page-locked host memory holds what its ranks keep
 * there (host bytes a rank; workers in all, gpus_per_node to a node). */
static bool host_fits(const dt_plan_req_t *q, double host, int workers)
{
    int rpn = workers < q->cluster.gpus_per_node ? workers : q->cluster.gpus_per_node;

    return !q->cuda || !(q->cluster.host_mem_bytes > 0) || host * rpn <= q->cluster.host_mem_bytes;
}

/* The plan at the request's shard level and recompute (AUTO as none);
 * *bound says what a refusal is about. With R free, rmax > 0 bounds the
 * ranks looked at (dt_plan_make wants fewer than a plan it has). */
static int plan_one(const dt_plan_req_t *q, int rmax, dt_plan_t *p, enum bound *bound,
                    dt_emsg_t *em)
{
    int64_t T = q->tokens;
    int cap, R, rc, N;
    char why[256];
    dt_cost_t v;

    memset(p, 0, sizeof(*p));
    *bound = BOUND_NONE;
    p->recompute = recomp(q);
    p->shard = shard_of(q);
    p->offload = q->offload;
    p->ckpt_dtype = q->ckpt_dtype;
    if ((rc = check_req(q, p, em)) < 0)
        return rc;
    cap = capacity(q);
    N = p->dp = dp_of(q);

    if (q->ranks > 0) {
        R = q->ranks;
        if (R > MAX_RANKS)
            return fail(p, em, DT_ERANGE, "ranks=%d: the planner stops at %d ranks", R, MAX_RANKS);
        if ((int64_t)N * R > MAX_RANKS)
            return fail(p, em, DT_ERANGE,
                        "dp=%d rings of ranks=%d: %lld workers, the planner stops at %d", N, R,
                        (long long)N * R, MAX_RANKS);
        if ((rc = divides(q, T, R, why, sizeof(why))) < 0)
            return fail(p, em, rc, "%s", why);
        dt_cost_eval(q, T, R, &v);
        fill(q, &v, p);
    } else {
        /* the fewest ranks that fit: start where the per-token part and
         * the sharded state alone would fill the memory the parts no R
         * shrinks leave: R (mem - a) >= T act + b / N */
        int64_t rlimit = MAX_RANKS / N; /* every ring's ranks: at most MAX_RANKS */
        int64_t limit = imin(rlimit, imax2(T / dt_layout_pieces(q->layout, 2), 1));
        int64_t start = 1, last = 0;
        dt_plan_mem_t whole;
        double a, b;

        if (rmax > 0)
            limit = imin(limit, rmax);
        dt_cost_constant_parts(q, &whole, &a, &b);
        if (a >= q->cluster.mem_bytes) {
            /* no R helps: report the parts that do not shrink */
            char big[64];
            p->mem = whole;
            p->mem.total = a;
            largest(&p->mem, big, sizeof(big));
            *bound = BOUND_WHOLE;
            return fail(p, em, DT_ENOSPC,
                        "memory: weights, grads, optimizer and fixed alone "
                        "need %.2f GiB per rank, more than the %.2f GiB of a %s rank (largest: "
                        "%s; %s)",
                        a / GiB, q->cluster.mem_bytes / GiB, q->cluster.name, big, held_whole(q));
        }
        double need = ((double)T * dt_cost_act_per_token(q) + b) / (q->cluster.mem_bytes - a);
        if (need > 1)
            start = need >= (double)MAX_RANKS + 1 ? MAX_RANKS + 1 : (int64_t)ceil(need);
        R = 0;
        for (int64_t r = start; r <= limit; r++) {
            if (divides(q, T, (int)r, why, sizeof(why)) < 0)
                continue;
            last = r;
            dt_cost_eval(q, T, (int)r, &v);
            /* the host's share shrinks with R too: more ranks when it binds */
            if (v.mem.total <= q->cluster.mem_bytes && host_fits(q, v.mem.host, N * (int)r)) {
                R = (int)r;
                break;
            }
        }
        *bound = BOUND_PER_TOKEN; /* unless it fits below */
        if (R == 0 && last == 0) {
            if (start > limit && limit < rlimit)
                return fail(p, em, DT_ENOSPC,
                            "memory: %lld tokens need at least %.0f ranks of "
                            "%.2f GiB, but split over at most %lld",
                            (long long)T, ceil(need), q->cluster.mem_bytes / GiB, (long long)limit);
            if (start > limit)
                return fail(p, em, DT_ERANGE,
                            "needs at least %.0f ranks to hold %lld tokens "
                            "in %.2f GiB per rank; the planner stops at %lld%s",
                            ceil(need), (long long)T, q->cluster.mem_bytes / GiB,
                            (long long)rlimit, N > 1 ? " per ring (dp x ranks workers in all)" : "");
            return fail(p, em, DT_ELAYOUT,
                        "tokens T=%lld: no rank count from %lld (the fewest "
                        "whose memory could fit) to %lld divides it%s",
                        (long long)T, (long long)start, (long long)limit,
                        q->layout == DT_LAYOUT_ZIGZAG    ? " as zigzag needs (2R | T)"
                        : q->layout == DT_LAYOUT_BALANCED ? " as balanced needs (8R | T)"
                                                          : "");
        }
        if (R == 0) {
            dt_cost_eval(q, T, (int)last, &v);
            fill(q, &v, p);
            if (p->mem.total > q->cluster.mem_bytes)
                return fail_memory(q, p, em);
        }
        fill(q, &v, p);
    }

    /* the user's R: memory is the question only when it does not fit */
    if (q->ranks > 0 && p->mem.total > q->cluster.mem_bytes)
        *bound = BOUND_PER_TOKEN;
    if (p->workers > cap) {
        if (q->cluster.nodes > 0 && N > 1)
            return fail(p, em, DT_ERANGE,
                        "needs %d workers (dp=%d rings of %d ranks, %lld tokens each) but %s has "
                        "%d nodes x %d = %d ranks%s",
                        p->workers, N, p->ranks, (long long)p->tokens_per_rank, q->cluster.name,
                        q->cluster.nodes, q->cluster.gpus_per_node,
                        q->cluster.nodes * q->cluster.gpus_per_node,
                        q->spares ? " before spares" : "");
        if (q->cluster.nodes > 0)
            return fail(p, em, DT_ERANGE,
                        "needs %d ranks (%lld tokens each) but %s has %d "
                        "nodes x %d = %d ranks%s",
                        p->ranks, (long long)p->tokens_per_rank, q->cluster.name, q->cluster.nodes,
                        q->cluster.gpus_per_node, q->cluster.nodes * q->cluster.gpus_per_node,
                        q->spares ? " before spares" : "");
        return fail(p, em, DT_ERANGE, "needs %d %s; the planner stops at %d", p->workers,
                    N > 1 ? "workers" : "ranks", MAX_RANKS);
    }
    if (p->mem.total > q->cluster.mem_bytes)
        return fail_memory(q, p, em);
    /* a GPU node's page-locked host memory holds what its ranks keep there */
    int rpn = p->workers < q->cluster.gpus_per_node ? p->workers : q->cluster.gpus_per_node;
    if (!host_fits(q, p->mem.host, p->workers))
        return fail(p, em, DT_ENOSPC,
                    "host memory: %.2f GiB per node (%d ranks x %.2f GiB of page-locked "
                    "buffers), %.2f GiB available per %s node",
                    p->mem.host * rpn / GiB, rpn, p->mem.host / GiB,
                    q->cluster.host_mem_bytes / GiB, q->cluster.name);
    *bound = BOUND_NONE;
    p->fits = true;
    return 0;
}

/* "shard = gradients, recompute = layer": what the planner itself chose
 * of p (the request's AUTO keys), "" when nothing. */
static void chosen(const dt_plan_req_t *q, const dt_plan_t *p, char *buf, size_t n)
{
    bool sa = q->shard == DT_SHARD_AUTO && p->shard != DT_SHARD_NONE;
    bool ra = q->recompute == DT_RECOMPUTE_AUTO && p->recompute;

    snprintf(buf, n, "%s%s%s%s", sa ? "shard = " : "", sa ? dt_shard_name(p->shard) : "",
             sa && ra ? ", " : "", ra ? "recompute = layer" : "");
}

/* p at its shard level without recompute, at its ranks. */
static void without_recompute(const dt_plan_req_t *q, const dt_plan_t *p, dt_cost_t *v)
{
    dt_plan_req_t t = *q;

    t.shard = p->shard;
    t.recompute = DT_RECOMPUTE_NONE;
    dt_cost_eval(&t, q->tokens, p->ranks, v);
}

/* The note of a plan that fits, where the planner chose: why. least and
 * least_ranks: the least sharded plan that fit at p's recompute. */
static void note_fit(const dt_plan_req_t *q, dt_plan_t *p, enum dt_shard_level least,
                     int least_ranks)
{
    bool sa = q->shard == DT_SHARD_AUTO && p->shard != DT_SHARD_NONE;
    bool ra = q->recompute == DT_RECOMPUTE_AUTO && p->recompute;
    char what[64];
    size_t len;
    dt_cost_t v;

    if (!ra && !sa)
        return;
    without_recompute(q, p, &v);
    if (!sa) {
        snprintf(p->note, sizeof(p->note),
                 "recompute = layer: without it the activations need %.2f GiB per rank at "
                 "R=%d (%.2f GiB in all, %.2f GiB available)",
                 v.mem.activations / GiB, p->ranks, v.mem.total / GiB, q->cluster.mem_bytes / GiB);
        return;
    }
    chosen(q, p, what, sizeof(what));
    if (least != p->shard) {
        len = (size_t)snprintf(p->note, sizeof(p->note),
                               "%s: fits on %d ranks; the least sharding that fits, shard = %s, "
                               "needs %d",
                               what, p->ranks, dt_shard_name(least), least_ranks);
    } else {
        dt_plan_req_t t = *q;
        dt_plan_mem_t whole;
        double a, b;
        t.shard = DT_SHARD_NONE;
        dt_cost_constant_parts(&t, &whole, &a, &b);
        len = (size_t)snprintf(p->note, sizeof(p->note),
                               "%s: without sharding the weights, gradients and optimizer need "
                               "%.2f GiB per rank (%.2f GiB available)",
                               what, (a - whole.fixed) / GiB, q->cluster.mem_bytes / GiB);
    }
    if (ra && len < sizeof(p->note))
        snprintf(p->note + len, sizeof(p->note) - len,
                 "; without recompute the activations need %.2f GiB per rank at R=%d "
                 "(%.2f GiB in all)",
                 v.mem.activations / GiB, p->ranks, v.mem.total / GiB);
}

/* The note of a refusal after the planner tried more than one plan (p is
 * the last); skipped_layer: recompute = layer was not tried at p's shard
 * level, the state kept whole being what does not fit. */
static void note_refused(const dt_plan_req_t *q, dt_plan_t *p, bool skipped_layer)
{
    dt_plan_req_t layer = *q;
    char what[64];
    dt_cost_t v;

    layer.shard = p->shard;
    layer.recompute = DT_RECOMPUTE_LAYER;
    if (skipped_layer) {
        snprintf(p->note, sizeof(p->note),
                 "recompute = layer would not help: it shrinks the activations (%.0f to %.0f "
                 "KiB per token), not the %.2f GiB of weights, grads and optimizer each rank "
                 "holds%s",
                 dt_cost_act_per_token(q) / 1024, dt_cost_act_per_token(&layer) / 1024,
                 (p->mem.weights + p->mem.grads + p->mem.optimizer) / GiB,
                 p->shard < DT_SHARD_PARAMETERS ? " (shard = parameters divides them over the "
                                                  "ranks)"
                                                : "");
        return;
    }
    chosen(q, p, what, sizeof(what));
    if (p->ranks > 0 && p->recompute) {
        without_recompute(q, p, &v);
        snprintf(p->note, sizeof(p->note),
                 "%s does not fit either: without recompute the activations need %.2f GiB per "
                 "rank at R=%d (%.2f GiB in all, %.2f GiB available)",
                 what, v.mem.activations / GiB, p->ranks, v.mem.total / GiB,
                 q->cluster.mem_bytes / GiB);
        if (q->shard != DT_SHARD_AUTO) /* the wording of recompute alone */
            snprintf(p->note, sizeof(p->note),
                     "%s does not fit either: without it the activations need %.2f GiB per rank "
                     "at R=%d (%.2f GiB in all, %.2f GiB available)",
                     what, v.mem.activations / GiB, p->ranks, v.mem.total / GiB,
                     q->cluster.mem_bytes / GiB);
    } else {
        snprintf(p->note, sizeof(p->note), "%s does not fit either", what);
    }
}

/* The planner chose the shard level: on a device whose engine runs only
 * some levels, the note says which it tried. */
static void note_device(const dt_plan_req_t *q, dt_plan_t *p)
{
    size_t len = strlen(p->note);
    enum dt_device dev = q->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU;

    if (dt_vocab_shard_runs(dev, DT_SHARD_PARAMETERS) || len >= sizeof(p->note) - 1)
        return;
    snprintf(p->note + len, sizeof(p->note) - len,
             "%sdevice %s does not run every shard level: the planner tried only those it runs",
             len ? "; " : "", dt_device_name(dev));
}

/* The plan at the request's offload: the shard level and recompute as
 * the request leaves them open (see the top). */
static int plan_levels(const dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    static const enum dt_shard_level levels[] = { DT_SHARD_NONE, DT_SHARD_OPTIMIZER,
                                                  DT_SHARD_GRADIENTS, DT_SHARD_PARAMETERS };
    static const enum dt_recompute settings[] = { DT_RECOMPUTE_NONE, DT_RECOMPUTE_LAYER };
    /* on the user's one rank (and one ring) every level keeps the whole
     * state, but for a GPU's optimizer in host memory, to which sharded
     * gradients stream (none kept on the device) */
    bool auto_shard = q->kind == DT_KIND_TRAIN && q->shard == DT_SHARD_AUTO &&
                      (q->ranks != 1 || dp_of(q) > 1 ||
                       (q->cuda && (q->offload & DT_OFFLOAD_OPTIMIZER)));
    bool auto_rc = q->kind == DT_KIND_TRAIN && q->recompute == DT_RECOMPUTE_AUTO;
    /* on the GPU, offloaded or bf16 layer inputs exist with recompute
     * only: auto is layer there */
    bool layer_only = auto_rc && q->cuda &&
                      ((q->offload & DT_OFFLOAD_ACTIVATIONS) || q->ckpt_dtype != DT_CKPT_FP32);
    int nsh = auto_shard ? (int)DT_ARRAY_SIZE(levels) : 1;
    int nrc = auto_rc ? (int)DT_ARRAY_SIZE(settings) : 1;
    bool whole[DT_SHARD_PARAMETERS + 1] = { false };
    dt_plan_t best = { 0 }, last = { 0 }, cur;
    dt_emsg_t cem, last_em = { "" };
    enum dt_shard_level least = DT_SHARD_NONE;
    int tried = 0, last_rc = 0, least_ranks = 0;
    bool have_best = false;
    enum bound bound;

    if (!auto_shard && !auto_rc)
        return plan_one(q, 0, p, &bound, em);
    if (layer_only)
        nrc = 1;
    /* sharding first, recompute after: at each recompute setting (none,
     * then layer) the shard level with the fewest ranks, the least
     * sharding among equals; layer only when no level fits without */
    for (int i = 0; i < nrc && !have_best; i++) {
        for (int j = 0; j < nsh; j++) {
            dt_plan_req_t t = *q;
            if (auto_shard)
                t.shard = levels[j];
            /* the planner's own pick: only what the device's engine runs
             * (spec/vocab.h); a level the user named is checked by plan_one */
            if (auto_shard && !dt_vocab_shard_runs(q->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU,
                                                   t.shard))
                continue;
            if (auto_rc)
                t.recompute = layer_only ? DT_RECOMPUTE_LAYER : settings[i];
            /* recompute cannot help where the state kept whole does not fit */
            if (whole[shard_of(&t)])
                continue;
            /* a later level is taken for fewer ranks only */
            if (have_best && (q->ranks > 0 || best.ranks == 1))
                break;
            memset(&cem, 0, sizeof(cem));
            int rc = plan_one(&t, have_best ? best.ranks - 1 : 0, &cur, &bound, &cem);
            tried++;
            if (rc == 0) {
                if (!have_best) {
                    least = cur.shard;
                    least_ranks = cur.ranks;
                }
                dt_plan_clear(&best);
                best = cur;
                have_best = true;
                continue;
            }
            if (tried == 1 && bound == BOUND_NONE) {
                /* not about memory: no other plan changes that */
                *p = cur;
                return dt_emsg_set(em, rc, "%s", cem.s);
            }
            if (bound == BOUND_WHOLE)
                whole[shard_of(&t)] = true;
            if (have_best) {
                dt_plan_clear(&cur);
                continue;
            }
            dt_plan_clear(&last);
            last = cur;
            last_rc = rc;
            last_em = cem;
        }
    }
    if (have_best) {
        dt_plan_clear(&last);
        *p = best;
        note_fit(q, p, least, least_ranks);
        if (auto_shard && p->shard != DT_SHARD_NONE)
            note_device(q, p); /* it had to shard: say what it could not try */
        return 0;
    }
    /* nothing fits: the last plan tried, the most sharding and
     * recomputation the request leaves open */
    *p = last;
    if (tried > 1 || (auto_rc && whole[p->shard]))
        note_refused(q, p, auto_rc && whole[p->shard] && !p->recompute);
    if (auto_shard)
        note_device(q, p);
    return dt_emsg_set(em, last_rc, "%s", last_em.s);
}

/* Offload, when the spec leaves it to the planner (train on GPUs): the
 * candidates in the order of the PCIe traffic they add, none first; a
 * later one is taken only for fewer GPUs (the fewest GPUs, then the least
 * traffic, then, within each, the least sharding: plan_levels). The kept
 * layer inputs go to the host (with recompute = layer) in the dtype the
 * spec gives, or, left open, fp32 before bf16 (half the host memory and
 * traffic, within dt-spec(5)'s tolerance). */
static int plan_offload(const dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    static const struct {
        unsigned offload;
        enum dt_ckpt_dtype ck;
    } cand[] = {
        { 0, DT_CKPT_FP32 },
        { DT_OFFLOAD_OPTIMIZER, DT_CKPT_FP32 },
        { DT_OFFLOAD_ACTIVATIONS | DT_OFFLOAD_OPTIMIZER, DT_CKPT_FP32 },
        { DT_OFFLOAD_ACTIVATIONS | DT_OFFLOAD_OPTIMIZER, DT_CKPT_BF16 },
    };
    dt_plan_t best = { 0 }, cur;
    dt_emsg_t cem;
    int best_i = -1, rc = 0, none_ranks = 0, ntried = 0;
    char tried[160] = "";

    if (!(q->kind == DT_KIND_TRAIN && q->cuda && q->offload_auto))
        return plan_levels(q, p, em);
    for (size_t i = 0; i < DT_ARRAY_SIZE(cand); i++) {
        dt_plan_req_t t = *q;
        t.offload = cand[i].offload;
        if (q->ckpt_auto)
            t.ckpt_dtype = cand[i].ck;
        else if (cand[i].ck != DT_CKPT_FP32)
            continue; /* the spec's dtype is in the candidate before */
        /* offloaded layer inputs are recompute = layer's */
        if ((t.offload & DT_OFFLOAD_ACTIVATIONS) && q->recompute == DT_RECOMPUTE_NONE)
            continue;
        if (!(t.offload & DT_OFFLOAD_ACTIVATIONS) && t.ckpt_dtype != q->ckpt_dtype)
            continue;
        memset(&cem, 0, sizeof(cem));
        int r = plan_levels(&t, &cur, &cem);
        char name[64];
        dt_vocab_format_set(name, sizeof(name), dt_offload_names, t.offload);
        size_t len = strlen(tried);
        snprintf(tried + len, sizeof(tried) - len, "%s%s%s", ntried ? ", " : "", name,
                 t.ckpt_dtype == DT_CKPT_BF16 && (t.offload & DT_OFFLOAD_ACTIVATIONS)
                     ? " (bf16 layer inputs)" : "");
        ntried++;
        if (r == 0 && i == 0)
            none_ranks = cur.ranks * cur.dp;
        if (r == 0 && (best_i < 0 || cur.ranks * cur.dp < best.ranks * best.dp)) {
            dt_plan_clear(&best);
            best = cur;
            best_i = (int)i;
            continue;
        }
        if (best_i < 0) {
            dt_plan_clear(&best);
            best = cur;
            rc = r;
            *em = cem;
        } else {
            dt_plan_clear(&cur);
        }
    }
    *p = best;
    if (best_i < 0) {
        size_t len = strlen(p->note);
        snprintf(p->note + len, sizeof(p->note) - len, "%snor with offload: tried %s",
                 len ? "; " : "", tried);
        return rc;
    }
    if (best_i > 0) {
        char name[64], why[200];
        dt_vocab_format_set(name, sizeof(name), dt_offload_names, p->offload);
        if (none_ranks > 0)
            snprintf(why, sizeof(why), "without offload it needs %d GPUs", none_ranks);
        else
            snprintf(why, sizeof(why), "without offload it does not fit");
        size_t len = strlen(p->note);
        snprintf(p->note + len, sizeof(p->note) - len,
                 "%soffload = %s%s chosen by the planner: fits on %d GPU%s, %s",
                 len ? "; " : "", name,
                 p->ckpt_dtype == DT_CKPT_BF16 && q->ckpt_auto ? ", ckpt_dtype = bf16" : "",
                 p->ranks * p->dp, p->ranks * p->dp == 1 ? "" : "s", why);
    }
    return 0;
}

/* The layout, when the spec leaves it to the planner and masks are given:
 * with documents (the data's, unknown here) balanced, whose pieces spread
 * any document's work over the ranks (zigzag's balance is one causal
 * sequence's); else the fastest of contiguous, zigzag and balanced for
 * the masks known (their work per rank and ring traffic), the default
 * on a tie. Otherwise the request's. */
static int plan_layout(const dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    static const enum dt_layout all[] = { DT_LAYOUT_CONTIGUOUS, DT_LAYOUT_ZIGZAG,
                                          DT_LAYOUT_BALANCED };
    int rc = plan_offload(q, p, em);

    p->layout = q->layout;
    if (rc < 0 || !q->layout_auto || !dt_mask_rules_any(&q->masks) || q->nbranch > 0)
        return rc;
    dt_plan_t best = *p;
    enum dt_layout chosen = q->layout;
    for (size_t i = 0; i < DT_ARRAY_SIZE(all); i++) {
        dt_plan_req_t t = *q;
        dt_plan_t cur;
        dt_emsg_t cem = { "" };
        if (all[i] == q->layout || (q->masks.docs && all[i] != DT_LAYOUT_BALANCED))
            continue;
        t.layout = all[i];
        t.layout_auto = false;
        if (plan_offload(&t, &cur, &cem) < 0 || !cur.fits) {
            dt_plan_clear(&cur);
            continue;
        }
        if (q->masks.docs || cur.seconds < best.seconds * (1 - 1e-9)) {
            if (chosen != q->layout)
                dt_plan_clear(&best);
            best = cur;
            chosen = all[i];
        } else {
            dt_plan_clear(&cur);
        }
    }
    if (chosen == q->layout)
        return 0;
    dt_plan_clear(p);
    *p = best;
    p->layout = chosen;
    size_t len = strlen(p->note);
    snprintf(p->note + len, sizeof(p->note) - len,
             "%slayout = %s chosen by the planner: %s", len ? "; " : "", dt_layout_name(chosen),
             q->masks.docs ? "documents' work spreads over its pieces whatever their lengths"
                           : "the least time for the masks' work and ring traffic");
    return 0;
}

/* In-memory checkpoints: what the request says, or with auto every step
 * where the ranks' host memory also holds their agents' copies (a GPU
 * node's beside its page-locked buffers, a CPU rank's beside its whole
 * state), else none. Asked for and not held: the plan does not fit. */
static int plan_mem_ckpt(const dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    double need = p->mem.mem_ckpt;
    int rpn = p->workers < q->cluster.gpus_per_node ? p->workers : q->cluster.gpus_per_node;
    bool fits = q->cuda ? host_fits(q, p->mem.host + need, p->workers)
                        : p->mem.total + need <= q->cluster.mem_bytes;

    p->mem_ckpt_every = 0;
    if ((q->kind != DT_KIND_TRAIN && q->kind != DT_KIND_PREFILL) || !p->fits ||
        q->mem_ckpt_every == 0) {
        p->mem.mem_ckpt = 0;
        return 0;
    }
    if (fits) {
        p->mem_ckpt_every = q->mem_ckpt_every > 0 ? q->mem_ckpt_every : 1;
        return 0;
    }
    if (q->mem_ckpt_every < 0) {
        p->mem.mem_ckpt = 0; /* auto: none, and the plan says why */
        size_t len = strlen(p->note);
        snprintf(p->note + len, sizeof(p->note) - len,
                 "%sno in-memory checkpoints: their %.2f GiB a rank do not fit in its host "
                 "memory", len ? "; " : "", need / GiB);
        return 0;
    }
    if (q->cuda)
        return fail(p, em, DT_ENOSPC,
                    "mem_ckpt_every: host memory: %.2f GiB per node (%d ranks x %.2f GiB of "
                    "page-locked buffers and %.2f GiB of in-memory checkpoints), %.2f GiB "
                    "available per %s node (mem_ckpt_every = 0: none)",
                    (p->mem.host + need) * rpn / GiB, rpn, p->mem.host / GiB, need / GiB,
                    q->cluster.host_mem_bytes / GiB, q->cluster.name);
    return fail(p, em, DT_ENOSPC,
                "mem_ckpt_every: %.2f GiB a rank with its in-memory checkpoints (%.2f GiB), "
                "%.2f GiB available per %s rank (mem_ckpt_every = 0: none)",
                (p->mem.total + need) / GiB, need / GiB, q->cluster.mem_bytes / GiB,
                q->cluster.name);
}

int dt_plan_make(const dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    int rc = plan_layout(q, p, em);

    return rc < 0 ? rc : plan_mem_ckpt(q, p, em);
}

void dt_plan_clear(dt_plan_t *p)
{
    if (p == NULL)
        return;
    free(p->placement);
    memset(p, 0, sizeof(*p));
}

/*-- JSON -------------------------------------------------------------------------------*/

static json_t *bytes(double v)
{
    return json_integer((json_int_t)llround(v));
}

json_t *dt_plan_to_json(const dt_plan_req_t *q, const dt_plan_t *p)
{
    json_t *o = json_object(), *mem = json_object(), *br = json_array(), *model, *cl;

    json_object_set_new(o, "fits", json_boolean(p->fits));
    if (!p->fits)
        json_object_set_new(o, "reason", json_string(p->reason));
    json_object_set_new(o, "recompute", json_string(p->recompute ? "layer" : "none"));
    json_object_set_new(o, "shard",
                        json_string(dt_shard_name(p->shard ? p->shard : DT_SHARD_NONE)));
    char off[64];
    dt_vocab_format_set(off, sizeof(off), dt_offload_names, p->offload);
    json_object_set_new(o, "offload", json_string(off));
    json_object_set_new(o, "ckpt_dtype", json_string(dt_ckpt_dtype_names[p->ckpt_dtype == DT_CKPT_BF16]));
    if (p->note[0])
        json_object_set_new(o, "note", json_string(p->note));
    json_object_set_new(o, "ranks", json_integer(p->ranks));
    json_object_set_new(o, "dp", json_integer(p->dp > 0 ? p->dp : dp_of(q)));
    json_object_set_new(o, "workers", json_integer(p->workers));
    json_object_set_new(o, "nodes", json_integer(p->nodes));
    json_object_set_new(o, "spares", json_integer(q->spares));
    json_object_set_new(o, "tokens_per_rank", json_integer(p->tokens_per_rank));
    json_object_set_new(o, "memory_per_rank_bytes", bytes(p->mem.total));
    json_object_set_new(o, "memory_available_bytes", bytes(q->cluster.mem_bytes));
    json_object_set_new(mem, "weights", bytes(p->mem.weights));
    json_object_set_new(mem, "grads", bytes(p->mem.grads));
    json_object_set_new(mem, "optimizer", bytes(p->mem.optimizer));
    json_object_set_new(mem, "activations", bytes(p->mem.activations));
    json_object_set_new(mem, "kv_buffers", bytes(p->mem.kv_buffers));
    json_object_set_new(mem, "workspace", bytes(p->mem.workspace));
    json_object_set_new(mem, "fixed", bytes(p->mem.fixed));
    json_object_set_new(o, "host_memory_per_rank_bytes", bytes(p->mem.host));
    json_object_set_new(o, "mem_ckpt_every", json_integer(p->mem_ckpt_every));
    json_object_set_new(o, "mem_ckpt_bytes_per_rank", bytes(p->mem.mem_ckpt));
    json_object_set_new(o, "memory_breakdown", mem);
    json_object_set_new(o, "flops", json_real(p->flops));
    json_object_set_new(o, "flops_per_token", json_real(p->flops_per_token));
    json_object_set_new(o, "bytes_per_step", bytes(p->bytes_per_step));
    json_object_set_new(o, "step_compute_s", json_real(p->step_compute_s));
    json_object_set_new(o, "step_comm_s", json_real(p->step_comm_s));
    json_object_set_new(o, "seconds", json_real(p->seconds));
    json_object_set_new(o, "comm_hidden", json_boolean(p->comm_hidden));
    json_object_set_new(o, "min_c_hidden", json_integer(p->min_c_hidden));
    json_object_set_new(o, "mask_share", json_real(p->mask_share));
    json_object_set_new(o, "imbalance", json_real(p->imbalance));
    json_object_set_new(o, "shard_comm_s", json_real(p->shard_comm_s));
    json_object_set_new(o, "shard_hidden", json_boolean(p->shard_hidden));
    json_object_set_new(o, "pcie_bytes_per_step", bytes(p->pcie_bytes));
    json_object_set_new(o, "pcie_s", json_real(p->pcie_s));
    json_object_set_new(o, "pcie_hidden", json_boolean(p->pcie_hidden));
    for (int b = 0; b < p->nbranch; b++) {
        json_t *x = json_object();
        json_object_set_new(x, "segment", json_integer(p->branch[b].w));
        json_object_set_new(x, "dilation", json_integer(p->branch[b].r));
        json_object_set_new(x, "group", json_integer(p->branch[b].group));
        json_object_set_new(x, "bytes_per_step", bytes(p->branch[b].bytes_per_step));
        json_object_set_new(x, "flops", json_real(p->branch[b].flops));
        json_array_append_new(br, x);
    }
    json_object_set_new(o, "branches", br);
    if (p->placement == NULL || p->workers <= PLACEMENT_LIST_MAX) {
        json_t *pl = json_array(); /* empty when no plan was made */
        for (int i = 0; p->placement != NULL && i < p->workers; i++)
            json_array_append_new(pl, json_integer(p->placement[i]));
        json_object_set_new(o, "placement", pl);
    } else {
        json_t *pl = json_object();
        int gpn = q->cluster.gpus_per_node;
        json_object_set_new(pl, "ranks_per_node", json_integer(gpn));
        json_object_set_new(pl, "nodes", json_integer(ceil_div(p->workers, gpn)));
        json_object_set_new(o, "placement", pl);
    }
    json_object_set_new(o, "intra_node_frac", json_real(p->intra_node_frac));

    /* the request */
    json_object_set_new(o, "tokens", json_integer(q->tokens));
    json_object_set_new(o, "kind", json_string(dt_kind_name(q->kind)));
    json_object_set_new(o, "device", json_string(q->cuda ? "cuda" : "cpu"));
    json_object_set_new(o, "dtype", json_string(dt_dtype_name(q->precision)));
    json_object_set_new(o, "precision", json_string(dt_dtype_name(q->precision)));
    json_object_set_new(o, "causal", json_boolean(q->causal));
    json_object_set_new(o, "layout", json_string(dt_layout_name(p->layout)));
    if (q->kind == DT_KIND_TRAIN)
        json_object_set_new(o, "batch", json_integer(q->batch > 1 ? q->batch : 1));
    model = json_object();
    json_object_set_new(model, "name", json_string(q->model.name));
    json_object_set_new(model, "dim", json_integer(q->model.dim));
    json_object_set_new(model, "layers", json_integer(q->model.layers));
    json_object_set_new(model, "heads", json_integer(q->model.heads));
    json_object_set_new(model, "kv_heads", json_integer(q->model.kv_heads));
    json_object_set_new(model, "ffn", json_integer(q->model.ffn));
    json_object_set_new(model, "vocab", json_integer(q->model.vocab));
    json_object_set_new(model, "head_dim", json_integer(dt_model_head_dim(&q->model)));
    json_object_set_new(model, "rope_theta", json_integer((json_int_t)q->model.rope.theta));
    json_object_set_new(model, "rope_scaling",
                        json_string(q->model.rope.factor > 0 ? "llama3" : "none"));
    json_object_set_new(model, "norm_eps", json_real(q->model.norm_eps));
    json_object_set_new(model, "tied", json_boolean(q->model.tied));
    json_object_set_new(o, "model", model);
    cl = json_object();
    json_object_set_new(cl, "name", json_string(q->cluster.name));
    json_object_set_new(cl, "gpus_per_node", json_integer(q->cluster.gpus_per_node));
    json_object_set_new(cl, "nodes", json_integer(q->cluster.nodes));
    json_object_set_new(cl, "mem_bytes", bytes(q->cluster.mem_bytes));
    json_object_set_new(cl, "peak_flops", json_real(q->cluster.peak_flops));
    json_object_set_new(cl, "efficiency", json_real(q->cluster.efficiency));
    json_object_set_new(cl, "nvlink_bps", json_real(q->cluster.nvlink_bps));
    json_object_set_new(cl, "net_bps", json_real(q->cluster.net_bps));
    json_object_set_new(cl, "fixed_bytes", bytes(q->cluster.fixed_bytes));
    json_object_set_new(cl, "peer_bytes", bytes(q->cluster.peer_bytes));
    json_object_set_new(o, "cluster", cl);
    return o;
}
