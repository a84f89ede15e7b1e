/* SPDX-License-Identifier: MIT
 *
 * Inside `dtengine train`: one run's state (dt_trainer_t) and the step
 * interface (dt_train_backend_t) that engine/cmd/train.c drives and the
 * two backends implement, dt_train_cpu (engine/cmd/train_cpu.c: the model
 * on this rank's cores, the state in host memory) and dt_train_gpu
 * (engine/cmd/train_gpu.c, only in a CUDA build: the whole step on this
 * rank's GPU). train.c owns the run (options, data, resume, the
 * agreement, the schedule, checkpoints, the result) and calls a backend
 * only through its table; a backend never calls train.c.
 *
 * Not an API for anything else: dt_cmd_train (engine/cmd/cmd.h) is the
 * command.
 */
#ifndef DT_ENGINE_CMD_TRAIN_H
#define DT_ENGINE_CMD_TRAIN_H

#include <stdint.h>

#include "common/err.h"
#include "engine/cmd/masks.h"
#include "engine/cmd/memckpt.h"
#include "engine/comm/comm.h"
#include "engine/data/loader.h"
#include "engine/data/recall.h"
#include "engine/model/model.h"
#include "engine/model/optim.h"
#include "spec/attn_spec.h"
#include "spec/dtype.h"
#include "spec/mask_rules.h"
#include "spec/spec.h"
#include "spec/vocab.h"

/* What the run resolved from its options and spec (train.c's parse). */
typedef struct dt_train_opts {
    dt_model_cfg_t model;
    int64_t T, steps, ckpt_every, ckpt_keep, batch;
    int64_t pos_offset; /* the first token's position (spec key pos_offset) */
    dt_mask_rules_t masks; /* the mask keys (spec/mask_rules.h) */
    uint64_t seed;
    const char *ckpt_dir, *data, *layout, *segments, *dilations, *params_out;
    const char *resume_from; /* a step directory, or NULL */
    int64_t resume_mem;      /* --resume-from-memory: the agent's copies of this step; 0 none */
    int64_t mem_every;       /* --mem-ckpt-every: steps between in-memory copies; 0 none */
    int resume, causal;
    int nondet;   /* deterministic = no: the GPU backward's fastest kernels */
    int external; /* --ckpt-commit external: the coordinator commits and prunes */
    int print;    /* --print-settings */
    double lr, min_lr, wd, clip, eps;
    int64_t warmup;
    int rkeys, rvalues, rpairs, rqueries; /* recall task sizes; 0: defaults */
    int recompute;                       /* --recompute layer (spec recompute) */
    enum dt_shard_level shard;           /* spec shard; unset (auto): none */
    unsigned offload;                    /* spec offload: enum dt_offload bits (the CPU
                                          * keeps everything in host memory: no effect) */
    enum dt_ckpt_dtype ckpt_dtype;       /* spec ckpt_dtype: the kept layer inputs' (GPU
                                          * with recompute; the CPU keeps fp32) */
    int dp;                              /* --dp N (spec dp): N rings of R ranks */
    int cuda;                            /* --device cuda: the step on this rank's GPU */
    dt_dtype_t dtype;                    /* its compute dtype: DT_BF16 or DT_F16 */
    dt_spec_t spec; /* --spec FILE, whose strings the options above may point into */
} dt_train_opts_t;

/* What --resume passed over: with --ckpt-commit self, the step
 * directories whose content does not verify. This run will write those
 * steps again, and dt_ckpt_begin never overwrites a step directory, so
 * rank 0 sets them aside once every rank has loaded. */
typedef struct dt_train_passed {
    int me, external;
    int64_t *steps;
    int n;
} dt_train_passed_t;

/* What the ranks agree on after every step, in the one all-reduce (a sum)
 * the step does anyway: the recall hits and counted targets of each rank,
 * and the agent's requests each rank has seen. */
