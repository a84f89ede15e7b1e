/* SPDX-License-Identifier: MIT
 *
 * Unit tests for coordinator/planner: presets; hand-computed plans (memory
 * to the byte against the formulas of plan/cost.c, FLOPs against 4 T^2 H D,
 * bytes per ring step, sub-ring sizes); every refusal with its code and
 * reason; the headline numbers (dense causal attention over 2^30 tokens of
 * llama3-8b takes days on H100s, the dilated configuration does not);
 * min_c_hidden agreeing with the plan at that c; placement; the JSON;
 * requests built from specs; training memory with and without recompute
 * by hand, the planner's own choice of recompute and the user's honoured;
 * sharded training state (memory and communication per level by hand, the
 * planner's pick of shard and recompute, llama3-8b and -70b fitting over
 * 1M tokens, the refusal outside training); data parallel (dp rings:
 * the sharded state over every ring's ranks, the extra unit on the CPU,
 * workers, nodes, placement and capacity over dp x ranks, FLOPs and the
 * collectives, the pick, the refusal outside training).
 * Pure computation: nothing to start.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "spec/spec.h"
#include "plan/planner.h"

#define MiB (1024.0 * 1024.0)
#define GiB (1024.0 * MiB)

/* A kind-attn request on the cpu preset: H, Hkv, D from a custom model. */
static dt_plan_req_t attn_req(int64_t T, int R, int H, int Hkv, int D, bool causal,
                              enum dt_layout layout)
{
    dt_plan_req_t q = { 0 };

    cr_assert_eq(dt_cluster_preset("cpu", &q.cluster, NULL), 0);
    strcpy(q.model.name, "custom");
    q.model.dim = (int64_t)H * D;
    q.model.heads = H;
    q.model.kv_heads = Hkv;
    q.model.layers = 1;
    q.model.ffn = 1;
    q.model.vocab = 1;
    q.tokens = T;
    q.ranks = R;
    q.kind = DT_KIND_ATTN;
    q.precision = DT_F32;
    q.causal = causal;
    q.layout = layout;
    return q;
}

static dt_plan_req_t llama_req(const char *gpu, enum dt_job_kind kind, int64_t T)
{
    dt_plan_req_t q = { 0 };

    cr_assert_eq(dt_model_preset("llama3-8b", &q.model, NULL), 0);
    cr_assert_eq(dt_cluster_preset(gpu, &q.cluster, NULL), 0);
    q.tokens = T;
    q.kind = kind;
    q.precision = DT_BF16;
    q.causal = true;
    q.layout = DT_LAYOUT_ZIGZAG;
    return q;
}

static void set_branches(dt_plan_req_t *q, int n, const int64_t *w, const int64_t *r)
{
    q->nbranch = n;
    for (int i = 0; i < n; i++) {
        q->seg[i] = w[i];
        q->dil[i] = r[i];
    }
}

Test(planner, presets)
{
    dt_model_cfg_t m;
    dt_cluster_t c;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_model_preset("llama3-8b", &m, &em), 0);
    cr_assert_eq(m.dim, 4096);
    cr_assert_eq(m.layers, 32);
    cr_assert_eq(m.heads, 32);
    cr_assert_eq(m.kv_heads, 8);
    cr_assert_eq(m.ffn, 14336);
    cr_assert_eq(m.vocab, 128256);
    cr_assert_eq(m.rope.theta, 500000);
    cr_assert_eq(dt_model_preset("llama3-70b", &m, &em), 0);
    cr_assert_eq(m.dim, 8192);
    cr_assert_eq(m.layers, 80);
    cr_assert_eq(m.heads, 64);
    cr_assert_eq(m.ffn, 28672);
    cr_assert_eq(dt_model_preset("tiny", &m, &em), 0);
    cr_assert_eq(m.dim % m.heads, 0);
    cr_assert_eq(dt_model_preset("gpt2", &m, &em), DT_EINVAL);
    cr_assert_not_null(strstr(em.s, "llama3-70b"), "%s", em.s);

    cr_assert_eq(dt_cluster_preset("h100-sxm", &c, &em), 0);
    cr_assert_eq(c.gpus_per_node, 8);
    cr_assert_eq(c.mem_bytes, 76 * GiB);
    cr_assert_eq(c.peak_flops, 989e12);
    cr_assert_eq(dt_cluster_preset("h200", &c, &em), 0);
    cr_assert(c.mem_bytes > 128 * GiB);
    cr_assert_eq(dt_cluster_preset("cpu", &c, &em), 0);
    cr_assert_eq(c.gpus_per_node, 2);
    cr_assert_eq(c.mem_bytes, 4 * GiB);
    cr_assert_eq(c.fixed_bytes, 15 * MiB);
    cr_assert_eq(dt_cluster_preset("tpu", &c, &em), DT_EINVAL);
    cr_assert_not_null(strstr(em.s, "h100-sxm"), "%s", em.s);
}

/* Dense attention on the cpu preset (fp32), R fixed: the engine's tensors.
 *   activations: q, o (c H D) + k, v (c Hkv D) + lse (H c), 4 bytes each
 *   kv_buffers:  two packs of K and V, 2 c Hkv D floats each (none when R = 1:
 *                K and V read where they lie)
 *   workspace:   24 c bytes of index arrays + a 48-byte record per rank
 *                + the kernel's packed K^T and V, 2 c D floats, and its
 *                packed query tile, 96 D floats
 *   flops:       4 T^2 H D (non-causal), 4 H D T (T + 1) / 2 (causal)
 *   bytes/step:  2 c Hkv D 4 when R > 1 */
Test(planner, dense_attention_by_hand)
{
    static const struct {
        int64_t T;
        int R, H, Hkv, D;
        bool causal;
        enum dt_layout layout;
    } cases[] = {
        { 4096, 1, 8, 2, 64, false, DT_LAYOUT_CONTIGUOUS },
        { 16384, 2, 8, 2, 64, false, DT_LAYOUT_CONTIGUOUS },
        { 16384, 4, 8, 2, 64, true, DT_LAYOUT_ZIGZAG },
        { 32768, 8, 16, 4, 32, false, DT_LAYOUT_CONTIGUOUS },
        { 6000, 3, 4, 4, 16, true, DT_LAYOUT_CONTIGUOUS },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_plan_req_t q = attn_req(cases[i].T, cases[i].R, cases[i].H, cases[i].Hkv, cases[i].D,
                                   cases[i].causal, cases[i].layout);
        dt_plan_t p;
        dt_emsg_t em = { "" };
        double T = (double)cases[i].T, H = cases[i].H, Hkv = cases[i].Hkv, D = cases[i].D;
        int R = cases[i].R;
        double c = T / R;

        cr_assert_eq(dt_plan_make(&q, &p, &em), 0, "case %zu: %s", i, em.s);
        cr_assert(p.fits);
        cr_assert_eq(p.ranks, R);
        cr_assert_eq(p.tokens_per_rank, (int64_t)c);
        double act = (2 * c * H * D + 2 * c * Hkv * D + H * c) * 4;
        double kv = (R > 1 ? 2 : 0) * 2 * c * Hkv * D * 4;
        double ws = 24 * c + 48.0 * R + (2 * c + 96) * D * 4;
        cr_assert_eq(p.mem.activations, act, "case %zu", i);
        cr_assert_eq(p.mem.kv_buffers, kv, "case %zu", i);
        cr_assert_eq(p.mem.workspace, ws, "case %zu: %.0f vs %.0f", i, p.mem.workspace, ws);
        cr_assert_eq(p.mem.weights + p.mem.grads + p.mem.optimizer, 0);
        /* the process, and the transport's buffers for each other rank */
        double fx = 15 * MiB + 720.0 * 1024 * (R - 1);
        cr_assert_eq(p.mem.fixed, fx);
        cr_assert_eq(p.mem.total, act + kv + ws + fx, "case %zu", i);
        double fl = cases[i].causal ? 4 * H * D * T * (T + 1) / 2 : 4 * T * T * H * D;
        cr_assert_eq(p.flops, fl, "case %zu: %g vs %g", i, p.flops, fl);
        cr_assert_eq(p.flops_per_token, fl / T);
        cr_assert_eq(p.bytes_per_step, R > 1 ? 2 * c * Hkv * D * 4 : 0, "case %zu", i);
        cr_assert_eq(p.nbranch, 1);
        cr_assert_eq(p.branch[0].w, cases[i].T);
        cr_assert_eq(p.branch[0].r, 1);
        cr_assert_eq(p.branch[0].group, R);
        /* time: every rank does 1/R of the work at peak x efficiency;
         * causal contiguous makes the last rank do 2 - 1/R times that */
        double imb =
            cases[i].causal && cases[i].layout == DT_LAYOUT_CONTIGUOUS ? 2.0 - 1.0 / R : 1.0;
        double compute = fl / R / (q.cluster.peak_flops * q.cluster.efficiency) * imb;
        if (p.comm_hidden)
            cr_assert_float_eq(p.seconds, compute, 1e-9 * compute, "case %zu", i);
        else
            cr_assert(p.seconds > compute);
        dt_plan_clear(&p);
    }
}

/* A dilated branch (w, r) over T: T / w segments, r head chunks of H / r
 * heads, w / r positions each: T / w * r * (w / r)^2 * 4 D (H / r) flops
 * (non-causal). */
Test(planner, dilated_branch_flops_and_groups)
{
    dt_plan_req_t q = attn_req(98304, 12, 8, 2, 64, false, DT_LAYOUT_CONTIGUOUS);
    static const int64_t w[] = { 2048, 8192, 12288, 24576, 98304 };
    static const int64_t r[] = { 2, 1, 4, 8, 16 };
    /* c = 8192: 12288 straddles two ranks, 24576 spans three, the whole
     * sequence all twelve */
    static const int group[] = { 1, 1, 2, 3, 12 };
    dt_plan_t p;
    dt_emsg_t em = { "" };

    set_branches(&q, 5, w, r);
    cr_assert_eq(dt_plan_make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.nbranch, 5);
    double total = 0;
    for (int b = 0; b < 5; b++) {
        double T = 98304, W = (double)w[b], Rr = (double)r[b], H = 8, D = 64;
        double hc = ceil(H / Rr), nchunk = ceil(H / hc);
        double fl = T / W * nchunk * (W / Rr) * (W / Rr) * 4 * D * hc;
        cr_assert_eq(p.branch[b].w, w[b]);
        cr_assert_eq(p.branch[b].r, r[b]);
        cr_assert_eq(p.branch[b].group, group[b], "branch %d: group %d", b, p.branch[b].group);
        cr_assert_eq(p.branch[b].flops, fl, "branch %d: %g vs %g", b, p.branch[b].flops, fl);
        cr_assert_eq(p.branch[b].bytes_per_step > 0, group[b] > 1, "branch %d", b);
        total += fl;
    }
    cr_assert_eq(p.flops, total);
    /* branch (98304, 16): 8 heads in 8 chunks of one head; each chunk reads
     * one kv head and c / r = 512 rows: K and V of 8 x 512 x 64 floats */
    cr_assert_eq(p.branch[4].bytes_per_step, 2.0 * 8 * 512 * 64 * 4);
    dt_plan_clear(&p);
}

static int make(const dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    memset(em, 0, sizeof(*em));
    return dt_plan_make(q, p, em);
}

/* Whether the request's device runs shard level sh with dp rings (the one
 * answer, spec/vocab.h); where it does not, the planner refuses the level
 * naming the device (refused() checks that), and the by-hand checks of
 * that level wait for the engine to run it. */
static bool runs(const dt_plan_req_t *q, enum dt_shard_level sh, int dp)
{
    return dt_vocab_runs(q->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, q->kind, sh, dp, NULL) == 0;
}

static void refused(dt_plan_req_t q, enum dt_shard_level sh, int dp)
{
    dt_plan_t p;
    dt_emsg_t em = { "" };

    q.shard = sh;
    q.dp = dp;
    cr_assert_eq(make(&q, &p, &em), DT_ENOTSUP, "shard %s dp %d: %s", dt_shard_name(sh), dp,
                 em.s);
    cr_assert(strstr(em.s, q.cuda ? "device cuda runs" : "device cpu runs") != NULL, "%s",
              em.s);
    dt_plan_clear(&p);
}

