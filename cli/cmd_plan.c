/* SPDX-License-Identifier: MIT
 *
 * `dtctl plan`: plan a job without submitting it. Every spec key of
 * dt-spec(5) is a flag (cli/spec_args.c); an optional spec file is read
 * first and the flags override it. The plan is the coordinator's own planner run in this process: no
 * coordinator is needed. Prints a report for people, or with --json the
 * plan as one JSON object. A job that cannot be planned exits 6
 * (DTCTL_REFUSED) with the reason on stderr (and fits:false in the JSON).
 *
 * Not here: the model behind the numbers (plan/cost.c, plan/planner.c).
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/dtctl.h"
#include "io/hfspec.h"
#include "cli/table.h"
#include "common/mem.h"
#include "spec/spec.h"
#include "plan/planner.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: dtctl plan [SPECFILE] --tokens N [--kind attn|prefill|train]\n"
        "                  [--model tiny|llama3-8b|llama3-70b|custom|HFDIR] [--device cpu|cuda]\n"
        "                  [--gpu h100-sxm|h200|cpu] [--dtype fp32|bf16|fp16]\n"
        "                  [--ranks R] [--nodes N] [--gpus-per-node G] [--cpus-per-gpu C]\n"
        "                  [--spares S] [--causal|--no-causal] [--segments w1,.. --dilations r1,..]\n"
        "                  [--layout contiguous|zigzag|balanced]\n"
        "                  [--dim N --layers N --heads N --kv-heads N --ffn N --vocab N\n"
        "                   --rope-theta N --tied yes|no --head-dim D --norm-eps E\n"
        "                   --rope-scaling none|llama3 --rope-factor F --rope-low-freq-factor L\n"
        "                   --rope-high-freq-factor H --rope-original-max-pos N]\n"
        "                  [--init-from HFDIR] [--steps N] [--batch B] [--recompute none|layer]\n"
        "                  [--shard none|optimizer|gradients|parameters] [--dp N] [--json]\n"
        "Every key of dt-spec(5) is a flag, '-' for '_' (--kv-heads 8, --lr=1e-3).\n"
        "HFDIR: a Hugging Face LLaMA directory (config.json); --model DIR is the same.\n"
        "N accepts K, M, G suffixes (powers of 1024). The kind defaults to attn (one\n"
        "attention call, as dtengine attn runs it). See dtctl(1) and dt-spec(5).\n");
}

/*-- human units ---------------------------------------------------------------*/

static void human_time(char *buf, size_t n, double s)
{
    if (s < 120)
        snprintf(buf, n, "%.3g s", s);
    else if (s < 2 * 3600)
        snprintf(buf, n, "%.1f min", s / 60);
    else if (s < 2 * 86400)
        snprintf(buf, n, "%.1f h", s / 3600);
    else
        snprintf(buf, n, "%.1f days", s / 86400);
}

static void human_bytes(char *buf, size_t n, double b)
{
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int u = 0;

    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    snprintf(buf, n, u == 0 ? "%.0f %s" : "%.1f %s", b, unit[u]);
}

/*-- the report ------------------------------------------------------------------*/

static const char *where(const dt_plan_branch_t *b, int R)
{
    if (b->group <= 1)
        return "local";
    return b->group == R ? "ring of all ranks" : "sub-ring";
}

