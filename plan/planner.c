/* SPDX-License-Identifier: MIT
 *
 * The ring-layout planner (planner.h): presets, a first-principles model of
 * one job on R ranks (memory per rank, FLOPs, bytes per ring step, time),
 * the choice of R, and the refusals. Pure computation, no I/O.
 *
 * Glossary: T tokens, R ranks, c = T / R tokens per rank, H query heads,
 * Hkv key/value heads, D = dim / H head dimension, P parameters, elem the
 * bytes of one value at the job's precision (4 fp32, 2 bf16/fp16); with
 * data parallelism (train, spec key dp) N rings of R ranks, W = N R the
 * job's ranks (W = R when N = 1).
 *
 * What each number means, and where it comes from:
 *
 * Memory per rank. Unsharded, every rank holds the whole training state
 * (weights, gradients, optimizer; the gradient all-reduce runs over the ring
 * group), which does not shrink with R; with shard (below) a part of it
 * does, as 1 / W; everything else is per token and shrinks with c.
 *  - attn: exactly what `dtengine attn` allocates (engine/attn/attn.c,
 *    engine/cmd/attn.c): q (c, H, D) and k, v (c, Hkv, D) at elem; o
 *    (c, H, D) and lse (H, c) in fp32; per branch the ring buffers of packed
 *    K/V (two when the branch's group has more than one rank; a ring of one
 *    never receives, and the engine never touches its second buffer, so it
 *    is never resident); the index arrays of the group being run (three
 *    int64 per row of the segment, a 48-byte member record per rank), and
 *    for dilated branches the gathered q, o, lse of each head chunk.
 *    Branches run one after another, so the largest branch counts, not
 *    their sum. On the cpu preset (fp32) this is tested against the
 *    engine's max RSS (tests/integration/plan_memory.sh).
 *  - prefill: weights P elem; for c tokens the residual stream (dim elem)
 *    plus one layer's working set, the larger of its attention half
 *    (normed x, q at elem, k and v at elem, o and lse in fp32) and its FFN
 *    half (normed x, gate, up and their product at elem); the ring buffers
 *    and workspace as for attn. No KV cache is kept: the output is the last
 *    hidden states.
 *  - train on GPUs (elem < 4): what dtengine train --device cuda allocates,
 *    from the one account both use (dt_model_gpu_train_bytes, spec/model.h,
 *    with the plan's recompute): the dtype weights (elem P), fp32 gradient
 *    (4 P), master copy and moments (12 P; sharded: below); every layer's
 *    kept activations per token (with recompute = layer its fp32 input
 *    only, 4 dim); the backward's scratch per token (with recompute one
 *    layer's activations too) and the LM head's chunk of logits
 *    (workspace).
 *  - train on CPUs (fp32): what dtengine train allocates
 *    (engine/model/model.c, engine/cmd/train.c). Weights, gradient and
 *    AdamW's two moments, 4 P each (weights 4 P, grads 4 P, optimizer 8 P;
 *    with batch > 1 a sequence's gradient beside the step's, grads 8 P).
 *    Activations kept for the backward, per token per layer:
 *        A = 4 (4 dim + 2 H D + 2 Hkv D + 3 ffn + H + 2) bytes,
 *    after Korthikanti et al., "Reducing Activation Recomputation in Large
 *    Transformer Models" (2022), sec. 4.1, whose 34 h bytes per token per
 *    layer (GPT, 16-bit) we redo for this LLaMA: the attention half keeps
 *    its input x and the normed x (2 dim), q and the attention output
 *    (2 H D), k and v (2 Hkv D), the LSE (H) and the norm's 1 / rms (1);
 *    the FFN half its input and the normed x (2 dim), gate, up and
 *    silu(gate) up (3 ffn: SwiGLU is one kernel) and 1 / rms (1). There is
 *    no dropout in LLaMA, and with flash attention no (T x T) score matrix
 *    is stored, so the 5 a s / h term of the paper is gone. With
 *    recompute = layer a layer keeps its input only (4 dim) and the
 *    backward makes its activations again, one layer at a time (below).
 *    Plus the final norm's input, output and 1 / rms (4 (2 dim + 1)).
 *    Workspace, per token: fp32 logits and their gradient (2 4 vocab), the
 *    residual stream, the branch output and two residual gradients
 *    (4 4 dim), the backward's dq, d(attention output), dk, dv and the
 *    three FFN gradients (4 (2 H D + 2 Hkv D + 3 ffn)), token ids and
 *    positions (24); with recompute one layer's activations (A) and the
 *    input it is recomputed from (4 dim); then every rank's copy of the T
 *    input and target ids (8 T) and the attention workspace. Ring
 *    buffers: the forward's plus four fp32 gradient packs (dK/dV travel one
 *    step behind K/V and come home; two when the ring is one rank). On the
 *    cpu preset this is tested against dtengine train's max RSS, with and
 *    without recompute (tests/integration/plan_memory.sh).
 *
 * Shard (train; spec key shard, dt_plan_req_t.shard). The flat parameters
 * (spec/model.h) are split into W contiguous slices (W = N R with dp: all
 * the job's ranks), rank r keeping about [P r / W, P (r + 1) / W) (with dp
 * the engine orders the slices otherwise, of the same sizes), and gathered
 * and reduced in units: the embedding (V dim), each layer, the final norm
 * with the LM head (V dim + dim; dim when tied). U is the largest unit's parameters
 * (dt_model_unit_max), E = V dim when the head is tied to the embedding,
 * else 0. Per rank, CPU (fp32; g = 4 P, 8 P with batch > 1):
 *    none        weights 4 P          grads g                 optimizer 8 P
 *    optimizer   weights 4 P          grads g                 optimizer 8 P / W
 *    gradients   weights 4 P          grads g / W + 4 (U + E) optimizer 8 P / W
 *    parameters  weights 4 P / W + 4 (U + E), grads and optimizer as gradients
 * the 4 U being the unit gathered (parameters) or reduce-scattered
 * (gradients), 4 E the tied embedding, gathered for the head and its
 * gradient alive through the backward. GPU (the dtype copy elem P, fp32
 * gradient 4 P, master 4 P, moments 8 P):
 *    none        (16 + elem) P
 *    optimizer   (8 + elem) P + 8 P / W                 (the moments)
 *    gradients   (4 + elem) P + 12 P / W + 4 (U + E)    (and the gradient)
 *    parameters  (16 + elem) P / W + 2 elem U + 4 U + (elem + 4) E
 * the 2 elem U being two gathered units in the dtype, one in use and one
 * prefetched, 4 U the unit's gradient. The per-token parts do not change.
 * So the memory no R shrinks is the state kept whole, a, and the search
 * for the fewest R starts from R (mem - a) >= T act + b / N, b the sharded
 * state at W = 1; no R helps when a (with fixed) fills a rank.
 *
 * Data parallel (train; spec key dp, dt_plan_req_t.dp = N). The job runs N
 * rings of R ranks, W = N R workers, ring i on the job's ranks [i R,
 * (i + 1) R); each ring trains on its own sequences, and the gradient is
 * summed around each ring, then across the rings (dtengine(1)). The
 * planner chooses R as without dp, for one ring's sequence over R ranks:
 * everything per token is one ring's. What dp changes: the sharded state
 * is divided by W, not R (above); on the CPU engine every rank keeps one
 * more buffer of the largest unit in fp32, 4 U, whatever the shard level
 * (the ring part of a unit between the two levels of the reduction, or of
 * a gather), counted in grads; the collectives over the training state
 * span W ranks (time, below); a step trains N sequences at once, so its
 * FLOPs are N times one ring's and flops_per_token is over N T tokens
 * (with batch B, N B sequences: B after one another on each ring, B
 * times the compute, and on the CPU engine B reductions);
 * the workers, nodes, the cluster's capacity and the placement count W.
 * The GPU engine does not run dp yet (dtengine refuses it): its plan is
 * the same model without the extra buffer.
 *
 * Recompute (train; spec key recompute, dt_plan_req_t.recompute). With
 * none every layer's activations stay until its backward; with layer only
 * each layer's input does, and its forward runs again just before its
 * backward.
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
 * FLOPs. Attention from dt_attn_flops (visible (query, key) pairs only;
 * 4 D per pair per head); the backward costs 2.5 times the forward
 * (attn.h: flash attention recomputes the scores), so training counts 3.5x.
 * Matrix products: 2 flops per parameter per token that multiplies (every
 * layer's Wq, Wk, Wv, Wo, W1, W2, W3 and the LM head; not the embedding
 * lookup), 6 for training. Prefill and train run every layer; attn is one
 * attention call. These are the model's useful FLOPs: recompute's second
 * forward is not in them, only in the time.
 *
 * Ring steps. For each branch (w, r) (dense: (T, 1)) the ranks holding one
 * segment form a group: the most blocks one segment touches (a block is
 * the c tokens of a rank, c / 2 for zigzag, whose ranks hold two chunks),
 * at most R; 1 when segments sit inside blocks. A member's pack holds, per
 * head chunk k, the K and V rows at offset k (about L / r of its L tokens in
 * the segment) of the kv heads that chunk reads. Every step moves one pack
 * to the next member while one block computes; a step's transfer hides when
 * pack / bandwidth <= the step's compute (the rank's branch FLOPs over its
 * steps, at peak times efficiency; causal contiguous layouts make the last
 * rank do 2 - 1/g times the average). The bandwidth is the node's link when
 * the group fits in a node and tiles it, else the network. Compute per step
 * grows as c^2 and the transfer as c, so there is a smallest c that hides:
 * min_c_hidden, found by bisection over c with R fixed.
 *
 * Time: per rank, compute + exposed communication, summed over layers and
 * branches, plus the matrix products, plus for training the collectives
 * over the training state at the slowest link the W ranks span (f = (W -
 * 1) / W; with dp the two levels of the reduction are modelled as one over
 * W ranks, at the network's bandwidth once W ranks leave a node; e = elem
 * on GPUs, 4 on the CPU): none all-reduces the gradient, 2 f P e bytes;
 * optimizer also gathers the updated parameters, f P e more; gradients
 * reduce-scatters the fp32 gradient unit by unit in the backward (f P 4)
 * and gathers the updated parameters (f P e); parameters gathers every
 * unit in the forward and again in the backward (2 f P e) and
 * reduce-scatters its gradient (f P 4). What runs after the backward is
 * not overlapped, nor is anything on the CPU engine, which runs the
 * per-unit transfers in line (dtengine(1)). On GPUs they are prefetched
 * beside a neighbouring unit, so each hides behind one layer's compute on
 * the rank (its matrix products for c tokens and its attention; the
 * backward's 2 and 2.5 times the forward's, with recompute plus a
 * forward), and only the excess counts, except the embedding's, which
 * has no compute beside it. shard_comm_s is all of it, shard_hidden
 * whether every per-unit transfer hides. attn and prefill: one forward;
 * train: one step. With
 * recompute = layer a step also runs every layer's forward once more: its
 * attention forward (compute and the forward's exposed communication) and
 * its matrix products, 2 Pmm_layers c (Pmm less the LM head's vocab dim,
 * which is not recomputed).
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

#include "common/cpuinfo.h"
#include "common/macros.h"
#include "common/mem.h"
#include "plan/planner.h"

#define GiB (1024.0 * 1024.0 * 1024.0)
#define MiB (1024.0 * 1024.0)
#define MAX_RANKS 1000000
#define PLACEMENT_LIST_MAX 4096
#define TOKENS_MAX ((int64_t)1 << 50)

/*-- presets -------------------------------------------------------------------*/