Test(planner, refusals)
{
    dt_plan_t p;
    dt_emsg_t em;
    dt_plan_req_t q;

    /* T not divisible by R */
    q = attn_req(1000, 3, 8, 2, 64, false, DT_LAYOUT_CONTIGUOUS);
    cr_assert_eq(make(&q, &p, &em), DT_ELAYOUT);
    cr_assert_not_null(strstr(em.s, "not divisible by R=3"), "%s", em.s);
    cr_assert_str_eq(p.reason, em.s);
    cr_assert(!p.fits);
    dt_plan_clear(&p);

    /* zigzag: T not divisible by 2R */
    q = attn_req(1005, 3, 8, 2, 64, true, DT_LAYOUT_ZIGZAG);
    cr_assert_eq(make(&q, &p, &em), DT_ELAYOUT);
    cr_assert_not_null(strstr(em.s, "2R=6"), "%s", em.s);
    dt_plan_clear(&p);

    /* w not a multiple of r */
    q = attn_req(4096, 2, 8, 2, 64, false, DT_LAYOUT_CONTIGUOUS);
    set_branches(&q, 2, (const int64_t[]){ 512, 1000 }, (const int64_t[]){ 1, 3 });
    cr_assert_eq(make(&q, &p, &em), DT_EINVAL);
    cr_assert_not_null(strstr(em.s, "branch 2"), "%s", em.s);
    cr_assert_not_null(strstr(em.s, "w=1000 is not a multiple of its dilation r=3"), "%s", em.s);
    dt_plan_clear(&p);

    /* bad shape */
    q = attn_req(4096, 2, 8, 3, 64, false, DT_LAYOUT_CONTIGUOUS);
    cr_assert_eq(make(&q, &p, &em), DT_EINVAL);
    cr_assert_not_null(strstr(em.s, "kv_heads=3 must divide heads=8"), "%s", em.s);
    dt_plan_clear(&p);

    /* more ranks than the cluster has */
    q = llama_req("h100-sxm", DT_KIND_PREFILL, INT64_C(1) << 30);
    q.cluster.nodes = 16;
    cr_assert_eq(make(&q, &p, &em), DT_ERANGE);
    cr_assert_not_null(strstr(em.s, "needs 2048 ranks"), "%s", em.s);
    cr_assert_not_null(strstr(em.s, "16 nodes x 8 = 128 ranks"), "%s", em.s);
    cr_assert_eq(p.ranks, 2048, "the plan is filled for the ranks it would need");
    cr_assert(!p.fits);
    dt_plan_clear(&p);

    /* fixed R beyond the planner's limit */
    q = attn_req(INT64_C(1) << 30, 2000000, 8, 2, 64, false, DT_LAYOUT_CONTIGUOUS);
    cr_assert_eq(make(&q, &p, &em), DT_ERANGE);
    cr_assert_not_null(strstr(em.s, "1000000"), "%s", em.s);
    dt_plan_clear(&p);

    /* memory at a fixed R: the numbers and the largest component */
    q = llama_req("h100-sxm", DT_KIND_PREFILL, INT64_C(1) << 20);
    q.ranks = 1;
    cr_assert_eq(make(&q, &p, &em), DT_ENOSPC);
    cr_assert_not_null(strstr(em.s, "largest: activations 100.00 GiB"), "%s", em.s);
    cr_assert_not_null(strstr(em.s, "76.00 GiB available"), "%s", em.s);
    cr_assert_eq(p.mem.activations, 100 * GiB, "1M tokens x 100 KiB of one layer's working set");
    cr_assert(p.mem.total > q.cluster.mem_bytes);
    dt_plan_clear(&p);

    /* memory at any R: the replicated model does not fit (unsharded, as
     * the user asks) */
    q = llama_req("h100-sxm", DT_KIND_TRAIN, INT64_C(1) << 20);
    q.shard = DT_SHARD_NONE;
    cr_assert_eq(make(&q, &p, &em), DT_ENOSPC);
    cr_assert_not_null(strstr(em.s, "largest: optimizer"), "%s", em.s);
    cr_assert_not_null(strstr(em.s, "every rank holds the whole model"), "%s", em.s);
    dt_plan_clear(&p);

    /* no rank count divides a prime T */
    q = llama_req("h100-sxm", DT_KIND_ATTN, 1000000007);
    cr_assert_eq(make(&q, &p, &em), DT_ELAYOUT);
    cr_assert_not_null(strstr(em.s, "1000000007"), "%s", em.s);
    dt_plan_clear(&p);
}

/* The headline: dense causal attention over 2^30 tokens of llama3-8b on
 * H100s takes days as a prefill (every layer), and hours even as a single
 * attention call; LongNet's dilated branches make it seconds to minutes. */
Test(planner, one_billion_tokens_dense_takes_days_dilated_does_not)
{
    static const int64_t w[] = { 2048, 16384, 131072, 1048576 };
    static const int64_t r[] = { 1, 4, 32, 256 };
    int64_t T = INT64_C(1) << 30;
    dt_plan_t p;
    dt_emsg_t em;
    dt_plan_req_t q;

    q = llama_req("h100-sxm", DT_KIND_PREFILL, T);
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.seconds > 86400, "dense prefill: %g s", p.seconds);
    cr_assert(p.comm_hidden);
    double dense = p.seconds;
    dt_plan_clear(&p);

    q = llama_req("h100-sxm", DT_KIND_ATTN, T);
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.seconds > 3 * 3600, "one dense attention call: %g s", p.seconds);
    dt_plan_clear(&p);

    q = llama_req("h100-sxm", DT_KIND_PREFILL, T);
    set_branches(&q, 4, w, r);
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.seconds < 86400, "dilated prefill: %g s", p.seconds);
    cr_assert(p.seconds < dense / 1000, "dilated %g s vs dense %g s", p.seconds, dense);
    cr_assert_eq(p.nbranch, 4);
    cr_assert_eq(p.branch[0].group, 1, "w = 2048 is local");
    dt_plan_clear(&p);

    /* the same on a 1000-node cluster given all its GPUs: still days */
    q = llama_req("h100-sxm", DT_KIND_PREFILL, T);
    q.cluster.nodes = 1024;
    q.ranks = 8192;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.seconds > 0.5 * 86400, "dense prefill on 8192 GPUs: %g s", p.seconds);
    dt_plan_clear(&p);
}

Test(planner, fewest_ranks_that_fit)
{
    dt_plan_req_t q = llama_req("h100-sxm", DT_KIND_PREFILL, INT64_C(1) << 30);
    dt_plan_t p, smaller;
    dt_emsg_t em;

    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.mem.total <= q.cluster.mem_bytes);
    q.ranks = p.ranks / 2; /* the next valid R below: powers of two divide 2^30 */
    cr_assert_eq(make(&q, &smaller, &em), DT_ENOSPC, "%s", em.s);
    dt_plan_clear(&smaller);
    dt_plan_clear(&p);

    /* T = 10^9: zigzag needs 2R | T, so R is a divisor of 5 x 10^8 */
    q = llama_req("h100-sxm", DT_KIND_ATTN, 1000000000);
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(1000000000 % (2 * (int64_t)p.ranks), 0, "R=%d", p.ranks);
    dt_plan_clear(&p);
}

/* Compute per step grows as c^2, the transfer as c: at c = min_c_hidden the
 * plan hides its communication, just below it does not. */
