/* SPDX-License-Identifier: MIT
 *
 * dtctl list, show, cancel, events, checkpoints, checkpoint: one request
 * each, printed as aligned tables for people or, with --json, the
 * coordinator's reply.
 */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <pwd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/dtctl.h"
#include "cli/table.h"
#include "common/proto.h"
#include "common/wire.h"

static const char *str(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : "";
}

static long long num(const json_t *o, const char *k)
{
    return (long long)json_integer_value(json_object_get(o, k));
}

static const char *when(long long ms, char *buf, size_t n)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (ms <= 0)
        return "-";
    localtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

static const char *user(long long uid, char *buf, size_t n)
{
    struct passwd *pw = getpwuid((uid_t)uid);
    if (pw)
        snprintf(buf, n, "%s", pw->pw_name);
    else
        snprintf(buf, n, "%lld", uid);
    return buf;
}

/* A table column: header (leading '-' = left-aligned), the JSON field of
 * each row object, and how to show it. */
typedef struct col {
    const char *header, *field;
    enum { C_INT, C_STR, C_TIME, C_USER, C_REAL } kind;
} col_t;

/* Print an array of objects as an aligned table, one row per object. */
static void print_rows(const json_t *rows, const col_t *cols, int ncol)
{
    const char *hdr[8];
    dt_table_t *t;
    size_t i;
    json_t *r;

    for (int c = 0; c < ncol; c++)
        hdr[c] = cols[c].header;
    t = dt_table_new(ncol, hdr);
    json_array_foreach(rows, i, r) {
        for (int c = 0; c < ncol; c++) {
            char b[64];
            switch (cols[c].kind) {
            case C_INT: dt_table_cell(t, "%lld", num(r, cols[c].field)); break;
            case C_STR: dt_table_cell(t, "%s", str(r, cols[c].field)); break;
            case C_TIME: dt_table_cell(t, "%s", when(num(r, cols[c].field), b, sizeof(b))); break;
            case C_USER: dt_table_cell(t, "%s", user(num(r, cols[c].field), b, sizeof(b))); break;
            case C_REAL:
                dt_table_cell(t, "%.4f", json_number_value(json_object_get(r, cols[c].field)));
                break;
            }
        }
    }
    dt_table_print(t, stdout);
    dt_table_free(t);
}

/* Options of the job commands: JOB and, per command, --since/--reason. */
typedef struct jobargs {
    long long id;
    long long since;
    const char *reason;
    int checkpoint;
} jobargs_t;

static int parse_job(dtctl_t *ctl, int argc, char **argv, int want_job, jobargs_t *a)
{
    static const struct option lo[] = {
        { "json", no_argument, NULL, 'j' },
        { "since", required_argument, NULL, 's' },
        { "reason", required_argument, NULL, 'r' },
        { "checkpoint", no_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;

    memset(a, 0, sizeof(*a));
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'j': ctl->json = 1; break;
        case 's':
            if (strcmp(optarg, "0") != 0 && dtctl_parse_id(optarg, &a->since) < 0) {
                fprintf(stderr, "dtctl %s: --since '%s' is not an event id (0 to %lld)\n",
                        argv[0], optarg, LLONG_MAX);
                return DTCTL_USAGE;
            }
            break;
        case 'r': a->reason = optarg; break;
        case 'c': a->checkpoint = 1; break;
        case 'h':
            printf("usage: dtctl %s%s\n", argv[0], want_job ? " JOB" : "");
            return DTCTL_OK + 100;
        default:
            fprintf(stderr, "dtctl %s: unknown option '%s'\n", argv[0], argv[optind - 1]);
            return DTCTL_USAGE;
        }
    }
    if (!want_job) {
        if (optind < argc) {
            fprintf(stderr, "dtctl %s: unexpected argument '%s'\n", argv[0], argv[optind]);
            return DTCTL_USAGE;
        }
        return 0;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "usage: dtctl %s JOB\n", argv[0]);
        return DTCTL_USAGE;
    }
    if (dtctl_parse_id(argv[optind], &a->id) < 0) {
        fprintf(stderr, "dtctl %s: '%s' is not a job id (1 to %lld)\n", argv[0], argv[optind],
                LLONG_MAX);
        return DTCTL_USAGE;
    }
    return 0;
}

