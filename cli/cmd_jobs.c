/* SPDX-License-Identifier: MIT
 *
 * dtctl list, show, cancel, events, checkpoints: one request each, printed
 * as aligned tables for people or, with --json, the coordinator's reply.
 */
#include "config.h"

#include <getopt.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/dtctl.h"
#include "cli/table.h"
#include "common/proto.h"

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

/* Options of the job commands: JOB and, per command, --since/--reason. */
typedef struct jobargs {
    long long id;
    long long since;
    const char *reason;
} jobargs_t;

static int parse_job(dtctl_t *ctl, int argc, char **argv, int want_job, jobargs_t *a)
{
    static const struct option lo[] = {
        { "json", no_argument, NULL, 'j' },
        { "since", required_argument, NULL, 's' },
        { "reason", required_argument, NULL, 'r' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    char *end;

    memset(a, 0, sizeof(*a));
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'j': ctl->json = 1; break;
        case 's':
            a->since = strtoll(optarg, &end, 10);
            if (*end || a->since < 0) {
                fprintf(stderr, "dtctl %s: --since '%s' is not an event id\n", argv[0], optarg);
                return DTCTL_USAGE;
            }
            break;
        case 'r': a->reason = optarg; break;
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
    a->id = strtoll(argv[optind], &end, 10);
    if (*argv[optind] == '\0' || *end || a->id <= 0) {
        fprintf(stderr, "dtctl %s: '%s' is not a job id\n", argv[0], argv[optind]);
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
    }
    return DTCTL_OK;
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
    static const char *const hdr[] = { "ID", "-NAME", "-OWNER", "-STATE", "-UPDATED", "-REASON" };
    dt_table_t *t = dt_table_new(6, hdr);
    size_t i;
    json_t *j;
    json_array_foreach(json_object_get(res, "jobs"), i, j) {
        char b1[64], b2[64];
        dt_table_cell(t, "%lld", num(j, "id"));
        dt_table_cell(t, "%s", str(j, "name"));
        dt_table_cell(t, "%s", user(num(j, "owner"), b1, sizeof(b1)));
        dt_table_cell(t, "%s", str(j, "state"));
        dt_table_cell(t, "%s", when(num(j, "updated_ms"), b2, sizeof(b2)));
        dt_table_cell(t, "%s", str(j, "reason"));
    }
    dt_table_print(t, stdout);
    dt_table_free(t);
    json_decref(res);
    return DTCTL_OK;
}

int dtctl_show(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    int rc = parse_job(ctl, argc, argv, 1, &a);
    if (rc)
        return rc == 100 ? DTCTL_OK : rc;
    rc = ask(ctl, "show", DT_MSG_SHOW, json_pack("{s:I}", "id", (json_int_t)a.id), &res);
    if (rc != DTCTL_OK || res == NULL)
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
    if (num(j, "slurm_id"))
        printf("  slurm     %lld\n", num(j, "slurm_id"));
    printf("  restarts  %lld\n", num(j, "restarts"));
    if (json_is_object(plan)) {
        json_t *sec = json_object_get(plan, "seconds");
        printf("  plan      ranks=%lld tokens_per_rank=%lld memory_per_rank=%.2f GiB "
               "estimated_s=%.1f comm_hidden=%s\n",
               num(plan, "ranks"), num(plan, "tokens_per_rank"),
               json_number_value(json_object_get(plan, "memory_per_rank_bytes")) / 1073741824.0,
               json_number_value(sec), json_is_true(json_object_get(plan, "comm_hidden")) ? "yes"
                                                                                         : "no");
    }
    json_t *agents = json_object_get(res, "agents"), *ag;
    size_t i;
    if (json_array_size(agents) > 0) {
        static const char *const hdr[] = { "AGENT", "-NODE", "SLOTS", "-STATE", "-LAST SEEN" };
        dt_table_t *t = dt_table_new(5, hdr);
        json_array_foreach(agents, i, ag) {
            dt_table_cell(t, "%lld", num(ag, "id"));
            dt_table_cell(t, "%s", str(ag, "node"));
            dt_table_cell(t, "%lld", num(ag, "slots"));
            dt_table_cell(t, "%s", str(ag, "state"));
            dt_table_cell(t, "%s", when(num(ag, "last_seen_ms"), b1, sizeof(b1)));
        }
        printf("\n");
        dt_table_print(t, stdout);
        dt_table_free(t);
    }
    json_t *prog = json_object_get(res, "progress"), *pg;
    if (json_array_size(prog) > 0) {
        static const char *const hdr[] = { "AGENT", "STEP", "TOKENS", "LOSS" };
        dt_table_t *t = dt_table_new(4, hdr);
        json_array_foreach(prog, i, pg) {
            dt_table_cell(t, "%lld", num(pg, "agent"));
            dt_table_cell(t, "%lld", num(pg, "step"));
            dt_table_cell(t, "%lld", num(pg, "tokens"));
            dt_table_cell(t, "%.4f", json_number_value(json_object_get(pg, "loss")));
        }
        printf("\nprogress:\n");
        dt_table_print(t, stdout);
        dt_table_free(t);
    }
    printf("\nspec:\n%s", str(res, "spec"));
    json_decref(res);
    return DTCTL_OK;
}

int dtctl_cancel(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    int rc = parse_job(ctl, argc, argv, 1, &a);
    if (rc)
        return rc == 100 ? DTCTL_OK : rc;
    json_t *body = json_pack("{s:I}", "id", (json_int_t)a.id);
    if (a.reason)
        json_object_set_new(body, "reason", json_string(a.reason));
    if ((rc = ask(ctl, "cancel", DT_MSG_CANCEL, body, &res)) != DTCTL_OK || res == NULL)
        return rc;
    printf("job %lld %s\n", num(res, "id"), str(res, "state"));
    json_decref(res);
    return DTCTL_OK;
}

int dtctl_events(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    int rc = parse_job(ctl, argc, argv, 1, &a);
    if (rc)
        return rc == 100 ? DTCTL_OK : rc;
    rc = ask(ctl, "events", DT_MSG_EVENTS,
             json_pack("{s:I, s:I}", "id", (json_int_t)a.id, "since", (json_int_t)a.since), &res);
    if (rc != DTCTL_OK || res == NULL)
        return rc;
    static const char *const hdr[] = { "ID", "-TIME", "-KIND", "-STATE", "-DETAIL" };
    dt_table_t *t = dt_table_new(5, hdr);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(res, "events"), i, e) {
        char b[64];
        dt_table_cell(t, "%lld", num(e, "id"));
        dt_table_cell(t, "%s", when(num(e, "at_ms"), b, sizeof(b)));
        dt_table_cell(t, "%s", str(e, "kind"));
        dt_table_cell(t, "%s", str(e, "state"));
        dt_table_cell(t, "%s", str(e, "detail"));
    }
    dt_table_print(t, stdout);
    dt_table_free(t);
    json_decref(res);
    return DTCTL_OK;
}

int dtctl_checkpoints(dtctl_t *ctl, int argc, char **argv)
{
    jobargs_t a;
    json_t *res;
    int rc = parse_job(ctl, argc, argv, 1, &a);
    if (rc)
        return rc == 100 ? DTCTL_OK : rc;
    rc = ask(ctl, "checkpoints", DT_MSG_CHECKPOINTS, json_pack("{s:I}", "id", (json_int_t)a.id),
             &res);
    if (rc != DTCTL_OK || res == NULL)
        return rc;
    static const char *const hdr[] = { "STEP", "-STATE", "SHARDS", "BYTES", "-CREATED",
                                       "-COMMITTED" };
    dt_table_t *t = dt_table_new(6, hdr);
    size_t i;
    json_t *ck;
    json_array_foreach(json_object_get(res, "checkpoints"), i, ck) {
        char b1[64], b2[64];
        dt_table_cell(t, "%lld", num(ck, "step"));
        dt_table_cell(t, "%s", str(ck, "state"));
        dt_table_cell(t, "%lld", num(ck, "shards"));
        dt_table_cell(t, "%lld", num(ck, "bytes"));
        dt_table_cell(t, "%s", when(num(ck, "created_ms"), b1, sizeof(b1)));
        dt_table_cell(t, "%s", when(num(ck, "committed_ms"), b2, sizeof(b2)));
    }
    dt_table_print(t, stdout);
    dt_table_free(t);
    json_decref(res);
    return DTCTL_OK;
}