Test(planner, min_c_hidden_agrees_with_the_plan)
{
    static const struct {
        const char *gpu;
        bool causal;
        enum dt_layout layout;
        int R;
    } cases[] = {
        { "h100-sxm", false, DT_LAYOUT_CONTIGUOUS, 16 },
        { "h100-sxm", true, DT_LAYOUT_ZIGZAG, 16 },
        { "cpu", true, DT_LAYOUT_ZIGZAG, 4 },
        { "h200", true, DT_LAYOUT_CONTIGUOUS, 64 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_plan_req_t q = llama_req(cases[i].gpu, DT_KIND_ATTN, 0);
        int64_t gran = cases[i].layout == DT_LAYOUT_ZIGZAG ? 2 : 1, m;
        dt_plan_t p;
        dt_emsg_t em;

        q.causal = cases[i].causal;
        q.layout = cases[i].layout;
        q.ranks = cases[i].R;
        q.tokens = (int64_t)cases[i].R * 65536;
        cr_assert_eq(make(&q, &p, &em), 0, "case %zu: %s", i, em.s);
        m = p.min_c_hidden;
        dt_plan_clear(&p);
        cr_assert(m > gran, "case %zu: min_c_hidden %lld", i, (long long)m);

        q.tokens = m * cases[i].R;
        cr_assert_eq(make(&q, &p, &em), 0, "case %zu: %s", i, em.s);
        cr_assert(p.comm_hidden, "case %zu: not hidden at c = %lld", i, (long long)m);
        cr_assert(p.step_comm_s <= p.step_compute_s);
        cr_assert_eq(p.min_c_hidden, m);
        dt_plan_clear(&p);

        int64_t half = m / 2 / gran * gran;
        q.tokens = half * cases[i].R;
        cr_assert_eq(make(&q, &p, &em), 0, "case %zu: %s", i, em.s);
        cr_assert(!p.comm_hidden, "case %zu: hidden at c/2 = %lld", i, (long long)half);
        dt_plan_clear(&p);

        q.tokens = (m - gran) * cases[i].R;
        cr_assert_eq(make(&q, &p, &em), 0, "case %zu: %s", i, em.s);
        cr_assert(!p.comm_hidden, "case %zu: hidden at c = %lld", i, (long long)(m - gran));
        dt_plan_clear(&p);
    }
}

Test(planner, placement_keeps_ring_hops_in_a_node)
{
    static const struct {
        int R, gpn;
        double frac;
        int nodes;
    } cases[] = {
        { 16, 8, 14.0 / 16, 2 }, { 4, 8, 1.0, 1 },     { 1, 8, 1.0, 1 },
        { 24, 8, 21.0 / 24, 3 }, { 6, 4, 4.0 / 6, 2 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_plan_req_t q = llama_req("h100-sxm", DT_KIND_ATTN, 49152);
        dt_plan_t p;
        dt_emsg_t em;

        q.ranks = cases[i].R;
        q.cluster.gpus_per_node = cases[i].gpn;
        cr_assert_eq(make(&q, &p, &em), 0, "case %zu: %s", i, em.s);
        cr_assert_eq(p.nodes, cases[i].nodes, "case %zu", i);
        cr_assert_float_eq(p.intra_node_frac, cases[i].frac, 1e-12, "case %zu: %g", i,
                           p.intra_node_frac);
        for (int r = 0; r < cases[i].R; r++)
            cr_assert_eq(p.placement[r], r / cases[i].gpn);
        dt_plan_clear(&p);
    }
}

static json_t *get(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert_not_null(v, "JSON has no '%s'", key);
    return v;
}

Test(planner, json)
{
    static const char *const keys[] = {
        "ranks",
        "tokens_per_rank",
        "memory_per_rank_bytes",
        "memory_breakdown",
        "flops",
        "flops_per_token",
        "bytes_per_step",
        "seconds",
        "comm_hidden",
        "min_c_hidden",
        "fits",
        "branches",
        "placement",
        "intra_node_frac",
        "tokens",
        "model",
        "cluster",
        "kind",
        "precision",
        "causal",
        "layout",
    };
    static const char *const parts[] = { "weights",    "grads",     "optimizer", "activations",
                                         "kv_buffers", "workspace", "fixed" };
    dt_plan_req_t q = attn_req(16384, 4, 8, 2, 64, true, DT_LAYOUT_ZIGZAG);
    dt_plan_t p;
    dt_emsg_t em;
    json_t *j, *mem;

    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    j = dt_plan_to_json(&q, &p);
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        get(j, keys[i]);
    cr_assert_null(json_object_get(j, "reason"));
    cr_assert_eq(json_integer_value(get(j, "ranks")), 4);
    cr_assert_eq(json_integer_value(get(j, "memory_per_rank_bytes")), (json_int_t)p.mem.total);
    mem = get(j, "memory_breakdown");
    json_int_t sum = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        sum += json_integer_value(get(mem, parts[i]));
    cr_assert_eq(sum, (json_int_t)p.mem.total);
    cr_assert_str_eq(json_string_value(get(j, "layout")), "zigzag");
    cr_assert_str_eq(json_string_value(get(j, "kind")), "attn");
    cr_assert_eq(json_integer_value(get(get(j, "model"), "heads")), 8);
    cr_assert_str_eq(json_string_value(get(get(j, "cluster"), "name")), "cpu");
    cr_assert_eq(json_array_size(get(j, "placement")), 4);
    json_t *b0 = json_array_get(get(j, "branches"), 0);
    cr_assert_eq(json_integer_value(get(b0, "segment")), 16384);
    cr_assert_eq(json_integer_value(get(b0, "group")), 4);
    json_decref(j);
    dt_plan_clear(&p);

    /* beyond 4096 ranks the placement is a summary */
    q = llama_req("h100-sxm", DT_KIND_ATTN, INT64_C(1) << 30);
    q.ranks = 8192;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    j = dt_plan_to_json(&q, &p);
    cr_assert_eq(json_integer_value(get(get(j, "placement"), "ranks_per_node")), 8);
    cr_assert_eq(json_integer_value(get(get(j, "placement"), "nodes")), 1024);
    json_decref(j);
    dt_plan_clear(&p);

    /* a refusal carries fits:false and the reason */
    q = attn_req(1000, 3, 8, 2, 64, false, DT_LAYOUT_CONTIGUOUS);
    cr_assert_eq(make(&q, &p, &em), DT_ELAYOUT);
    j = dt_plan_to_json(&q, &p);
    cr_assert(json_is_false(get(j, "fits")));
    cr_assert_str_eq(json_string_value(get(j, "reason")), em.s);
    json_decref(j);
    dt_plan_clear(&p);
}

Test(planner, request_from_spec)
{
    dt_spec_t s;
    dt_plan_req_t q;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_spec_parse("s", "kind = attn\ntokens = 64K\n", &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
    cr_assert_str_eq(q.model.name, "tiny");
    cr_assert_str_eq(q.cluster.name, "cpu");
    cr_assert_eq(q.precision, DT_F32, "fp32 on the cpu");
    cr_assert(q.causal);
    cr_assert_eq(q.layout, DT_LAYOUT_ZIGZAG, "zigzag when causal");
    cr_assert_eq(q.tokens, 65536);
    cr_assert_eq(q.nbranch, 0);
    cr_assert_eq(q.recompute, DT_RECOMPUTE_AUTO, "unset: the planner decides");
    cr_assert_eq(q.shard, DT_SHARD_AUTO, "unset: the planner decides");
    cr_assert_eq(q.batch, 1);
    dt_spec_free(&s);

    const struct {
        const char *text;
        enum dt_shard_level want;
    } shs[] = {
        { "kind = train\ntokens = 4096\nshard = none\n", DT_SHARD_NONE },
        { "kind = train\ntokens = 4096\nshard = optimizer\n", DT_SHARD_OPTIMIZER },
        { "kind = train\ntokens = 4096\nshard = gradients\nbatch = 3\n", DT_SHARD_GRADIENTS },
        { "kind = train\ntokens = 4096\nshard = parameters\n", DT_SHARD_PARAMETERS },
    };
    for (size_t i = 0; i < sizeof(shs) / sizeof(shs[0]); i++) {
        cr_assert_eq(dt_spec_parse("s", shs[i].text, &s, &em), 0, "%s", em.s);
        cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
        cr_assert_eq(q.shard, shs[i].want, "%s", shs[i].text);
        cr_assert_str_eq(dt_shard_name(q.shard), s.shard);
        cr_assert_eq(q.batch, shs[i].want == DT_SHARD_GRADIENTS ? 3 : 1);
        dt_spec_free(&s);
    }
    cr_assert_eq(dt_spec_parse("s", "kind = train\ntokens = 4096\nshard = zero3\n", &s, &em),
                 DT_EINVAL);
    cr_assert(strstr(em.s, "none, optimizer, gradients or parameters"), "%s", em.s);

    const struct {
        const char *text;
        enum dt_recompute want;
    } rcs[] = {
        { "kind = train\ntokens = 4096\nrecompute = layer\n", DT_RECOMPUTE_LAYER },
        { "kind = train\ntokens = 4096\nrecompute = none\n", DT_RECOMPUTE_NONE },
    };
    for (size_t i = 0; i < sizeof(rcs) / sizeof(rcs[0]); i++) {
        cr_assert_eq(dt_spec_parse("s", rcs[i].text, &s, &em), 0, "%s", em.s);
        cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
        cr_assert_eq(q.recompute, rcs[i].want, "%s", rcs[i].text);
        dt_spec_free(&s);
    }

    cr_assert_eq(dt_spec_parse("s",
                               "kind = train\ntokens = 1M\nmodel = llama3-8b\nlayers = 2\n"
                               "gpu = h100-sxm\nprecision = fp32\ncausal = no\nnodes = 4\n"
                               "segments = 2048,8192\ndilations = 1,4\nranks = 16\nspares = 1\n",
                               &s, &em),
                 0, "%s", em.s);
    cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
    cr_assert_eq(q.kind, DT_KIND_TRAIN);
    cr_assert_eq(q.model.layers, 2, "explicit keys override the preset");
    cr_assert_eq(q.model.dim, 4096);
    cr_assert_eq(q.precision, DT_F32);
    cr_assert_eq(q.cluster.peak_flops, 67e12, "fp32 on an H100 runs at the FP32 peak");
    cr_assert_eq(q.cluster.nodes, 4);
    cr_assert(!q.causal);
    cr_assert_eq(q.layout, DT_LAYOUT_CONTIGUOUS, "contiguous when not causal");
    cr_assert_eq(q.nbranch, 2);
    cr_assert_eq(q.seg[1], 8192);
    cr_assert_eq(q.dil[1], 4);
    cr_assert_eq(q.ranks, 16);
    cr_assert_eq(q.spares, 1);
    dt_spec_free(&s);

    cr_assert_eq(dt_spec_parse("s",
                               "kind = prefill\ntokens = 4096\nmodel = custom\ndim = 512\n"
                               "layers = 2\nheads = 8\nkv_heads = 2\nffn = 1024\nvocab = 1000\n"
                               "gpu = h200\ntied = yes\n",
                               &s, &em),
                 0, "%s", em.s);
    cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
    cr_assert_str_eq(q.model.name, "custom");
    cr_assert(q.model.tied);
    cr_assert_eq(q.precision, DT_BF16, "bf16 on GPUs");
    cr_assert_eq(q.cluster.peak_flops, 989e12);
    cr_assert(q.cuda, "a GPU preset runs on cuda");
    dt_spec_free(&s);

    /* device = cuda alone plans on the H100 preset, bf16 */
    cr_assert_eq(dt_spec_parse("s", "kind = train\ntokens = 64K\ndevice = cuda\n", &s, &em), 0,
                 "%s", em.s);
    cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
    cr_assert(q.cuda);
    cr_assert_str_eq(q.cluster.name, "h100-sxm");
    cr_assert_eq(q.precision, DT_BF16);
    dt_plan_t p;
    cr_assert_eq(dt_plan_make(&q, &p, &em), 0, "%s", em.s);
    json_t *j = dt_plan_to_json(&q, &p);
    cr_assert_str_eq(json_string_value(json_object_get(j, "device")), "cuda");
    cr_assert_str_eq(json_string_value(json_object_get(j, "dtype")), "bf16");
    json_decref(j);
    dt_plan_clear(&p);
    dt_spec_free(&s);

    /* and a cpu job on the cpu preset, fp32 */
    cr_assert_eq(dt_spec_parse("s", "kind = train\ntokens = 4096\n", &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
    cr_assert(!q.cuda);
    cr_assert_str_eq(q.cluster.name, "cpu");
    cr_assert_eq(q.precision, DT_F32);
    dt_spec_free(&s);
}

/* tiny trained over 4096 tokens on one rank of the cluster preset, causal,
 * zigzag, at the given dtype. */
static dt_plan_req_t tiny_train(const char *cluster, dt_dtype_t precision)
{
    dt_plan_req_t q = { 0 };

    cr_assert_eq(dt_model_preset("tiny", &q.model, NULL), 0);
    cr_assert_eq(dt_cluster_preset(cluster, &q.cluster, NULL), 0);
    q.kind = DT_KIND_TRAIN;
    q.precision = precision;
    q.tokens = 4096;
    q.ranks = 1;
    q.causal = true;
    q.layout = DT_LAYOUT_ZIGZAG;
    return q;
}

/* Training memory by hand for the tiny model on one cpu rank (fp32), as
 * engine/model/model.c allocates it: P = 4 (2 d^2 + 2 d kv + 3 d f + 2 d)
 * + v d + d (tied), 16 bytes each; per token per layer the layer's
 * activations A = 4 (4 d + 2 d + 2 kv + 3 f + H + 2) (xin, h1, x2, h2; q,
 * o; k, v; a, b, g; lse; two 1/rms), beside them the final norm's
 * 4 (2 d + 1); workspace per token the logits and their gradient (2 4 v),
 * four residual-sized buffers (16 d), the backward's gradients
 * 4 (2 d + 2 kv + 3 f), token ids and positions (24); 8 T for every
 * rank's ids; the attention's index arrays 8 (3 c) + 48 and its kernel's
 * packed K^T, V^T and K, 3 c D floats, and the backward's query tile
 * packs (Q and dO as rows and as panels), 4 96 D (D = d / H). With recompute =
 * layer a layer keeps 4 d, and the workspace holds one layer's A and the
 * recomputed layer's input 4 d. */
#define TINY_D 256.0
#define TINY_L 4.0
#define TINY_H 8.0
#define TINY_KV 64.0
#define TINY_F 768.0
#define TINY_V 512.0
static double tiny_cpu_layer_act(void)
{
    double d = TINY_D, kv = TINY_KV, f = TINY_F, H = TINY_H;
    return 4 * (4 * d + 2 * d + 2 * kv + 3 * f + H + 2);
}

static double tiny_cpu_workspace(double c, double T)
{
    double d = TINY_D, kv = TINY_KV, f = TINY_F, v = TINY_V;
    return c * (2 * 4 * v + 16 * d + 4 * (2 * d + 2 * kv + 3 * f) + 24) + 8 * T + 8 * 3 * c + 48 +
           (3 * c + 4 * 96) * (d / TINY_H) * 4;
}

Test(planner, training_memory_by_hand)
{
    dt_plan_req_t q = tiny_train("cpu", DT_F32);
    dt_plan_t p;
    dt_emsg_t em;

    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    double d = 256, L = 4, H = 8, kv = 64, f = 768, v = 512, c = 4096;
    double P = L * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + v * d + d;
    cr_assert_eq(p.mem.weights, 4 * P);
    cr_assert_eq(p.mem.grads, 4 * P);
    cr_assert_eq(p.mem.optimizer, 8 * P, "fp32: no master copy");
    cr_assert_eq(p.mem.activations, c * (L * tiny_cpu_layer_act() + 4 * (2 * d + 1)));
    cr_assert_eq(p.mem.workspace, tiny_cpu_workspace(c, c));
    cr_assert(!p.recompute, "fits without: not recomputed");
    cr_assert_str_eq(p.note, "");
    /* flops: 6 per matmul parameter per token (LM head included, embedding
     * lookup not) + 3.5 x the causal attention of every layer */
    double Pmm = L * (2 * d * d + 2 * d * kv + 3 * d * f) + v * d;
    double attn = 4 * H * 32 * c * (c + 1) / 2;
    cr_assert_float_eq(p.flops, 6 * Pmm * c + L * 3.5 * attn, 1e-6 * p.flops);
    dt_plan_clear(&p);
}

/* A small model for the shard tests, trained over 4096 tokens on R = 4
 * ranks of the cluster preset (fp32 on the cpu, bf16 on cuda), unsharded,
 * no recompute: dim 256, 2 layers, 4 heads of 64, 2 kv heads, ffn 512,
 * vocab 1000. Its units: the embedding (V d = 256000), two layers (2 d +
 * 2 d 4 64 + 2 d 2 64 + 3 d f = 590336 each: the largest, U), the final
 * norm with the head (d + V d = 256256; d when tied). */
#define SM_D 256.0
#define SM_V 1000.0
#define SM_LAYER (2 * SM_D + 2 * SM_D * 256 + 2 * SM_D * 128 + 3 * SM_D * 512)
static dt_plan_req_t small_train(const char *cluster, dt_dtype_t precision, bool tied)
{
    dt_plan_req_t q = { 0 };

    cr_assert_eq(dt_model_preset("custom", &q.model, NULL), 0);
    cr_assert_eq(dt_cluster_preset(cluster, &q.cluster, NULL), 0);
    q.model.dim = 256;
    q.model.layers = 2;
    q.model.heads = 4;
    q.model.kv_heads = 2;
    q.model.ffn = 512;
    q.model.vocab = 1000;
    q.model.tied = tied;
    q.kind = DT_KIND_TRAIN;
    q.precision = precision;
    q.cuda = precision != DT_F32;
    q.tokens = 4096;
    q.ranks = 4;
    q.causal = true;
    q.layout = DT_LAYOUT_ZIGZAG;
    q.shard = DT_SHARD_NONE;
    q.recompute = DT_RECOMPUTE_NONE;
    return q;
}

static double small_params(bool tied)
{
    return 2 * SM_LAYER + SM_V * SM_D + SM_D + (tied ? 0 : SM_V * SM_D);
}

static double state(const dt_plan_t *p)
{
    return p->mem.weights + p->mem.grads + p->mem.optimizer;
}

/* The training state per rank at W = 4 by hand, CPU (fp32): the weights
 * are the master copy, 4 P; the gradient 4 P (8 P with batch > 1: a
 * sequence's beside the step's); the AdamW moments 8 P. optimizer
 * divides the moments by W, gradients the gradient too (plus the unit
 * being reduce-scattered, 4 U, and a tied embedding's gradient, 4 V d),
 * parameters the weights too (plus one gathered unit and a tied
 * embedding). Everything per token is the same at every level. */
Test(planner, shard_memory_by_hand_cpu)
{
    for (int tied = 0; tied < 2; tied++) {
        for (int batch = 1; batch <= 2; batch++) {
            dt_plan_req_t q = small_train("cpu", DT_F32, tied);
            double P = small_params(tied), U = SM_LAYER, E = tied ? SM_V * SM_D : 0, W = 4;
            double g = batch > 1 ? 8 * P : 4 * P;
            const struct {
                enum dt_shard_level sh;
                double w, g, o;
            } want[] = {
                { DT_SHARD_NONE, 4 * P, g, 8 * P },
                { DT_SHARD_OPTIMIZER, 4 * P, g, 8 * P / W },
                { DT_SHARD_GRADIENTS, 4 * P, g / W + 4 * (U + E), 8 * P / W },
                { DT_SHARD_PARAMETERS, 4 * P / W + 4 * (2 * U + E), g / W + 4 * (U + E), 8 * P / W },
            };
            dt_plan_t base, p;
            dt_emsg_t em;

            cr_assert_eq(dt_model_unit_max(&q.model), (int64_t)U);
            q.batch = batch;
            cr_assert_eq(make(&q, &base, &em), 0, "%s", em.s);
            for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
                q.shard = want[i].sh;
                cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
                cr_assert_eq(p.shard, want[i].sh);
                cr_assert_eq(p.mem.weights, want[i].w, "tied %d batch %d %s", tied, batch,
                             dt_shard_name(want[i].sh));
                cr_assert_eq(p.mem.grads, want[i].g, "tied %d batch %d %s: %.0f vs %.0f", tied,
                             batch, dt_shard_name(want[i].sh), p.mem.grads, want[i].g);
                cr_assert_eq(p.mem.optimizer, want[i].o, "tied %d batch %d %s", tied, batch,
                             dt_shard_name(want[i].sh));
                cr_assert_float_eq(p.mem.total - state(&p), base.mem.total - state(&base), 1e-6,
                                   "the per-token parts do not change");
                dt_plan_clear(&p);
            }
            dt_plan_clear(&base);
        }
    }
}

/* The same on an H100 in bf16 (elem 2), the GPU engine's state
 * (engine/model/train_cuda.c): the dtype copy 2 P, an fp32 gradient 4 P,
 * master copy 4 P and moments 8 P (18 P), sliced by the level; sharded
 * gradients add two fp32 unit buffers 8 U, a tied embedding's 4 V d and
 * the reduce-scatter's scratch rs (W units, at most 64 MiB); sharded
 * parameters two dtype unit buffers 4 U and two units' norm gains 16 d:
 *   none        (16 + 2) P
 *   optimizer   (4 + 4 + 2) P + 8 P / W
 *   gradients   (4 + 2) P + 12 P / W + 8 U + rs (+ 4 V d tied)
 *   parameters  18 P / W + 4 U + 16 d + 8 U + rs (+ 4 V d tied) */
Test(planner, shard_memory_by_hand_gpu)
{
    for (int tied = 0; tied < 2; tied++) {
        dt_plan_req_t q = small_train("h100-sxm", DT_BF16, tied);
        double P = small_params(tied), U = SM_LAYER, E = tied ? SM_V * SM_D : 0, W = 4;
        double rs = fmin(64.0 * 1024 * 1024, 4 * U * W), G = 4 * P / W + 8 * U + 4 * E + rs;
        const struct {
            enum dt_shard_level sh;
            double w, g, o, sum;
        } want[] = {
            { DT_SHARD_NONE, 2 * P, 4 * P, 12 * P, 18 * P },
            { DT_SHARD_OPTIMIZER, 2 * P, 4 * P, 4 * P + 8 * P / W, 10 * P + 8 * P / W },
            { DT_SHARD_GRADIENTS, 2 * P, G, 4 * P + 8 * P / W, 6 * P + 8 * P / W + G },
            { DT_SHARD_PARAMETERS, 2 * P / W + 4 * U + 16 * SM_D, G, 12 * P / W,
              14 * P / W + 4 * U + 16 * SM_D + G },
        };
        dt_plan_t base, p;
        dt_emsg_t em;

        cr_assert_eq(make(&q, &base, &em), 0, "%s", em.s);
        for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
            if (!runs(&q, want[i].sh, 1)) {
                refused(q, want[i].sh, 1);
                continue;
            }
            q.shard = want[i].sh;
            cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
            cr_assert_eq(p.mem.weights, want[i].w, "tied %d %s", tied, dt_shard_name(want[i].sh));
            cr_assert_eq(p.mem.grads, want[i].g, "tied %d %s", tied, dt_shard_name(want[i].sh));
            cr_assert_eq(p.mem.optimizer, want[i].o, "tied %d %s", tied, dt_shard_name(want[i].sh));
            cr_assert_float_eq(state(&p), want[i].sum, 1e-9 * want[i].sum, "tied %d %s", tied,
                               dt_shard_name(want[i].sh));
            cr_assert_float_eq(p.mem.total - state(&p), base.mem.total - state(&base), 1e-6);
            dt_plan_clear(&p);
        }
        dt_plan_clear(&base);
    }
}

/* PCIe per step per GPU with offload, by hand at R = 4 (c = 1024): the
 * offloaded layer inputs go down and come up once each (L c d 2 bytes in
 * bf16), beside compute; the host optimizer's slice of the gradient goes
 * down (4 P / 4 with shard = optimizer) and the parameters come up (4 P),
 * after the backward. A node's page-locked host memory must hold its
 * ranks' host bytes, or the plan is refused naming it. */
Test(planner, pcie_and_host_memory_by_hand)
{
    dt_plan_req_t q = small_train("h100-sxm", DT_BF16, false);
    double P = small_params(false), act = 2 * 1024 * SM_D * 2;
    dt_plan_t p;
    dt_emsg_t em;

    cr_assert_eq(q.cluster.pcie_bps, 50e9);
    cr_assert_gt(q.cluster.host_mem_bytes, 1024.0 * 1024 * 1024 * 1024);
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.pcie_bytes, 0, "no offload, no PCIe");
    dt_plan_clear(&p);
    q.recompute = DT_RECOMPUTE_LAYER;
    q.ckpt_dtype = DT_CKPT_BF16;
    q.offload = DT_OFFLOAD_ACTIVATIONS;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_float_eq(p.pcie_bytes, act, 1e-9 * act);
    cr_assert_float_eq(p.pcie_s, act / 50e9, 1e-9);
    cr_assert(p.pcie_hidden);
    double s_act = p.seconds;
    dt_plan_clear(&p);
    q.offload |= DT_OFFLOAD_OPTIMIZER;
    q.shard = DT_SHARD_OPTIMIZER;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_float_eq(p.pcie_bytes, act + 4 * P, 1e-9 * P);
    cr_assert(!p.pcie_hidden, "the optimizer's copies do not overlap");
    /* the spec's keys override the preset's figures; a cpu job refuses them */
    {
        dt_spec_t sp;
        dt_plan_req_t r;
        cr_assert_eq(dt_spec_parse("s", "kind = train\ntokens = 4K\ngpu = h100-sxm\n"
                                   "host_memory = 1T\npcie_gbps = 25\n", &sp, &em), 0, "%s",
                     em.s);
        cr_assert_eq(dt_plan_req_from_spec(&sp, &r, &em), 0, "%s", em.s);
        cr_assert_eq(r.cluster.host_mem_bytes, 1024.0 * 1024 * 1024 * 1024);
        cr_assert_eq(r.cluster.pcie_bps, 25e9);
        dt_spec_free(&sp);
        cr_assert_neq(dt_spec_parse("s", "kind = train\ntokens = 4K\npcie_gbps = 25\n", &sp,
                                    &em), 0);
        cr_assert(strstr(em.s, "pcie_gbps") && strstr(em.s, "device = cuda"), "%s", em.s);
    }

    cr_assert_gt(p.seconds, s_act + 4 * P / 50e9 * 0.99);
    double host = p.mem.host;
    dt_plan_clear(&p);
    q.cluster.host_mem_bytes = 4 * host - 1;
    cr_assert_neq(make(&q, &p, &em), 0);
    cr_assert(strstr(em.s, "host memory:") && strstr(em.s, "4 ranks"), "%s", em.s);
    dt_plan_clear(&p);
}

/* The collectives over the training state per step, by hand at R = 4
 * (f = 3/4): none all-reduces the gradient (2 f P e), optimizer also
 * gathers the updated parameters (+ f P e), gradients reduce-scatters the
 * fp32 gradient and gathers the parameters (f P 4 + f P e), parameters
 * gathers every unit twice and reduce-scatters the gradient (2 f P e +
 * f P 4); e = 4 on the cpu (its link between machines, 1 GB/s: R = 4 is
 * two of them), the dtype's 2 on an H100 (NVLink, 450 GB/s). What follows
 * the backward adds to the step's time, and on the cpu all of it (the CPU
 * engine does not overlap them); on one rank nothing is sent. */
Test(planner, shard_communication_by_hand)
{
    const struct {
        const char *cluster;
        dt_dtype_t prec;
        double e, bw;
    } cases[] = { { "cpu", DT_F32, 4, 1e9 }, { "h100-sxm", DT_BF16, 2, 450e9 } };

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        dt_plan_req_t q = small_train(cases[k].cluster, cases[k].prec, false);
        double P = small_params(false), f = 0.75, e = cases[k].e, bw = cases[k].bw;
        const struct {
            enum dt_shard_level sh;
            double bytes;
        } want[] = {
            { DT_SHARD_NONE, 2 * f * P * e },
            { DT_SHARD_OPTIMIZER, 3 * f * P * e },
            { DT_SHARD_GRADIENTS, f * P * 4 + f * P * e },
            { DT_SHARD_PARAMETERS, 2 * f * P * e + f * P * 4 },
        };
        dt_plan_t p, none;
        dt_emsg_t em;

        cr_assert_eq(make(&q, &none, &em), 0, "%s", em.s);
        for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
            if (!runs(&q, want[i].sh, 1)) {
                refused(q, want[i].sh, 1);
                continue;
            }
            q.shard = want[i].sh;
            cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
            cr_assert_float_eq(p.shard_comm_s, want[i].bytes / bw, 1e-9 * p.shard_comm_s,
                               "%s %s: %g s", cases[k].cluster, dt_shard_name(want[i].sh),
                               p.shard_comm_s);
            if (!q.cuda) {
                /* the CPU engine runs them in line: all of it counts */
                cr_assert_float_eq(p.seconds - none.seconds,
                                   p.shard_comm_s - none.shard_comm_s, 1e-6 * p.seconds);
                cr_assert_eq(p.shard_hidden, false);
            }
            if (want[i].sh == DT_SHARD_OPTIMIZER) {
                cr_assert_float_eq(p.seconds - none.seconds, f * P * e / bw, 1e-6 * p.seconds,
                                   "the gather after the backward");
                cr_assert(!p.shard_hidden, "after the backward: nothing to hide behind");
            }
            dt_plan_clear(&p);
        }
        dt_plan_clear(&none);

        q.ranks = 1;
        q.shard = runs(&q, DT_SHARD_PARAMETERS, 1) ? DT_SHARD_PARAMETERS : DT_SHARD_OPTIMIZER;
        cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
        cr_assert_eq(p.shard_comm_s, 0);
        cr_assert(p.shard_hidden);
        dt_plan_clear(&p);
    }
}

