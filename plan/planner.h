/* SPDX-License-Identifier: MIT
 *
 * The ring-layout planner: from a job (tokens, model, attention, kind,
 * precision) and a cluster (GPUs per node, memory, peak FLOP/s, NVLink and
 * network bandwidth), the ranks, tokens per rank, per-branch layout, memory
 * per rank broken down, FLOPs, bytes per ring step, whether communication
 * hides behind compute (and the smallest c for which it would), estimated
 * time, and a rank -> node placement; for training with data parallelism
 * (dp = N rings of R ranks) the same per ring, the sharded state over all
 * N R ranks and the reduction across the rings. It refuses what cannot
 * work, with the reason. Pure computation: no I/O, no coordinator state;
 * `dtctl plan` uses it without a running coordinator.
 *
 * The model is first principles: FLOPs from the visible (query, key) pairs
 * of each branch and the model's matrix products, bytes from the K/V packs
 * that travel, times from peak FLOP/s times an efficiency and the link
 * bandwidths. The `cpu` preset describes one dtengine rank per core with
 * its measured fixed memory; its memory prediction for kind attn is tested
 * against dtengine attn's max RSS.
 *
 * Three files define it: request.c (the presets, a request from a spec),
 * cost.c (the model of one choice of ranks, shard level and recompute)
 * and planner.c (the search, the plan and its JSON).
 */
#ifndef DT_PLANNER_H
#define DT_PLANNER_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "common/err.h"
#include "spec/dtype.h"
#include "spec/model.h"
#include "spec/spec.h"
#include "spec/attn_spec.h"
#include "spec/mask_rules.h"
#include "spec/vocab.h"

typedef struct dt_cluster {
    char name[32];
    int gpus_per_node;
    int nodes;           /* available nodes; 0 = as many as needed */
    double mem_bytes;    /* usable memory per GPU (or per CPU rank) */
    double peak_flops;   /* per GPU, at the job's precision */
    double efficiency;   /* fraction of peak the kernels reach (on GPUs: all but
                          * the attention's, which attn_eff says) */
    double nvlink_bps;   /* bytes/s between GPUs of one node, per direction */
    double net_bps;      /* bytes/s between nodes, per GPU, per direction */
    double fixed_bytes;  /* per-process memory before any tensor */
    double peer_bytes;   /* per process, per other process of the job (the CPU
                          * transport's shared-memory buffers); 0 on GPUs */
    double host_mem_bytes; /* GPUs: usable host memory per node (0: not separate) */
    double pcie_bps;       /* GPUs: bytes/s host <-> device per GPU, per direction */
    /* GPUs: the fraction of peak the attention blocks reach at head
     * width D >= 128, forward, backward and deterministic backward
     * (DT_ATTN_EFF_*), and the factor for D <= 64; 0: efficiency */
    double attn_eff[3];
    double attn_eff_d64;
} dt_cluster_t;

enum { DT_ATTN_EFF_FWD, DT_ATTN_EFF_BWD, DT_ATTN_EFF_BWD_DET };

/* kind, recompute and shard: the job vocabulary's (spec/vocab.h). */

/* Cluster presets: h100-sxm, h200, cpu (model presets: spec/model.h). DT_EINVAL with
 * the list of known names otherwise. */
int dt_cluster_preset(const char *name, dt_cluster_t *out, dt_emsg_t *em);

typedef struct dt_plan_req {
    int64_t tokens;
    dt_model_cfg_t model;
    dt_cluster_t cluster;
    enum dt_job_kind kind;
    dt_dtype_t precision;
    bool cuda;   /* device = cuda: the cluster preset is a GPU's */
    bool causal;
    bool nondet; /* deterministic = no: the GPU backward's faster scratch */
    int nbranch; /* 0: dense */
    int64_t seg[DT_ATTN_MAXBRANCH], dil[DT_ATTN_MAXBRANCH];
    enum dt_layout layout;
    int ranks;   /* 0: the planner chooses the fewest that fit */
    int spares;
    enum dt_recompute recompute; /* train only; AUTO when the spec leaves it unset */
    enum dt_shard_level shard;   /* train only; AUTO when the spec leaves it unset */
    unsigned offload;            /* train only: enum dt_offload bits (spec offload) */
    enum dt_ckpt_dtype ckpt_dtype; /* train with recompute: the kept inputs' (spec ckpt_dtype) */
    /* train on GPUs: the spec leaves offload (ckpt_dtype) unset, so the
     * planner may choose it (dt_plan_make) */
    bool offload_auto, ckpt_auto;
    int64_t batch;               /* train: sequences per step (spec batch); 0 is 1 */
    int dp;                      /* train: dp rings of `ranks` ranks (spec dp), each its own
                                  * sequences; 0 is 1; more is refused for attn and prefill */
    dt_mask_rules_t masks;       /* the mask keys (documents are the data's: planned as one) */
    bool layout_auto;            /* the spec leaves layout unset: with masks the planner
                                  * chooses it (dt_plan_make) */
    int64_t mem_ckpt_every;      /* train, prefill: steps (layers) between in-memory
                                  * checkpoints (spec mem_ckpt_every); -1 auto, 0 none */
} dt_plan_req_t;

/* Build a request from a spec (presets, overrides, defaults). */
int dt_plan_req_from_spec(const dt_spec_t *s, dt_plan_req_t *out, dt_emsg_t *em);