typedef struct dt_train_ctl {
    double hits, targets; /* summed over ranks: the step's accuracy */
    double loss;          /* summed over ranks: each rank's share of the step's loss
                           * (a backend's loss_shared), or with dp each ring's 1/N */
    int ckpt_requested;   /* in: this rank has an unmet W_CHECKPOINT; out: some rank has */
    int stop_requested;   /* W_STOP: in this rank's, out any rank's */
    int stop_ckpt;        /* W_STOP asking for a checkpoint first */
} dt_train_ctl_t;

/* accuracy of the last DT_TRAIN_ACC_WINDOW steps, for the result (one
 * step's is a handful of answers) */
enum { DT_TRAIN_ACC_WINDOW = 50 };

typedef struct dt_train_backend dt_train_backend_t;

/* fp16 training's dynamic loss scaling (bf16 and fp32 need none): the
 * loss's gradient is multiplied by scale (from DT_LOSS_SCALE_INIT); a
 * step whose gradient has an inf or NaN is skipped (no update; it still
 * consumes its data and counts) and halves scale; DT_LOSS_SCALE_WINDOW
 * clean steps in a row double it. Checkpointed (the manifest's rng
 * object, "loss_scale"). A step that overflows at scale 1 diverged. */
#define DT_LOSS_SCALE_INIT 65536.0
#define DT_LOSS_SCALE_WINDOW 2000
typedef struct dt_loss_scale {
    double scale;  /* 1 when not scaling */
    int64_t clean; /* steps since the last overflow (or the start) */
} dt_loss_scale_t;

/* One run of `dtengine train` on this rank: options, data, model, the
 * optimizer state and what the run has seen so far. */
typedef struct dt_trainer {
    dt_comm_t *comm;     /* the job: agreement, reports */
    int R, me;           /* ranks per ring, this rank in the job */
    int W, r, N, i;      /* ranks in the job; ring rank r; replica i of N (dp) */
    dt_comm_t *cring;    /* this rank's ring: attention, the loss (comm when dp = 1) */
    dt_comm_t *crep;     /* the replicas at ring rank r (dp > 1), else NULL */
    dt_train_opts_t o;
    dt_emsg_t em;
    dt_attn_spec_t attn;
    dt_cmd_masks_t masks; /* the sequence's masks, attn's */
    dt_recall_opts_t task;
    dt_loader_t *loader; /* token shards; NULL: the recall task */
    dt_model_layout_t lo;
    dt_model_t *m;       /* the CPU's model; NULL on the GPU */
    int64_t n, c;        /* parameters; tokens of this rank */
    int64_t moff, mlen;  /* the moments this rank keeps: [moff, moff + mlen) of n
                          * (its slice, dt_model_slice; all of n unsharded) */
    int64_t pn, gn;      /* floats in P and in G: n, or mlen where sharded */
    float *P, *G, *Gb, *M, *V;
    int32_t *xs, *ys, *x, *y;
    int64_t *pos;  /* (c) this rank's tokens' indices in the sequence */
    int64_t *rpos; /* (c) their RoPE positions: pos + pos_offset (doc_positions =
                    * reset: pos from its document's start) */
    int64_t start;       /* the step this run starts at (a resume's) */
    dt_train_passed_t passed; /* checkpoints --resume passed over */
    dt_memckpt_t mem;    /* in-memory checkpoints in the agent's memory (memckpt.h) */
    dt_adamw_cfg_t acfg;
    dt_lr_sched_t sched;
    int scaling;          /* fp16 on the GPU: dynamic loss scaling */
    dt_loss_scale_t ls;   /* its state (scale 1 without) */
    double last_loss;    /* of the last step this run took */
    double acc_win[DT_TRAIN_ACC_WINDOW];
    int64_t acc_n;
    int owed;            /* W_CHECKPOINTs already acted on before ours arrived */
    int stopped;         /* W_STOP: exit DT_EXIT_STOPPED */
    int64_t pending;     /* the step whose copy off the device is in flight, to be
                          * saved; 0 none (backends with copy_start) */
    dt_st_writer_t *mem_w; /* the in-memory copy of step mem_step whose state is being
                            * copied off the device, handed to the copies' thread
                            * before the next update (backends with copy_start) */
    int64_t mem_step;
    const dt_train_backend_t *be; /* the step's backend */
    void *dev;           /* the backend's own state (its alloc's; its close frees it) */
} dt_trainer_t;