/* The pick at the user's R (4 on the cpu preset), T = 16384 so that the
 * activations outweigh the state: the memory of a rank set to each plan's
 * total in turn. Least change first: unsharded and no recompute; then the
 * shard levels in order; then, when no level fits without recompute,
 * recompute = layer, the least sharding with it; when nothing fits, the
 * most there is, refused. The user's values are honoured. */
Test(planner, shard_and_recompute_pick_order)
{
    dt_plan_req_t q = small_train("cpu", DT_F32, false);
    double t[DT_SHARD_PARAMETERS + 1][2];
    dt_plan_t p;
    dt_emsg_t em;

    q.tokens = 16384;
    for (enum dt_shard_level sh = DT_SHARD_NONE; sh <= DT_SHARD_PARAMETERS; sh++) {
        for (int l = 0; l < 2; l++) {
            q.shard = sh;
            q.recompute = l ? DT_RECOMPUTE_LAYER : DT_RECOMPUTE_NONE;
            cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
            t[sh][l] = p.mem.total;
            dt_plan_clear(&p);
        }
    }
    /* each level saves memory; recompute more than all the sharding */
    cr_assert_lt(t[DT_SHARD_OPTIMIZER][0], t[DT_SHARD_NONE][0]);
    cr_assert_lt(t[DT_SHARD_GRADIENTS][0], t[DT_SHARD_OPTIMIZER][0]);
    cr_assert_lt(t[DT_SHARD_PARAMETERS][0], t[DT_SHARD_GRADIENTS][0]);
    cr_assert_lt(t[DT_SHARD_NONE][1], t[DT_SHARD_PARAMETERS][0]);
    cr_assert_lt(t[DT_SHARD_OPTIMIZER][1], t[DT_SHARD_NONE][1]);

    const struct {
        double mem;
        enum dt_shard_level sh;
        bool layer;
        const char *note; /* its start; "" none */
    } cases[] = {
        { t[DT_SHARD_NONE][0], DT_SHARD_NONE, false, "" },
        { t[DT_SHARD_NONE][0] - 1, DT_SHARD_OPTIMIZER, false,
          "shard = optimizer: without sharding the weights, gradients and optimizer need" },
        { t[DT_SHARD_OPTIMIZER][0] - 1, DT_SHARD_GRADIENTS, false, "shard = gradients: " },
        { t[DT_SHARD_GRADIENTS][0] - 1, DT_SHARD_PARAMETERS, false, "shard = parameters: " },
        { t[DT_SHARD_PARAMETERS][0] - 1, DT_SHARD_NONE, true,
          "recompute = layer: without it the activations need" },
        { t[DT_SHARD_NONE][1] - 1, DT_SHARD_OPTIMIZER, true,
          "shard = optimizer, recompute = layer: without sharding" },
        { t[DT_SHARD_GRADIENTS][1], DT_SHARD_GRADIENTS, true, "shard = gradients, recompute" },
    };
    q.shard = DT_SHARD_AUTO;
    q.recompute = DT_RECOMPUTE_AUTO;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        q.cluster.mem_bytes = cases[i].mem;
        cr_assert_eq(make(&q, &p, &em), 0, "case %zu: %s", i, em.s);
        cr_assert_eq(p.shard, cases[i].sh, "case %zu: shard = %s", i, dt_shard_name(p.shard));
        cr_assert_eq(p.recompute, cases[i].layer, "case %zu", i);
        cr_assert_eq(p.ranks, 4);
        cr_assert_eq(strncmp(p.note, cases[i].note, strlen(cases[i].note)), 0, "case %zu: %s", i,
                     p.note);
        if (!cases[i].note[0])
            cr_assert_str_eq(p.note, "");
        dt_plan_clear(&p);
    }
    /* shard and recompute reach the JSON */
    q.cluster.mem_bytes = t[DT_SHARD_NONE][1] - 1;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    json_t *j = dt_plan_to_json(&q, &p);
    cr_assert_str_eq(json_string_value(json_object_get(j, "shard")), "optimizer");
    cr_assert_str_eq(json_string_value(json_object_get(j, "recompute")), "layer");
    cr_assert(json_is_real(json_object_get(j, "shard_comm_s")));
    cr_assert(json_is_boolean(json_object_get(j, "shard_hidden")));
    cr_assert(strstr(json_string_value(json_object_get(j, "note")), "without recompute"));
    json_decref(j);
    dt_plan_clear(&p);

    /* nothing fits: the most sharding and recompute, refused */
    q.cluster.mem_bytes = t[DT_SHARD_PARAMETERS][1] - 1;
    cr_assert_eq(make(&q, &p, &em), DT_ENOSPC, "%s", em.s);
    cr_assert(!p.fits);
    cr_assert_eq(p.shard, DT_SHARD_PARAMETERS);
    cr_assert(p.recompute);
    cr_assert(strstr(p.note, "shard = parameters, recompute = layer does not fit either"), "%s",
              p.note);
    cr_assert_str_eq(p.reason, em.s);
    dt_plan_clear(&p);

    /* the user's shard, fitting or not; recompute still the planner's */
    q.cluster.mem_bytes = t[DT_SHARD_NONE][0] - 1;
    q.shard = DT_SHARD_NONE;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.shard, DT_SHARD_NONE);
    cr_assert(p.recompute, "shard = none asked: recompute instead");
    dt_plan_clear(&p);
    q.cluster.mem_bytes = t[DT_SHARD_GRADIENTS][0] - 1;
    q.shard = DT_SHARD_GRADIENTS;
    q.recompute = DT_RECOMPUTE_NONE;
    cr_assert_eq(make(&q, &p, &em), DT_ENOSPC, "the user's gradients is honoured");
    cr_assert_eq(p.shard, DT_SHARD_GRADIENTS);
    cr_assert(!p.recompute);
    cr_assert_str_eq(p.note, "");
    cr_assert(strstr(em.s, "at R=4"), "%s", em.s);
    j = dt_plan_to_json(&q, &p);
    cr_assert_str_eq(json_string_value(json_object_get(j, "shard")), "gradients");
    json_decref(j);
    dt_plan_clear(&p);
    /* and the user's recompute with the planner's shard: none does not
     * fit without sharding, so the least sharding that does */
    q.cluster.mem_bytes = t[DT_SHARD_NONE][0] - 1;
    q.shard = DT_SHARD_AUTO;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.shard, DT_SHARD_OPTIMIZER);
    cr_assert(!p.recompute);
    dt_plan_clear(&p);
}

