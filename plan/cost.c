/* SPDX-License-Identifier: MIT
 *
 * The planner's cost model (cost.h): what one choice costs, a request on R
 * ranks at its shard level and recompute setting. Memory per rank broken
 * down, FLOPs, bytes per ring step and whether each branch's transfers
 * hide, the collectives over the training state, time; and the memory no
 * R shrinks, where the search for R starts. First principles, pure
 * computation, no I/O.
 *
 * Not here: which R, shard level and recompute setting to take, the checks
 * of the request, the refusals and their notes, the placement and the JSON
 * (planner.c, which calls this file; this file calls nothing of it); the
 * presets' figures and the request from a spec (request.c).
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
 *    for dilated branches the gathered q, o, lse of each head chunk. On
 *    GPUs, unless a mask sends the blocks to dt's kernels, the scratch of
 *    blocks through cuDNN (dt_attn_cudnn_bytes, spec/attn_spec.h: a query
 *    chunk's o or dq and stats, the keys' dK/dV, the deterministic
 *    backward's scores, the backward's copy of o), as if cuDNN were
 *    installed (the default where it is).
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
 *    (engine/model/model.c, engine/cmd/train.c and train_cpu.c). Weights,
 *    gradient and AdamW's two moments, 4 P each (weights 4 P, grads 4 P,
 *    optimizer 8 P; with batch > 1 a sequence's gradient beside the
 *    step's, grads 8 P).
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
 * With offload = optimizer (GPU, shard none or optimizer) the master copy
 * and the moments leave the device: optimizer 4 (V dim + (2 L + 1) dim)
 * (the fp32 parameters the GPU reads as such: the embedding and the norm
 * gains) + 4 min(P, 2^24) (the staging buffer the parameters come up
 * through), and the host holds them instead (dt_plan_mem_t.host).
 * Host memory per rank (GPU): the fp32 parameters 4 P and the moments
 * 8 P (8 P / W sharded) that dtengine keeps page-locked for checkpoints
 * either way, and with offload = optimizer the gradient's slice, 4 P
 * (4 P / W sharded). The CPU engine's memory is all host memory: host =
 * total.
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
 * a gather), counted in grads; the GPU engine reduces and gathers the
 * ring part in place in its unit buffers, and with sharded gradients
 * keeps a second reduce-scatter scratch for the replicas' level
 * (min(N units, DT_GPU_RS_BYTES), in grads); the collectives over the training state
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
 * min_c_hidden, found by bisection over c with R fixed (planner.c).
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
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "plan/cost.h"
#include "plan/planner.h"

static double elem_of(dt_dtype_t p)
{
    return p == DT_F32 ? 4.0 : 2.0;
}

static double dmax(double a, double b)
{
    return a > b ? a : b;
}

static double dmin(double a, double b)
{
    return a < b ? a : b;
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

/* The attention spec of the request over T tokens. */
static dt_attn_spec_t attn_spec(const dt_plan_req_t *q, int64_t T)
{
    dt_attn_spec_t a = { 0 };

    a.T = T;
    a.H = (int)q->model.heads;
    a.Hkv = (int)q->model.kv_heads;
    a.D = dt_model_head_dim(&q->model);
    a.causal = q->causal;
    a.nondet = q->nondet;
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
/* The fp32 state a training rank holds on the host for checkpoints, and
 * writes whole into each in-memory copy: the parameters (its slice with
 * shard = parameters) and both moments (its slice from shard = optimizer). */
static double held_state(const dt_plan_req_t *q, double inv_w)
{
    double P, Pmm, Pmm_layers;
    enum dt_shard_level sh = shard_of(q);

    params(&q->model, &P, &Pmm, &Pmm_layers);
    const double S = P * inv_w;
    return (sh == DT_SHARD_PARAMETERS ? 4 * S : 4 * P) + 8 * (sh >= DT_SHARD_OPTIMIZER ? S : P);
}

static void train_state(const dt_plan_req_t *q, double inv_w, dt_plan_mem_t *mm)
{
    const dt_model_cfg_t *m = &q->model;
    double e = elem_of(q->precision), P, Pmm, Pmm_layers;
    double U = (double)dt_model_unit_max(m), E = m->tied ? (double)m->vocab * m->dim : 0;
    enum dt_shard_level sh = shard_of(q);

    params(m, &P, &Pmm, &Pmm_layers);
    if (e < 4) {
        /* the GPU engine (engine/model/train_cuda.c): dtype weights (e P),
         * fp32 gradient (4 P), fp32 master copy (4 P) and moments (8 P),
         * each whole or this rank's slice S as the level says; sharded
         * gradients add two fp32 unit buffers, a tied embedding's and the
         * reduce-scatter's scratch (spec/model.h), sharded parameters two
         * dtype unit buffers and two units' fp32 norm gains */
        const double S = P * inv_w, d = (double)m->dim;
        const bool sg = sh >= DT_SHARD_GRADIENTS, sp = sh == DT_SHARD_PARAMETERS;
        const bool host = (q->offload & DT_OFFLOAD_OPTIMIZER) != 0;
        double slice = sh >= DT_SHARD_OPTIMIZER ? S : P;
        /* the scratch: none on one rank, R units or the cap (no R: the
         * cap); with dp the replicas' level its own, N units or the cap */
        const double N = dp_of(q), cap = (double)DT_GPU_RS_BYTES;
        const double Rr = inv_w > 0 ? 1 / (inv_w * N) : 0;
        double rs = inv_w <= 0 ? cap : Rr <= 1 ? 0 : dmin(cap, 4 * U * Rr);
        if (N > 1)
            rs += dmin(cap, 4 * U * N);
        /* the unit buffers: the largest unit's and a layer's */
        const double Ul = (double)dt_model_unit_layer(m);
        mm->weights = sp ? e * S + 2 * e * U + 2 * 2 * 4 * d : e * P;
        mm->grads = sg ? 4 * S + 4 * (U + Ul + E) + rs : 4 * P;
        mm->optimizer = sp ? 12 * S : sh >= DT_SHARD_OPTIMIZER ? 4 * P + 8 * S : 12 * P;
        /* the host's copies for checkpoints: P (the slice with sp), M, V */
        mm->host = held_state(q, inv_w);
        if (host) {
            /* the optimizer on the host: the device keeps the fp32 ranges
             * it reads (the embedding, the norms; with sp their part in
             * the slice, at most the slice: the embedding leads the array)
             * and the staging buffer; the host the slice's gradient beside
             * P, M, V. Sharded gradients stream there unit by unit: no
             * slice of them on the device, and with batch > 1 two units'
             * parts in page-locked memory to add a sequence's */
            double f32 = (double)m->vocab * d + (2.0 * m->layers + 1) * d;
            double stage = dmin(sp ? S : P, (double)(1 << 24));
            mm->optimizer = 4 * (sp ? dmin(f32, S) : f32) + 4 * stage;
            mm->host += 4 * slice;
            if (sg) {
                mm->grads -= 4 * S;
                if (q->batch > 1)
                    mm->host += 2 * 4 * dmin(U, slice);
            }
        }
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

/* Train on GPUs with offload: PCIe bytes per step per GPU, each way. The
 * offloaded layer inputs go down once in the forward and up once in the
 * backward (layers c d in the checkpoint dtype, each sequence of the
 * batch), on a copy stream beside compute: hidden when they take no
 * longer than the step's compute. The host optimizer's slice of the
 * gradient goes down (4 bytes a parameter of the slice: with sharded
 * gradients unit by unit during the backward, else after it) and the
 * parameters come up (4 of the whole, or of the slice with shard =
 * parameters) after the update, not overlapped yet: their time adds to
 * the step's. */
static void pcie(const dt_plan_req_t *q, double W, int64_t c, double P, double compute_s,
                 dt_cost_t *v)
{
    const dt_cluster_t *cl = &q->cluster;
    const enum dt_shard_level sh = shard_of(q);
    double B = q->batch > 1 ? (double)q->batch : 1.0, act = 0, down = 0, up = 0;

    v->pcie_bytes = v->pcie_s = 0;
    v->pcie_hidden = true;
    if (!q->cuda || q->offload == 0 || !(cl->pcie_bps > 0))
        return;
    if (recomp(q) && (q->offload & DT_OFFLOAD_ACTIVATIONS))
        act = B * (double)q->model.layers * (double)c * (double)q->model.dim *
              (q->ckpt_dtype == DT_CKPT_BF16 ? 2 : 4);
    if (q->offload & DT_OFFLOAD_OPTIMIZER) {
        double slice = sh >= DT_SHARD_OPTIMIZER ? P / W : P;
        down = 4 * slice;
        up = sh == DT_SHARD_PARAMETERS ? 4 * slice : 4 * P;
    }
    v->pcie_bytes = act + dmax(down, up);
    v->pcie_s = v->pcie_bytes / cl->pcie_bps;
    /* sharded gradients stream down unit by unit during the backward
     * (about two thirds of the compute), beside the layer inputs coming
     * up; the parameters' way up follows the update */
    double bwd_s = compute_s * 2.0 / 3.0, act_s = act / cl->pcie_bps;
    double down_s = sh >= DT_SHARD_GRADIENTS ? dmax(0, down / cl->pcie_bps - bwd_s) : down / cl->pcie_bps;
    double opt_s = dmax(down_s, up / cl->pcie_bps);
    v->pcie_hidden = act_s <= compute_s && opt_s == 0;
    v->seconds += opt_s + dmax(0, act_s - compute_s);
}

/* The GPU engine's account (spec/model.h) for this request at c tokens a
 * GPU: its dtype, recompute, the kept inputs' dtype and offload. */
static dt_gpu_train_bytes_t gpu_bytes(const dt_plan_req_t *q, int64_t c)
{
    return dt_model_gpu_train_bytes(&q->model, (int)elem_of(q->precision), recomp(q), c,
                                    q->ckpt_dtype == DT_CKPT_BF16 ? 2 : 4,
                                    recomp(q) && (q->offload & DT_OFFLOAD_ACTIVATIONS));
}

/* The activations per token at c tokens per rank (the GPU engine's
 * account, spec/model.h, for train on GPUs). */
static double act_per_token_at(const dt_plan_req_t *q, int64_t c)
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
                   gpu_bytes(q, c).per_token_layer;
        return (double)m->layers * train_kept_per_token_layer(q) + 4 * (2 * dim + 1);
    }
    return 0;
}

double dt_cost_act_per_token(const dt_plan_req_t *q)
{
    /* the fewest bytes: at many tokens a rank, the GPU's MLP tiled */
    return act_per_token_at(q, INT64_MAX);
}

/* What the masks known before the data (windows, block patterns; a
 * document mask is the data's and is planned as one document, the most
 * work) do to dense attention over T on R ranks, from the masks the
 * engine builds (spec/mask_rules.h): share, the layers' mean fraction of
 * the unmasked pairs attended; group, the most ranks whose K/V one rank's
 * queries need (the masked ring sends to those only); imbalance, the
 * most loaded rank's pairs over the mean. Without masks: share 1, group
 * R and the layout's own imbalance (left to branch_time); on GPUs the
 * group stays R, the GPU ring passing K/V to every rank. A pattern of
 * more than 2^22 blocks, or whose block does not divide T, is planned
 * as no mask (its rows would not be built for the estimate). */
typedef struct mask_effect {
    bool any;
    double share, imbalance;
    int group;
} mask_effect_t;

#define MASK_PLAN_BLOCKS (INT64_C(1) << 22)

static void mask_layer(const dt_plan_req_t *q, const dt_mask_t *m, int R, double *pairs,
                       double *imb, int *group)
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS], kr[DT_LAYOUT_MAXRUNS];
    double most = 0, all = 0;

    *group = 1;
    for (int r = 0; r < R; r++) {
        int nr = dt_layout_runs(q->layout, m->T, R, r, runs);
        double w = 0;
        for (int i = 0; i < nr; i++)
            w += dt_mask_pairs(m, 0, runs[i].start, runs[i].start + runs[i].len, 0, m->T);
        most = dmax(most, w);
        all += w;
        /* the senders this rank needs: every rank for big rings but three
         * sampled (the ends and the middle: masks are alike along it) */
        if (R > 64 && r != 0 && r != R / 2 && r != R - 1)
            continue;
        int need = 0;
        for (int src = 0; src < R; src++) {
            int nk = dt_layout_runs(q->layout, m->T, R, src, kr), hit = 0;
            for (int i = 0; i < nr && !hit; i++)
                for (int j = 0; j < nk && !hit; j++)
                    hit = dt_mask_box(m, 0, runs[i].start, runs[i].start + runs[i].len - 1,
                                      kr[j].start, kr[j].start + kr[j].len - 1) != DT_MASK_EMPTY;
            need += hit;
        }
        *group = (int)imin(R, need > *group ? need : *group);
    }
    *pairs = all;
    *imb = all > 0 ? most / (all / R) : 1.0;
}