static void report(const dtctl_t *ctl, const dt_spec_t *s, const dt_plan_req_t *q,
                   const dt_plan_t *p)
{
    static const char *const bh[] = { "segment", "dilation",   "group",
                                      "-where",  "bytes/step", "FLOPs" };
    static const char *const mh[] = { "-memory per rank", "GiB" };
    char t1[64], t2[64], t3[64];
    dt_table_t *t;
    int gpn = q->cluster.gpus_per_node;

    (void)ctl;
    printf("plan: %s of %s over %lld tokens on %s (%s, %s, %s, %s layout, %s)\n", s->kind,
           q->model.name, (long long)q->tokens, q->cluster.name, dt_spec_device(s),
           dt_spec_dtype(s), q->causal ? "causal" : "non-causal", dt_layout_name(p->layout),
           q->nbranch ? "dilated" : "dense attention");
    /* with dp the nodes hold every ring: they go with the workers */
    if (p->dp > 1)
        printf("%-16s %d per ring\n%-16s %d rings of %d ranks: %d workers", "ranks", p->ranks,
               "dp", p->dp, p->ranks, p->workers);
    else
        printf("%-16s %d", "ranks", p->ranks);
    printf(" on %d node%s (%d per node%s%s)\n", p->nodes, p->nodes == 1 ? "" : "s", gpn,
           q->spares ? ", spares included" : "", q->cluster.nodes ? "" : "; nodes not limited");
    printf("%-16s %lld\n", "tokens per rank", (long long)p->tokens_per_rank);
    if (q->kind == DT_KIND_TRAIN)
        printf("%-16s %s (%s)\n", "recompute", p->recompute ? "layer" : "none",
               q->recompute != DT_RECOMPUTE_AUTO ? "as asked"
               : p->recompute                    ? "chosen by the planner"
                                                 : "not needed");
    if (q->kind == DT_KIND_TRAIN)
        printf("%-16s %s (%s)\n", "shard", dt_shard_name(p->shard),
               q->shard != DT_SHARD_AUTO   ? "as asked"
               : p->shard != DT_SHARD_NONE ? "chosen by the planner"
                                           : "not needed");
    if (q->kind == DT_KIND_TRAIN && p->offload && (!q->offload_auto || !q->cuda)) {
        dt_vocab_format_set(t1, sizeof(t1), dt_offload_names, p->offload);
        printf("%-16s %s (as asked%s)\n", "offload", t1,
               q->cuda ? "" : "; on the CPU everything is in host memory already");
    } else if (q->kind == DT_KIND_TRAIN && q->cuda) {
        dt_vocab_format_set(t1, sizeof(t1), dt_offload_names, p->offload);
        printf("%-16s %s (%s)\n", "offload", t1, p->offload ? "chosen by the planner"
                                                             : "not needed");
    }
    if (q->kind == DT_KIND_TRAIN && q->cuda && p->recompute)
        printf("%-16s %s (%s)\n", "ckpt_dtype", dt_ckpt_dtype_names[p->ckpt_dtype == DT_CKPT_BF16],
               !q->ckpt_auto ? "as asked"
               : p->ckpt_dtype == DT_CKPT_BF16 ? "chosen by the planner" : "the default");
    if (p->note[0])
        printf("%-16s %s\n", "note", p->note);
    human_time(t1, sizeof(t1), p->seconds);
    if (q->kind == DT_KIND_TRAIN) {
        int64_t steps = dt_spec_int(s, "steps");
        human_time(t2, sizeof(t2), p->seconds * (double)steps);
        printf("%-16s %s per step; %lld step%s: %s\n", "time", t1, (long long)steps,
               steps == 1 ? "" : "s", t2);
    } else if (p->seconds >= 120) {
        printf("%-16s %s (%.4g s), one forward\n", "time", t1, p->seconds);
    } else {
        printf("%-16s %s, one forward\n", "time", t1);
    }
    printf("%-16s %.3g (%.3g per token)\n", "FLOPs", p->flops, p->flops_per_token);
    if (dt_mask_rules_any(&q->masks)) {
        char line[256];
        dt_mask_rules_format(line, sizeof(line), &q->masks);
        printf("%-16s %s\n", "masks", line);
        if (q->nbranch > 0)
            printf("%-16s dilated branches: FLOPs counted without the masks\n", "");
        else
            printf("%-16s %.4g of the unmasked pairs attended (the layers' mean)%s\n", "",
                   p->mask_share,
                   q->masks.docs ? "; documents are the data's: planned as one" : "");
    }
    if (p->ranks > 1)
        printf("%-16s %.3f (the most loaded rank's attention work over the mean)\n",
               "imbalance", p->imbalance);
    if (q->kind == DT_KIND_TRAIN && p->workers > 1) {
        static const char *const what[] = {
            [DT_SHARD_NONE] = "gradient all-reduce after the backward",
            [DT_SHARD_OPTIMIZER] = "gradient all-reduce and parameter gather after the backward",
            [DT_SHARD_GRADIENTS] = "a reduce-scatter per unit in the backward, a parameter "
                                   "gather after it",
            [DT_SHARD_PARAMETERS] = "a gather per unit in the forward and the backward, a "
                                    "reduce-scatter per unit",
        };
        human_time(t1, sizeof(t1), p->shard_comm_s);
        printf("%-16s %s per step (%s)%s\n", "state comm", t1, what[p->shard],
               p->shard < DT_SHARD_GRADIENTS ? ""
               : !q->cuda                    ? ": in line, not overlapped on the CPU"
               : p->shard_hidden             ? ": hidden behind each unit's compute"
                                             : ": NOT hidden behind each unit's compute");
    }
    if (p->pcie_bytes > 0) {
        human_bytes(t1, sizeof(t1), p->pcie_bytes);
        human_time(t2, sizeof(t2), p->pcie_s);
        printf("%-16s %s per step per GPU each way (offload), %s: %s\n", "pcie", t1, t2,
               p->pcie_hidden ? "hidden behind compute" : "NOT hidden (adds to the step)");
    }
    if (p->bytes_per_step > 0) {
        human_bytes(t1, sizeof(t1), p->bytes_per_step);
        human_time(t2, sizeof(t2), p->step_compute_s);
        human_time(t3, sizeof(t3), p->step_comm_s);
        printf("%-16s %s per step; compute %s, transfer %s per step: %s\n", "ring", t1, t2, t3,
               p->comm_hidden ? "hidden" : "NOT hidden");
        if (p->nbranch > 1)
            printf("%-16s (the step of the branch whose transfer hides least)\n", "");
        if (p->min_c_hidden > 0)
            printf("%-16s from c = %lld tokens per rank (now %lld)\n", "comm hides",
                   (long long)p->min_c_hidden, (long long)p->tokens_per_rank);
        else
            printf("%-16s at no c up to 2^50 tokens\n", "comm hides");
    } else {
        printf("%-16s none (every branch is local to a rank)\n", "ring");
    }
    printf("%-16s %d node%s x %d ranks, contiguous%s; %.1f%% of ring hops inside a node\n",
           "placement", (p->workers + gpn - 1) / gpn, (p->workers + gpn - 1) / gpn == 1 ? "" : "s",
           p->workers < gpn ? p->workers : gpn, p->dp > 1 ? ", ring after ring" : "",
           100.0 * p->intra_node_frac);

    putchar('\n');
    t = dt_table_new(6, bh);
    for (int b = 0; b < p->nbranch; b++) {
        const dt_plan_branch_t *x = &p->branch[b];
        dt_table_cell(t, "%lld", (long long)x->w);
        dt_table_cell(t, "%lld", (long long)x->r);
        dt_table_cell(t, "%d", x->group);
        dt_table_cell(t, "%s", where(x, p->ranks));
        human_bytes(t1, sizeof(t1), x->bytes_per_step);
        dt_table_cell(t, "%s", x->bytes_per_step > 0 ? t1 : "-");
        dt_table_cell(t, "%.3g", x->flops);
    }
    dt_table_print(t, stdout);
    dt_table_free(t);

    putchar('\n');
    t = dt_table_new(2, mh);
    const struct {
        const char *name;
        double v;
    } parts[] = {
        { "weights", p->mem.weights },       { "grads", p->mem.grads },
        { "optimizer", p->mem.optimizer },   { "activations", p->mem.activations },
        { "kv_buffers", p->mem.kv_buffers }, { "workspace", p->mem.workspace },
        { "fixed", p->mem.fixed },
    };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        dt_table_cell(t, "%s", parts[i].name);
        dt_table_cell(t, "%.3f", parts[i].v / GiB);
    }
    dt_table_cell(t, "total");
    dt_table_cell(t, "%.3f", p->mem.total / GiB);
    dt_table_cell(t, "available");
    dt_table_cell(t, "%.3f", q->cluster.mem_bytes / GiB);
    if (q->cuda && p->mem.host > 0) {
        dt_table_cell(t, "host");
        dt_table_cell(t, "%.3f", p->mem.host / GiB);
    }
    dt_table_print(t, stdout);
    dt_table_free(t);
}

