/* SPDX-License-Identifier: MIT
 *
 * One default per job-spec key, everywhere: for every key of the table
 * (spec/spec.c), the default the table gives is the one
 *   - each dtengine command runs with (attn, prefill and train, their
 *     --print-settings: what the run itself resolved),
 *   - the planner plans with (dt_plan_req_from_spec),
 *   - dt-spec(5) states ("Default: X." in the key's paragraph, parsed),
 * and a value given explicitly, 0 included, is the one run. Changing a
 * default in one of these places only fails here.
 *
 * Needs DT_BUILDDIR (the built dtengine) and DT_SRCDIR (the man page), as
 * make check sets them.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/mem.h"
#include "plan/planner.h"
#include "spec/spec.h"
#include "spec/vocab.h"

#define MAXSET 64

typedef struct settings {
    int n;
    char key[MAXSET][40], val[MAXSET][160];
} settings_t;

/* `dtengine CMD ARGS --print-settings` into s; the command's exit status. */
static int engine_settings(const char *cmd, const char *args, settings_t *s)
{
    const char *b = getenv("DT_BUILDDIR");
    char line[512];

    cr_assert_not_null(b, "DT_BUILDDIR is not set (run through make check)");
    char *c = dt_xasprintf("'%s/engine/dtengine' %s %s --print-settings 2>/dev/null", b, cmd,
                           args);
    FILE *p = popen(c, "r");
    cr_assert_not_null(p, "%s", c);
    memset(s, 0, sizeof(*s));
    while (fgets(line, sizeof(line), p) != NULL && s->n < MAXSET) {
        char *eq = strstr(line, " = ");
        if (eq == NULL)
            continue;
        *eq = '\0';
        line[strcspn(line, "\n")] = '\0';
        eq[3 + strcspn(eq + 3, "\n")] = '\0';
        snprintf(s->key[s->n], sizeof(s->key[0]), "%.39s", line);
        snprintf(s->val[s->n], sizeof(s->val[0]), "%.159s", eq + 3);
        s->n++;
    }
    int st = pclose(p);
    free(c);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *get(const settings_t *s, const char *key)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->key[i], key) == 0)
            return s->val[i];
    return NULL;
}

/* A default that is a value in the key's own syntax (a number, or one of
 * its words), not a condition in words or "auto". */
static int is_value(const dt_conf_key_t *k)
{
    char *end;

    if (k->def == NULL)
        return 0;
    const char *const *words = dt_spec_key_values(k->name);
    unsigned set;
    if (words != NULL && dt_spec_key_is_list(k->name))
        return dt_vocab_parse_set(k->name, k->def, words, &set, NULL) == 0;
    if (words != NULL)
        return dt_vocab_find(words, k->def) >= 0;
    if (k->type == DT_CONF_BOOL)
        return strcmp(k->def, "yes") == 0 || strcmp(k->def, "no") == 0;
    if (k->type == DT_CONF_STRING && strchr(k->def, ' ') == NULL)
        return 1; /* a free-text key's value, "recall" */
    strtod(k->def, &end);
    return end != k->def && *end == '\0';
}

static int same(const char *a, const char *b)
{
    char *ea, *eb;
    double x = strtod(a, &ea), y = strtod(b, &eb);

    if (ea != a && *ea == '\0' && eb != b && *eb == '\0')
        return x == y || (x != 0 && y != 0 && fabs(x - y) <= 1e-7 * fabs(y));
    return strcmp(a, b) == 0;
}

/* What dtengine alone must run with when `key` is not given, from the
 * table: its value; for "auto" (the planner's pick) the engine's own
 * choice without a planner, none; for the conditions in words, their
 * outcome for a cpu job of default causality with `steps` steps and T
 * tokens. NULL: no value (the key is not printed). */