static void mask_effect(const dt_plan_req_t *q, int64_t T, int R, mask_effect_t *e)
{
    const dt_mask_rules_t *r = &q->masks;
    double L = q->kind == DT_KIND_ATTN ? 1 : (double)q->model.layers;
    double plain = q->causal ? (double)T * ((double)T + 1) / 2 : (double)T * (double)T;

    e->any = false;
    e->share = e->imbalance = 1;
    e->group = R;
    bool pat = dt_mask_rules_pattern(r);
    if (q->nbranch > 0 || (r->window == 0 && !pat) ||
        (pat && (T % r->block != 0 || T / r->block > MASK_PLAN_BLOCKS)))
        return;
    /* the windowed layers, then (alternating) the others */
    double nw = L, share = 0, imb = 0;
    int group = 0;
    if (dt_mask_rules_alternate(r, (int64_t)L) && q->kind != DT_KIND_ATTN)
        nw = (double)((int64_t)(L - 1) / r->window_every + 1);
    for (int k = 0; k < 2; k++) {
        double n = k == 0 ? nw : L - nw, pairs, im;
        int g;
        dt_mask_t m;
        if (n <= 0)
            continue;
        if (dt_mask_rules_mask(r, T, q->causal, k == 0, &m, NULL) < 0)
            return;
        mask_layer(q, &m, R, &pairs, &im, &g);
        dt_mask_close(&m);
        share += n / L * pairs / plain;
        imb = dmax(imb, im);
        group = g > group ? g : group;
    }
    e->any = true;
    e->share = share;
    e->imbalance = imb;
    /* the GPU ring still passes every block around all the ranks (it
     * skips the compute only); the CPU's sends to the ranks that need it */
    e->group = q->cuda ? R : group;
}

