/* SPDX-License-Identifier: MIT
 *
 * dtctl watch: a job's live display until it ends, from SHOW polled every
 * interval. On a terminal the display is redrawn in place (cursor up and
 * erase to the end of the screen; no curses, no alternate screen, lines cut
 * to the terminal's width so the redraw stays aligned); otherwise one line
 * is printed per change of state or step, so that a log stays readable.
 * The ETA comes from the step rate seen in this session. When the job ends:
 * a summary, the `result:` line, and an exit code that says how it ended.
 * The coordinator may go away for a while (it is stateless and restarts):
 * the display says so and keeps polling.
 *
 * The same loop drives `dtctl run --local` (cmd_run.c), which hooks into
 * every poll. Not here: anything that changes a job (cancel, checkpoint).
 */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "cli/dtctl.h"
#include "cli/table.h"
#include "common/clock.h"
#include "common/conf.h"
#include "common/mem.h"
#include "common/proto.h"
#include "common/wire.h"
#include "spec/spec.h"
#include "spec/state.h"

#define DEFAULT_GAP_S 30.0 /* the coordinator may be away this long */

struct dtctl_watch {
    dtctl_t *ctl;
    long long id;
    int tty;       /* redraw in place */
    FILE *notes;   /* where notes go: stdout, or stderr with --json */
    int drawn;     /* lines of the display now on the screen (tty) */
    char *screen;  /* the display last drawn, to draw again after a note */
    char last[512]; /* not a tty: the last line printed, without the ETA */
    long long steps; /* S from the spec, 0 until known */
    int spec_parsed;
    /* step rate in this session: first and latest sample since the last
     * time the step went back (a recovery) or the generation changed */
    double t0, t1;
    long long s0, s1, rate_gen;
    int have_rate;
    long long resumed_gen; /* the newest generation whose resume was noted */
    double started;
};

/* ---- JSON fields, tolerant: a missing or mistyped field is "absent" ----- */

static const char *jstr(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static long long jint(const json_t *o, const char *k, long long dflt)
{
    const json_t *v = json_object_get(o, k);
    if (json_is_integer(v))
        return (long long)json_integer_value(v);
    if (json_is_real(v))
        return (long long)json_real_value(v);
    return dflt;
}

static int jreal(const json_t *o, const char *k, double *out)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_number(v))
        return 0;
    *out = json_number_value(v);
    return 1;
}

/* ---- what one SHOW reply says ------------------------------------------- */

typedef struct view {
    const json_t *job, *ranks, *agents, *result;
    const char *name, *state, *reason;
    long long restarts, gen, step, steps;
} view_t;

int dtctl_job_exit(const char *state)
{
    enum dt_job_state s;

    if (state == NULL || dt_job_state_parse(state, &s) < 0 || !dt_job_state_terminal(s))
        return -1;
    return s == DT_JOB_COMPLETED ? DTCTL_OK : DTCTL_JOBFAILED;
}

static void read_view(dtctl_watch_t *w, const json_t *show, view_t *v)
{
    const json_t *gen = json_object_get(show, "gen"), *r;
    size_t i;

    memset(v, 0, sizeof(*v));
    v->job = json_object_get(show, "job");
    v->ranks = json_object_get(show, "ranks");
    v->agents = json_object_get(show, "agents");
    v->result = json_object_get(v->job, "result");
    if (!json_is_object(v->result))
        v->result = NULL;
    v->name = jstr(v->job, "name");
    v->state = jstr(v->job, "state");
    v->reason = jstr(v->job, "reason");
    v->restarts = jint(v->job, "restarts", 0);
    v->gen = json_is_object(gen) ? jint(gen, "gen", 0) : 0;
    v->step = -1;
    json_array_foreach(v->ranks, i, r) {
        long long s = jint(r, "step", -1), S = jint(r, "steps", 0);
        v->step = s > v->step ? s : v->step;
        v->steps = S > v->steps ? S : v->steps;
    }
    if (v->steps == 0 && v->result)
        v->steps = jint(v->result, "steps", 0);
    if (v->steps == 0 && !w->spec_parsed && jstr(show, "spec")) {
        /* S from the stored spec (canonical text, so it parses) */
        dt_spec_t spec;
        w->spec_parsed = 1;
        if (dt_spec_parse("spec", jstr(show, "spec"), &spec, NULL) == 0) {
            if (spec.kind && strcmp(spec.kind, "train") == 0)
                w->steps = dt_spec_int(&spec, "steps");
            dt_spec_free(&spec);
        }
    }
    if (v->steps == 0)
        v->steps = w->steps;
}

