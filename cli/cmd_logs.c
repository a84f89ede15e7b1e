/* SPDX-License-Identifier: MIT
 *
 * dtctl logs JOB [--rank N] [-f]: a job's output, read as the user who
 * runs dtctl from where it lives. The coordinator says where (SHOW: the
 * job directory, the Slurm batch output) and never reads the files
 * itself: they are the job owner's. With --rank, that rank's log
 * (JOBDIR/logs/rank-N.log, every generation appended, each under a
 * dtagentd header line); without, the Slurm batch output of a job run by
 * Slurm (every agent's and worker's output), else every rank's log one
 * after the other. -f follows the files, like tail -f, until the job has
 * ended and everything is read.
 *
 * On a terminal, control characters and invalid UTF-8 are shown escaped
 * (\x1b): a job's output must not drive the reader's terminal. Piped, the
 * bytes are passed on as they are.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/dtctl.h"
#include "common/mem.h"
#include "common/text.h"
#include "common/proto.h"
#include "common/wire.h"
#include "spec/state.h"

#define POLL_MS 250
#define STATE_EVERY 4 /* ask for the job's state every STATE_EVERY polls */

typedef struct src {
    char *path, *label;
    int64_t off;
} src_t;

typedef struct logs {
    dtctl_t *ctl;
    long long job;
    long long rank; /* -1: all */
    int follow, tty;
    src_t *s;
    int n;
    int last; /* source printed last, for headers; -1 none */
} logs_t;

/* Write n bytes of a job's output; on a terminal, escape what could
 * drive it (a UTF-8 sequence cut by the read shows as \x escapes). */
static void emit(const logs_t *L, const unsigned char *p, size_t n)
{
    if (!L->tty) {
        fwrite(p, 1, n, stdout);
        return;
    }
    char *e = dt_text_escape_n((const char *)p, n, DT_TEXT_KEEP_LINES);
    fputs(e, stdout);
    free(e);
}

/* Print what is new in source k since its offset: DTCTL_OK, or an exit
 * code after printing why it cannot be read (a file not there yet is fine
 * unless must_exist). */
static int drain(logs_t *L, int k, int must_exist)
{
    src_t *s = &L->s[k];
    unsigned char buf[65536];
    struct stat st;
    int fd;

    fd = open(s->path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT && !must_exist)
            return DTCTL_OK;
        fprintf(stderr, "%s logs: job %lld: %s: %s%s\n", L->ctl->prog, L->job, s->path,
                strerror(e),
                e == ENOENT ? " (no output yet, or the job's files are on a file system not "
                              "mounted here)"
                : e == EACCES ? " (a job's logs are readable by its owner only)"
                : e == ELOOP  ? " (a symbolic link: not followed)" : "");
        return e == EACCES ? DTCTL_DENIED : DTCTL_ERROR;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s logs: job %lld: %s: not a regular file\n", L->ctl->prog, L->job,
                s->path);
        close(fd);
        return DTCTL_ERROR;
    }
    if (st.st_size < s->off)
        s->off = 0; /* truncated (Slurm truncates -o files without --open-mode=append) */
    for (;;) {
        ssize_t r = pread(fd, buf, sizeof(buf), s->off);
        if (r <= 0)
            break;
        if (L->n > 1 && L->last != k) {
            printf("%s==> %s <==\n", L->last >= 0 ? "\n" : "", s->label);
            L->last = k;
        }
        emit(L, buf, (size_t)r);
        s->off += r;
    }
    close(fd);
    fflush(stdout);
    return DTCTL_OK;
}

static void add_src(logs_t *L, const char *path, const char *label)
{
    for (int i = 0; i < L->n; i++)
        if (strcmp(L->s[i].path, path) == 0)
            return;
    L->s = dt_xrealloc(L->s, (size_t)(L->n + 1) * sizeof(*L->s));
    L->s[L->n].path = dt_xstrdup(path);
    L->s[L->n].label = dt_xstrdup(label);
    L->s[L->n].off = 0;
    L->n++;
}

static long long rank_of(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? strtoll(b + 1 + strlen("rank-"), NULL, 10) : 0;
}

static int by_rank(const void *a, const void *b)
{
    long long x = rank_of(*(char *const *)a), y = rank_of(*(char *const *)b);
    return (x > y) - (x < y);
}

/* The files to show, from the SHOW reply; every rank log found so far
 * when no rank and no Slurm output. */