/* One branch on R ranks of c tokens: group, pack, memory. */
static void branch_shape(const dt_plan_req_t *q, const dt_attn_spec_t *a, int b, int R, int64_t c,
                         const mask_effect_t *me, dt_cost_branch_t *o)
{
    dt_attn_branch_t br = dt_attn_branch(a, b);
    double e = elem_of(q->precision);
    int pc = dt_layout_pieces(q->layout, R);
    bool zz = pc > 1 && br.w < a->T;
    int64_t block = zz ? c / pc : c, chunks;

    o->w = br.w;
    o->r = br.r;
    if (br.w >= a->T) {
        o->group = me->any ? me->group : R; /* a mask sends to the ranks it needs */
    } else {
        /* segments start at multiples of w, blocks at multiples of block:
         * a segment starts at an offset into a block that is a multiple of
         * gcd(w, block), at worst block - gcd, and touches the blocks up to
         * that offset + w */
        int64_t g = gcd(br.w, block);
        chunks = ceil_div(block - g + br.w, block);
        o->group = (int)imin(chunks, R);
    }
    o->segs = zz ? pc : 1;
    o->L = (double)imin(br.w, block);

    /* pack: per head chunk, K and V rows at its offset, of the kv heads it reads */
    int64_t nrow = ceil_div((int64_t)o->L, br.r);
    double kvrows = 0;
    for (int k = 0; k < br.nchunk; k++)
        kvrows += dt_attn_chunk(a, &br, k).nkv;
    o->pack = 2.0 * (double)nrow * kvrows * a->D * e;

    /* ring buffers: a ring of one never receives; dense attention on one
     * rank reads K and V (and adds their gradients) where they lie, with
     * no pack at all (the CPU's, and the GPU's ring, engine/attn/ring_call.c) */
    if (a->nbranch == 0 && R == 1)
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
    /* the GPU's blocks through cuDNN (its default where installed; masks
     * run on dt's kernels, without it): their scratch, deterministic
     * unless the spec says deterministic = no */
    if (q->cuda && (a->mask == NULL || dt_mask_is_plain(a->mask)))
        o->work += dt_attn_cudnn_bytes(nrow, a->H, a->Hkv, a->D, (size_t)e,
                                       q->kind == DT_KIND_TRAIN, !a->nondet);
}