/* ---- formatting ---------------------------------------------------------- */

static const char *fmt_dur(double s, char *buf, size_t n)
{
    if (s < 0 || s != s)
        snprintf(buf, n, "-");
    else if (s < 10)
        snprintf(buf, n, "%.1fs", s);
    else if (s < 60)
        snprintf(buf, n, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)s % 3600 / 60);
    return buf;
}

/* Step rate: samples since the step last went back or the generation
 * changed. Returns the ETA in seconds, or -1 when it cannot be told yet. */
static double eta(dtctl_watch_t *w, const view_t *v, double now)
{
    if (v->step < 0 || v->steps <= 0)
        return -1;
    if (!w->have_rate || v->step < w->s1 || v->gen != w->rate_gen) {
        w->have_rate = 1;
        w->t0 = w->t1 = now;
        w->s0 = w->s1 = v->step;
        w->rate_gen = v->gen;
    } else if (v->step > w->s1) {
        w->t1 = now;
        w->s1 = v->step;
    }
    if (w->s1 - w->s0 < 2 || w->t1 - w->t0 < 1.0)
        return -1;
    double rate = (double)(w->s1 - w->s0) / (w->t1 - w->t0);
    /* time since the latest step counts against the estimate */
    double left = (double)(v->steps - v->step) / rate - (now - w->t1);
    return left > 0 ? left : 0;
}

static void header(const view_t *v, long long id, double eta_s, char *buf, size_t n)
{
    char g[32], st[64], e[32];

    if (v->gen > 0)
        snprintf(g, sizeof(g), "%lld", v->gen);
    else
        snprintf(g, sizeof(g), "-");
    if (v->steps > 0)
        snprintf(st, sizeof(st), "%lld/%lld", v->step < 0 ? 0 : v->step, v->steps);
    else if (v->step >= 0)
        snprintf(st, sizeof(st), "%lld", v->step);
    else
        snprintf(st, sizeof(st), "-");
    snprintf(buf, n, "job %lld %s  state %s  gen %s  restarts %lld  step %s  ETA %s", id,
             v->name ? v->name : "", v->state ? v->state : "?", g, v->restarts, st,
             dtctl_job_exit(v->state) >= 0 ? "-" : fmt_dur(eta_s, e, sizeof(e)));
}

static void rank_table(const view_t *v, FILE *f, int max_rows)
{
    static const char *const hdr[] = { "RANK", "-NODE", "-STATE", "STEP", "LOSS", "TOKENS/S",
                                       "ACC" };
    dt_table_t *t = dt_table_new(7, hdr);
    size_t i, n = json_array_size(v->ranks);
    const json_t *r;
    double x;

    json_array_foreach(v->ranks, i, r) {
        if ((int)i >= max_rows)
            break;
        long long rank = jint(r, "rank", -1), step = jint(r, "step", -1);
        const char *node = jstr(r, "node");
        if (rank >= 0)
            dt_table_cell(t, "%lld", rank);
        else
            dt_table_cell(t, "-");
        dt_table_cell(t, "%s", node ? node : "-");
        dt_table_cell(t, "%s", jstr(r, "state") ? jstr(r, "state") : "-");
        if (step >= 0)
            dt_table_cell(t, "%lld", step);
        else
            dt_table_cell(t, "-");
        if (jreal(r, "loss", &x))
            dt_table_cell(t, "%.4f", x);
        else
            dt_table_cell(t, "-");
        if (jreal(r, "tokens_s", &x))
            dt_table_cell(t, "%.0f", x);
        else
            dt_table_cell(t, "-");
        if (jreal(r, "acc", &x))
            dt_table_cell(t, "%.3f", x);
        else
            dt_table_cell(t, "-");
    }
    dt_table_print(t, f);
    dt_table_free(t);
    if (n > (size_t)max_rows)
        fprintf(f, "... and %zu more ranks\n", n - (size_t)max_rows);
}

