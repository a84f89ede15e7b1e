/* SPDX-License-Identifier: MIT
 *
 * dtctl plot JOB --svg FILE [--state-dir DIR]: a picture of a job's
 * history. One HISTORY request, to the configured coordinator, or with
 * --state-dir to a coordinator started for the purpose on the state
 * directory of a `dtctl run --local` that has ended (the local
 * supervisor's start and teardown, cli/run_super.h; when that directory's
 * coordinator still runs, it is asked instead); the reply drawn by
 * cli/svgplot.h and written atomically (or to stdout for "-").
 *
 * Not here: the drawing (cli/svgplot.c), the history (the coordinator's
 * dt_jobs_history).
 */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/dtctl.h"
#include "cli/run_super.h"
#include "cli/svgplot.h"
#include "common/fileio.h"
#include "common/proto.h"
#include "common/wire.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dtctl plot JOB --svg FILE|- [--state-dir DIR]\n"
               "  --svg FILE       write the picture there (- for stdout)\n"
               "  --state-dir DIR  the job of a dtctl run --local that has ended: ask a\n"
               "                   coordinator started on DIR for the time it takes\n"
               "With --json (no --svg needed): the HISTORY document it is drawn from.\n"
               "See dtctl(1).\n");
}

typedef struct plot_opts {
    long long id;
    const char *svg, *state_dir;
} plot_opts_t;

/* -1 for --help (done), else an exit code (0: go on). */
static int parse(dtctl_t *ctl, int argc, char **argv, plot_opts_t *o)
{
    static const struct option lo[] = {
        { "svg", required_argument, NULL, 's' },
        { "state-dir", required_argument, NULL, 'd' },
        { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;

    memset(o, 0, sizeof(*o));
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 's': o->svg = optarg; break;
        case 'd': o->state_dir = optarg; break;
        case 'j': ctl->json = 1; break;
        case 'h': usage(stdout); return -1;
        default:
            fprintf(stderr, "dtctl plot: unknown option or missing value '%s'\n",
                    argv[optind - 1]);
            usage(stderr);
            return DTCTL_USAGE;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return DTCTL_USAGE;
    }
    if (dtctl_parse_id(argv[optind], &o->id) < 0) {
        fprintf(stderr, "dtctl plot: '%s' is not a job id (1 to %lld)\n", argv[optind],
                LLONG_MAX);
        return DTCTL_USAGE;
    }
    if (o->svg == NULL && !ctl->json) {
        fprintf(stderr, "dtctl plot: --svg FILE is needed (or --json for the data)\n");
        return DTCTL_USAGE;
    }
    if (o->svg && *o->svg == '\0') {
        fprintf(stderr, "dtctl plot: --svg '': no file name\n");
        return DTCTL_USAGE;
    }
    if (o->svg && strcmp(o->svg, "-") == 0 && ctl->json) {
        fprintf(stderr, "dtctl plot: --svg - and --json both want stdout\n");
        return DTCTL_USAGE;
    }
    return 0;
}

/* HISTORY of job id from the coordinator of an ended run's state
 * directory: started (and stopped) here unless one already runs there.
 * Returns an exit code; *res the reply. */
static int ask_state_dir(dtctl_t *ctl, const plot_opts_t *o, json_t **res)
{
    dtctl_super_t sup = { .ctl = ctl, .by = "dtctl plot" };
    dt_emsg_t em = { "" };
    int held = 0, rc, code = DTCTL_OK;

    sup.local = (dtctl_t){ .prog = ctl->prog, .json = ctl->json };
    sup.out = stderr;
    if ((rc = dtctl_super_state_dir_again(&sup, o->state_dir, &held, &em)) < 0 ||
        (!held && (rc = dtctl_super_find_coordd(&sup, &em)) < 0)) {
        dtctl_error(ctl, "plot", NULL, em.s);
        code = rc == DT_EUSAGE ? DTCTL_USAGE : DTCTL_ERROR;
        goto out;
    }
    if (!held) {
        dtctl_super_signals_install();
        if ((rc = dtctl_super_coord_start(&sup, &em)) < 0) {
            dtctl_error(ctl, "plot", NULL, em.s);
            if (rc != DT_ECANCELED)
                dtctl_super_log_tail(sup.coord.log, 5);
            code = rc == DT_ECANCELED ? 128 + dtctl_super_signal() : DTCTL_NOCOORD;
            goto stop;
        }
    }
    dt_wire_job_ref_t ref = { .id = o->id };
    if ((rc = dtctl_request(&sup.local, DT_MSG_HISTORY, dt_wire_history_encode(&ref), res,
                            &em)) < 0)
        code = dtctl_fail(ctl, "plot", rc, &em);
stop:
    if (!held)
        dtctl_super_teardown(&sup, 1, NULL);
out:
    dtctl_super_close(&sup);
    return code;
}

/* The picture into o->svg: an exit code. */
static int write_svg(dtctl_t *ctl, const plot_opts_t *o, const json_t *res)
{
    dt_emsg_t em = { "" };
    char *svg;
    size_t len;
    int rc = dtctl_svgplot(res, &svg, &len, &em);

    if (rc < 0) {
        dtctl_error(ctl, "plot", NULL, em.s);
        return DTCTL_ERROR;
    }
    if (strcmp(o->svg, "-") == 0) {
        rc = fwrite(svg, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : DT_EIO;
        if (rc < 0)
            dtctl_error(ctl, "plot", "writing to stdout: ", dt_strerror(rc));
    } else if ((rc = dt_file_write_atomic(o->svg, svg, len, 0644, 0, &em)) < 0) {
        dtctl_error(ctl, "plot", NULL, em.s);
    } else {
        const json_t *j = json_object_get(res, "job");
        /* stdout is the JSON document's with --json */
        size_t nf = json_array_size(json_object_get(res, "failures"));
        fprintf(ctl->json ? stderr : stdout, "job %lld: %zu steps, %zu failure%s drawn in %s\n",
                (long long)json_integer_value(json_object_get(j, "id")),
                json_array_size(json_object_get(res, "steps")), nf, nf == 1 ? "" : "s", o->svg);
    }
    free(svg);
    if (rc == DT_EACCES || rc == DT_EPERM)
        return DTCTL_DENIED;
    return rc < 0 ? DTCTL_ERROR : DTCTL_OK;
}

int dtctl_plot(dtctl_t *ctl, int argc, char **argv)
{
    plot_opts_t o;
    json_t *res = NULL;
    int rc = parse(ctl, argc, argv, &o);

    if (rc != 0)
        return rc < 0 ? DTCTL_OK : rc;
    if (o.state_dir) {
        if ((rc = ask_state_dir(ctl, &o, &res)) != DTCTL_OK)
            return rc;
    } else {
        dt_emsg_t em = { "" };
        dt_wire_job_ref_t ref = { .id = o.id };
        if ((rc = dtctl_request(ctl, DT_MSG_HISTORY, dt_wire_history_encode(&ref), &res, &em)) <
            0)
            return dtctl_fail(ctl, "plot", rc, &em);
    }
    if (ctl->json)
        dtctl_print_json(res);
    rc = o.svg ? write_svg(ctl, &o, res) : DTCTL_OK;
    json_decref(res);
    return rc;
}