/* With R free the fewest ranks come first: 2048 tokens of the small model
 * (16 layers, so that a unit is small against the whole, as in real ones)
 * on cpu ranks of just the memory the unsharded plan needs on 8 ranks;
 * sharded, the state shrinks and the tokens fit on fewer ranks. The least
 * sharding among the fewest ranks is taken, and the note says how many
 * ranks the least sharding that fits needs. */
Test(planner, shard_saves_ranks)
{
    dt_plan_req_t q = small_train("cpu", DT_F32, false);
    dt_plan_t none, p;
    dt_emsg_t em;

    q.tokens = 2048;
    q.ranks = 8;
    q.model.layers = 16; /* units small against the model, as in real ones */
    q.cluster.peer_bytes = 0; /* a memory that does not grow with the ranks */
    cr_assert_eq(make(&q, &none, &em), 0, "%s", em.s);
    q.ranks = 0;
    q.cluster.mem_bytes = none.mem.total;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.ranks, 8, "unsharded: the fewest ranks that fit");
    dt_plan_clear(&p);

    q.shard = DT_SHARD_AUTO;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.ranks, 4, "R=%d: %s", p.ranks, p.note);
    cr_assert_eq(p.shard, DT_SHARD_GRADIENTS, "%s", p.note);
    cr_assert(!p.recompute);
    cr_assert_str_eq(p.note, "shard = gradients: fits on 4 ranks; the least sharding that "
                             "fits, shard = none, needs 8");
    dt_plan_clear(&p);
    /* parameters reaches 4 too, not fewer: gradients is the least */
    q.shard = DT_SHARD_PARAMETERS;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.ranks, 4);
    dt_plan_clear(&p);
    /* optimizer alone does not reach 4: it keeps the weights and the
     * gradient whole */
    q.shard = DT_SHARD_OPTIMIZER;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_gt(p.ranks, 4);
    dt_plan_clear(&p);
    dt_plan_clear(&none);
}

/* The headline: llama3-8b and llama3-70b trained over 1M tokens on H100s,
 * refused unsharded (every rank would hold 18 bytes a parameter), fit with
 * the parameters sharded. 8B: on 128 ranks without recompute (the least
 * sharding that fits, gradients, needs 512), its per-unit gathers hidden;
 * on 4 nodes with recompute as well. 70B: without recompute on many more
 * ranks, its transfers no longer hidden; on 16 nodes with recompute. */
Test(planner, shard_fits_llama3_at_1M_tokens)
{
    dt_plan_req_t q = llama_req("h100-sxm", DT_KIND_TRAIN, INT64_C(1) << 20);
    dt_plan_t p;
    dt_emsg_t em;

    q.cuda = true;
    cr_assert(runs(&q, DT_SHARD_PARAMETERS, 1), "the GPU engine runs every shard level");
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.fits);
    cr_assert_eq(p.shard, DT_SHARD_PARAMETERS);
    cr_assert(!p.recompute);
    cr_assert_leq(p.ranks, 128, "R=%d", p.ranks);
    cr_assert_leq(p.mem.total, q.cluster.mem_bytes);
    cr_assert(p.shard_hidden, "a layer's compute hides its gathers");
    cr_assert(strstr(p.note, "the least sharding that fits, shard = gradients"), "%s", p.note);
    int R = p.ranks;
    dt_plan_clear(&p);
    q.shard = DT_SHARD_GRADIENTS;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_gt(p.ranks, R, "gradients needs more ranks");
    dt_plan_clear(&p);
    q.shard = DT_SHARD_AUTO;
    q.cluster.nodes = 2;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.shard, DT_SHARD_PARAMETERS);
    cr_assert(p.recompute);
    cr_assert_leq(p.ranks, 16);
    dt_plan_clear(&p);

    cr_assert_eq(dt_model_preset("llama3-70b", &q.model, NULL), 0);
    q.cluster.nodes = 0;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.fits);
    cr_assert_eq(p.shard, DT_SHARD_PARAMETERS);
    cr_assert(!p.recompute);
    cr_assert(strstr(p.note, "without sharding the weights, gradients and optimizer need "
                             "1182.75 GiB per rank"),
              "%s", p.note);
    /* a GPU's layer of 4096 tokens still covers its unit's gather */
    cr_assert(p.shard_hidden, "c = %lld tokens per rank", (long long)p.tokens_per_rank);
    dt_plan_clear(&p);
    q.cluster.nodes = 16;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.shard, DT_SHARD_PARAMETERS);
    cr_assert(p.recompute);
    cr_assert_leq(p.ranks, 128);
    dt_plan_clear(&p);
}

/* A GPU train spec that leaves offload (and ckpt_dtype) unset: the
 * planner takes offload where it saves GPUs (the issue's targets: 8B at
 * 512K on one H100, 4M on one node, 70B at 1M on at most 8 nodes), none
 * where it saves nothing, and one that fits nowhere names every candidate
 * tried; a spec that sets offload is planned as it says. */
static int plan_text(const char *text, dt_plan_req_t *q, dt_plan_t *p, dt_emsg_t *em)
{
    dt_spec_t sp;

    cr_assert_eq(dt_spec_parse("s", text, &sp, em), 0, "%s", em->s);
    cr_assert_eq(dt_plan_req_from_spec(&sp, q, em), 0, "%s", em->s);
    dt_spec_free(&sp);
    return make(q, p, em);
}