static void sources(logs_t *L, const json_t *job)
{
    const char *dir = json_string_value(json_object_get(job, "dir"));
    const json_t *sl = json_object_get(job, "slurm");
    const char *out = json_string_value(json_object_get(sl, "output"));
    char *p;

    if (L->rank >= 0) {
        if (dir == NULL)
            return;
        p = dt_xasprintf("%s/logs/rank-%lld.log", dir, L->rank);
        add_src(L, p, p);
        free(p);
        return;
    }
    if (out && *out) {
        add_src(L, out, out);
        return;
    }
    if (dir == NULL)
        return;
    glob_t g;
    p = dt_xasprintf("%s/logs/rank-*.log", dir);
    if (glob(p, 0, NULL, &g) == 0) {
        qsort(g.gl_pathv, g.gl_pathc, sizeof(char *), by_rank);
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char *b = strrchr(g.gl_pathv[i], '/');
            add_src(L, g.gl_pathv[i], b ? b + 1 : g.gl_pathv[i]);
        }
        globfree(&g);
    }
    free(p);
}

static int ended(const json_t *job)
{
    enum dt_job_state s;
    return dt_job_state_parse(json_string_value(json_object_get(job, "state")), &s) == 0 &&
           dt_job_state_terminal(s);
}

static int show(logs_t *L, json_t **res)
{
    dt_emsg_t em = { "" };
    dt_wire_job_ref_t ref = { .id = L->job };
    int rc = dtctl_request(L->ctl, DT_MSG_SHOW, dt_wire_show_encode(&ref), res,
                           &em);
    return rc < 0 ? dtctl_fail(L->ctl, "logs", rc, &em) : DTCTL_OK;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dtctl logs JOB [--rank N] [-f|--follow]\n"
               "  --rank N     rank N's log (every generation); default: the Slurm batch output,\n"
               "               or every rank's log\n"
               "  -f, --follow keep printing what is appended until the job has ended\n");
}

int dtctl_logs(dtctl_t *ctl, int argc, char **argv)
{
    static const struct option lo[] = {
        { "rank", required_argument, NULL, 'r' },
        { "follow", no_argument, NULL, 'f' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    logs_t L = { .ctl = ctl, .rank = -1, .last = -1, .tty = isatty(1) };
    json_t *res = NULL;
    char *end;
    int c, rc = DTCTL_OK;

    while ((c = getopt_long(argc, argv, "fh", lo, NULL)) != -1) {
        switch (c) {
        case 'r':
            errno = 0;
            L.rank = strtoll(optarg, &end, 10);
            if (*optarg == '\0' || *end || errno || L.rank < 0 || L.rank >= 1 << 24) {
                fprintf(stderr, "%s logs: --rank '%s': a rank from 0\n", ctl->prog, optarg);
                return DTCTL_USAGE;
            }
            break;
        case 'f': L.follow = 1; break;
        case 'h': usage(stdout); return DTCTL_OK;
        default: usage(stderr); return DTCTL_USAGE;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "%s logs: %s\n", ctl->prog, optind >= argc ? "which job?" : "one job");
        usage(stderr);
        return DTCTL_USAGE;
    }
    errno = 0;
    L.job = strtoll(argv[optind], &end, 10);
    if (*argv[optind] == '\0' || *end || errno || L.job <= 0) {
        fprintf(stderr, "%s logs: '%s' is not a job id\n", ctl->prog, argv[optind]);
        return DTCTL_USAGE;
    }
    if ((rc = show(&L, &res)) != DTCTL_OK)
        return rc;
    json_t *job = json_object_get(res, "job");
    sources(&L, job);
    if (L.n == 0 && !L.follow) {
        fprintf(stderr, "%s logs: job %lld has no output yet\n", ctl->prog, L.job);
        rc = DTCTL_ERROR;
        goto out;
    }
    /* without -f every named file must be there; following, it may come */
    for (int k = 0; k < L.n && rc == DTCTL_OK; k++)
        rc = drain(&L, k, !L.follow);
    for (int polls = 1; L.follow && rc == DTCTL_OK; polls++) {
        int done = ended(job);
        struct timespec ts = { 0, POLL_MS * 1000000L };
        nanosleep(&ts, NULL);
        if (polls % STATE_EVERY == 0 || done) {
            json_decref(res);
            res = NULL;
            if ((rc = show(&L, &res)) != DTCTL_OK)
                break;
            job = json_object_get(res, "job");
            sources(&L, job);
        }
        for (int k = 0; k < L.n && rc == DTCTL_OK; k++)
            rc = drain(&L, k, 0);
        if (done) /* one full pass after the end: the last words are in */
            break;
    }
out:
    json_decref(res);
    for (int k = 0; k < L.n; k++) {
        free(L.s[k].path);
        free(L.s[k].label);
    }
    free(L.s);
    return rc;
}