/* Run one request; print the whole reply for --json. */
static int ask(dtctl_t *ctl, const char *cmd, uint16_t type, json_t *body, json_t **res)
{
    dt_emsg_t em = { "" };
    int rc = dtctl_request(ctl, type, body, res, &em);
    if (rc < 0)
        return dtctl_fail(ctl, cmd, rc, &em);
    if (ctl->json) {
        dtctl_print_json(*res);
        json_decref(*res);
        *res = NULL;
    } else {
        dtctl_sanitize(ctl, *res);
    }
    return DTCTL_OK;
}

/* The shape of every command on one job: its options and JOB, then one
 * request {"id": JOB} plus what the options add (see body_of). Returns an
 * exit status; *res is the reply to print, NULL when there is nothing
 * more to do (--help, --json, an error already reported). */
static int job_request(dtctl_t *ctl, int argc, char **argv, uint16_t type, jobargs_t *a,
                       json_t **res)
{
    int rc = parse_job(ctl, argc, argv, 1, a);

    *res = NULL;
    if (rc)
        return rc == 100 ? DTCTL_OK : rc;
    json_t *body;
    if (type == DT_MSG_EVENTS) {
        dt_wire_events_t ev = { .id = a->id, .since = a->since };
        body = dt_wire_events_encode(&ev);
    } else if (type == DT_MSG_CANCEL) {
        dt_wire_cancel_t cn = { .id = a->id, .reason = a->reason, .checkpoint = a->checkpoint };
        body = dt_wire_cancel_encode(&cn);
    } else {
        dt_wire_job_ref_t ref = { .id = a->id };
        body = dt_wire_encode(dt_wire_schema(type, false), &ref);
    }
    return ask(ctl, argv[0], type, body, res);
}

int dtctl_list(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    int rc = parse_job(ctl, argc, argv, 0, &a);
    if (rc)
        return rc == 100 ? DTCTL_OK : rc;
    if ((rc = ask(ctl, "list", DT_MSG_LIST, NULL, &res)) != DTCTL_OK || res == NULL)
        return rc;
    static const col_t cols[] = {
        { "ID", "id", C_INT },           { "-NAME", "name", C_STR },
        { "-OWNER", "owner", C_USER },   { "-STATE", "state", C_STR },
        { "-SLURM", "slurm_col", C_STR }, { "-UPDATED", "updated_ms", C_TIME },
        { "-REASON", "reason", C_STR },
    };
    /* the dt state and the Slurm job's, side by side */
    json_t *jobs = json_object_get(res, "jobs"), *jr;
    size_t i;
    json_array_foreach(jobs, i, jr) {
        json_t *sl = json_object_get(jr, "slurm");
        char col[160] = "-";
        if (json_is_object(sl)) {
            const char *reason = str(sl, "reason");
            snprintf(col, sizeof(col), "%lld %s%s%s%s", num(sl, "id"), str(sl, "state"),
                     *reason && strcmp(reason, "None") ? " (" : "",
                     *reason && strcmp(reason, "None") ? reason : "",
                     *reason && strcmp(reason, "None") ? ")" : "");
        }
        json_object_set_new(jr, "slurm_col", json_string(col));
    }
    print_rows(jobs, cols, 7);
    json_decref(res);
    return DTCTL_OK;
}

/* A prefill's perplexity.json (io/nll.h), read as the user: its
 * per-bucket perplexity. Silent when path is another output or cannot be
 * read (the outputs are listed above). */
static void print_perplexity(const char *path)
{
    size_t n = strlen(path), i;
    const char *tail = "/perplexity.json";
    json_t *j, *b;

    if (n < strlen(tail) || strcmp(path + n - strlen(tail), tail) != 0)
        return;
    if ((j = json_load_file(path, 0, NULL)) == NULL)
        return;
    printf("  perplexity by position:\n");
    json_array_foreach(json_object_get(j, "buckets"), i, b)
        printf("    [%lld, %lld)  targets=%lld nll=%.6f ppl=%.4f\n", num(b, "from"),
               num(b, "to"), num(b, "targets"), json_number_value(json_object_get(b, "nll")),
               json_number_value(json_object_get(b, "ppl")));
    json_decref(j);
}