/* FLOP/s of the attention blocks, forward or backward (DT_ATTN_EFF_*):
 * the GPU presets' measured fraction of peak for them (its D <= 64 factor
 * applied), else the cluster's one efficiency. */
static double attn_pe(const dt_plan_req_t *q, const dt_attn_spec_t *a, int which)
{
    const dt_cluster_t *cl = &q->cluster;
    double e = cl->attn_eff[which];

    if (!q->cuda || !(e > 0))
        return cl->peak_flops * cl->efficiency;
    if (a->D <= 64 && cl->attn_eff_d64 > 0)
        e *= cl->attn_eff_d64;
    return cl->peak_flops * e;
}

/* The attention backward's time over its forward's: 2.5 times the FLOPs,
 * at the backward's rate (deterministic unless deterministic = no). */
static double bwd_ratio(const dt_plan_req_t *q, const dt_attn_spec_t *a)
{
    return 2.5 * attn_pe(q, a, DT_ATTN_EFF_FWD) /
           attn_pe(q, a, a->nondet ? DT_ATTN_EFF_BWD : DT_ATTN_EFF_BWD_DET);
}

/* Per-rank compute and communication of one branch (one attention
 * forward, or forward + backward for train). */
static void branch_time(const dt_plan_req_t *q, const dt_attn_spec_t *a, int R,
                        const mask_effect_t *me, dt_cost_branch_t *o)
{
    const dt_cluster_t *cl = &q->cluster;
    double pe = attn_pe(q, a, DT_ATTN_EFF_FWD), e = elem_of(q->precision);
    double imb = me->any ? me->imbalance
                 : q->causal && q->layout == DT_LAYOUT_CONTIGUOUS ? 2.0 - 1.0 / o->group
                                                                  : 1.0;
    dt_attn_spec_t one = *a;

    if (q->nbranch > 0) {
        one.nbranch = 1;
        one.seg[0] = o->w;
        one.dil[0] = o->r;
    }
    o->flops = dt_attn_flops(&one) * (me->any ? me->share : 1.0);
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
            /* backward: 2.5x the FLOPs at its rate; K/V again plus their fp32
             * gradients */
            double cb = bwd_ratio(q, a) * o->step_compute_s, mb = o->pack * (1 + 4.0 / e) / bw;
            o->exposed_s += transfers * dmax(0, mb - cb);
            o->hidden = o->hidden && mb <= cb;
        }
    }
}

