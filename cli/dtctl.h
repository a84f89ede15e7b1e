/* SPDX-License-Identifier: MIT
 *
 * dtctl: the command table's shared context and the client side of the
 * protocol. Each subcommand is one file (cmd_*.c) with a function
 * `int dtctl_<name>(dtctl_t *ctl, int argc, char **argv)` returning an exit
 * code; argv[0] is the subcommand name, options come after it.
 */
#ifndef DT_DTCTL_H
#define DT_DTCTL_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "common/exitcodes.h" /* DTCTL_*: dtctl(1) EXIT STATUS */
#include "spec/spec.h"

typedef struct dtctl {
    const char *socket; /* Unix socket path (--socket or DT_SOCKET) */
    const char *coord;  /* host:port for TCP (--coord or DT_COORD), or NULL */
    const char *munge_socket; /* --munge-socket: munged's socket for TCP */
    int json;           /* --json: one JSON document on stdout */
    const char *prog;   /* "dtctl" */
} dtctl_t;

/* Send one request and wait for its reply. body is consumed (may be NULL).
 * On DT_MSG_OK returns 0 and *result (new reference, the caller decrefs).
 * Otherwise returns a negative dt code: the coordinator's error code with
 * its message in em, or DT_ECOMM when it cannot be reached. */
int dtctl_request(dtctl_t *ctl, uint16_t type, json_t *body, json_t **result, dt_emsg_t *em);

/* Print "dtctl CMD: WHAT MESSAGE" on stderr, the message escaped for the
 * terminal (it may quote a spec, a file or the coordinator); what may be
 * NULL. */
void dtctl_error(const dtctl_t *ctl, const char *cmd, const char *what, const char *msg);

/* The exit code for a request's failure, printing "dtctl CMD: MESSAGE". */
int dtctl_fail(dtctl_t *ctl, const char *cmd, int rc, const dt_emsg_t *em);

/* The result of a request of `type` decoded into out, the struct
 * common/wire.h gives for it (SUBMIT, CANCEL, CHECKPOINT, RESUME): 0, or
 * when it does not decode "dtctl CMD: the coordinator's reply: ..." on
 * stderr and DTCTL_ERROR. */
int dtctl_result(dtctl_t *ctl, const char *cmd, uint16_t type, const json_t *res, void *out);

/* Print a JSON value to stdout (indented, one document, newline). */
void dtctl_print_json(const json_t *v);

/* Before a reply is printed for people (not with --json, whose strings
 * jansson escapes): every string in it escaped for the terminal
 * (dt_text_escape), so that a name or reason someone stored cannot move
 * the cursor or forge a line. The multi-line "spec" and "script" keep
 * their newlines and tabs. Errors from the coordinator (em of
 * dtctl_request) come escaped already. */
void dtctl_sanitize(const dtctl_t *ctl, json_t *reply);

/* --coord HOST:PORT (or [IPV6]:PORT): host (at most hostlen - 1 bytes) and
 * port (1 to 65535, as digits). DT_EUSAGE naming what is wrong. */
int dtctl_parse_coord(const char *hostport, char *host, size_t hostlen, char port[6],
                      dt_emsg_t *em);

/* A job id: decimal digits only, 1 to 2^63-1. 0 or DT_EUSAGE. */
int dtctl_parse_id(const char *s, long long *out);
/* The spec key a flag's key stands for with that value: `--model DIR` (a
 * value with a '/') is init_from = DIR, a Hugging Face model directory.
 * (plan, submit and run then fill the model keys from its config.json on
 * the user's side, io/hfspec.h: the coordinator plans that very model and
 * never reads the user's files.) */
const char *dtctl_spec_key(const char *key, const char *value);

/* The spec of `dtctl CMD [SPECFILE] [--KEY VALUE ...]` (cli/spec_args.c)
 * into spec (zeroed by the caller): the file, at most one and read
 * without its required keys (dt_spec_load_partial), then every other flag
 * a spec key set over it. own: the command's own flags (NULL-terminated,
 * taking no value, e.g. "--json"), bit i of *seen set when own[i] was
 * given; *help set for --help or -h (nothing read then). Returns DTCTL_OK,
 * or DTCTL_USAGE with "dtctl CMD: WHY" printed. The caller checks the
 * spec (dt_spec_check) once it has added what it fills in itself. */
int dtctl_spec_args(dtctl_t *ctl, const char *cmd, int argc, char **argv,
                    const char *const *own, unsigned *seen, int *help, dt_spec_t *spec);

int dtctl_plan(dtctl_t *ctl, int argc, char **argv);
int dtctl_submit(dtctl_t *ctl, int argc, char **argv);
int dtctl_list(dtctl_t *ctl, int argc, char **argv);
int dtctl_show(dtctl_t *ctl, int argc, char **argv);
int dtctl_cancel(dtctl_t *ctl, int argc, char **argv);
int dtctl_events(dtctl_t *ctl, int argc, char **argv);
int dtctl_checkpoints(dtctl_t *ctl, int argc, char **argv);
int dtctl_checkpoint(dtctl_t *ctl, int argc, char **argv);
int dtctl_resume(dtctl_t *ctl, int argc, char **argv);
int dtctl_watch(dtctl_t *ctl, int argc, char **argv);
int dtctl_logs(dtctl_t *ctl, int argc, char **argv);
int dtctl_plot(dtctl_t *ctl, int argc, char **argv);
int dtctl_run(dtctl_t *ctl, int argc, char **argv);
int dtctl_nll(dtctl_t *ctl, int argc, char **argv);
int dtctl_export(dtctl_t *ctl, int argc, char **argv);

/* ---- the live display of a job (cmd_watch.c), shared by watch and run --- */

typedef struct dtctl_watch dtctl_watch_t;

typedef struct dtctl_watch_hooks {
    /* Called after every poll with the SHOW reply (borrowed), or NULL when
     * the coordinator did not answer. Returns -1 to go on watching, or an
     * exit code to stop at once (no summary is printed). */
    int (*poll)(void *arg, dtctl_watch_t *w, const json_t *show);
    void *arg;
    double gap_s; /* how long the coordinator may stay unreachable once it
                   * has answered (0: 30 s) */
    int ended;    /* out: 1 when the watch stopped because the job ended */
} dtctl_watch_hooks_t;

/* Show job id until it reaches completed, failed or cancelled, polling SHOW
 * every interval_ms; then print the summary and the `result:` line (or with
 * ctl->json one JSON object). Returns DTCTL_OK for completed,
 * DTCTL_JOBFAILED for failed or cancelled, the code of a request that
 * failed (errors printed as "dtctl CMD: ..."), or what hooks->poll
 * returned. hooks may be NULL. */
int dtctl_watch_job(dtctl_t *ctl, const char *cmd, long long id, int64_t interval_ms,
                    dtctl_watch_hooks_t *hooks);
/* A line about something that happened, printed above the live display
 * (which is drawn again below it), or on stderr with --json. */
void dtctl_watch_note(dtctl_watch_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The exit code a job in this state ends dtctl with: DTCTL_OK (completed),
 * DTCTL_JOBFAILED (failed, cancelled), or -1 for a state that is not final
 * (or NULL). */
int dtctl_job_exit(const char *state);
/* "result: job=ID state=STATE loss=X checksum=HEX" from a job's result
 * object ({steps, loss, checksum}; NULL or fields absent: "-"). */
void dtctl_print_result(FILE *f, long long id, const char *state, const json_t *result);

#endif /* DT_DTCTL_H */
