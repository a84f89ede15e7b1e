/* SPDX-License-Identifier: MIT
 *
 * The one option parser of dtengine's commands (engine/cmd/options.h):
 * the job-spec keys a command takes come from the key table
 * (spec/spec.c), so their names, values, checks and defaults are the
 * spec's; each command adds only its own (paths, modes) from a small
 * table. Not here: what a command does with the settings.
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "engine/cmd/cmd.h"
#include "engine/cmd/options.h"
#include "spec/spec.h"

/* Engine option names that are not the key's own spelling. */
static const struct {
    const char *option, *key;
} aliases[] = {
    { "seq_len", "tokens" },
    { "out_dir", "output_dir" },
};

static const char *key_of(const char *name)
{
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcmp(name, aliases[i].option) == 0)
            return aliases[i].key;
    return name;
}

/* The option a key is spelt as ("tokens" -> "seq-len"), into buf. */
static const char *option_of(const char *key, char *buf, size_t n)
{
    const char *name = key;
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcmp(key, aliases[i].key) == 0)
            name = aliases[i].option;
    size_t j = 0;
    for (; name[j] != '\0' && j + 1 < n; j++)
        buf[j] = name[j] == '_' ? '-' : name[j];
    buf[j] = '\0';
    return buf;
}

static const dt_cmd_opt_t *own_option(const dt_cmd_opt_t *own, const char *arg, size_t len)
{
    for (; own != NULL && own->name != NULL; own++)
        if (strlen(own->name) == len && strncmp(own->name, arg, len) == 0)
            return own;
    return NULL;
}

/* The shared options (dt_cmd_common_t); the ids are this file's. */
enum { C_PRINT = -1, C_RESUME = -2, C_RESUME_FROM = -3, C_CKPT_COMMIT = -4, C_RESUME_MEM = -5 };
static const dt_cmd_opt_t common_all[] = {
    { "print-settings", 0, C_PRINT },
    { NULL, 0, 0 },
};
static const dt_cmd_opt_t common_ckpt[] = {
    { "print-settings", 0, C_PRINT },
    { "resume", 0, C_RESUME },
    { "resume-from", 1, C_RESUME_FROM },
    { "resume-from-memory", 1, C_RESUME_MEM },
    { "ckpt-commit", 1, C_CKPT_COMMIT },
    { NULL, 0, 0 },
};

static int common_option(int id, const char *value, dt_cmd_common_t *c, dt_emsg_t *em)
{
    switch (id) {
    case C_PRINT:
        c->print = 1;
        return 0;
    case C_RESUME:
        c->resume = 1;
        return 0;
    case C_RESUME_FROM:
        c->resume_from = value;
        return 0;
    case C_RESUME_MEM: {
        char *end;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (errno != 0 || end == value || *end != '\0' || v < 1)
            return dt_emsg_set(em, DT_EUSAGE, "--resume-from-memory '%s': not a step >= 1",
                               value);
        c->resume_mem = v;
        return 0;
    }
    case C_CKPT_COMMIT:
        return dt_cmd_commit_option(value, &c->external, em);
    }
    return 0;
}

int dt_cmd_options(int argc, char **argv, enum dt_job_kind kind, const dt_cmd_opt_t *own,
                   dt_cmd_opt_fn fn, void *arg, dt_spec_t *spec, dt_cmd_common_t *common,
                   dt_emsg_t *em)
{
    const char *cmd = dt_kind_name(kind);
    const dt_cmd_opt_t *shared = kind == DT_KIND_ATTN ? common_all : common_ckpt;
    int rc;

    memset(common, 0, sizeof(*common));

    /* a spec file first (dt-spec(5)), options on top of it */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--spec") == 0 &&
            (rc = dt_cmd_spec_load(argv[i + 1], cmd, spec, em)) < 0)
            return rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
            return dt_emsg_set(em, DT_EUSAGE, "unexpected argument '%s'", a);
        if (strcmp(a, "--spec") == 0) {
            i++; /* read above */
            continue;
        }
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        const dt_cmd_opt_t *o = own_option(shared, a + 2, len);
        if (o == NULL)
            o = own_option(own, a + 2, len);
        if (o != NULL) {
            const char *value = NULL;
            if (o->has_arg) {
                if (eq)
                    value = eq + 1;
                else if (i + 1 < argc)
                    value = argv[++i];
                else
                    return dt_emsg_set(em, DT_EUSAGE, "option '--%s' needs a value", o->name);
            } else if (eq) {
                return dt_emsg_set(em, DT_EUSAGE, "option '--%s' takes no value", o->name);
            }
            if ((rc = o->id < 0 ? common_option(o->id, value, common, em)
                                : fn(o->id, value, arg, em)) < 0)
                return rc;
            continue;
        }
        /* a job-spec key this command takes ("--no-x" a boolean x's no) */
        char *name = NULL, optname[64];
        const char *value;
        char probe[64];
        snprintf(probe, sizeof(probe), "%.*s", (int)(len < 63 ? len : 63), a + 2);
        for (char *p = probe; *p; p++)
            if (*p == '-')
                *p = '_';
        const dt_conf_key_t *pk = dt_spec_key(key_of(probe));
        if (pk == NULL && strncmp(probe, "no_", 3) == 0) {
            pk = dt_spec_key(key_of(probe + 3));
            if (pk != NULL && pk->type != DT_CONF_BOOL)
                pk = NULL;
        }
        if (pk == NULL || !(pk->tags & DT_SPEC_FOR(kind)))
            return dt_emsg_set(em, DT_EUSAGE, "unknown option '%.*s'%s", (int)(len + 2), a,
                               pk != NULL ? " (a job-spec key this command does not take)" : "");
        int used = dt_spec_flag(argc, argv, i, &name, &value, em);
        if (used < 0)
            return DT_EUSAGE;
        const char *key = key_of(name);
        dt_emsg_t why = { "" };
        rc = dt_spec_set(spec, key, value, &why);
        if (rc < 0) {
            /* "key 'steps': value ..." said of the option instead */
            char pre[80];
            const char *msg = why.s;
            snprintf(pre, sizeof(pre), "key '%s': ", key);
            if (strncmp(msg, pre, strlen(pre)) == 0)
                msg += strlen(pre);
            rc = dt_emsg_set(em, DT_EUSAGE, "--%s: %s", option_of(key, optname, sizeof(optname)),
                             msg);
        }
        free(name);
        if (rc < 0)
            return rc;
        i += used - 1;
    }
    /* what every command needs of the options given, said once */
    if (kind != DT_KIND_ATTN && spec->tokens <= 0)
        return dt_emsg_set(em, DT_EUSAGE, "--seq-len T is required (the sequence length; "
                           "tokens in a --spec)");
    return dt_cmd_device_check(spec, em);
}

const char *dt_cmd_option_name(const char *key, char *buf, size_t n)
{
    return option_of(key, buf, n);
}

void dt_cmd_setting(const char *key, const char *fmt, ...)
{
    va_list ap;

    if (fmt == NULL)
        return;
    printf("%s = ", key);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}