Test(planner, offload_auto_pick)
{
    dt_plan_req_t q;
    dt_plan_t p;
    dt_emsg_t em;

    cr_assert_eq(plan_text("kind = train\nmodel = llama3-8b\ndevice = cuda\ngpu = h100-sxm\n"
                           "tokens = 512K\nranks = 1\n", &q, &p, &em), 0, "%s", em.s);
    cr_assert(q.offload_auto && q.ckpt_auto);
    cr_assert_eq(p.ranks, 1);
    cr_assert_eq(p.offload, DT_OFFLOAD_ACTIVATIONS | DT_OFFLOAD_OPTIMIZER);
    cr_assert_eq(p.shard, DT_SHARD_GRADIENTS, "the gradient streams to the host");
    cr_assert(p.recompute);
    cr_assert_leq(p.mem.total, q.cluster.mem_bytes);
    cr_assert(strstr(p.note, "offload = activations,optimizer chosen by the planner: fits on "
                             "1 GPU, without offload it does not fit"), "%s", p.note);
    dt_plan_clear(&p);

    cr_assert_eq(plan_text("kind = train\nmodel = llama3-8b\ndevice = cuda\ngpu = h100-sxm\n"
                           "tokens = 4M\nnodes = 1\n", &q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.ranks, 8);
    cr_assert_eq(p.ckpt_dtype, DT_CKPT_BF16, "fp32 layer inputs overfill the host");
    cr_assert(strstr(p.note, "ckpt_dtype = bf16"), "%s", p.note);
    dt_plan_clear(&p);

    cr_assert_eq(plan_text("kind = train\nmodel = llama3-70b\ndevice = cuda\ngpu = h100-sxm\n"
                           "tokens = 1M\nnodes = 8\n", &q, &p, &em), 0, "%s", em.s);
    cr_assert_leq(p.ranks, 64);
    cr_assert(p.offload != 0);
    dt_plan_clear(&p);

    /* fits without: nothing offloaded */
    cr_assert_eq(plan_text("kind = train\nmodel = tiny\ndevice = cuda\ngpu = h100-sxm\n"
                           "tokens = 4K\n", &q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.offload, 0);
    cr_assert_eq(p.note[0], '\0', "%s", p.note);
    dt_plan_clear(&p);

    /* as asked: none stays none, and so does fp32 */
    cr_assert_neq(plan_text("kind = train\nmodel = llama3-8b\ndevice = cuda\ngpu = h100-sxm\n"
                            "tokens = 512K\nranks = 1\noffload = none\n", &q, &p, &em), 0);
    cr_assert_eq(p.offload, 0);
    dt_plan_clear(&p);

    /* nowhere: every candidate named */
    cr_assert_neq(plan_text("kind = train\nmodel = llama3-70b\ndevice = cuda\ngpu = h100-sxm\n"
                            "tokens = 4M\nranks = 1\n", &q, &p, &em), 0);
    cr_assert(strstr(p.note, "nor with offload: tried none, optimizer, activations,optimizer, "
                             "activations,optimizer (bf16 layer inputs)"), "%s", p.note);
    dt_plan_clear(&p);
}

/* attn and prefill keep no training state: shard is refused, named. */
Test(planner, shard_refused_outside_training)
{
    dt_plan_req_t q = attn_req(16384, 4, 8, 2, 64, true, DT_LAYOUT_ZIGZAG);
    dt_plan_t p;
    dt_emsg_t em;

    q.shard = DT_SHARD_OPTIMIZER;
    cr_assert_eq(make(&q, &p, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "shard = optimizer is for train jobs: kind attn"), "%s", em.s);
    dt_plan_clear(&p);
    q.shard = DT_SHARD_NONE;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.shard, DT_SHARD_NONE);
    dt_plan_clear(&p);

    q = llama_req("h100-sxm", DT_KIND_PREFILL, 1 << 20);
    q.shard = DT_SHARD_PARAMETERS;
    cr_assert_eq(make(&q, &p, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "shard = parameters is for train jobs: kind prefill"), "%s", em.s);
    dt_plan_clear(&p);
}

/* The same model trained on an H100 in bf16 is planned with what dtengine
 * train --device cuda allocates (spec/model.h): dtype weights, an fp32
 * gradient, an fp32 master copy and moments; per token per layer what a
 * layer keeps, fp32 (its input, o, lse) and bf16 (q, k, v); the
 * token-local parts in 1024-token tiles, the LM head's chunk of logits
 * (fp32 and its bf16 gradient) among them, in the fixed workspace: no
 * (tokens x ffn) scratch at any length. */
Test(planner, gpu_training_memory_by_hand)
{
    dt_plan_req_t q = tiny_train("h100-sxm", DT_BF16);
    dt_plan_t p, t;
    dt_emsg_t em;

    cr_assert_eq(make(&q, &t, &em), 0, "%s", em.s);
    q.tokens = 1024;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    double d = 256, L = 4, H = 8, kv = 64, f = 768, v = 512, c = 1024;
    double P = L * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + v * d + d;
    cr_assert_eq(p.tokens_per_rank, 1024);
    cr_assert_eq(p.mem.weights, 2 * P);
    cr_assert_eq(p.mem.grads, 4 * P);
    cr_assert_eq(p.mem.optimizer, 12 * P);
    cr_assert_eq(p.mem.activations, c * L * (4 * (d + d + H) + 2 * (d + 2 * kv)));
    cr_assert_geq(p.mem.workspace, 1024 * v * (4 + 2), "the head's chunk");
    /* 4096 tokens: four tiles, the same per token */
    cr_assert_eq(t.tokens_per_rank, 4096);
    cr_assert_eq(t.mem.activations, 4096 * L * (4 * (d + d + H) + 2 * (d + 2 * kv)));
    cr_assert_geq(t.mem.workspace, 1024 * f * (5 * 4 + 2 * 2), "the MLP's tile");
    cr_assert_lt(t.mem.workspace, 4 * p.mem.workspace, "no (tokens x ffn) scratch");
    dt_plan_clear(&t);
    dt_plan_clear(&p);
}

/* recompute = layer on one cpu rank, by hand: the layers keep their
 * inputs (4 d per token each), the workspace gains one layer's
 * activations and the recomputed layer's input; the FLOPs stay the
 * model's, the time gains one forward of every layer (attention forward
 * and 2 Pmm_layers c), weights and the rest unchanged. */
Test(planner, recompute_memory_and_time_by_hand)
{
    dt_plan_req_t q = tiny_train("cpu", DT_F32);
    dt_plan_t none, layer;
    dt_emsg_t em;

    q.recompute = DT_RECOMPUTE_NONE;
    cr_assert_eq(make(&q, &none, &em), 0, "%s", em.s);
    q.recompute = DT_RECOMPUTE_LAYER;
    cr_assert_eq(make(&q, &layer, &em), 0, "%s", em.s);
    cr_assert(layer.recompute && !none.recompute);
    cr_assert_str_eq(layer.note, "", "the user's choice needs no note");

    double d = TINY_D, L = TINY_L, H = TINY_H, kv = TINY_KV, f = TINY_F, c = 4096;
    cr_assert_eq(layer.mem.activations, c * (L * 4 * d + 4 * (2 * d + 1)));
    cr_assert_eq(layer.mem.workspace,
                 tiny_cpu_workspace(c, c) + c * (tiny_cpu_layer_act() + 4 * d));
    cr_assert_eq(layer.mem.weights, none.mem.weights);
    cr_assert_eq(layer.mem.optimizer, none.mem.optimizer);
    cr_assert_eq(layer.mem.kv_buffers, none.mem.kv_buffers);
    cr_assert_lt(layer.mem.total, 0.6 * none.mem.total);

    cr_assert_eq(layer.flops, none.flops, "useful FLOPs: the recompute is not counted");
    double Pmm_layers = L * (2 * d * d + 2 * d * kv + 3 * d * f);
    double attn = 4 * H * 32 * c * (c + 1) / 2; /* causal, one layer's forward */
    double pe = q.cluster.peak_flops * q.cluster.efficiency;
    cr_assert_float_eq(layer.seconds - none.seconds, (L * attn + 2 * Pmm_layers * c) / pe,
                       1e-9 * layer.seconds);
    dt_plan_clear(&none);
    dt_plan_clear(&layer);

    /* on an H100 in bf16 the GPU engine's account with recompute
     * (spec/model.h): a layer keeps its fp32 input; one layer's attention
     * activations (what it kept less its input) move to the per-token
     * workspace */
    dt_plan_req_t g = tiny_train("h100-sxm", DT_BF16);
    g.recompute = DT_RECOMPUTE_NONE;
    cr_assert_eq(make(&g, &none, &em), 0, "%s", em.s);
    g.recompute = DT_RECOMPUTE_LAYER;
    cr_assert_eq(make(&g, &layer, &em), 0, "%s", em.s);
    dt_gpu_train_bytes_t b0 =
        dt_model_gpu_train_bytes(&g.model, 2, 0, layer.tokens_per_rank, 4, 0);
    cr_assert_eq(layer.mem.activations, c * L * 4 * d);
    cr_assert_eq(layer.mem.workspace - none.mem.workspace, c * (b0.per_token_layer - 4 * d));
    dt_plan_clear(&none);
    dt_plan_clear(&layer);
}

/* Unset, the planner recomputes when nothing fits without: 64K tokens of
 * tiny on one cpu rank (4 GiB) need 5.4 GiB with every layer's
 * activations, 2.8 with recompute. The plan says so, in the note and the
 * JSON; the user's none is honoured and refused with the memory reason;
 * where none fits, unset plans none. */
Test(planner, recompute_auto_pick)
{
    dt_plan_req_t q = tiny_train("cpu", DT_F32);
    dt_plan_t p, none;
    dt_emsg_t em;

    q.tokens = 65536;
    q.recompute = DT_RECOMPUTE_AUTO;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.fits && p.recompute, "planned with recompute = layer");
    cr_assert_eq(p.ranks, 1);
    cr_assert_leq(p.mem.total, q.cluster.mem_bytes);

    q.recompute = DT_RECOMPUTE_NONE;
    cr_assert_eq(make(&q, &none, &em), DT_ENOSPC, "the user's none is honoured");
    cr_assert(!none.fits && !none.recompute);
    cr_assert_str_eq(none.note, "");
    cr_assert(strstr(em.s, "memory:") && strstr(em.s, "at R=1"), "%s", em.s);
    cr_assert_str_eq(none.reason, em.s);
    cr_assert_gt(none.mem.total, q.cluster.mem_bytes);

    /* the note: what none would need at the plan's R */
    char want[256];
    snprintf(want, sizeof(want),
             "recompute = layer: without it the activations need %.2f GiB per rank at R=1 "
             "(%.2f GiB in all, 4.00 GiB available)",
             none.mem.activations / GiB, none.mem.total / GiB);
    cr_assert_str_eq(p.note, want);
    json_t *j = dt_plan_to_json(&q, &p);
    cr_assert_str_eq(json_string_value(json_object_get(j, "recompute")), "layer");
    cr_assert_str_eq(json_string_value(json_object_get(j, "note")), want);
    cr_assert(json_is_true(json_object_get(j, "fits")));
    json_decref(j);
    j = dt_plan_to_json(&q, &none);
    cr_assert_str_eq(json_string_value(json_object_get(j, "recompute")), "none");
    cr_assert_null(json_object_get(j, "note"));
    json_decref(j);
    dt_plan_clear(&p);
    dt_plan_clear(&none);

    /* the planner's choice of R comes first: with R free, none fits on more
     * ranks and is planned */
    q.ranks = 0;
    q.recompute = DT_RECOMPUTE_AUTO;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(!p.recompute);
    cr_assert_gt(p.ranks, 1);
    cr_assert_str_eq(p.note, "");
    dt_plan_clear(&p);

    /* and no cluster is big enough: 4 ranks at most (2 nodes of 2) */
    q.tokens = 262144;
    q.cluster.nodes = 2;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.recompute && p.ranks <= 4, "R=%d", p.ranks);
    cr_assert(strstr(p.note, "recompute = layer: without it"), "%s", p.note);
    dt_plan_clear(&p);
    q.recompute = DT_RECOMPUTE_NONE;
    cr_assert_eq(make(&q, &p, &em), DT_ERANGE, "%s", em.s);
    cr_assert(!p.recompute);
    dt_plan_clear(&p);

    /* a refusal that is not about memory is left alone: 8 ranks asked of
     * a cluster of 4 */
    q.tokens = 4096;
    q.ranks = 8;
    q.recompute = DT_RECOMPUTE_AUTO;
    cr_assert_eq(make(&q, &p, &em), DT_ERANGE, "%s", em.s);
    cr_assert(!p.recompute);
    cr_assert_str_eq(p.note, "");
    dt_plan_clear(&p);
}

/* llama3-8b trained on H100s with shard = none: every rank holds the
 * whole model (weights, grads, optimizer 134.6 GiB), so recompute cannot
 * help and the plan says so rather than choosing it; the same at shard =
 * optimizer, which keeps the weights and gradients whole. */
Test(planner, recompute_does_not_help_the_whole_model)
{
    dt_plan_req_t q = llama_req("h100-sxm", DT_KIND_TRAIN, 1 << 20);
    dt_plan_t p;
    dt_emsg_t em;

    q.shard = DT_SHARD_NONE;
    cr_assert_eq(make(&q, &p, &em), DT_ENOSPC);
    cr_assert(!p.recompute);
    cr_assert_eq(p.shard, DT_SHARD_NONE);
    cr_assert(strstr(em.s, "every rank holds the whole model"), "%s", em.s);
    cr_assert(strstr(p.note, "recompute = layer would not help"), "%s", p.note);
    cr_assert(strstr(p.note, "shard = parameters divides them over the ranks"), "%s", p.note);
    dt_plan_clear(&p);

    q.shard = DT_SHARD_OPTIMIZER;
    q.cluster.mem_bytes = 70 * GiB;
    cr_assert_eq(make(&q, &p, &em), DT_ENOSPC);
    cr_assert_eq(p.shard, DT_SHARD_OPTIMIZER);
    cr_assert(strstr(em.s, "still holds the whole weights and gradients"), "%s", em.s);
    cr_assert(strstr(p.note, "recompute = layer would not help"), "%s", p.note);
    dt_plan_clear(&p);
}

/* The training state per rank by hand (see shard_memory_by_hand_cpu and
 * _gpu), untied, batch 1, at 1 / W = inv_w: inv_w = 0 is the part no W
 * shrinks. */
static dt_plan_mem_t state_by_hand(bool cuda, enum dt_shard_level sh, double inv_w)
{
    double P = small_params(false), U = SM_LAYER;
    dt_plan_mem_t m = { 0 };

    if (cuda) {
        /* parameters: two dtype unit buffers and two units' norm gains;
         * gradients: the two fp32 unit buffers (the largest unit's, a
         * layer's: both U here) and the ring's reduce-scatter scratch of
         * R = 4 units (under the cap); dp adds the replicas' (the
         * caller's ring_part) */
        m.weights = sh == DT_SHARD_PARAMETERS ? 2 * P * inv_w + 4 * U + 16 * SM_D : 2 * P;
        m.grads = sh >= DT_SHARD_GRADIENTS ? 4 * P * inv_w + 8 * U + 4 * 4 * U : 4 * P;
        m.optimizer = sh == DT_SHARD_PARAMETERS  ? 12 * P * inv_w
                      : sh >= DT_SHARD_OPTIMIZER ? 4 * P + 8 * P * inv_w
                                                 : 12 * P;
    } else {
        /* parameters: two units, one computing and the next one arriving */
        m.weights = sh == DT_SHARD_PARAMETERS ? 4 * P * inv_w + 8 * U : 4 * P;
        m.grads = sh >= DT_SHARD_GRADIENTS ? 4 * P * inv_w + 4 * U : 4 * P;
        m.optimizer = sh >= DT_SHARD_OPTIMIZER ? 8 * P * inv_w : 8 * P;
    }
    return m;
}

/* Data parallel (dp = N rings of R ranks, W = N R): the sharded state per
 * rank is divided by W, so dp = 2 halves it against dp = 1 at the same R
 * (the part kept whole does not change); the CPU engine keeps one more
 * fp32 unit per rank with dp (4 U in grads, at every level), the GPU
 * engine with sharded gradients the replicas' reduce-scatter scratch (N
 * units: 8 U, in grads); both engines run dp at every level; everything
 * per token is one ring's and does not change. The step trains N
 * sequences: N times the FLOPs, the same FLOPs per token; the collectives
 * over the state span W ranks at the slowest link (f = (W - 1) / W; on
 * the cpu, W = 8 leaves a machine: 1 GB/s; on an H100 W = 8 is one node:
 * NVLink), and on the cpu they are all the time dp adds. */
