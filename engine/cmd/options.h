/* SPDX-License-Identifier: MIT
 *
 * dtengine's options, one parser for attn, prefill and train
 * (engine/cmd/options.c). Every job-spec key a command takes (the key
 * table's tags, spec/spec.h DT_SPEC_FOR) is an option spelt with '-' for
 * '_' (`--kv-heads 8`, `--steps=10`; a boolean as --causal / --no-causal),
 * with two spellings of the engine's own: --seq-len for tokens and
 * --out-dir for output_dir. `--spec FILE` is read first and the options
 * go over it. The values land in a dt_spec_t and are checked as a spec's;
 * the command then reads every setting through the spec's resolvers
 * (dt_spec_int, dt_spec_layout, ...), so a default is the key table's
 * whichever way the job was given. Options of the command's own (paths,
 * modes) come from its table and go to its handler.
 */
#ifndef DT_ENGINE_CMD_OPTIONS_H
#define DT_ENGINE_CMD_OPTIONS_H

#include <stddef.h>

#include "common/err.h"
#include "spec/spec.h"

typedef struct dt_cmd_opt {
    const char *name; /* without "--"; NULL ends the table */
    int has_arg;      /* 1: takes a value (--name V or --name=V) */
    int id;           /* handed to the handler */
} dt_cmd_opt_t;

/* The command's handler of its own option `id` (value NULL when it takes
 * none): 0, or a negative DT_E* code with the message in em. */
typedef int (*dt_cmd_opt_fn)(int id, const char *value, void *arg, dt_emsg_t *em);

/* The engine's own options that more than one command takes, parsed
 * here: --print-settings (every command), and for prefill and train
 * --resume, --resume-from DIR, --resume-from-memory STEP and --ckpt-commit
 * self|external. */
typedef struct dt_cmd_common {
    int print;               /* --print-settings */
    int resume;              /* --resume: the newest checkpoint under ckpt_dir */
    const char *resume_from; /* --resume-from STEPDIR, or NULL */
    int64_t resume_mem;      /* --resume-from-memory STEP (the agent's copies), 0 none */
    int external;            /* --ckpt-commit external: the coordinator commits */
} dt_cmd_common_t;

/* Parse argv (argv[0] is the command's name) for the command of `kind`
 * into spec (zeroed by the caller), common (zeroed here) and, for the
 * command's other options, through fn. Returns 0, 1 for --help, or
 * DT_EUSAGE naming the option (an unknown one, a spec key the command does
 * not take, a missing value, a value the key refuses, no --seq-len for
 * train or prefill, a device this build cannot run: dt_cmd_device_check);
 * a --spec file that cannot be read or is of another kind: its error. */
int dt_cmd_options(int argc, char **argv, enum dt_job_kind kind, const dt_cmd_opt_t *own,
                   dt_cmd_opt_fn fn, void *arg, dt_spec_t *spec, dt_cmd_common_t *common,
                   dt_emsg_t *em);

/* --print-settings: print on stdout one
 * `key = value` line per setting the command resolved, the value it will
 * run with, as a job spec says it (tests/unit/test_defaults.c compares
 * them with the key table). fmt NULL: the setting has no value (left
 * out). */
void dt_cmd_setting(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The option that sets `key` ("tokens" -> "seq-len"), into buf. */
const char *dt_cmd_option_name(const char *key, char *buf, size_t n);

#endif /* DT_ENGINE_CMD_OPTIONS_H */