static const char *expected(const dt_conf_key_t *k, long long steps, long long T, char *buf,
                            size_t n)
{
    static const struct {
        const char *key, *cond, *value;
    } conds[] = {
        { "layout", "zigzag when causal, else contiguous", "zigzag" },
        { "dtype", "bf16 on cuda, fp32 on cpu", "fp32" },
        { "device", "cuda when gpu is a GPU preset, else cpu", "cpu" },
        { "recall_pairs", "16, fewer when the sequence is short", "16" },
        { "ckpt_dir", "under agents the job's directory's ckpt/, else none", NULL },
        { "output_dir", "under agents the job's directory's output/, else none", NULL },
        { "ckpt_every", "train: the last step (one checkpoint at the end); prefill: 1", NULL },
        { "eot_token", "config.json's eos_token_id with init_from, else 50256", NULL },
        { "sliding_window", "none", NULL },
    };

    if (k->def == NULL)
        return NULL;
    if (strcmp(k->def, "auto") == 0)
        return "none";
    if (strcmp(k->name, "warmup") == 0) {
        cr_assert_str_eq(k->def, "steps / 10");
        snprintf(buf, n, "%lld", steps / 10);
        return buf;
    }
    (void)T;
    for (size_t i = 0; i < sizeof(conds) / sizeof(conds[0]); i++)
        if (strcmp(k->name, conds[i].key) == 0) {
            cr_assert_str_eq(k->def, conds[i].cond, "key %s: the table's default changed",
                             k->name);
            return conds[i].value;
        }
    cr_assert(is_value(k), "key %s: default '%s' is neither a value nor a known condition",
              k->name, k->def);
    return k->def;
}

/* Every key the command takes: printed with its default, or not printed
 * when it has none (the model's shape keys are the preset's, printed as
 * model). */
static void check_command(enum dt_job_kind kind, const char *args, long long steps, long long T)
{
    settings_t s;
    const char *cmd = dt_kind_name(kind);
    char buf[64];

    cr_assert_eq(engine_settings(cmd, args, &s), 0, "dtengine %s %s --print-settings failed",
                 cmd, args);
    cr_assert_gt(s.n, 4, "dtengine %s printed %d settings", cmd, s.n);
    for (const dt_conf_key_t *k = dt_spec_keys(); k->name != NULL; k++) {
        if (!(k->tags & DT_SPEC_FOR(kind)) || strcmp(k->name, "tokens") == 0 ||
            (k->def != NULL && strcmp(k->def, "the model preset's") == 0) ||
            strcmp(k->name, "head_dim") == 0 || strcmp(k->name, "init_from") == 0 ||
            strncmp(k->name, "rope_", 5) == 0 || strcmp(k->name, "norm_eps") == 0)
            continue; /* the model's shape: the preset's (test_spec, test_model) */
        const char *want = expected(k, steps, T, buf, sizeof(buf)), *got = get(&s, k->name);
        if (want == NULL)
            cr_expect_null(got, "dtengine %s: key %s has no default, but runs with '%s'", cmd,
                           k->name, got);
        else
            cr_expect(got != NULL && same(got, want),
                      "dtengine %s: key %s defaults to '%s' in the table, the command runs "
                      "with '%s'",
                      cmd, k->name, want, got ? got : "(nothing)");
    }
}

Test(defaults, each_engine_command_runs_the_tables_defaults)
{
    check_command(DT_KIND_TRAIN, "--seq-len 4096", 1, 4096);
    check_command(DT_KIND_PREFILL, "--seq-len 4096", 1, 4096);
    check_command(DT_KIND_ATTN, "--generate 4096,1,1,4", 1, 4096);
}