static void agents_line(const view_t *v, FILE *f)
{
    const json_t *a;
    size_t i;

    if (json_array_size(v->agents) == 0)
        return;
    fputs("agents", f);
    json_array_foreach(v->agents, i, a) {
        const char *node = jstr(a, "node"), *state = jstr(a, "state");
        fprintf(f, "  %s %s%s%s", node ? node : "?", state ? state : "?",
                json_is_true(json_object_get(a, "spare")) ? " (spare)" : "",
                json_is_true(json_object_get(a, "suspect")) ? " (suspect: a GPU failed)" : "");
    }
    fputc('\n', f);
}

/* ---- the terminal ------------------------------------------------------- */

static void term_size(int *cols, int *rows)
{
    struct winsize ws;

    *cols = 80;
    *rows = 24;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        *cols = ws.ws_col;
        *rows = ws.ws_row > 0 ? ws.ws_row : 24;
    }
}

static void erase(dtctl_watch_t *w)
{
    if (w->tty && w->drawn > 0)
        printf("\r\033[%dA\033[J", w->drawn);
    w->drawn = 0;
}

/* Draw text (lines ending in '\n') in place of the last display, each line
 * cut to the terminal's width so that a wrapped line cannot throw the
 * count of lines to move back over. */
static void draw(dtctl_watch_t *w, const char *text)
{
    int cols, rows;

    term_size(&cols, &rows);
    erase(w);
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        fwrite(p, 1, len < (size_t)(cols - 1) ? len : (size_t)(cols - 1), stdout);
        fputc('\n', stdout);
        w->drawn++;
        p += len + (nl != NULL);
    }
    fflush(stdout);
}

void dtctl_watch_note(dtctl_watch_t *w, const char *fmt, ...)
{
    va_list ap;

    erase(w);
    va_start(ap, fmt);
    vfprintf(w->notes, fmt, ap);
    va_end(ap);
    fputc('\n', w->notes);
    fflush(w->notes);
    if (w->tty && w->screen)
        draw(w, w->screen);
}

/* A generation after a failure says once where it resumed ("resumed step
 * N from disk"), as the coordinator put it when all its ranks ran. */
static void note_resume(dtctl_watch_t *w, const json_t *show, const view_t *v)
{
    const char *how = jstr(json_object_get(show, "gen"), "resumed");

    if (how == NULL || v->gen <= w->resumed_gen)
        return;
    w->resumed_gen = v->gen;
    dtctl_watch_note(w, "gen %lld: %s", v->gen, how); /* sanitized with the reply */
}

/* One poll's worth of display. gap_s > 0: the coordinator has not answered
 * for that long and v is the last view that it gave. */
static void show_view(dtctl_watch_t *w, const view_t *v, double now, double gap_s)
{
    char head[512], e[32];
    double eta_s = gap_s > 0 ? -1 : eta(w, v, now);

    header(v, w->id, eta_s, head, sizeof(head));
    if (w->ctl->json)
        return;
    if (w->tty) {
        char *text = NULL;
        size_t len = 0;
        int cols, rows;
        FILE *f = open_memstream(&text, &len);

        if (f == NULL)
            return;
        term_size(&cols, &rows);
        fprintf(f, "%s\n", head);
        if (gap_s > 0)
            fprintf(f, "coordinator unreachable for %s, retrying\n", fmt_dur(gap_s, e, sizeof(e)));
        agents_line(v, f);
        if (json_array_size(v->ranks) > 0)
            rank_table(v, f, rows > 8 ? rows - 6 : 2);
        fclose(f);
        free(w->screen);
        w->screen = text;
        draw(w, text);
        return;
    }
    /* not a terminal: a line when the state or the step changes (the ETA
     * alone changes every poll) */
    char key[512];
    double loss;
    const json_t *r0 = json_array_get(v->ranks, 0);
    snprintf(key, sizeof(key), "%s|%lld|%lld|%lld|%d", v->state ? v->state : "", v->gen,
             v->restarts, v->step, gap_s > 0);
    if (strcmp(key, w->last) == 0)
        return;
    snprintf(w->last, sizeof(w->last), "%s", key);
    if (gap_s > 0)
        printf("%s  (coordinator unreachable, retrying)\n", head);
    else if (r0 && jreal(r0, "loss", &loss)) {
        double acc;
        if (jreal(r0, "acc", &acc))
            printf("%s  loss %.4f  acc %.3f\n", head, loss, acc);
        else
            printf("%s  loss %.4f\n", head, loss);
    }
    else
        printf("%s\n", head);
    fflush(stdout);
}