/* peak_fp32: the same machine at fp32 (GPUs without TF32: the non-tensor
 * FP32 peak), used when a job asks for fp32. */
static const struct cluster_preset {
    dt_cluster_t c;
    double peak_fp32;
    int this_cpu; /* peak and efficiency from this machine's CPU */
} clusters[] = {
    /* H100 SXM: 80 GiB HBM3 (76 usable after the CUDA context, allocator
     * slack and fragmentation), 989 TFLOP/s dense bf16, NVLink 4 at 900 GB/s
     * both directions together, one 400 Gb/s NDR InfiniBand port per GPU.
     * Fixed: CUDA context, cuBLAS workspace and NCCL buffers, ~1 GiB. */
    { { "h100-sxm", 8, 0, 76.0 * GiB, 989e12, 0.5, 450e9, 50e9, 1.0 * GiB, 0 }, 67e12, 0 },
    /* H200: the same compute and links, 141 GB HBM3e (about 140 GiB; 133
     * usable). */
    { { "h200", 8, 0, 133.0 * GiB, 989e12, 0.5, 450e9, 50e9, 1.0 * GiB, 0 }, 67e12, 0 },
    /* cpu: one dtengine rank per core, a "node" being one machine of two
     * ranks, 4 GiB per rank. Peak and efficiency: this machine's
     * (common/cpuinfo.h dt_cpu_peak: measured on the CPUs dt was run on,
     * else vector width x FMA pipes x clock), filled in by preset_copy;
     * the figures here are AMD Zen 5's, where the attention kernels'
     * 6-row products reach 270 GFLOP/s and dtengine attn and the tiny
     * training step 0.55 of it. Links: shared-memory copies between ranks
     * of one machine (5 GB/s), 1 GB/s between machines. Fixed: dtengine's
     * max RSS with 16 tokens per rank under mpirun (bench/memory.sh): 13.2
     * MiB at R = 1, 13.5 at 2, 16.5 at 4; 15 MiB. Per peer: Open MPI's
     * shared-memory transport maps and touches buffers for each other
     * rank, about 0.7 MiB each at 1 to 8 ranks of dtengine train
     * (bench/train_memory.sh): 720 KiB. bf16 runs no faster on the CPU
     * kernels. */
    { { "cpu", 2, 0, 4.0 * GiB, 270e9, 0.55, 5e9, 1e9, 15.0 * MiB, 720.0 * 1024 }, 270e9, 1 },
};