Test(defaults, conditional_defaults_follow_their_condition)
{
    settings_t s;

    /* layout follows causal, in the engine as in the planner */
    cr_assert_eq(engine_settings("train", "--seq-len 258 --no-causal", &s), 0);
    cr_assert_str_eq(get(&s, "layout"), "contiguous");
    cr_assert_eq(engine_settings("attn", "--generate 64,1,1,4 --no-causal", &s), 0);
    cr_assert_str_eq(get(&s, "layout"), "contiguous");
    cr_assert_eq(engine_settings("attn", "--generate 64,1,1,4 --causal", &s), 0);
    cr_assert_str_eq(get(&s, "layout"), "zigzag");
    /* warmup is steps / 10; the checkpoint interval with a directory: the
     * last step (train), every layer (prefill) */
    cr_assert_eq(engine_settings("train", "--seq-len 256 --steps 50 --ckpt-dir /nonexistent",
                                 &s), 0);
    cr_assert_str_eq(get(&s, "warmup"), "5");
    cr_assert_str_eq(get(&s, "ckpt_every"), "50");
    cr_assert_eq(engine_settings("prefill", "--seq-len 256 --ckpt-dir /nonexistent", &s), 0);
    cr_assert_str_eq(get(&s, "ckpt_every"), "1");
}

Test(defaults, explicit_values_zero_included_are_honoured)
{
    settings_t s;

    cr_assert_eq(engine_settings("train", "--seq-len 256 --seed 0 --warmup 0 --clip 0 "
                                          "--min-lr 0 --weight-decay 0 --steps 30",
                                 &s), 0);
    cr_assert_str_eq(get(&s, "seed"), "0");
    cr_assert_str_eq(get(&s, "warmup"), "0");
    cr_assert_str_eq(get(&s, "clip"), "0");
    cr_assert_str_eq(get(&s, "min_lr"), "0");
    cr_assert_str_eq(get(&s, "weight_decay"), "0");
    cr_assert_eq(engine_settings("train", "--seq-len 256 --seed 7 --layout contiguous", &s), 0);
    cr_assert_str_eq(get(&s, "seed"), "7");
    cr_assert_str_eq(get(&s, "layout"), "contiguous");
    cr_assert_eq(engine_settings("prefill", "--seq-len 256 --seed 0", &s), 0);
    cr_assert_str_eq(get(&s, "seed"), "0");
    cr_assert_eq(engine_settings("attn", "--generate 64,1,1,4 --seed 0", &s), 0);
    cr_assert_str_eq(get(&s, "seed"), "0");

    /* the same through a spec file: seed = 0 is 0 */
    char path[] = "/tmp/dt-test-defaults-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char text[] = "kind = train\ntokens = 256\nseed = 0\nsteps = 20\n";
    cr_assert_eq(write(fd, text, sizeof(text) - 1), (ssize_t)(sizeof(text) - 1));
    close(fd);
    char *args = dt_xasprintf("--spec %s", path);
    cr_assert_eq(engine_settings("train", args, &s), 0);
    unlink(path);
    free(args);
    cr_assert_str_eq(get(&s, "seed"), "0");
    cr_assert_str_eq(get(&s, "steps"), "20");
    cr_assert_str_eq(get(&s, "warmup"), "2");
}

static void plan_req(const char *text, dt_plan_req_t *q)
{
    dt_spec_t s;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_spec_parse("spec", text, &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_plan_req_from_spec(&s, q, &em), 0, "%s", em.s);
    dt_spec_free(&s);
}

Test(defaults, the_planner_plans_with_the_tables_defaults)
{
    dt_plan_req_t q;
    settings_t e;
    const dt_spec_t none = { 0 };

    plan_req("kind = train\ntokens = 4096\n", &q);
    cr_assert_eq(q.causal, strcmp(dt_spec_key("causal")->def, "yes") == 0);
    cr_assert_eq(q.batch, dt_spec_int(&none, "batch"));
    cr_assert_eq(q.dp, dt_spec_int(&none, "dp"));
    cr_assert_eq(q.spares, dt_spec_int(&none, "spares"));
    cr_assert_str_eq(dt_spec_key("shard")->def, "auto");
    cr_assert_eq(q.shard, DT_SHARD_AUTO);
    cr_assert_str_eq(dt_spec_key("recompute")->def, "auto");
    cr_assert_eq(q.recompute, DT_RECOMPUTE_AUTO);
    cr_assert_eq(q.precision, DT_F32, "fp32 on cpu");
    cr_assert_str_eq(q.cluster.name, "cpu");
    cr_assert_eq(q.ranks, 0, "auto: the planner chooses");
    /* and the engine runs the layout the planner planned */
    cr_assert_eq(engine_settings("train", "--seq-len 4096", &e), 0);
    cr_assert_str_eq(dt_layout_name(q.layout), get(&e, "layout"));
    plan_req("kind = train\ntokens = 258\ncausal = no\nranks = 2\n", &q);
    cr_assert_eq(engine_settings("train", "--seq-len 258 --no-causal", &e), 0);
    cr_assert_str_eq(dt_layout_name(q.layout), get(&e, "layout"));
    cr_assert_eq(q.layout, DT_LAYOUT_CONTIGUOUS);
    /* on cuda: bf16, the h100-sxm preset */
    plan_req("kind = train\ntokens = 4096\ndevice = cuda\n", &q);
    cr_assert_eq(q.precision, DT_BF16);
    cr_assert_str_eq(q.cluster.name, "h100-sxm");
}