/* ---- the end -------------------------------------------------------------- */

void dtctl_print_result(FILE *f, long long id, const char *state, const json_t *result)
{
    double loss;
    const char *sum = json_is_object(result) ? jstr(result, "checksum") : NULL;

    fprintf(f, "result: job=%lld state=%s loss=", id, state ? state : "?");
    if (json_is_object(result) && jreal(result, "loss", &loss))
        fprintf(f, "%.6f", loss);
    else
        fputc('-', f);
    fprintf(f, " checksum=%s\n", sum && *sum ? sum : "-");
    fflush(f);
}

static void summary(dtctl_watch_t *w, const view_t *v, double now)
{
    long long c = jint(v->job, "created_ms", 0), u = jint(v->job, "updated_ms", 0);
    double wall = c > 0 && u >= c ? (double)(u - c) / 1000 : now - w->started;
    long long steps = v->result ? jint(v->result, "steps", v->step) : v->step;
    char d[32];

    if (w->ctl->json) {
        double loss;
        json_t *o = json_pack("{s:I, s:s, s:s?, s:I, s:I, s:f}", "id", (json_int_t)w->id,
                              "state", v->state, "reason", v->reason, "steps",
                              (json_int_t)(steps < 0 ? 0 : steps), "restarts",
                              (json_int_t)v->restarts, "wall_s", wall);
        json_object_set_new(o, "loss",
                            v->result && jreal(v->result, "loss", &loss) ? json_real(loss)
                                                                         : json_null());
        json_object_set_new(o, "checksum",
                            v->result && jstr(v->result, "checksum")
                                ? json_string(jstr(v->result, "checksum"))
                                : json_null());
        json_t *outs = v->result ? json_object_get(v->result, "outputs") : NULL;
        json_object_set_new(o, "outputs", json_is_array(outs) ? json_deep_copy(outs)
                                                              : json_array());
        dtctl_print_json(o);
        json_decref(o);
        return;
    }
    printf("job %lld %s %s\n", w->id, v->name ? v->name : "", v->state);
    if (v->reason && *v->reason)
        printf("  reason     %s\n", v->reason);
    if (steps >= 0 && v->steps > 0)
        printf("  steps      %lld/%lld\n", steps, v->steps);
    else if (v->steps > 0)
        printf("  steps      0/%lld\n", v->steps);
    else if (steps >= 0)
        printf("  steps      %lld\n", steps);
    else
        printf("  steps      -\n");
    printf("  wall time  %s\n", fmt_dur(wall, d, sizeof(d)));
    printf("  restarts   %lld\n", v->restarts);
    double acc;
    if (v->result && jreal(v->result, "acc", &acc))
        printf("  accuracy   %.4f (mean of the last steps: recall at the answers, or "
               "next-token)\n", acc);
    size_t i;
    const json_t *out;
    json_array_foreach(v->result ? json_object_get(v->result, "outputs") : NULL, i, out)
        if (json_is_string(out))
            printf("  output     %s\n", json_string_value(out));
    dtctl_print_result(stdout, w->id, v->state, v->result);
}

/* ---- the loop ----------------------------------------------------------- */

static void sleep_ms(int64_t ms)
{
    struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL); /* a signal cuts it short: the caller polls sooner */
}