/* The step's collectives over the training state on W ranks (R, or N R
 * with dp) at bw (see the top): their time in all and whether those of
 * each unit hide behind its compute in v; returns the part that does not
 * hide. c tokens per rank; attn_fwd_s one layer's attention forward on
 * this rank, its backward bwd_r times that. */
static double state_comm(const dt_plan_req_t *q, double W, double c, double bw, double attn_fwd_s,
                         double bwd_r, dt_cost_t *v)
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
    double lb = 4 * (Pmm_layers / L) * c / pe + bwd_r * attn_fwd_s + (recomp(q) ? lf : 0);
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

void dt_cost_eval(const dt_plan_req_t *q, int64_t T, int R, dt_cost_t *v)
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
    mask_effect_t me;
    mask_effect(q, T, R, &me);
    v->mask_share = me.share;
    v->imbalance = me.any ? me.imbalance
                   : q->causal && q->layout == DT_LAYOUT_CONTIGUOUS && q->nbranch == 0 && R > 1
                       ? 2.0 - 1.0 / R
                       : 1.0;
    double buffers = 0, work = 0;
    for (int b = 0; b < v->nb; b++) {
        dt_cost_branch_t *o = &v->b[b];
        branch_shape(q, &a, q->nbranch > 0 ? b : -1, R, v->c, &me, o);
        branch_time(q, &a, R, &me, o);
        buffers = dmax(buffers, o->buffers);
        work = dmax(work, o->work);
        v->attn_flops += o->flops;
        attn_fwd_s += o->compute_s;
        attn_s += (q->kind == DT_KIND_TRAIN ? 1.0 + bwd_ratio(q, &a) : 1.0) * o->compute_s +
                  o->exposed_s;
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
    mm->activations = c * act_per_token_at(q, v->c);
    mm->kv_buffers = buffers;
    mm->workspace = work;
    if (q->kind == DT_KIND_TRAIN) {
        train_state(q, 1.0 / ((double)dp_of(q) * R), mm);
        /* two in-memory copies of what it holds and two replicas of
         * another rank's (as large), with their headers */
        mm->mem_ckpt = 4 * (held_state(q, 1.0 / ((double)dp_of(q) * R)) + 65536);
    } else if (q->kind == DT_KIND_PREFILL) {
        /* a prefill's state between layers: its rows' fp32 hidden state
         * and their positions (engine/cmd/prefill.c), copied as above */
        mm->mem_ckpt = 4 * (c * (4 * dim + 8) + 65536);
    }
    if (q->kind == DT_KIND_TRAIN && e < 4) {
        /* the GPU engine's own accounting (spec/model.h); the head in
         * chunks of rows */
        dt_gpu_train_bytes_t gb = gpu_bytes(q, v->c);
        mm->workspace += c * gb.per_token + gb.fixed;
        mm->host += c * (double)m->layers * gb.host_per_token_layer;
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
    if (!q->cuda)
        mm->host = mm->total; /* the CPU engine's memory is the host's */

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
        /* the GPU's backward makes each tile's output projection and gate
         * and up products again (spec/model.h); its recompute only the
         * attention's inputs (q, k, v) and the attention, the CPU's the
         * whole layer */
        const double dm = (double)m->dim, ff = (double)m->ffn, hd = (double)dt_model_head_dim(m);
        const double qdim = hd * m->heads, kvd = hd * m->kv_heads;
        double again = q->cuda ? 2 * layers * (qdim * dm + 2 * dm * ff) : 0;
        double rec = !recomp(q) ? 0 : q->cuda ? 2 * layers * (qdim + 2 * kvd) * dm : 2 * Pmm_layers;
        double compute_s = B * (layers * attn_s + (6 * Pmm + rec + again) * c / pe);
        v->seconds = compute_s + (q->cuda ? 1.0 : B) *
                                     state_comm(q, W, c, bw, attn_fwd_s, bwd_ratio(q, &a), v);
        pcie(q, W, c, P, compute_s, v);
        break;
    }
    }
}

void dt_cost_constant_parts(const dt_plan_req_t *q, dt_plan_mem_t *whole, double *a, double *b)
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
