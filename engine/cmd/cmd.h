/* SPDX-License-Identifier: MIT
 *
 * dtengine subcommands. Each takes the job's communicator and its own argv
 * (argv[0] is the subcommand name) and returns a process exit code. Each
 * (engine/cmd/attn.c, prefill.c, train.c) is a short sequence of
 * named steps over one object of its run; what they share is in
 * engine/cmd/common.c (below) and engine/cmd/agree.h (agree across ranks,
 * report once). main.c dispatches to them; they never call it.
 */
#ifndef DT_ENGINE_CMD_H
#define DT_ENGINE_CMD_H

#include <jansson.h>

#include "engine/comm/comm.h"
#include "engine/model/model.h"
#include "spec/dtype.h"

/* Exit codes of dtengine (documented in dtengine(1)). */
enum {
    DT_EXIT_OK = 0,
    DT_EXIT_FAILURE = 1, /* a failure while running: I/O, transport; may be retried */
    DT_EXIT_INPUT = 2,   /* bad options or input: retrying cannot help */
    DT_EXIT_STOPPED = 3, /* stopped on purpose (prefill --stop-after-layer, agent W_STOP) */
    DT_EXIT_PEER = 4,    /* another rank of the job failed (PMIx event): restart helps */
    DT_EXIT_AGENT_LOST = 5, /* the channel to dtagentd broke */
    /* 6, DT_EXIT_CKPT (common/proto.h): the --resume-from checkpoint does not verify */
    /* 7, DT_EXIT_DEVICE (common/proto.h): this rank's GPU failed */
};

/* `dtengine devices [--json]`: the GPUs this process sees; a local query
 * that joins no job (engine/cmd/devices.c). */
int dt_cmd_devices(int argc, char **argv);

/* Parse option --name's value s as a number in [lo, hi]; DT_EUSAGE with a
 * message naming the option otherwise. */
int dt_cmd_number(const char *name, const char *s, double lo, double hi, double *out,
                  dt_emsg_t *em);

/* The model and position options train and prefill share: each is a
 * job-spec key (dt-spec(5), one table for dtctl, dtcoordd and dtengine)
 * spelt with '-' for '_', all with the getopt value DT_OPT_SPEC; splice
 * DT_CMD_SPEC_OPTIONS into a long-option table. */
enum { DT_OPT_SPEC = 300 };
#define DT_CMD_SPEC_OPTIONS                                                                   \
    { "model", 1, NULL, DT_OPT_SPEC }, { "dim", 1, NULL, DT_OPT_SPEC },                        \
        { "layers", 1, NULL, DT_OPT_SPEC }, { "heads", 1, NULL, DT_OPT_SPEC },                 \
        { "kv-heads", 1, NULL, DT_OPT_SPEC }, { "ffn", 1, NULL, DT_OPT_SPEC },                 \
        { "vocab", 1, NULL, DT_OPT_SPEC }, { "head-dim", 1, NULL, DT_OPT_SPEC },               \
        { "rope-theta", 1, NULL, DT_OPT_SPEC }, { "tied", 1, NULL, DT_OPT_SPEC },              \
        { "norm-eps", 1, NULL, DT_OPT_SPEC }, { "rope-scaling", 1, NULL, DT_OPT_SPEC },        \
        { "rope-factor", 1, NULL, DT_OPT_SPEC },                                               \
        { "rope-low-freq-factor", 1, NULL, DT_OPT_SPEC },                                      \
        { "rope-high-freq-factor", 1, NULL, DT_OPT_SPEC },                                     \
        { "rope-original-max-pos", 1, NULL, DT_OPT_SPEC },                                     \
        { "init-from", 1, NULL, DT_OPT_SPEC }, { "pos-offset", 1, NULL, DT_OPT_SPEC }

/* Option --name (one of DT_CMD_SPEC_OPTIONS) = value into the spec s, as
 * dt_spec_set checks it. 0, or DT_EUSAGE naming the option. */
struct dt_spec;
int dt_cmd_spec_option(const char *name, const char *value, struct dt_spec *s, dt_emsg_t *em);

/* The model of a run: the spec's model keys (from --spec and the options
 * above) over its preset, or, with init_from, the Hugging Face
 * directory's config.json with every model key the spec gives agreeing
 * with it (io/hfspec.h); then checked (dt_model_cfg_check). 0, or the
 * error naming the key (and the file). */
int dt_cmd_model_resolve(struct dt_spec *s, dt_model_cfg_t *m, dt_emsg_t *em);

/* A job spec for `dtengine KIND --spec path`: loaded into s (freed first)
 * and its kind checked (a spec without a kind is a train job's). 0, or
 * the error naming the file. */
int dt_cmd_spec_load(const char *path, const char *kind, struct dt_spec *s, dt_emsg_t *em);

/* --device cpu|cuda and --dtype bf16|fp16 of train and prefill: value of
 * option --name into *cuda or *dtype.
 * dt_cmd_device_check: after parsing, a --dtype without --device cuda, or
 * cuda in a dtengine built without it, is DT_EUSAGE. */
int dt_cmd_device_option(const char *name, const char *value, int *cuda, dt_dtype_t *dtype,
                         dt_emsg_t *em);
int dt_cmd_device_check(int cuda, int dtype_given, dt_emsg_t *em);

/* A window's first position in a checkpoint manifest's "plan": set in
 * plan when pos_offset is not 0 (a manifest without it is at 0, as every
 * checkpoint from before the key was); and checked against this run's:
 * DT_EINVAL naming the checkpoint dir and both offsets when they differ. */
void dt_cmd_plan_pos_offset(json_t *plan, int64_t pos_offset);
int dt_cmd_check_pos_offset(const char *dir, const json_t *plan, int64_t pos_offset,
                            dt_emsg_t *em);

/* The exit code for a dt error code. */
int dt_exit_code(int rc);

int dt_cmd_attn(dt_comm_t *comm, int argc, char **argv);
int dt_cmd_prefill(dt_comm_t *comm, int argc, char **argv);
int dt_cmd_train(dt_comm_t *comm, int argc, char **argv);

#endif /* DT_ENGINE_CMD_H */