int dtctl_watch_job(dtctl_t *ctl, const char *cmd, long long id, int64_t interval_ms,
                    dtctl_watch_hooks_t *hooks)
{
    const char *term = getenv("TERM");
    dtctl_watch_t w = {
        .ctl = ctl,
        .id = id,
        .tty = !ctl->json && isatty(STDOUT_FILENO) && !(term && strcmp(term, "dumb") == 0),
        .notes = ctl->json ? stderr : stdout,
        .started = dt_clock_now(),
    };
    double gap_max = hooks && hooks->gap_s > 0 ? hooks->gap_s : DEFAULT_GAP_S, gap_since = 0;
    json_t *last = NULL; /* the latest SHOW reply */
    int code = -1;

    if (hooks)
        hooks->ended = 0;
    while (code < 0) {
        dt_emsg_t em = { "" };
        json_t *res = NULL;
        view_t v;
        dt_wire_job_ref_t ref = { .id = id };
        int rc = dtctl_request(ctl, DT_MSG_SHOW, dt_wire_show_encode(&ref), &res,
                               &em);
        double now = dt_clock_now();

        if (rc == 0) {
            dtctl_sanitize(ctl, res); /* names and reasons, for the terminal */
            json_decref(last);
            last = res;
            gap_since = 0;
            read_view(&w, last, &v);
            note_resume(&w, last, &v);
            show_view(&w, &v, now, 0);
            if ((code = dtctl_job_exit(v.state)) >= 0) {
                if (hooks)
                    hooks->ended = 1;
                summary(&w, &v, now);
                break;
            }
        } else if (rc == DT_ECOMM && last != NULL) {
            /* it answered before: it may be restarting */
            if (gap_since == 0)
                gap_since = now;
            if (now - gap_since > gap_max) {
                fprintf(stderr, "%s %s: %s (for %.0f s; gave up)\n", ctl->prog, cmd, em.s,
                        now - gap_since);
                code = DTCTL_NOCOORD;
                break;
            }
            read_view(&w, last, &v);
            show_view(&w, &v, now, now - gap_since > 0.001 ? now - gap_since : 0.001);
        } else {
            code = dtctl_fail(ctl, cmd, rc, &em); /* below the last display, kept */
            break;
        }
        if (hooks && hooks->poll)
            code = hooks->poll(hooks->arg, &w, rc == 0 ? last : NULL);
        if (code < 0)
            sleep_ms(interval_ms);
    }
    json_decref(last);
    free(w.screen);
    return code;
}

/* ---- dtctl watch JOB ------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f, "usage: dtctl watch [--interval DUR] [--json] JOB\n"
               "  --interval DUR  how often to ask the coordinator (default 500ms; 10ms to 1h)\n");
}

int dtctl_watch(dtctl_t *ctl, int argc, char **argv)
{
    static const struct option lo[] = {
        { "interval", required_argument, NULL, 'i' },
        { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int64_t interval_ms = 500;
    long long id;
    int c;

    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'i':
            if (dt_conf_parse_duration(optarg, &interval_ms) < 0 || interval_ms < 10 ||
                interval_ms > 3600000) {
                fprintf(stderr, "dtctl watch: --interval '%s': a duration from 10ms to 1h, "
                                "such as 500ms or 2s\n", optarg);
                return DTCTL_USAGE;
            }
            break;
        case 'j': ctl->json = 1; break;
        case 'h': usage(stdout); return DTCTL_OK;
        default:
            fprintf(stderr, "dtctl watch: unknown option or missing value '%s'\n",
                    argv[optind - 1]);
            usage(stderr);
            return DTCTL_USAGE;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return DTCTL_USAGE;
    }
    if (dtctl_parse_id(argv[optind], &id) < 0) {
        fprintf(stderr, "dtctl watch: '%s' is not a job id (1 to %lld)\n", argv[optind],
                LLONG_MAX);
        return DTCTL_USAGE;
    }
    return dtctl_watch_job(ctl, "watch", id, interval_ms, NULL);
}
