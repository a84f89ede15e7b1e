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

#include "common/err.h"

/* Exit codes of dtctl (documented in dtctl(1)). */
enum {
    DTCTL_OK = 0,
    DTCTL_ERROR = 1,    /* the coordinator refused or failed the request */
    DTCTL_USAGE = 2,    /* bad options or spec */
    DTCTL_NOCOORD = 3,  /* cannot reach the coordinator */
    DTCTL_NOTFOUND = 4, /* no such job */
    DTCTL_DENIED = 5,   /* permission denied */
    DTCTL_REFUSED = 6,  /* the job cannot be planned: does not fit, bad lengths */
};

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

/* The exit code for a request's failure, printing "dtctl CMD: MESSAGE". */
int dtctl_fail(dtctl_t *ctl, const char *cmd, int rc, const dt_emsg_t *em);

/* Print a JSON value to stdout (indented, one document, newline). */
void dtctl_print_json(const json_t *v);

int dtctl_plan(dtctl_t *ctl, int argc, char **argv);
int dtctl_submit(dtctl_t *ctl, int argc, char **argv);
int dtctl_list(dtctl_t *ctl, int argc, char **argv);
int dtctl_show(dtctl_t *ctl, int argc, char **argv);
int dtctl_cancel(dtctl_t *ctl, int argc, char **argv);
int dtctl_events(dtctl_t *ctl, int argc, char **argv);
int dtctl_checkpoints(dtctl_t *ctl, int argc, char **argv);

#endif /* DT_DTCTL_H */