typedef struct dt_plan_branch {
    int64_t w, r;
    int group;           /* ranks in its sub-ring; 1 = local */
    double bytes_per_step;
    double flops;        /* over the job, one forward */
} dt_plan_branch_t;

/* Per rank, bytes: the parts of the device's memory (on the CPU preset,
 * the rank's), their total, and host: what a GPU rank keeps in host memory
 * (train: the fp32 parameters and moments, page-locked, and with offload =
 * optimizer the gradient's slice; 0 where not counted), on the CPU the
 * total. */
typedef struct dt_plan_mem {
    double weights, grads, optimizer, activations, kv_buffers, workspace, fixed, total;
    double host;
    double mem_ckpt; /* train, prefill: the in-memory checkpoints its agent holds for it
                      * (two copies of its state and two replicas of another rank's); host
                      * memory, apart from total and host */
} dt_plan_mem_t;

typedef struct dt_plan {
    bool fits;
    char reason[256];    /* why not, when !fits */
    bool recompute;      /* train: planned with recompute = layer */
    enum dt_shard_level shard; /* train: the shard level planned (never AUTO); NONE otherwise */
    unsigned offload;    /* train: the offload planned (the request's, or the planner's pick) */
    enum dt_ckpt_dtype ckpt_dtype; /* train: the kept layer inputs' dtype planned */
    char note[512];      /* why the planner chose a shard level or recompute = layer
                          * itself (or why they would not help, or that nothing fits
                          * with them either); "" when the request decided */
    int ranks, nodes;    /* ranks: per ring, R; nodes: for every worker and the spares */
    int64_t mem_ckpt_every; /* train, prefill: steps between in-memory checkpoints (0: none) */
    int dp, workers;     /* dp rings of R ranks (1 unless training with dp): the job
                          * runs workers = dp R processes, ring i on ranks [i R, (i + 1) R) */
    int64_t tokens_per_rank;
    int nbranch;
    dt_plan_branch_t branch[DT_ATTN_MAXBRANCH + 1]; /* dense: one (T, 1) */
    dt_plan_mem_t mem;   /* per rank, bytes */
    double flops_per_token, flops; /* flops: one step over every ring (dp T tokens) */
    /* bytes_per_step, step_compute_s and step_comm_s are those of the branch
     * whose transfer hides least behind its compute */
    double bytes_per_step;
    double step_compute_s, step_comm_s;
    bool comm_hidden;
    int64_t min_c_hidden; /* smallest c for which comm hides; 0 if never */
    /* masks (dense attention): the layers' mean share of the unmasked
     * pairs they attend, and the attention work's imbalance over the
     * ranks, the most loaded rank's pairs over the mean (1 balanced) */
    double mask_share, imbalance;
    enum dt_layout layout; /* the layout planned: the request's, or the planner's pick */
    /* train: the step's collectives over the training state (all-reduce;
     * with sharding reduce-scatters and gathers), all of them at the
     * plan's bandwidth; shard_hidden: those inside the forward and
     * backward (gradients, parameters: one unit at a time) hide behind
     * their unit's compute, or there is nothing to send (R = 1) */
    double shard_comm_s;
    bool shard_hidden;
    /* train on GPUs with offload: bytes over PCIe per step per GPU (the
     * larger direction), their time at the preset's pcie_bps, and whether
     * it hides (the layer inputs' copies overlap compute; the optimizer's
     * do not yet, and add to seconds) */
    double pcie_bytes, pcie_s;
    bool pcie_hidden;
    double seconds;
    int *placement;      /* [workers] node of each rank of the job; owned */
    double intra_node_frac; /* ring hops inside a node (each ring's, over all rings) */
} dt_plan_t;

/* Plan. Returns 0 when the job fits; DT_ENOSPC (does not fit in memory),
 * DT_ELAYOUT (indivisible lengths), DT_EINVAL (w not a multiple of r, bad
 * shape, shard asked of an attn or prefill job), DT_ERANGE (needs more
 * GPUs than the cluster has), each with the reason in em and in
 * out->reason; out is filled as far as it could be computed in every case.
 * A train request with shard or recompute AUTO is planned at each shard
 * level and recompute setting it leaves open, in the order of planner.c's
 * top comment, while the refusals are for want of memory (DT_ENOSPC;
 * DT_ERANGE or DT_ELAYOUT when the ranks it would need are more than the
 * cluster has or none of them divides T): out is the plan picked
 * (out->shard, out->recompute; out->note says why), or when none fits the
 * one with the most sharding and recomputation tried, refused. The caller
 * that runs the job must hand the engine out->shard and out->recompute. */
int dt_plan_make(const dt_plan_req_t *req, dt_plan_t *out, dt_emsg_t *em);
void dt_plan_clear(dt_plan_t *p);

/* The plan as JSON: at least ranks (per ring), dp, workers (the processes
 * to launch: dp x ranks), tokens_per_rank, memory_per_rank_bytes,
 * memory_breakdown, flops, seconds, comm_hidden, fits, branches, placement,
 * recompute ("none" or "layer"; "none" for attn and prefill), shard
 * ("none", "optimizer", "gradients" or "parameters"; "none" for attn and
 * prefill), shard_comm_s and shard_hidden, note (when there is one),
 * plus the request's echo. New reference. */
json_t *dt_plan_to_json(const dt_plan_req_t *req, const dt_plan_t *p);

#endif /* DT_PLANNER_H */