/* A backend: the step's device-specific parts, in the order train.c
 * calls them. Each runs on every rank; an error is returned with its
 * message in t->em (train.c agrees and reports). */
struct dt_train_backend {
    /* 1: seq's loss is this rank's share of the step's loss, summed over
     * the ranks in the step's agreement (dt_train_ctl_t.loss); 0: every
     * rank of a ring has the ring's whole loss */
    int loss_shared;
    /* The model and the step's buffers, for t->n parameters, t->c tokens
     * and the slices moff, mlen, pn, gn. It may set t->P (n floats), t->M
     * and t->V (mlen): the host copies train.c loads, checkpoints and
     * reports; those left NULL train.c allocates. Aborts on no memory. */
    void (*alloc)(dt_trainer_t *t);
    /* Rank 0, after the header's fields: what this backend adds to the
     * run's header line (dtengine(1) OUTPUT). NULL: nothing. */
    void (*print_header)(const dt_trainer_t *t);
    /* Once the parameters and moments are loaded or initialised in
     * t->P, M, V, before the first step; agreed and reported (every rank
     * gets the outcome). NULL: nothing to do. */
    int (*start)(dt_trainer_t *t);
    /* Sequence b (0 the first of this ring's B) of a step, this rank's
     * tokens in t->x, t->y (the whole sequence in t->xs, t->ys): forward
     * and backward. Its gradient goes into the step's (the mean of the
     * B), its loss / B is added to *loss, this rank's hits and counted
     * targets to ctl. */
    int (*seq)(dt_trainer_t *t, int64_t b, double *loss, dt_train_ctl_t *ctl);
    /* After the agreement: the gradient complete over the ranks, *norm its
     * global norm, clipped to o.clip (dt_grad_clip's rule) now or through
     * *gscale (1 on entry), the factor update applies. */
    int (*clip)(dt_trainer_t *t, int64_t step, double *norm, float *gscale);
    /* (with loss scaling the gradient is that of the loss times
     * t->ls.scale: clip's *norm is still the loss's own, inf or NaN on an
     * overflow, and *gscale folds 1 / scale in) */
    /* AdamW's step step + 1 at rate lr, the gradient times gscale; every
     * rank's parameters updated whole where it keeps them whole. */
    int (*update)(dt_trainer_t *t, int64_t step, double lr, float gscale);
    /* Where the state lives off the host: copy_start starts copying the
     * parameters and moments into the host's P, M, V (each may be NULL:
     * not copied), overlapping what follows; copy_wait waits for it,
     * *stall_s (may be NULL) how long it waited. Both NULL: the state is
     * on the host, P, M, V are it. */
    int (*copy_start)(dt_trainer_t *t, float *P, float *M, float *V);
    int (*copy_wait)(dt_trainer_t *t, double *stall_s);
    /* With copy_start: 1 when update still changes the host's P, M, V
     * (the optimizer on the host), else 0; NULL: 0. */
    int (*updates_host)(const dt_trainer_t *t);
    /* Everything alloc and start made; safe after a failed or skipped
     * alloc (t->dev and the buffers NULL). It may free t->P, M, V that
     * alloc set, leaving them NULL. */
    void (*close)(dt_trainer_t *t);
};

/* Every rank's slice of the parameters (dt_model_slice) into the whole
 * array all (t->n floats; this rank's slice already there): across the
 * replicas (dp), then around the ring, over MPI. Returns 0 or a DT_E
 * code (no message). */
DT_MUST_CHECK int dt_trainer_gather(dt_trainer_t *t, float *all);

extern const dt_train_backend_t dt_train_cpu; /* engine/cmd/train_cpu.c */
extern const dt_train_backend_t dt_train_gpu; /* engine/cmd/train_gpu.c: CUDA builds only */

#endif /* DT_ENGINE_CMD_TRAIN_H */