/* The paragraph of `key` in dt-spec(5) (from its .TP tag line to the next
 * .TP, .SS or .SH), or NULL. The caller frees it. */
static char *man_paragraph(const char *page, const char *key)
{
    const char *p = page;

    while ((p = strstr(p, "\n.TP\n")) != NULL) {
        p += 5;
        const char *tag_end = strchr(p, '\n');
        if (tag_end == NULL)
            break;
        /* the tag line names the key as a word: `.B key`, `.BR key " (...)"`,
         * `.BR a ", " key ...` */
        int hit = 0;
        for (const char *q = p; q < tag_end; q++) {
            size_t n = strlen(key);
            if (strncmp(q, key, n) == 0 && (q == p || !(isalnum((unsigned char)q[-1]) || q[-1] == '_')) &&
                !(isalnum((unsigned char)q[n]) || q[n] == '_'))
                hit = 1;
        }
        if (!hit || (strncmp(p, ".B", 2) != 0))
            continue;
        const char *end = tag_end;
        for (;;) {
            const char *nx = strstr(end, "\n.");
            if (nx == NULL) {
                end = page + strlen(page);
                break;
            }
            if (strncmp(nx, "\n.TP", 4) == 0 || strncmp(nx, "\n.SS", 4) == 0 ||
                strncmp(nx, "\n.SH", 4) == 0) {
                end = nx;
                break;
            }
            end = nx + 2;
        }
        if (*end == '\n')
            end++; /* the last line's newline */
        return dt_xasprintf("%.*s", (int)(end - p), p);
    }
    return NULL;
}

Test(defaults, dt_spec_5_states_the_tables_defaults)
{
    const char *src = getenv("DT_SRCDIR");
    cr_assert_not_null(src, "DT_SRCDIR is not set (run through make check)");
    char *path = dt_xasprintf("%s/man/dt-spec.5", src);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char *page = dt_xmalloc(1 << 20);
    size_t n = fread(page, 1, (1 << 20) - 1, f);
    page[n] = '\0';
    fclose(f);

    for (const dt_conf_key_t *k = dt_spec_keys(); k->name != NULL; k++) {
        char *para = man_paragraph(page, k->name);
        cr_expect_not_null(para, "dt-spec(5) has no entry for key %s", k->name);
        if (para == NULL)
            continue;
        char *plain = dt_xasprintf("\nDefault: %s.\n", k->def ? k->def : "");
        char *named = dt_xasprintf("\nDefault (%s): %s.\n", k->name, k->def ? k->def : "");
        int has = strstr(para, plain) != NULL || strstr(para, named) != NULL;
        char *mine = dt_xasprintf("\nDefault (%s): ", k->name);
        int any = strstr(para, "\nDefault: ") != NULL || strstr(para, mine) != NULL;
        free(mine);
        if (k->def != NULL)
            cr_expect(has, "dt-spec(5), key %s: no line 'Default: %s.' in its entry", k->name,
                      k->def);
        else
            cr_expect(!any, "dt-spec(5), key %s: a Default line, but the key has none",
                      k->name);
        free(plain);
        free(named);
        free(para);
    }
    free(page);
    free(path);
}