Test(planner, dp_divides_the_sharded_state_over_every_ring)
{
    const struct {
        const char *cluster;
        dt_dtype_t prec;
        double e, bw;
    } cases[] = { { "cpu", DT_F32, 4, 1e9 }, { "h100-sxm", DT_BF16, 2, 450e9 } };

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        dt_plan_req_t q = small_train(cases[k].cluster, cases[k].prec, false);
        double P = small_params(false), U = SM_LAYER, e = cases[k].e, bw = cases[k].bw;
        double ring_part = q.cuda ? 0 : 4 * U, f = 7.0 / 8;
        const double cuda_rs2 = 4 * U * 2; /* the replicas' scratch, N = 2 units */
        const enum dt_shard_level levels[] = { DT_SHARD_NONE, DT_SHARD_OPTIMIZER,
                                               DT_SHARD_GRADIENTS, DT_SHARD_PARAMETERS };
        const double bytes[] = { 2 * f * P * e, 3 * f * P * e, f * P * 4 + f * P * e,
                                 2 * f * P * e + f * P * 4 };

        for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
            const char *lv = dt_shard_name(levels[i]);
            if (q.cuda)
                ring_part = levels[i] >= DT_SHARD_GRADIENTS ? cuda_rs2 : 0;
            if (!runs(&q, levels[i], 2)) {
                refused(q, levels[i], 2);
                continue;
            }
            dt_plan_mem_t w1 = state_by_hand(q.cuda, levels[i], 1.0 / 4);
            dt_plan_mem_t w2 = state_by_hand(q.cuda, levels[i], 1.0 / 8);
            dt_plan_mem_t kept = state_by_hand(q.cuda, levels[i], 0);
            dt_plan_t one, two;
            dt_emsg_t em;

            q.shard = levels[i];
            q.dp = 1;
            cr_assert_eq(make(&q, &one, &em), 0, "%s", em.s);
            q.dp = 2;
            cr_assert_eq(make(&q, &two, &em), 0, "%s %s: %s", cases[k].cluster, lv, em.s);
            cr_assert_eq(one.dp, 1);
            cr_assert_eq(one.workers, 4);
            cr_assert_eq(two.dp, 2);
            cr_assert_eq(two.ranks, 4, "ranks stays the ring's");
            cr_assert_eq(two.workers, 8);
            cr_assert_eq(two.tokens_per_rank, one.tokens_per_rank);

            /* by hand: W = 4 at dp = 1, W = 8 and the ring part at dp = 2 */
            cr_assert_eq(one.mem.weights, w1.weights, "%s %s", cases[k].cluster, lv);
            cr_assert_eq(one.mem.grads, w1.grads, "%s %s", cases[k].cluster, lv);
            cr_assert_eq(one.mem.optimizer, w1.optimizer, "%s %s", cases[k].cluster, lv);
            /* with parameters the gather has its own ring part too */
            double wring = !q.cuda && levels[i] == DT_SHARD_PARAMETERS ? ring_part : 0;
            cr_assert_eq(two.mem.weights, w2.weights + wring, "%s %s", cases[k].cluster, lv);
            cr_assert_eq(two.mem.grads, w2.grads + ring_part, "%s %s: %.0f vs %.0f",
                         cases[k].cluster, lv, two.mem.grads, w2.grads + ring_part);
            cr_assert_eq(two.mem.optimizer, w2.optimizer, "%s %s", cases[k].cluster, lv);
            /* so the sharded part halves, and the whole part stays */
            double s1 = state(&one) - (kept.weights + kept.grads + kept.optimizer);
            double s2 = state(&two) - ring_part - wring -
                        (kept.weights + kept.grads + kept.optimizer);
            cr_assert_float_eq(s2, s1 / 2, 1e-9 * P, "%s %s: sharded %.0f at dp 2, %.0f at dp 1",
                               cases[k].cluster, lv, s2, s1);
            if (levels[i] == DT_SHARD_NONE)
                cr_assert_eq(s1, 0, "none keeps it whole");
            else
                cr_assert_gt(s1, 0, "%s shards something", lv);
            cr_assert_float_eq(two.mem.total - state(&two) - two.mem.fixed,
                               one.mem.total - state(&one) - one.mem.fixed, 1e-6,
                               "%s %s: the per-token parts are one ring's", cases[k].cluster, lv);
            /* and the transport's buffers are for dp R - 1 peers */
            cr_assert_float_eq(two.mem.fixed - one.mem.fixed,
                               two.workers > one.workers
                                   ? q.cluster.peer_bytes * (two.workers - one.workers)
                                   : 0.0,
                               1e-6, "%s %s", cases[k].cluster, lv);

            cr_assert_float_eq(two.flops, 2 * one.flops, 1e-9 * two.flops);
            cr_assert_float_eq(two.flops_per_token, one.flops_per_token,
                               1e-9 * one.flops_per_token);
            cr_assert_float_eq(two.shard_comm_s, bytes[i] / bw, 1e-9 * two.shard_comm_s,
                               "%s %s: %g s", cases[k].cluster, lv, two.shard_comm_s);
            if (!q.cuda)
                cr_assert_float_eq(two.seconds - one.seconds,
                                   two.shard_comm_s - one.shard_comm_s, 1e-6 * two.seconds,
                                   "the cpu: the rings side by side, the collectives in line");
            dt_plan_clear(&one);
            dt_plan_clear(&two);
        }
    }
}

/* The same by hand on the cpu at shard = parameters, R = 4, dp = 2 (W = 8):
 * weights 4 P / 8 + 4 U, grads 4 P / 8 + 4 U + 4 U (the ring part),
 * optimizer 8 P / 8. */
Test(planner, dp_memory_by_hand_cpu)
{
    dt_plan_req_t q = small_train("cpu", DT_F32, false);
    double P = small_params(false), U = SM_LAYER;
    dt_plan_t p;
    dt_emsg_t em;

    q.shard = DT_SHARD_PARAMETERS;
    q.dp = 2;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.mem.weights, 4 * P / 8 + 8 * U + 4 * U);
    cr_assert_eq(p.mem.grads, 4 * P / 8 + 4 * U + 4 * U);
    cr_assert_eq(p.mem.optimizer, 8 * P / 8);
    dt_plan_clear(&p);
    q.shard = DT_SHARD_NONE;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.mem.weights, 4 * P);
    cr_assert_eq(p.mem.grads, 4 * P + 4 * U, "unsharded too: dt_model_gather's ring part");
    cr_assert_eq(p.mem.optimizer, 8 * P);
    dt_plan_clear(&p);
}

/* The workers are dp x ranks: the nodes (spares included), the placement
 * (contiguous blocks of gpus_per_node over every worker, ring after ring)
 * and the ring hops inside a node, each ring's. R = 6 on nodes of 8, dp = 2:
 * ring 0 is ranks 0-5 (node 0, 6 hops inside), ring 1 ranks 6-11 (nodes
 * 0, 0, 1, 1, 1, 1: 4 hops inside, 7 -> 8 and 11 -> 6 cross). */
Test(planner, dp_workers_nodes_placement)
{
    static const struct {
        int R, dp, gpn, spares, nodes, workers;
        double frac;
    } cases[] = {
        { 6, 2, 8, 0, 2, 12, 10.0 / 12 }, { 4, 2, 8, 0, 1, 8, 1.0 },
        { 4, 2, 8, 1, 2, 8, 1.0 },        { 2, 4, 2, 0, 4, 8, 1.0 },
        { 3, 2, 2, 0, 3, 6, 2.0 / 6 },    { 6, 1, 8, 0, 1, 6, 1.0 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        /* the cpu engine runs dp; nodes of gpn ranks, as GPUs would be */
        dt_plan_req_t q = small_train("cpu", DT_F32, false);
        dt_plan_t p;
        dt_emsg_t em;

        q.tokens = 4096 * 3;
        q.ranks = cases[i].R;
        q.dp = cases[i].dp;
        q.spares = cases[i].spares;
        q.cluster.gpus_per_node = cases[i].gpn;
        cr_assert_eq(make(&q, &p, &em), 0, "case %zu: %s", i, em.s);
        cr_assert_eq(p.ranks, cases[i].R, "case %zu", i);
        cr_assert_eq(p.workers, cases[i].workers, "case %zu", i);
        cr_assert_eq(p.nodes, cases[i].nodes, "case %zu: %d", i, p.nodes);
        for (int r = 0; r < cases[i].workers; r++)
            cr_assert_eq(p.placement[r], r / cases[i].gpn, "case %zu rank %d", i, r);
        cr_assert_float_eq(p.intra_node_frac, cases[i].frac, 1e-12, "case %zu: %g", i,
                           p.intra_node_frac);
        json_t *j = dt_plan_to_json(&q, &p);
        cr_assert_eq(json_integer_value(get(j, "ranks")), cases[i].R);
        cr_assert_eq(json_integer_value(get(j, "dp")), cases[i].dp);
        cr_assert_eq(json_integer_value(get(j, "workers")), cases[i].workers);
        cr_assert_eq(json_array_size(get(j, "placement")), (size_t)cases[i].workers);
        json_decref(j);
        dt_plan_clear(&p);
    }
}

/* The cluster must hold every worker: 4 nodes of 2 CPU ranks take dp = 2
 * rings of 4, not 3; the planner's own R is refused the same way. */
Test(planner, dp_capacity_counts_every_worker)
{
    dt_plan_req_t q = small_train("cpu", DT_F32, false);
    dt_plan_t p;
    dt_emsg_t em;

    q.cluster.nodes = 4;
    q.dp = 2;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.workers, 8);
    cr_assert_eq(p.nodes, 4);
    dt_plan_clear(&p);

    q.dp = 3;
    cr_assert_eq(make(&q, &p, &em), DT_ERANGE);
    cr_assert(strstr(em.s, "needs 12 workers (dp=3 rings of 4 ranks, 1024 tokens each) but cpu "
                           "has 4 nodes x 2 = 8 ranks"),
              "%s", em.s);
    cr_assert(!p.fits);
    cr_assert_eq(p.workers, 12);
    dt_plan_clear(&p);

    q.dp = 2;
    q.spares = 1;
    cr_assert_eq(make(&q, &p, &em), DT_ERANGE);
    cr_assert(strstr(em.s, "needs 8 workers") && strstr(em.s, "before spares"), "%s", em.s);
    dt_plan_clear(&p);

    /* the planner's R (the fewest per ring that fit) is refused the same
     * way: 2 of its rings need 2 R0 workers, R0 nodes of 2 */
    q.ranks = 0;
    q.spares = 0;
    q.cluster.nodes = 0;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    int R0 = p.ranks;
    cr_assert_eq(p.workers, 2 * R0);
    cr_assert_eq(p.nodes, R0);
    dt_plan_clear(&p);
    q.cluster.nodes = R0;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.ranks, R0);
    dt_plan_clear(&p);
    q.spares = 1;
    cr_assert_eq(make(&q, &p, &em), DT_ERANGE);
    char want[96];
    snprintf(want, sizeof(want), "needs %d workers (dp=2 rings of %d ranks", 2 * R0, R0);
    cr_assert(strstr(em.s, want), "%s", em.s);
    dt_plan_clear(&p);

    /* workers beyond the planner's limit */
    q.cluster.nodes = 0;
    q.spares = 0;
    q.ranks = 16;
    q.dp = 65536;
    cr_assert_eq(make(&q, &p, &em), DT_ERANGE);
    cr_assert(strstr(em.s, "dp=65536 rings of ranks=16: 1048576 workers, the planner stops at "
                           "1000000"),
              "%s", em.s);
    dt_plan_clear(&p);
}

/* attn and prefill have no gradient to reduce across rings: dp > 1 is
 * refused, named (the spec refuses it first, dt_spec_check); dp = 1 is
 * the default. */