static double real(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

/* ETTR, the checkpoints' stall and each failure's cost (what the
 * coordinator's step history says; nothing before the first step). */
static void print_goodput(const json_t *g)
{
    if (!json_is_object(g) || num(g, "first_step_ms") <= 0)
        return;
    const json_t *ettr = json_object_get(g, "ettr");
    printf("  goodput   ");
    if (json_is_number(ettr))
        printf("ETTR %.3f  ", json_number_value(ettr));
    printf("productive %.1f s of %.1f s  recomputed %.1f s  checkpoint stall %.1f s\n",
           real(g, "productive_s"), real(g, "wall_s"), real(g, "recomputed_s"),
           real(g, "ckpt_stall_s"));
    size_t i;
    const json_t *f;
    json_array_foreach(json_object_get(g, "failure_costs"), i, f)
        printf("  failure   gen %lld %s: detect %.1f s  restart %.1f s  load %.1f s  "
               "resumed at step %lld  recomputed %lld steps (%.1f s)\n",
               num(f, "gen"), str(f, "fault"), real(f, "detect_s"), real(f, "restart_s"),
               real(f, "load_s"), num(f, "resume_step"), num(f, "recomputed_steps"),
               real(f, "recomputed_s"));
}

int dtctl_show(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    int rc = job_request(ctl, argc, argv, DT_MSG_SHOW, &a, &res);
    if (res == NULL)
        return rc;
    json_t *j = json_object_get(res, "job"), *plan = json_object_get(res, "plan");
    char b1[64], b2[64], b3[64];
    printf("job %lld  %s\n", num(j, "id"), str(j, "name"));
    printf("  owner     %s\n", user(num(j, "owner"), b1, sizeof(b1)));
    if (*str(j, "reason"))
        printf("  state     %s  (%s)\n", str(j, "state"), str(j, "reason"));
    else
        printf("  state     %s\n", str(j, "state"));
    printf("  created   %s\n  updated   %s\n", when(num(j, "created_ms"), b2, sizeof(b2)),
           when(num(j, "updated_ms"), b3, sizeof(b3)));
    if (*str(j, "dir"))
        printf("  dir       %s\n", str(j, "dir"));
    json_t *sl = json_object_get(j, "slurm");
    if (json_is_object(sl)) {
        const char *reason = str(sl, "reason");
        printf("  slurm     job %lld  %s%s%s%s\n", num(sl, "id"), str(sl, "state"),
               *reason && strcmp(reason, "None") ? " (" : "",
               *reason && strcmp(reason, "None") ? reason : "",
               *reason && strcmp(reason, "None") ? ")" : "");
        if (*str(sl, "nodes"))
            printf("  nodes     %s\n", str(sl, "nodes"));
        if (*str(sl, "exclude"))
            printf("  excluded  %s\n", str(sl, "exclude"));
        printf("  output    %s\n", str(sl, "output"));
        if (num(sl, "exit_code") >= 0 && strcmp(str(sl, "state"), "RUNNING") != 0 &&
            strcmp(str(sl, "state"), "PENDING") != 0)
            printf("  exit      %lld\n", num(sl, "exit_code"));
    }
    printf("  restarts  %lld", num(j, "restarts"));
    if (num(j, "requeues"))
        printf("  (requeues %lld)", num(j, "requeues"));
    printf("\n");
    print_goodput(json_object_get(res, "goodput"));
    json_t *result = json_object_get(j, "result");
    if (json_is_object(result)) {
        json_t *loss = json_object_get(result, "loss"), *acc = json_object_get(result, "acc");
        const char *kind = json_is_object(plan) ? str(plan, "kind") : "";
        printf("  result    steps=%lld", num(result, "steps"));
        if (json_is_number(loss))
            printf(" loss=%.6f", json_number_value(loss));
        /* a prefill's loss is the mean NLL of the sequence's targets */
        if (json_is_number(loss) && strcmp(kind, "prefill") == 0)
            printf(" ppl=%.4f", exp(json_number_value(loss)));
        if (json_is_number(acc))
            printf(" acc=%.4f", json_number_value(acc));
        printf(" checksum=%s\n", *str(result, "checksum") ? str(result, "checksum") : "-");
        size_t i;
        json_t *o;
        json_array_foreach(json_object_get(result, "outputs"), i, o)
            if (json_is_string(o))
                printf("  outputs   %s\n", json_string_value(o));
        json_array_foreach(json_object_get(result, "outputs"), i, o)
            if (json_is_string(o))
                print_perplexity(json_string_value(o));
    }
    if (json_is_object(plan)) {
        json_t *sec = json_object_get(plan, "seconds");
        /* ranks is per ring; with dp rings the workers are all of them */
        printf("  plan      ranks=%lld ", num(plan, "ranks"));
        if (num(plan, "dp") > 1)
            printf("dp=%lld workers=%lld ", num(plan, "dp"), num(plan, "workers"));
        printf("tokens_per_rank=%lld memory_per_rank=%.2f GiB "
               "estimated_s=%.1f comm_hidden=%s\n",
               num(plan, "tokens_per_rank"),
               json_number_value(json_object_get(plan, "memory_per_rank_bytes")) / 1073741824.0,
               json_number_value(sec), json_is_true(json_object_get(plan, "comm_hidden")) ? "yes"
                                                                                         : "no");
        /* why the planner chose what the user did not (recompute) */
        if (*str(plan, "note"))
            printf("  note      %s\n", str(plan, "note"));
    }
    static const col_t agent_cols[] = {
        { "AGENT", "id", C_INT },       { "-NODE", "node", C_STR },
        { "SLOTS", "slots", C_INT },    { "GPUS", "gpus", C_INT },
        { "-STATE", "state", C_STR },   { "-LAST SEEN", "last_seen_ms", C_TIME },
    };
    static const col_t progress_cols[] = {
        { "AGENT", "agent", C_INT },
        { "STEP", "step", C_INT },
        { "TOKENS", "tokens", C_INT },
        { "LOSS", "loss", C_REAL },
    };
    if (json_array_size(json_object_get(res, "agents")) > 0) {
        printf("\n");
        print_rows(json_object_get(res, "agents"), agent_cols, 6);
    }
    if (json_array_size(json_object_get(res, "progress")) > 0) {
        printf("\nprogress:\n");
        print_rows(json_object_get(res, "progress"), progress_cols, 4);
    }
    printf("\nspec:\n%s", str(res, "spec"));
    json_decref(res);
    return DTCTL_OK;
}

int dtctl_cancel(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    dt_wire_cancel_ok_t ok;
    int rc = job_request(ctl, argc, argv, DT_MSG_CANCEL, &a, &res);
    if (res == NULL)
        return rc;
    if ((rc = dtctl_result(ctl, argv[0], DT_MSG_CANCEL, res, &ok)) == 0) {
        if (ok.stopping)
            printf("job %lld stopping: checkpoint at the next step, then cancelled\n",
                   (long long)ok.id);
        else
            printf("job %lld %s\n", (long long)ok.id, ok.state);
    }
    json_decref(res);
    return rc;
}

int dtctl_events(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    int rc = job_request(ctl, argc, argv, DT_MSG_EVENTS, &a, &res);
    if (res == NULL)
        return rc;
    static const col_t cols[] = {
        { "ID", "id", C_INT },       { "-TIME", "at_ms", C_TIME }, { "-KIND", "kind", C_STR },
        { "-STATE", "state", C_STR }, { "-DETAIL", "detail", C_STR },
    };
    print_rows(json_object_get(res, "events"), cols, 5);
    json_decref(res);
    return DTCTL_OK;
}

int dtctl_checkpoints(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    int rc = job_request(ctl, argc, argv, DT_MSG_CHECKPOINTS, &a, &res);
    if (res == NULL)
        return rc;
    static const col_t cols[] = {
        { "STEP", "step", C_INT },           { "-STATE", "state", C_STR },
        { "SHARDS", "shards", C_INT },       { "BYTES", "bytes", C_INT },
        { "-CREATED", "created_ms", C_TIME }, { "-COMMITTED", "committed_ms", C_TIME },
        { "-CORRUPT", "corrupt_ms", C_TIME },
    };
    print_rows(json_object_get(res, "checkpoints"), cols, 7);
    json_decref(res);
    return DTCTL_OK;
}

/* Ask the running generation for a checkpoint at its next step boundary;
 * the coordinator commits it when every shard is in (see checkpoints). */
int dtctl_checkpoint(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    dt_wire_checkpoint_ok_t ok;
    int rc = job_request(ctl, argc, argv, DT_MSG_CHECKPOINT, &a, &res);
    if (res == NULL)
        return rc;
    if ((rc = dtctl_result(ctl, argv[0], DT_MSG_CHECKPOINT, res, &ok)) == 0)
        printf("job %lld: checkpoint requested (generation %lld)\n", (long long)ok.id,
               (long long)ok.gen);
    json_decref(res);
    return rc;
}

int dtctl_resume(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    dt_wire_resume_ok_t ok;
    int rc = job_request(ctl, argc, argv, DT_MSG_RESUME, &a, &res);
    if (res == NULL)
        return rc;
    if ((rc = dtctl_result(ctl, argv[0], DT_MSG_RESUME, res, &ok)) == 0 && ok.step > 0)
        printf("job %lld %s: resumes from the checkpoint at step %lld\n", (long long)ok.id,
               ok.state, (long long)ok.step);
    else if (rc == 0)
        printf("job %lld %s: no committed checkpoint, starts over\n", (long long)ok.id,
               ok.state);
    json_decref(res);
    return rc;
}