/* A preset as planned on this machine: the cpu preset's peak is this
 * CPU's. */
static void preset_copy(const struct cluster_preset *p, dt_cluster_t *out, double *peak_fp32)
{
    *out = p->c;
    if (peak_fp32)
        *peak_fp32 = p->peak_fp32;
    if (p->this_cpu) {
        out->peak_flops = dt_cpu_peak(dt_cpu_this(), &out->efficiency);
        if (peak_fp32)
            *peak_fp32 = out->peak_flops;
    }
}

static const struct cluster_preset *find_cluster(const char *name)
{
    for (size_t i = 0; i < DT_ARRAY_SIZE(clusters); i++)
        if (name != NULL && strcmp(name, clusters[i].c.name) == 0)
            return &clusters[i];
    return NULL;
}

int dt_cluster_preset(const char *name, dt_cluster_t *out, dt_emsg_t *em)
{
    const struct cluster_preset *p = find_cluster(name);

    if (p == NULL)
        return dt_emsg_set(em, DT_EINVAL, "unknown gpu '%s' (known: h100-sxm, h200, cpu)",
                           name ? name : "(null)");
    preset_copy(p, out, NULL);
    return 0;
}

/*-- from a spec -----------------------------------------------------------------*/

static const char *kind_name(enum dt_job_kind k)
{
    return k == DT_KIND_TRAIN ? "train" : k == DT_KIND_PREFILL ? "prefill" : "attn";
}

static const char *prec_name(dt_dtype_t p)
{
    return p == DT_F32 ? "fp32" : p == DT_F16 ? "fp16" : "bf16";
}

const char *dt_shard_name(enum dt_shard_level s)
{
    switch (s) {
    case DT_SHARD_AUTO:
        return "auto";
    case DT_SHARD_NONE:
        return "none";
    case DT_SHARD_OPTIMIZER:
        return "optimizer";
    case DT_SHARD_GRADIENTS:
        return "gradients";
    case DT_SHARD_PARAMETERS:
        return "parameters";
    }
    return "none";
}

int dt_plan_req_from_spec(const dt_spec_t *s, dt_plan_req_t *out, dt_emsg_t *em)
{
    const char *gpu;
    const struct cluster_preset *cp;
    dt_attn_spec_t a = { 0 };
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = dt_spec_check(s, em)) < 0)
        return rc;
    gpu = dt_spec_gpu(s);
    out->cuda = strcmp(dt_spec_device(s), "cuda") == 0;
    out->tokens = s->tokens;

    if ((rc = dt_model_from_spec(s, &out->model, em)) < 0)
        return rc;

    if ((cp = find_cluster(gpu)) == NULL)
        return dt_cluster_preset(gpu, &out->cluster, em);
    double peak_fp32;
    preset_copy(cp, &out->cluster, &peak_fp32);
    if (s->nodes)
        out->cluster.nodes = (int)s->nodes;
    if (s->gpus_per_node)
        out->cluster.gpus_per_node = (int)s->gpus_per_node;

    out->kind = strcmp(s->kind, "train") == 0     ? DT_KIND_TRAIN
                : strcmp(s->kind, "prefill") == 0 ? DT_KIND_PREFILL
                                                  : DT_KIND_ATTN;
    const char *dt = dt_spec_dtype(s);
    out->precision = strcmp(dt, "fp32") == 0 ? DT_F32 : strcmp(dt, "fp16") == 0 ? DT_F16 : DT_BF16;
    if (out->precision == DT_F32)
        out->cluster.peak_flops = peak_fp32;

    out->causal = s->causal_set ? s->causal != 0 : true;
    if (s->layout != NULL)
        dt_layout_parse(s->layout, &out->layout);
    else
        out->layout = out->causal ? DT_LAYOUT_ZIGZAG : DT_LAYOUT_CONTIGUOUS;
    if ((rc = dt_attn_parse_branches(&a, s->segments, s->dilations, em)) < 0)
        return rc;
    out->nbranch = a.nbranch;
    memcpy(out->seg, a.seg, sizeof(out->seg));
    memcpy(out->dil, a.dil, sizeof(out->dil));
    out->ranks = (int)s->ranks;
    out->spares = (int)s->spares;
    /* checked against none | layer by dt_spec_check */
    out->recompute = s->recompute == NULL                 ? DT_RECOMPUTE_AUTO
                     : strcmp(s->recompute, "layer") == 0 ? DT_RECOMPUTE_LAYER
                                                          : DT_RECOMPUTE_NONE;
    /* checked against the four levels by dt_spec_check */
    out->shard = DT_SHARD_AUTO;
    for (enum dt_shard_level l = DT_SHARD_NONE; s->shard != NULL && l <= DT_SHARD_PARAMETERS; l++)
        if (strcmp(s->shard, dt_shard_name(l)) == 0)
            out->shard = l;
    out->batch = s->batch > 0 ? s->batch : 1;
    out->dp = s->dp > 0 ? (int)s->dp : 1;
    return 0;
}