/*-- the command -------------------------------------------------------------------*/

/* A spec file that may leave kind and tokens to the flags: nothing
 * required; dt_spec_check runs once the flags are in. */
int dtctl_plan(dtctl_t *ctl, int argc, char **argv)
{
    static const char *const own[] = { "--json", NULL };
    dt_spec_t spec = { 0 };
    dt_plan_req_t req;
    dt_plan_t plan = { 0 };
    dt_emsg_t em = { "" };
    unsigned seen;
    int rc, help, ret;

    if ((ret = dtctl_spec_args(ctl, "plan", argc, argv, own, &seen, &help, &spec)) != DTCTL_OK ||
        help) {
        if (help)
            usage(stdout);
        goto out;
    }
    ret = DTCTL_USAGE;
    if (seen & 1u)
        ctl->json = 1;
    if (spec.kind == NULL && (rc = dt_spec_set(&spec, "kind", "attn", &em)) < 0)
        goto out;
    if ((rc = dt_spec_check(&spec, &em)) < 0 || (rc = dt_hf_spec_fill(&spec, &em)) < 0 ||
        (rc = dt_plan_req_from_spec(&spec, &req, &em)) < 0) {
        dtctl_error(ctl, "plan", NULL, em.s);
        goto out;
    }

    rc = dt_plan_make(&req, &plan, &em);
    if (ctl->json) {
        json_t *j = dt_plan_to_json(&req, &plan);
        if (req.kind == DT_KIND_TRAIN) {
            int64_t steps = dt_spec_int(&spec, "steps");
            json_object_set_new(j, "steps", json_integer(steps));
            json_object_set_new(j, "total_seconds", json_real(plan.seconds * (double)steps));
        }
        dtctl_print_json(j);
        json_decref(j);
    } else if (plan.ranks > 0) {
        report(ctl, &spec, &req, &plan);
    }
    if (rc < 0) {
        dtctl_error(ctl, "plan", "refused: ", em.s[0] ? em.s : dt_strerror(rc));
        /* the report (with the note) was not printed: the note goes with the reason */
        if (!ctl->json && plan.ranks == 0 && plan.note[0])
            dtctl_error(ctl, "plan", "note: ", plan.note);
        ret = DTCTL_REFUSED;
        goto out;
    }
    ret = DTCTL_OK;
out:
    dt_plan_clear(&plan);
    dt_spec_free(&spec);
    return ret;
}
