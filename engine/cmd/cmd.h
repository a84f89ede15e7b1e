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

/* The model options train and prefill share, as getopt values: 'm' for
 * --model (tiny or custom), 1 to 6 for --dim --layers --heads --kv-heads
 * --ffn --vocab (each 1 to 2^20), stored into m. 0, or DT_EUSAGE with a
 * message naming the option. */
int dt_cmd_model_option(int c, const char *value, dt_model_cfg_t *m, dt_emsg_t *em);

/* A job spec for `dtengine KIND --spec path`: loaded into s (freed first)
 * and its kind checked (a spec without a kind is a train job's). 0, or
 * the error naming the file. */
struct dt_spec;
int dt_cmd_spec_load(const char *path, const char *kind, struct dt_spec *s, dt_emsg_t *em);

/* --device cpu|cuda and --dtype bf16|fp16 of train and prefill: value of
 * option --name into *cuda or *dtype.
 * dt_cmd_device_check: after parsing, a --dtype without --device cuda, or
 * cuda in a dtengine built without it, is DT_EUSAGE. */
int dt_cmd_device_option(const char *name, const char *value, int *cuda, dt_dtype_t *dtype,
                         dt_emsg_t *em);
int dt_cmd_device_check(int cuda, int dtype_given, dt_emsg_t *em);

/* The exit code for a dt error code. */
int dt_exit_code(int rc);

int dt_cmd_attn(dt_comm_t *comm, int argc, char **argv);
int dt_cmd_prefill(dt_comm_t *comm, int argc, char **argv);
int dt_cmd_train(dt_comm_t *comm, int argc, char **argv);

#endif /* DT_ENGINE_CMD_H */