/*-- the model of one job on R ranks ---------------------------------------------*/

typedef struct bev {
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
} bev_t;

typedef struct ev {
    int64_t T, c;
    int R;
    int nb;
    bev_t b[DT_ATTN_MAXBRANCH];
    dt_plan_mem_t mem;
    double attn_flops, flops, seconds, bytes_per_step;
    double step_compute_s, step_comm_s;
    bool hidden;
    double shard_comm_s; /* train */
    bool shard_hidden;
} ev_t;

static double elem_of(dt_dtype_t p)
{
    return p == DT_F32 ? 4.0 : 2.0;
}

static int64_t imin(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int64_t imax2(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static double dmax(double a, double b)
{
    return a > b ? a : b;
}

static int64_t gcd(int64_t a, int64_t b)
{
    while (b != 0) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Train with recompute = layer (AUTO is planned as none; dt_plan_make
 * decides). */
static bool recomp(const dt_plan_req_t *q)
{
    return q->kind == DT_KIND_TRAIN && q->recompute == DT_RECOMPUTE_LAYER;
}

/* The shard level planned (AUTO as none; dt_plan_make decides), none
 * unless training. */
static enum dt_shard_level shard_of(const dt_plan_req_t *q)
{
    return q->kind != DT_KIND_TRAIN || q->shard == DT_SHARD_AUTO ? DT_SHARD_NONE : q->shard;
}

/* The rings (spec dp): 1 unless given. */
static int dp_of(const dt_plan_req_t *q)
{
    return q->dp > 1 ? q->dp : 1;
}

static bool zig(const dt_plan_req_t *q, int R)
{
    return q->layout == DT_LAYOUT_ZIGZAG && R > 1;
}

/* The attention spec of the request over T tokens. */
static dt_attn_spec_t attn_spec(const dt_plan_req_t *q, int64_t T)
{
    dt_attn_spec_t a = { 0 };

    a.T = T;
    a.H = (int)q->model.heads;
    a.Hkv = (int)q->model.kv_heads;
    a.D = dt_model_head_dim(&q->model);
    a.causal = q->causal;
    a.nbranch = q->nbranch;
    memcpy(a.seg, q->seg, sizeof(a.seg));
    memcpy(a.dil, q->dil, sizeof(a.dil));
    a.layout = q->layout;
    return a;
}

/* Parameters, those that multiply every token (matrix products), and of
 * those the layers' (what a recomputed forward multiplies again). */
static void params(const dt_model_cfg_t *m, double *P, double *Pmm, double *Pmm_layers)
{
    double dim = (double)m->dim, kvdim = (double)(dt_model_head_dim(m) * m->kv_heads);
    double qdim = (double)dt_model_head_dim(m) * (double)m->heads;
    double attn = 2 * dim * qdim + 2 * dim * kvdim, ffn = 3 * dim * (double)m->ffn;
    double vd = (double)m->vocab * dim;

    *P = (double)m->layers * (attn + ffn + 2 * dim) + vd + dim + (m->tied ? 0 : vd);
    *Pmm_layers = (double)m->layers * (attn + ffn);
    *Pmm = *Pmm_layers + vd;
}

/* The CPU engine (fp32): what one layer keeps for its backward, per token
 * (see the top). */
static double train_act_per_token_layer(const dt_model_cfg_t *m)
{
    double dim = (double)m->dim, D = (double)dt_model_head_dim(m);
    double qdim = D * (double)m->heads, kvdim = D * (double)m->kv_heads;
    return 4 * (4 * dim + 2 * qdim + 2 * kvdim + 3 * (double)m->ffn + (double)m->heads + 2);
}

/* The CPU engine: activations kept per token per layer, the whole layer's
 * or with recompute its input only. */
static double train_kept_per_token_layer(const dt_plan_req_t *q)
{
    return recomp(q) ? 4 * (double)q->model.dim : train_act_per_token_layer(&q->model);
}

/* The training state per rank (weights, grads, optimizer in mm) at the
 * request's shard level over W ranks (N R with dp), inv_w = 1 / W;
 * inv_w = 0 gives the part that no W shrinks. See the top: U is the
 * largest unit, E the embedding when the head shares it (kept gathered for
 * the head, its gradient alive through the backward). */
static void train_state(const dt_plan_req_t *q, double inv_w, dt_plan_mem_t *mm)
{
    const dt_model_cfg_t *m = &q->model;
    double e = elem_of(q->precision), P, Pmm, Pmm_layers;
    double U = (double)dt_model_unit_max(m), E = m->tied ? (double)m->vocab * m->dim : 0;
    enum dt_shard_level sh = shard_of(q);

    params(m, &P, &Pmm, &Pmm_layers);
    if (e < 4) {
        /* the GPU engine: dtype weights (e P), fp32 gradient (4 P), fp32
         * master copy (4 P, whole until parameters) and moments (8 P) */
        mm->weights = sh == DT_SHARD_PARAMETERS ? e * P * inv_w + 2 * e * U + e * E : e * P;
        mm->grads = sh >= DT_SHARD_GRADIENTS ? 4 * P * inv_w + 4 * (U + E) : 4 * P;
        mm->optimizer = sh == DT_SHARD_PARAMETERS  ? 12 * P * inv_w
                        : sh >= DT_SHARD_OPTIMIZER ? 4 * P + 8 * P * inv_w
                                                   : 12 * P;
        return;
    }
    /* the CPU engine, fp32: the weights are the master copy; with batch > 1
     * a sequence's gradient beside the step's sum; with dp a unit's ring
     * part between the two levels of the reduction (or of a gather) */
    double copies = q->batch > 1 ? 2 : 1, ring_part = dp_of(q) > 1 ? 4 * U : 0;
    /* parameters: two units (one computing, the next one's gather in
     * flight), with dp the gather's own ring part */
    mm->weights = sh == DT_SHARD_PARAMETERS ? 4 * P * inv_w + 4 * (2 * U + E) + ring_part
                                            : 4 * P;
    mm->grads = (sh >= DT_SHARD_GRADIENTS ? 4 * copies * P * inv_w + 4 * (U + E) : 4 * copies * P) +
                ring_part;
    mm->optimizer = sh >= DT_SHARD_OPTIMIZER ? 8 * P * inv_w : 8 * P;
}

/* Bytes per token that grow with c for sure (a lower bound of the per-token
 * memory, for where to start looking for R). */
static double act_per_token(const dt_plan_req_t *q)
{
    const dt_model_cfg_t *m = &q->model;
    double e = elem_of(q->precision), dim = (double)m->dim, H = (double)m->heads;
    double kvdim = (double)(dt_model_head_dim(m) * m->kv_heads);

    switch (q->kind) {
    case DT_KIND_ATTN:
        return dim * e + 2 * kvdim * e + dim * 4 + H * 4;
    case DT_KIND_PREFILL: {
        double attn = e * (2 * dim + 2 * kvdim) + 4 * dim + 4 * H;
        double ffn = e * (dim + 3 * (double)m->ffn);
        return dim * e + dmax(attn, ffn);
    }
    case DT_KIND_TRAIN:
        /* on GPUs (16-bit compute): what dtengine train --device cuda keeps */
        if (e < 4)
            return (double)m->layers *
                   dt_model_gpu_train_bytes(m, (int)e, recomp(q)).per_token_layer;
        return (double)m->layers * train_kept_per_token_layer(q) + 4 * (2 * dim + 1);
    }
    return 0;
}

/* One branch on R ranks of c tokens: group, pack, memory. */
static void branch_shape(const dt_plan_req_t *q, const dt_attn_spec_t *a, int b, int R, int64_t c,
                         bev_t *o)
{
    dt_attn_branch_t br = dt_attn_branch(a, b);
    double e = elem_of(q->precision);
    bool zz = zig(q, R) && br.w < a->T;
    int64_t block = zz ? c / 2 : c, chunks;

    o->w = br.w;
    o->r = br.r;
    if (br.w >= a->T) {
        o->group = R;
    } else {
        /* segments start at multiples of w, blocks at multiples of block:
         * a segment starts at an offset into a block that is a multiple of
         * gcd(w, block), at worst block - gcd, and touches the blocks up to
         * that offset + w */
        int64_t g = gcd(br.w, block);
        chunks = ceil_div(block - g + br.w, block);
        o->group = (int)imin(chunks, R);
    }
    o->segs = zz ? 2 : 1;
    o->L = (double)imin(br.w, block);

    /* pack: per head chunk, K and V rows at its offset, of the kv heads it reads */
    int64_t nrow = ceil_div((int64_t)o->L, br.r);
    double kvrows = 0;
    for (int k = 0; k < br.nchunk; k++)
        kvrows += dt_attn_chunk(a, &br, k).nkv;
    o->pack = 2.0 * (double)nrow * kvrows * a->D * e;

    /* ring buffers: a ring of one never receives; on the CPU, dense
     * attention on one rank reads K and V (and adds their gradients) where
     * they lie, with no pack at all */
    if (!q->cuda && a->nbranch == 0 && R == 1)
        o->buffers = 0;
    else {
        o->buffers = (o->group > 1 ? 2 : 1) * o->pack;
        if (q->kind == DT_KIND_TRAIN)
            o->buffers += (o->group > 1 ? 4 : 2) * o->pack * 4.0 / e;
    }
    /* index arrays: my positions and local rows (L each), the peer's
     * positions (L / r), a member record per rank */
    o->work = 8.0 * (2 * o->L + (double)nrow) + 48.0 * R;
    /* the CPU kernels pack one head's K^T and V per block (the backward:
     * K^T, V^T and K), fp32, and per query tile of 96 rows its Q (the
     * backward: Q and dO, as rows and as panels); they keep the block's
     * key positions per head chunk */
    if (!q->cuda)
        o->work += (q->kind == DT_KIND_TRAIN ? 3.0 * nrow + 4.0 * 96 : 2.0 * nrow + 96.0) *
                       a->D * 4 +
                   8.0 * (double)nrow * (br.nchunk - 1);
    /* gathered q (elem), o and lse (fp32) per head chunk, unless the branch
     * covers all my rows undilated (the engine then works in place) */
    if (!(br.r == 1 && (int64_t)o->L == c)) {
        double per = (double)nrow * a->H * (a->D * (e + 4) + 4);
        o->work += q->kind == DT_KIND_TRAIN ? 2 * per : per; /* + dout, dq, delta */
    }
}

/* Per-rank compute and communication of one branch (one attention
 * forward, or forward + backward for train). */
static void branch_time(const dt_plan_req_t *q, const dt_attn_spec_t *a, int R, bev_t *o)
{
    const dt_cluster_t *cl = &q->cluster;
    double pe = cl->peak_flops * cl->efficiency, e = elem_of(q->precision);
    double imb = q->causal && q->layout == DT_LAYOUT_CONTIGUOUS ? 2.0 - 1.0 / o->group : 1.0;
    dt_attn_spec_t one = *a;

    if (q->nbranch > 0) {
        one.nbranch = 1;
        one.seg[0] = o->w;
        one.dil[0] = o->r;
    }
    o->flops = dt_attn_flops(&one);
    o->compute_s = o->flops / R / pe * imb;
    o->step_compute_s = o->compute_s / (o->segs * o->group);
    o->step_comm_s = 0;
    o->exposed_s = 0;
    o->exposed_fwd_s = 0;
    o->hidden = true;
    if (o->group > 1) {
        int gpn = cl->gpus_per_node;
        double bw = o->group <= gpn && gpn % o->group == 0 ? cl->nvlink_bps : cl->net_bps;
        double transfers = (double)o->segs * (o->group - 1);

        o->step_comm_s = o->pack / bw;
        o->exposed_s = transfers * dmax(0, o->step_comm_s - o->step_compute_s);
        o->exposed_fwd_s = o->exposed_s;
        o->hidden = o->step_comm_s <= o->step_compute_s;
        if (q->kind == DT_KIND_TRAIN) {
            /* backward: 2.5x the compute; K/V again plus their fp32 gradients */
            double cb = 2.5 * o->step_compute_s, mb = o->pack * (1 + 4.0 / e) / bw;
            o->exposed_s += transfers * dmax(0, mb - cb);
            o->hidden = o->hidden && mb <= cb;
        }
    }
}

/* The step's collectives over the training state on W ranks (R, or N R
 * with dp) at bw (see the top): their time in all and whether those of
 * each unit hide behind its compute in v; returns the part that does not
 * hide. c tokens per rank; attn_fwd_s one layer's attention forward on
 * this rank. */
static double state_comm(const dt_plan_req_t *q, double W, double c, double bw, double attn_fwd_s,
                         ev_t *v)
{
    const dt_model_cfg_t *m = &q->model;
    double P, Pmm, Pmm_layers, e = elem_of(q->precision), f = (W - 1.0) / W;
    double pe = q->cluster.peak_flops * q->cluster.efficiency, L = (double)m->layers;
    double vd = (double)m->vocab * m->dim;
    enum dt_shard_level sh = shard_of(q);

    params(m, &P, &Pmm, &Pmm_layers);
    /* the units: the embedding, L layers, the final norm with the head */
    double Ue = vd, Ul = Pmm_layers / L + 2.0 * m->dim, Uh = m->dim + (m->tied ? 0 : vd);
    /* bytes sent per unit byte in the forward and the backward (gathers
     * of the dtype copy, reduce-scatters of the fp32 gradient), and after
     * the backward per parameter: none all-reduces, optimizer all-reduces
     * and gathers the updated parameters, gradients gathers them */
    double fwd = sh == DT_SHARD_PARAMETERS ? e : 0;
    double bwd = sh == DT_SHARD_PARAMETERS ? e + 4 : sh == DT_SHARD_GRADIENTS ? 4 : 0;
    double after = sh == DT_SHARD_NONE        ? 2 * e
                   : sh == DT_SHARD_OPTIMIZER ? 3 * e
                   : sh == DT_SHARD_GRADIENTS ? e
                                              : 0;
    /* one unit is prefetched while its neighbour computes, so a unit's
     * transfers hide behind a layer's compute on this rank: its matrix
     * products and attention (the backward 2x and 2.5x the forward, with
     * recompute one forward more). The embedding's have none to hide
     * behind: its gather starts the step, its gradient ends the backward. */
    double lf = 2 * (Pmm_layers / L) * c / pe + attn_fwd_s;
    double lb = 4 * (Pmm_layers / L) * c / pe + 2.5 * attn_fwd_s + (recomp(q) ? lf : 0);
    double tl_f = f * fwd * Ul / bw, tl_b = f * bwd * Ul / bw;
    double th_f = f * fwd * Uh / bw, th_b = f * bwd * Uh / bw;

    v->shard_comm_s = f * ((fwd + bwd) * P + after * P) / bw;
    if (!q->cuda) {
        /* the CPU engine runs them in line: nothing hides */
        v->shard_hidden = v->shard_comm_s == 0;
        return v->shard_comm_s;
    }
    v->shard_hidden = v->shard_comm_s == 0 || (sh >= DT_SHARD_GRADIENTS && tl_f <= lf &&
                                               tl_b <= lb && th_f <= lf && th_b <= lb);
    return f * ((fwd + bwd) * Ue + after * P) / bw + L * (dmax(0, tl_f - lf) + dmax(0, tl_b - lb)) +
           dmax(0, th_f - lf) + dmax(0, th_b - lb);
}

/* Everything but the placement, for R ranks (T % R checked by the caller). */
static void evaluate(const dt_plan_req_t *q, int64_t T, int R, ev_t *v)
{
    const dt_model_cfg_t *m = &q->model;
    const dt_cluster_t *cl = &q->cluster;
    dt_attn_spec_t a = attn_spec(q, T);
    double e = elem_of(q->precision), P = 0, Pmm = 0, Pmm_layers = 0;
    double pe = cl->peak_flops * cl->efficiency;
    double layers = q->kind == DT_KIND_ATTN ? 1 : (double)m->layers;
    double attn_s = 0, attn_fwd_s = 0, worst = -1;

    memset(v, 0, sizeof(*v));
    v->T = T;
    v->R = R;
    v->c = T / R;
    v->nb = q->nbranch > 0 ? q->nbranch : 1;
    v->hidden = true;
    v->shard_hidden = true; /* nothing to send unless training on W > 1 */
    double buffers = 0, work = 0;
    for (int b = 0; b < v->nb; b++) {
        bev_t *o = &v->b[b];
        branch_shape(q, &a, q->nbranch > 0 ? b : -1, R, v->c, o);
        branch_time(q, &a, R, o);
        buffers = dmax(buffers, o->buffers);
        work = dmax(work, o->work);
        v->attn_flops += o->flops;
        attn_fwd_s += o->compute_s;
        attn_s += (q->kind == DT_KIND_TRAIN ? 3.5 : 1.0) * o->compute_s + o->exposed_s;
        if (recomp(q)) /* the layer's forward once more, its ring included */
            attn_s += o->compute_s + o->exposed_fwd_s;
        v->hidden = v->hidden && o->hidden;
        /* the plan's ring step is its least hidden branch's */
        if (o->group > 1 && o->step_comm_s / o->step_compute_s > worst) {
            worst = o->step_comm_s / o->step_compute_s;
            v->bytes_per_step = o->pack;
            v->step_compute_s = o->step_compute_s;
            v->step_comm_s = o->step_comm_s;
        }
    }
    if (worst < 0)
        v->step_compute_s = v->b[0].step_compute_s;

    /* memory */
    double c = (double)v->c, dim = (double)m->dim;
    dt_plan_mem_t *mm = &v->mem;
    if (q->kind != DT_KIND_ATTN)
        params(m, &P, &Pmm, &Pmm_layers);
    mm->weights = P * e;
    mm->activations = c * act_per_token(q);
    mm->kv_buffers = buffers;
    mm->workspace = work;
    if (q->kind == DT_KIND_TRAIN)
        train_state(q, 1.0 / ((double)dp_of(q) * R), mm);
    if (q->kind == DT_KIND_TRAIN && e < 4) {
        /* the GPU engine's own accounting (spec/model.h); the head in
         * chunks of rows */
        dt_gpu_train_bytes_t gb = dt_model_gpu_train_bytes(m, (int)e, recomp(q));
        mm->workspace += c * gb.per_token + gb.fixed;
    } else if (q->kind == DT_KIND_TRAIN) {
        /* the CPU engine, fp32 (see the top) */
        double D = (double)dt_model_head_dim(m), qdim = D * (double)m->heads;
        double kvdim = D * (double)m->kv_heads;
        mm->workspace += c * (2 * 4 * (double)m->vocab + 4 * 4 * dim +
                              4 * (2 * qdim + 2 * kvdim + 3 * (double)m->ffn) + 24) +
                         8 * (double)T;
        if (recomp(q))
            mm->workspace += c * (train_act_per_token_layer(m) + 4 * dim);
    }
    /* the transport's buffers per other process of the job (the cpu
     * preset's; GPU presets count NCCL's in fixed_bytes) */
    mm->fixed = cl->fixed_bytes + cl->peer_bytes * (dp_of(q) * (double)R - 1);
    mm->total = mm->weights + mm->grads + mm->optimizer + mm->activations + mm->kv_buffers +
                mm->workspace + mm->fixed;

    /* flops and time */
    double Tt = (double)T;
    switch (q->kind) {
    case DT_KIND_ATTN:
        v->flops = v->attn_flops;
        v->seconds = attn_s;
        break;
    case DT_KIND_PREFILL:
        v->flops = layers * v->attn_flops + 2 * Pmm * Tt;
        v->seconds = layers * attn_s + 2 * Pmm * c / pe;
        break;
    case DT_KIND_TRAIN: {
        /* the collectives span all W ranks: every ring's, then across */
        double W = (double)dp_of(q) * R;
        double bw = W <= cl->gpus_per_node ? cl->nvlink_bps : cl->net_bps;
        /* the useful FLOPs, every ring's; recompute's forward is in the
         * time (attn_s and the layers' matrix products once more), not in
         * them */
        /* a step is batch sequences on each ring, one after another */
        double B = q->batch > 1 ? (double)q->batch : 1.0;
        v->flops = dp_of(q) * B * (layers * 3.5 * v->attn_flops + 6 * Pmm * Tt);
        /* the rings run side by side: the time is one ring's, plus the
         * collectives over the training state, as far as they do not hide:
         * the CPU engine reduces each sequence's gradient, the GPU engine
         * the step's sum once */
        v->seconds = B * (layers * attn_s + (6 * Pmm + (recomp(q) ? 2 * Pmm_layers : 0)) * c / pe) +
                     (q->cuda ? 1.0 : B) * state_comm(q, W, c, bw, attn_fwd_s, v);
        break;
    }
    }
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
                    dt_shard_name(q->shard), kind_name(q->kind));

    if (q->dp < 0 || q->dp > 65536)
        return fail(p, em, DT_EINVAL, "dp=%d: the rings must be 1 to 65536", q->dp);
    if (q->kind != DT_KIND_TRAIN && q->dp > 1)
        return fail(p, em, DT_EINVAL,
                    "dp = %d is for train jobs: kind %s has no gradient to reduce across "
                    "rings (run more jobs instead)",
                    q->dp, kind_name(q->kind));

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
                    kind_name(q->kind));
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
    if (zig(q, R) && T % (2 * (int64_t)R) != 0) {
        snprintf(why, n,
                 "tokens T=%lld is not divisible by 2R=%lld (zigzag: each of the %d "
                 "ranks holds two chunks of c/2 tokens)",
                 (long long)T, 2 * (long long)R, R);
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
    int64_t gran = zig(q, R) ? 2 : 1, lo, hi;
    ev_t v;

    evaluate(q, gran * R, R, &v);
    if (v.hidden)
        return gran;
    for (hi = 2 * gran;; hi *= 2) {
        if (hi * R > TOKENS_MAX)
            return 0;
        evaluate(q, hi * R, R, &v);
        if (v.hidden)
            break;
    }
    lo = hi / 2; /* not hidden at lo, hidden at hi; both multiples of gran */
    while (hi - lo > gran) {
        int64_t mid = lo + (hi - lo) / 2 / gran * gran;
        evaluate(q, mid * R, R, &v);
        if (v.hidden)
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}

/* Fill p from the evaluation at v->R, with the placement of every worker
 * (N v->R, checked against MAX_RANKS by the caller). */
static void fill(const dt_plan_req_t *q, const ev_t *v, dt_plan_t *p)
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
    p->step_compute_s = v->step_compute_s;
    p->step_comm_s = v->step_comm_s;
    p->comm_hidden = v->hidden;
    p->shard_comm_s = v->shard_comm_s;
    p->shard_hidden = v->shard_hidden;
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

/* The memory no R shrinks (*a: the training state kept whole, or a
 * prefill's weights, and fixed; its parts in *whole) and the part that
 * shrinks as 1 / R (*b: the sharded state at R = 1, over the N ranks of
 * the dp rings). */
static void constant_parts(const dt_plan_req_t *q, dt_plan_mem_t *whole, double *a, double *b)
{
    dt_plan_mem_t one = { 0 };
    double P, Pmm, Pmm_layers;

    memset(whole, 0, sizeof(*whole));
    if (q->kind == DT_KIND_TRAIN) {
        train_state(q, 0, whole);
        train_state(q, 1.0 / dp_of(q), &one);
    } else if (q->kind == DT_KIND_PREFILL) {
        params(&q->model, &P, &Pmm, &Pmm_layers);
        whole->weights = one.weights = P * elem_of(q->precision);
    }
    whole->fixed = q->cluster.fixed_bytes;
    *a = whole->weights + whole->grads + whole->optimizer + whole->fixed;
    *b = one.weights + one.grads + one.optimizer - (*a - whole->fixed);
}

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

/* The plan at the request's shard level and recompute (AUTO as none);
 * *bound says what a refusal is about. With R free, rmax > 0 bounds the
 * ranks looked at (dt_plan_make wants fewer than a plan it has). */
static int plan_one(const dt_plan_req_t *q, int rmax, dt_plan_t *p, enum bound *bound,
                    dt_emsg_t *em)
{
    int64_t T = q->tokens;
    int cap, R, rc, N;
    char why[256];
    ev_t v;

    memset(p, 0, sizeof(*p));
    *bound = BOUND_NONE;
    p->recompute = recomp(q);
    p->shard = shard_of(q);
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
        evaluate(q, T, R, &v);
        fill(q, &v, p);
    } else {
        /* the fewest ranks that fit: start where the per-token part and
         * the sharded state alone would fill the memory the parts no R
         * shrinks leave: R (mem - a) >= T act + b / N */
        int64_t rlimit = MAX_RANKS / N; /* every ring's ranks: at most MAX_RANKS */
        int64_t limit = imin(rlimit, q->layout == DT_LAYOUT_ZIGZAG ? imax2(T / 2, 1) : T);
        int64_t start = 1, last = 0;
        dt_plan_mem_t whole;
        double a, b;

        if (rmax > 0)
            limit = imin(limit, rmax);
        constant_parts(q, &whole, &a, &b);
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
        double need = ((double)T * act_per_token(q) + b) / (q->cluster.mem_bytes - a);
        if (need > 1)
            start = need >= (double)MAX_RANKS + 1 ? MAX_RANKS + 1 : (int64_t)ceil(need);
        R = 0;
        for (int64_t r = start; r <= limit; r++) {
            if (divides(q, T, (int)r, why, sizeof(why)) < 0)
                continue;
            last = r;
            evaluate(q, T, (int)r, &v);
            if (v.mem.total <= q->cluster.mem_bytes) {
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
                        q->layout == DT_LAYOUT_ZIGZAG ? " as zigzag needs (2R | T)" : "");
        }
        if (R == 0) {
            evaluate(q, T, (int)last, &v);
            fill(q, &v, p);
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
static void without_recompute(const dt_plan_req_t *q, const dt_plan_t *p, ev_t *v)
{
    dt_plan_req_t t = *q;

    t.shard = p->shard;
    t.recompute = DT_RECOMPUTE_NONE;
    evaluate(&t, q->tokens, p->ranks, v);
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
    ev_t v;

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
        constant_parts(&t, &whole, &a, &b);
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
    ev_t v;

    layer.shard = p->shard;
    layer.recompute = DT_RECOMPUTE_LAYER;
    if (skipped_layer) {
        snprintf(p->note, sizeof(p->note),
                 "recompute = layer would not help: it shrinks the activations (%.0f to %.0f "
                 "KiB per token), not the %.2f GiB of weights, grads and optimizer each rank "
                 "holds%s",
                 act_per_token(q) / 1024, act_per_token(&layer) / 1024,
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

int dt_plan_make(const dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    static const enum dt_shard_level levels[] = { DT_SHARD_NONE, DT_SHARD_OPTIMIZER,
                                                  DT_SHARD_GRADIENTS, DT_SHARD_PARAMETERS };
    static const enum dt_recompute settings[] = { DT_RECOMPUTE_NONE, DT_RECOMPUTE_LAYER };
    /* on the user's one rank (and one ring) every level keeps the whole
     * state */
    bool auto_shard = q->kind == DT_KIND_TRAIN && q->shard == DT_SHARD_AUTO &&
                      (q->ranks != 1 || dp_of(q) > 1);
    bool auto_rc = q->kind == DT_KIND_TRAIN && q->recompute == DT_RECOMPUTE_AUTO;
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
    /* sharding first, recompute after: at each recompute setting (none,
     * then layer) the shard level with the fewest ranks, the least
     * sharding among equals; layer only when no level fits without */
    for (int i = 0; i < nrc && !have_best; i++) {
        for (int j = 0; j < nsh; j++) {
            dt_plan_req_t t = *q;
            if (auto_shard)
                t.shard = levels[j];
            if (auto_rc)
                t.recompute = settings[i];
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
        return 0;
    }
    /* nothing fits: the last plan tried, the most sharding and
     * recomputation the request leaves open */
    *p = last;
    if (tried > 1 || (auto_rc && whole[p->shard]))
        note_refused(q, p, auto_rc && whole[p->shard] && !p->recompute);
    return dt_emsg_set(em, last_rc, "%s", last_em.s);
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
    json_object_set_new(o, "memory_breakdown", mem);
    json_object_set_new(o, "flops", json_real(p->flops));
    json_object_set_new(o, "flops_per_token", json_real(p->flops_per_token));
    json_object_set_new(o, "bytes_per_step", bytes(p->bytes_per_step));
    json_object_set_new(o, "step_compute_s", json_real(p->step_compute_s));
    json_object_set_new(o, "step_comm_s", json_real(p->step_comm_s));
    json_object_set_new(o, "seconds", json_real(p->seconds));
    json_object_set_new(o, "comm_hidden", json_boolean(p->comm_hidden));
    json_object_set_new(o, "min_c_hidden", json_integer(p->min_c_hidden));
    json_object_set_new(o, "shard_comm_s", json_real(p->shard_comm_s));
    json_object_set_new(o, "shard_hidden", json_boolean(p->shard_hidden));
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
    json_object_set_new(o, "kind", json_string(kind_name(q->kind)));
    json_object_set_new(o, "device", json_string(q->cuda ? "cuda" : "cpu"));
    json_object_set_new(o, "dtype", json_string(prec_name(q->precision)));
    json_object_set_new(o, "precision", json_string(prec_name(q->precision)));
    json_object_set_new(o, "causal", json_boolean(q->causal));
    json_object_set_new(o, "layout", json_string(dt_layout_name(q->layout)));
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
