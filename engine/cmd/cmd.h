/* SPDX-License-Identifier: MIT
 *
 * dtengine subcommands. Each takes the job's communicator and its own argv
 * (argv[0] is the subcommand name) and returns a process exit code. Each
 * (engine/cmd/attn.c, prefill.c, train.c) is a short sequence of
 * named steps over one object of its run (train's step on the CPU or the
 * GPU is a backend behind engine/cmd/train.h); what they share is in
 * engine/cmd/common.c (below) and engine/cmd/agree.h (agree across ranks,
 * report once). main.c dispatches to them; they never call it.
 */
#ifndef DT_ENGINE_CMD_H
#define DT_ENGINE_CMD_H

#include <jansson.h>

#include "common/exitcodes.h" /* DT_EXIT_*: dtengine(1) EXIT STATUS */
#include "engine/comm/comm.h"
#include "engine/model/model.h"
#include "spec/dtype.h"

struct dt_spec;

/* `dtengine devices [--json]`: the GPUs this process sees; a local query
 * that joins no job (engine/cmd/devices.c). */
int dt_cmd_devices(int argc, char **argv);

/* Parse option --name's value s as a number in [lo, hi]; DT_EUSAGE with a
 * message naming the option otherwise. */
int dt_cmd_number(const char *name, const char *s, double lo, double hi, double *out,
                  dt_emsg_t *em);

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

/* The run's device and dtype (the spec's device and dtype keys, from
 * --device and --dtype or a --spec): DT_EUSAGE for a bf16 or fp16 on the
 * CPU, fp32 on a GPU, or cuda in a dtengine built without it. */
int dt_cmd_device_check(const struct dt_spec *s, dt_emsg_t *em);

/* --ckpt-commit self|external into *external. */
int dt_cmd_commit_option(const char *value, int *external, dt_emsg_t *em);

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