Test(planner, dp_refused_outside_training)
{
    dt_plan_req_t q = attn_req(16384, 4, 8, 2, 64, true, DT_LAYOUT_ZIGZAG);
    dt_plan_t p;
    dt_emsg_t em;
    dt_spec_t s;

    q.dp = 2;
    cr_assert_eq(make(&q, &p, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "dp = 2 is for train jobs: kind attn"), "%s", em.s);
    cr_assert_str_eq(p.reason, em.s);
    dt_plan_clear(&p);
    q.dp = 1;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.dp, 1);
    cr_assert_eq(p.workers, 4);
    dt_plan_clear(&p);

    q = llama_req("h100-sxm", DT_KIND_PREFILL, 1 << 20);
    q.dp = 4;
    cr_assert_eq(make(&q, &p, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "dp = 4 is for train jobs: kind prefill"), "%s", em.s);
    dt_plan_clear(&p);

    cr_assert_eq(dt_spec_parse("s", "kind = attn\ntokens = 4096\ndp = 2\n", &s, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "data parallel is for kind train"), "%s", em.s);
    cr_assert_eq(dt_spec_parse("s", "kind = train\ntokens = 4096\ndp = 3\nranks = 2\n", &s, &em),
                 0, "%s", em.s);
    cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
    cr_assert_eq(q.dp, 3);
    cr_assert_eq(q.ranks, 2);
    dt_spec_free(&s);
    cr_assert_eq(dt_spec_parse("s", "kind = train\ntokens = 4096\n", &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
    cr_assert_eq(q.dp, 1, "unset: one ring");
    dt_spec_free(&s);
}

/* The planner's pick with dp: the sharded divisions are over W = N R. On
 * the user's one rank per ring, dp = 2 leaves sharding something to
 * divide (W = 2): where unsharded does not fit but shard = optimizer does
 * at W = 2, the planner picks it; one ring of one rank has nothing to
 * divide and is refused. And with R free the search starts low enough:
 * the fewest R per ring is found, as a rank-by-rank search finds it. */
Test(planner, dp_shard_pick)
{
    dt_plan_req_t q = small_train("cpu", DT_F32, false);
    dt_plan_t p, opt;
    dt_emsg_t em;

    q.ranks = 1;
    q.dp = 2;
    q.shard = DT_SHARD_OPTIMIZER;
    cr_assert_eq(make(&q, &opt, &em), 0, "%s", em.s);
    q.cluster.mem_bytes = opt.mem.total;
    q.shard = DT_SHARD_AUTO;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.shard, DT_SHARD_OPTIMIZER, "%s", p.note);
    cr_assert_eq(p.ranks, 1);
    cr_assert_eq(p.workers, 2);
    cr_assert(strstr(p.note, "shard = optimizer"), "%s", p.note);
    dt_plan_clear(&p);
    q.dp = 1;
    cr_assert_eq(make(&q, &p, &em), DT_ENOSPC, "%s", em.s);
    cr_assert_eq(p.shard, DT_SHARD_NONE, "one rank, one ring: nothing to divide");
    dt_plan_clear(&p);
    dt_plan_clear(&opt);

    /* R free: the fewest per ring, checked rank by rank */
    for (int dp = 1; dp <= 4; dp *= 2) {
        for (int lv = DT_SHARD_NONE; lv <= DT_SHARD_PARAMETERS; lv++) {
            dt_plan_req_t t = small_train("cpu", DT_F32, false);
            int want = 0;
            t.tokens = 16384;
            t.shard = (enum dt_shard_level)lv;
            t.dp = dp;
            t.cluster.mem_bytes = 60 * MiB;
            for (int R = 1; R <= 64 && want == 0; R++) {
                dt_plan_t x;
                t.ranks = R;
                if (make(&t, &x, &em) == 0)
                    want = R;
                dt_plan_clear(&x);
            }
            t.ranks = 0;
            int rc = make(&t, &p, &em);
            if (want == 0) {
                cr_assert_neq(rc, 0, "dp %d %s: R=%d", dp, dt_shard_name(t.shard), p.ranks);
            } else {
                cr_assert_eq(rc, 0, "dp %d %s: %s", dp, dt_shard_name(t.shard), em.s);
                cr_assert_eq(p.ranks, want, "dp %d %s: %d, not %d", dp, dt_shard_name(t.shard),
                             p.ranks, want);
            }
            dt_plan_clear(&p);
        }
    }
}

/* A step of batch B trains B sequences after one another on each ring:
 * B times the FLOPs (the same per token) and, on the CPU engine, which
 * reduces each sequence's gradient, B times the whole step's time. */
Test(planner, batch_multiplies_a_steps_work)
{
    dt_plan_req_t q = small_train("cpu", DT_F32, false);
    dt_plan_t one, four;
    dt_emsg_t em;

    q.ranks = 2;
    cr_assert_eq(make(&q, &one, &em), 0, "%s", em.s);
    q.batch = 4;
    cr_assert_eq(make(&q, &four, &em), 0, "%s", em.s);
    cr_assert_float_eq(four.flops, 4 * one.flops, 1e-9 * four.flops);
    cr_assert_float_eq(four.flops_per_token, one.flops_per_token, 1e-9 * one.flops_per_token);
    cr_assert_float_eq(four.seconds, 4 * one.seconds, 1e-9 * four.seconds, "%g vs 4 x %g",
                       four.seconds, one.seconds);
    dt_plan_clear(&one);
    dt_plan_clear(&four);
}

/* A spec's plan, for the mask tests. */
static void plan_masks(const char *text, dt_plan_req_t *q, dt_plan_t *p, int want)
{
    dt_spec_t s;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_spec_parse("s", text, &s, &em), 0, "%s: %s", text, em.s);
    cr_assert_eq(dt_plan_req_from_spec(&s, q, &em), 0, "%s", em.s);
    cr_assert_eq(make(q, p, &em), want, "%s: %s", text, em.s);
    dt_spec_free(&s);
}

/* The masks known before the data: a window's share of the causal pairs
 * exactly (T = 64K, W = 1024: sum over i of min(i + 1, W) over T (T + 1)
 * / 2), its ring reaching the neighbours only, and FLOPs scaled by it. */
Test(planner, masks_price_their_pairs)
{
    dt_plan_req_t q;
    dt_plan_t p, d;
    const double T = 65536, W = 1024;
    double pairs = W * (W + 1) / 2 + (T - W) * W;

    plan_masks("kind = attn\ntokens = 64K\nranks = 4\nsliding_window = 1024\nlayout = "
              "contiguous\n", &q, &p, 0);
    cr_assert_float_eq(p.mask_share, pairs / (T * (T + 1) / 2), 1e-12, "%.9g", p.mask_share);
    cr_assert_eq(p.branch[0].group, 2, "a window of 1024 < c reaches the next rank only");
    plan_masks("kind = attn\ntokens = 64K\nranks = 4\nlayout = contiguous\n", &q, &d, 0);
    cr_assert_float_eq(p.flops / d.flops, p.mask_share, 1e-9);
    cr_assert_float_eq(d.imbalance, 2.0 - 1.0 / 4, 1e-12, "contiguous causal: 2 - 1/R");
    cr_assert_lt(p.imbalance, 1.02, "a window's work is even: %g", p.imbalance);
    dt_plan_clear(&p);
    dt_plan_clear(&d);
    /* every:2 on 4 layers: half the layers windowed */
    plan_masks("kind = train\ntokens = 64K\nranks = 4\nsliding_window = 1024\n"
              "sliding_window_layers = every:2\nlayout = contiguous\n", &q, &p, 0);
    cr_assert_float_eq(p.mask_share, 0.5 + 0.5 * pairs / (T * (T + 1) / 2), 1e-12);
    dt_plan_clear(&p);
    /* a block pattern: global:1,local:1 over 16 blocks, not causal: each
     * row its own block, block 0, and row 0 everything: 1 + 15 * 2 + 15 */
    plan_masks("kind = attn\ntokens = 16K\nranks = 2\ncausal = no\nblock_pattern = "
              "global:1,local:1\nblock_size = 1024\n", &q, &p, 0);
    cr_assert_float_eq(p.mask_share, (16.0 + 15 * 2) / 256, 1e-12, "%.9g", p.mask_share);
    dt_plan_clear(&p);
}

/* Left to the planner, documents get the balanced layout (the data's
 * documents are not known: zigzag balances one causal sequence only); a
 * given layout is kept; balanced is the CPU engine's. */
Test(planner, masks_choose_the_layout)
{
    dt_plan_req_t q;
    dt_plan_t p;

    plan_masks("kind = train\ntokens = 64K\nranks = 4\ndoc_mask = eot\ndata = /x.bin\n", &q, &p,
              0);
    cr_assert_eq(p.layout, DT_LAYOUT_BALANCED);
    cr_assert(strstr(p.note, "layout = balanced chosen by the planner"), "%s", p.note);
    json_t *j = dt_plan_to_json(&q, &p);
    cr_assert_str_eq(json_string_value(get(j, "layout")), "balanced");
    json_decref(j);
    dt_plan_clear(&p);
    plan_masks("kind = train\ntokens = 64K\nranks = 4\ndoc_mask = eot\ndata = /x.bin\n"
              "layout = zigzag\n", &q, &p, 0);
    cr_assert_eq(p.layout, DT_LAYOUT_ZIGZAG, "the spec's layout is kept");
    dt_plan_clear(&p);
    plan_masks("kind = attn\ntokens = 64K\nranks = 4\n", &q, &p, 0);
    cr_assert_eq(p.layout, DT_LAYOUT_ZIGZAG, "no mask: the default");
    dt_plan_clear(&p);
    plan_masks("kind = attn\ntokens = 64K\nranks = 4\nlayout = balanced\ngpu = h100-sxm\n", &q,
              &p, DT_ENOTSUP);
    cr_assert(strstr(p.reason, "layout = balanced runs on device = cpu"), "%s", p.reason);
    dt_plan_clear(&p);
    plan_masks("kind = attn\ntokens = 1020\nranks = 5\nlayout = balanced\n", &q, &p,
               DT_ELAYOUT);
    cr_assert(strstr(p.reason, "not divisible by 8R=40"), "%s", p.reason);
    dt_plan_clear(&p);
}

/* The GPU presets' calibration (plan/request.c): the LLaMA-3.2-1B shape
 * untied, one GPU, T = 16384, trained in 0.909 s a step on an H200 with
 * the backward deterministic (bench/train_gpu.sh, 2026-12-04); the plan
 * within 15 % of that, and the nondeterministic backward's plan faster by
 * what the attention backward's rates say (118 against 517 TFLOP/s at D =
 * 128, the same ratio at D = 64). */
Test(planner, gpu_step_time_calibrated_on_an_h200)
{
    const char *text = "kind = train\ntokens = 16K\ndevice = cuda\ngpu = h200\n"
                       "model = custom\ndim = 2048\nlayers = 16\nheads = 32\nkv_heads = 8\n"
                       "ffn = 8192\nvocab = 128256\ntied = no\nranks = 1\n";
    double sec[2];
    for (int nd = 0; nd < 2; nd++) {
        dt_spec_t s;
        dt_plan_req_t q;
        dt_plan_t p;
        dt_emsg_t em = { "" };
        char *t = dt_xasprintf("%s%s", text, nd ? "deterministic = no\n" : "");
        cr_assert_eq(dt_spec_parse("s", t, &s, &em), 0, "%s", em.s);
        cr_assert_eq(dt_plan_req_from_spec(&s, &q, &em), 0, "%s", em.s);
        cr_assert_eq(q.nondet, nd == 1);
        cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
        sec[nd] = p.seconds;
        dt_plan_clear(&p);
        dt_spec_free(&s);
        free(t);
    }
    cr_assert(fabs(sec[0] / 0.909 - 1) < 0.15, "planned %.3f s, measured 0.909 s", sec[0]);
    /* the attention backward: 2.5 x 1.759e13 FLOPs at 0.12 x 0.75 of 989
     * TFLOP/s, or at 0.52 x 0.75 */
    double det = 2.5 * 1.759e13 / (989e12 * 0.12 * 0.75), fast = det * 0.12 / 0.52;
    cr_assert(fabs((sec[0] - sec[1]) - (det - fast)) < 0.02 * det, "det %.3f s, nondet %.3f s",
              sec[0], sec[1]);
}

/* In-memory checkpoints (plan_mem_ckpt): auto is every step where the
 * host memory holds them, an explicit K is kept, 0 is none; a prefill's
 * copies are its rows' hidden state and positions; attn has none; auto
 * without the memory is none with a note, an explicit K without it a
 * refusal. The bytes are 2 copies and 2 replicas of the state, each with
 * a 64 KiB header allowance. */
Test(planner, mem_ckpt_auto_explicit_kinds_and_memory)
{
    dt_plan_req_t q = small_train("cpu", DT_F32, false);
    double P = small_params(false);
    dt_plan_t p;
    dt_emsg_t em;

    q.mem_ckpt_every = -1;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.mem_ckpt_every, 1);
    cr_assert_eq(p.mem.mem_ckpt, 4 * (12 * P + 65536), "fp32 P, M, V unsharded: 12 P");
    double need = p.mem.mem_ckpt, total = p.mem.total;
    dt_plan_clear(&p);
    q.mem_ckpt_every = 7;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.mem_ckpt_every, 7);
    dt_plan_clear(&p);
    q.mem_ckpt_every = 0;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.mem_ckpt_every, 0);
    cr_assert_eq(p.mem.mem_ckpt, 0);
    dt_plan_clear(&p);

    /* the rank's memory holds its state but not the copies as well */
    q.cluster.mem_bytes = total + need / 2;
    q.mem_ckpt_every = -1;
    cr_assert_eq(make(&q, &p, &em), 0, "%s", em.s);
    cr_assert(p.fits);
    cr_assert_eq(p.mem_ckpt_every, 0);
    cr_assert_eq(p.mem.mem_ckpt, 0);
    cr_assert(strstr(p.note, "no in-memory checkpoints") != NULL, "%s", p.note);
    dt_plan_clear(&p);
    q.mem_ckpt_every = 1;
    cr_assert_lt(make(&q, &p, &em), 0);
    cr_assert(strstr(em.s, "mem_ckpt_every") != NULL, "%s", em.s);
    dt_plan_clear(&p);

    dt_plan_req_t f = small_train("cpu", DT_F32, false);
    f.kind = DT_KIND_PREFILL;
    f.mem_ckpt_every = -1;
    cr_assert_eq(make(&f, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.mem_ckpt_every, 1);
    cr_assert_eq(p.mem.mem_ckpt, 4 * (1024.0 * (4 * 256 + 8) + 65536),
                 "4096 tokens on 4 ranks: 1024 rows of dim 256, fp32, and their positions");
    dt_plan_clear(&p);

    dt_plan_req_t a = attn_req(4096, 4, 4, 2, 64, true, DT_LAYOUT_ZIGZAG);
    a.mem_ckpt_every = -1;
    cr_assert_eq(make(&a, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.mem_ckpt_every, 0);
    cr_assert_eq(p.mem.mem_ckpt, 0);
    dt_plan_clear(&p);
}
