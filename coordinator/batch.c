/* SPDX-License-Identifier: MIT
 *
 * The batch job of one dt job (batch.h): sbatch's options in a
 * dt_slurm_desc_t, and the script, whose #SBATCH lines are written from
 * that same desc so the two cannot disagree. Pure apart from one lookup:
 * the owner's home directory and name (getpwuid_r) for the job's
 * environment. No libslurm, no libuv.
 *
 * Quoting. Every value that reaches the script is single-quoted, and a
 * value holding a single quote or a newline is refused naming its field,
 * so no value is ever expanded by the shell. #SBATCH lines are read by
 * sbatch's own parser (quotes group, a backslash escapes, an unquoted '#'
 * starts a comment): a value with anything outside a plain set is written
 * in single quotes with its backslashes doubled. Values never appear
 * inside double quotes or inside the trap.
 *
 * dt_slurm_desc_clear (slurm.h) lives here too: it is plain memory, and
 * this file is linked wherever a desc is built, unit tests included,
 * where slurm.c (libslurm) is not.
 */
#include "config.h"

#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"
#include "coordinator/batch.h"

#define NAME_MAX_CHARS 40
#define WARN_TIME_MAX 65535 /* job_desc_msg_t.warn_time is a uint16_t of seconds */
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

void dt_slurm_desc_clear(dt_slurm_desc_t *d)
{
    if (d == NULL)
        return;
    free(d->name);
    free(d->script);
    free(d->partition);
    free(d->account);
    free(d->qos);
    free(d->constraint);
    free(d->exclude);
    free(d->output);
    free(d->workdir);
    if (d->env != NULL)
        for (char **e = d->env; *e != NULL; e++)
            free(*e);
    free(d->env);
    memset(d, 0, sizeof(*d));
}

/* ---- a growing string -------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
} sb_t;

static void sb_printf(sb_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sb_t *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    for (;;) {
        size_t room = b->cap - b->n;
        va_start(ap, fmt);
        n = vsnprintf(b->p == NULL ? NULL : b->p + b->n, room, fmt, ap);
        va_end(ap);
        if (n < 0)
            abort(); /* only a bad format does this */
        if ((size_t)n < room) {
            b->n += (size_t)n;
            return;
        }
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->p = dt_xrealloc(b->p, b->cap);
    }
}

/* ---- checks -------------------------------------------------------------- */

/* A value that will be single-quoted in the script. NULL passes. */
static int check_quotable(const char *field, const char *v, dt_emsg_t *em)
{
    if (v == NULL)
        return 0;
    if (strchr(v, '\'') != NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: a single quote is not allowed (in \"%s\")", field,
                           v);
    if (strchr(v, '\n') != NULL || strchr(v, '\r') != NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: a newline is not allowed", field);
    return 0;
}

static int check_set(const char *field, const char *v, dt_emsg_t *em)
{
    if (v == NULL || *v == '\0')
        return dt_emsg_set(em, DT_EINVAL, "%s: not set", field);
    return check_quotable(field, v, em);
}

static int valid_env_name(const char *e, size_t len)
{
    if (len == 0 || !((e[0] >= 'A' && e[0] <= 'Z') || (e[0] >= 'a' && e[0] <= 'z') || e[0] == '_'))
        return 0;
    for (size_t i = 1; i < len; i++)
        if (!((e[i] >= 'A' && e[i] <= 'Z') || (e[i] >= 'a' && e[i] <= 'z') ||
              (e[i] >= '0' && e[i] <= '9') || e[i] == '_'))
            return 0;
    return 1;
}

/* ---- the desc ------------------------------------------------------------ */

static char *dup_or_null(const char *s)
{
    return s == NULL || *s == '\0' ? NULL : dt_xstrdup(s);
}

int dt_batch_signal_number(const char *name)
{
    if (name != NULL && strcmp(name, "USR1") == 0)
        return SIGUSR1;
    if (name != NULL && strcmp(name, "USR2") == 0)
        return SIGUSR2;
    return 0;
}

const char *dt_batch_signal_name(int sig)
{
    return sig == SIGUSR1 ? "USR1" : sig == SIGUSR2 ? "USR2" : "?";
}

/* "dt-JOB.TAG-NAME": TAG the job's creation time in base 36, NAME cut to
 * 40 characters, outside [A-Za-z0-9._-] -> '_'. */
static char *job_name(int64_t job, int64_t created_ms, const char *name)
{
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    char clean[NAME_MAX_CHARS + 1], tag[16];
    uint64_t t = created_ms > 0 ? (uint64_t)created_ms : 0;
    size_t i, n = 0;

    do {
        tag[n++] = digits[t % 36];
        t /= 36;
    } while (t > 0 && n < sizeof(tag) - 1);
    for (i = 0; i < n / 2; i++) {
        char c = tag[i];
        tag[i] = tag[n - 1 - i];
        tag[n - 1 - i] = c;
    }
    tag[n] = '\0';

    if (name == NULL || *name == '\0')
        name = "job";
    for (i = 0; i < NAME_MAX_CHARS && name[i] != '\0'; i++) {
        char c = name[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        clean[i] = ok ? c : '_';
    }
    clean[i] = '\0';
    return dt_xasprintf("dt-%lld.%s-%s", (long long)job, tag, clean);
}

/* The union of two comma-separated host lists, first-seen order, exact
 * duplicates dropped (ranges such as n[1-4] are kept as written: Slurm
 * expands them). NULL when both are empty. */
static char *merge_exclude(const char *a, const char *b)
{
    const char *lists[2] = { a, b };
    sb_t out = { 0 };

    for (int l = 0; l < 2; l++) {
        const char *p = lists[l];
        while (p != NULL && *p != '\0') {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            int dup = 0;
            if (len > 0 && out.p != NULL) {
                for (const char *q = out.p; *q != '\0';) {
                    const char *qe = strchr(q, ',');
                    size_t qlen = qe ? (size_t)(qe - q) : strlen(q);
                    if (qlen == len && memcmp(q, p, len) == 0) {
                        dup = 1;
                        break;
                    }
                    q += qlen + (qe != NULL);
                }
            }
            if (len > 0 && !dup)
                sb_printf(&out, "%s%.*s", out.n > 0 ? "," : "", (int)len, p);
            p += len + (end != NULL);
        }
    }
    return out.p;
}

/* Put NAME=VALUE in the NULL-terminated *env of *n entries, replacing an
 * entry of the same NAME. Takes ownership of `entry`. */
static void env_put(char ***env, size_t *n, char *entry)
{
    size_t name_len = strcspn(entry, "=");

    for (size_t i = 0; i < *n; i++) {
        if (strncmp((*env)[i], entry, name_len + 1) == 0) {
            free((*env)[i]);
            (*env)[i] = entry;
            return;
        }
    }
    *env = dt_xrealloc(*env, (*n + 2) * sizeof(char *));
    (*env)[(*n)++] = entry;
    (*env)[*n] = NULL;
}

/* PATH, the owner's HOME, USER and LOGNAME when the user database knows
 * the uid, then the configured entries (which win). slurmctld refuses a
 * batch job without an environment, so PATH is always there. */
static void make_env(const dt_batch_conf_t *bc, dt_slurm_desc_t *d)
{
    struct passwd pw, *res = NULL;
    char buf[4096];
    size_t n = 0;

    env_put(&d->env, &n, dt_xstrdup("PATH=" DEFAULT_PATH));
    if (getpwuid_r((uid_t)bc->uid, &pw, buf, sizeof(buf), &res) == 0 && res != NULL) {
        if (pw.pw_dir != NULL && *pw.pw_dir != '\0')
            env_put(&d->env, &n, dt_xasprintf("HOME=%s", pw.pw_dir));
        if (pw.pw_name != NULL && *pw.pw_name != '\0') {
            env_put(&d->env, &n, dt_xasprintf("USER=%s", pw.pw_name));
            env_put(&d->env, &n, dt_xasprintf("LOGNAME=%s", pw.pw_name));
        }
    }
    if (bc->env != NULL)
        for (const char *const *e = bc->env; *e != NULL; e++)
            env_put(&d->env, &n, dt_xstrdup(*e));
}

/* ---- the script ---------------------------------------------------------- */

/* A value on an #SBATCH line, as sbatch's parser reads it back. */
static void sbatch_value(sb_t *b, const char *v)
{
    int plain = *v != '\0';

    for (const char *p = v; *p != '\0' && plain; p++)
        plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
                strchr("_./:@%,=+-[]", *p) != NULL;
    if (plain) {
        sb_printf(b, "%s", v);
        return;
    }
    sb_printf(b, "'");
    for (const char *p = v; *p != '\0'; p++) {
        if (*p == '\\')
            sb_printf(b, "\\\\");
        else
            sb_printf(b, "%c", *p);
    }
    sb_printf(b, "'");
}

static void sbatch_str(sb_t *b, const char *opt, const char *v)
{
    if (v == NULL)
        return;
    sb_printf(b, "#SBATCH --%s=", opt);
    sbatch_value(b, v);
    sb_printf(b, "\n");
}

static void sbatch_lines(sb_t *b, const dt_slurm_desc_t *d)
{
    sbatch_str(b, "job-name", d->name);
    sb_printf(b, "#SBATCH --nodes=%u\n", d->nodes);
    sb_printf(b, "#SBATCH --ntasks-per-node=1\n");
    if (d->cpus_per_task > 0)
        sb_printf(b, "#SBATCH --cpus-per-task=%u\n", d->cpus_per_task);
    if (d->gpus_per_node > 0)
        sb_printf(b, "#SBATCH --gpus-per-node=%u\n", d->gpus_per_node);
    if (d->gpus_per_node > 0 && d->cpus_per_gpu > 0)
        sb_printf(b, "#SBATCH --cpus-per-gpu=%u\n", d->cpus_per_gpu);
    if (d->time_min > 0)
        sb_printf(b, "#SBATCH --time=%u\n", d->time_min);
    if (d->signal_lead_s > 0)
        sb_printf(b, "#SBATCH --signal=B:%s@%u\n", dt_batch_signal_name(d->warn_signal),
                  d->signal_lead_s);
    sb_printf(b, "#SBATCH --requeue\n");
    sb_printf(b, "#SBATCH --open-mode=append\n");
    /* a failed node must not end the job: its agents' loss is dt's to
     * handle (a spare takes over, or dt requeues) */
    sb_printf(b, "#SBATCH --no-kill\n");
    sbatch_str(b, "output", d->output);
    sbatch_str(b, "chdir", d->workdir);
    sbatch_str(b, "partition", d->partition);
    sbatch_str(b, "account", d->account);
    sbatch_str(b, "qos", d->qos);
    sbatch_str(b, "constraint", d->constraint);
    sbatch_str(b, "exclude", d->exclude);
}

static char *make_script(int64_t job, int ranks_per_node, const dt_batch_conf_t *bc,
                         const dt_slurm_desc_t *d)
{
    long long j = (long long)job;
    const char *sig = dt_batch_signal_name(d->warn_signal);
    const char *other = d->warn_signal == SIGUSR1 ? "USR2" : "USR1";
    sb_t b = { 0 };

    sb_printf(&b,
              "#!/bin/sh\n"
              "# %s: dt job %lld, one dtagentd per node started by srun. Written by\n"
              "# dtcoordd; `sbatch` this file by hand to ask Slurm for the same job.\n",
              d->name, j);
    sbatch_lines(&b, d);

    /* The site's setup comes before `set -u`: such files (module, conda)
     * commonly read unset variables. */
    if (bc->setup != NULL) {
        sb_printf(&b,
                  "\nif [ ! -r '%s' ]; then\n"
                  "    echo \"dt: job %lld: the setup file is not readable:\" '%s' >&2\n"
                  "    exit 1\n"
                  "fi\n"
                  ". '%s'\n",
                  bc->setup, j, bc->setup, bc->setup);
    }
    if (bc->env != NULL) {
        sb_printf(&b, "\n");
        for (const char *const *e = bc->env; *e != NULL; e++) {
            size_t len = strcspn(*e, "=");
            sb_printf(&b, "export %.*s='%s'\n", (int)len, *e, *e + len + 1);
        }
    }
    sb_printf(&b,
              "\nset -u\n"
              "echo \"dt: job %lld: slurm job $SLURM_JOB_ID run ${SLURM_RESTART_COUNT:-0}"
              " on $SLURM_JOB_NODELIST: starting agents\"\n",
              j);

    /* slurm_setup may have set NCCL_PROXY_DUMP_SIGNAL (dt_batch_make
     * checked slurm_env): NCCL would take the warning for a request to
     * dump its state. printf reads the number as NCCL's strtoll does. */
    sb_printf(&b,
              "\nnccl_sig=$(printf '%%d' \"${NCCL_PROXY_DUMP_SIGNAL:-}\" 2>/dev/null)\n"
              "if [ \"$nccl_sig\" = %d ]; then\n"
              "    echo \"dt: job %lld: NCCL_PROXY_DUMP_SIGNAL=$NCCL_PROXY_DUMP_SIGNAL is the job's"
              " warning signal (%s): NCCL would catch it; set signal = %s in the spec\" >&2\n"
              "    exit 1\n"
              "fi\n",
              d->warn_signal, j, sig, other);

    /* --signal=B:SIG reaches this shell only; srun passes SIG on to every
     * process of the step. The other signal dt may use is trapped too, so
     * that a stray one (an NCCL dump asked of the step) does not end the
     * job; a trapped signal, unlike an ignored one, is back to its default
     * in srun. A trapped signal cuts `wait` short, hence the loop. */
    sb_printf(&b,
              "\nsrun_pid=\n"
              "trapped=0\n"
              "forward_warning() {\n"
              "    trapped=1\n"
              "    if [ -n \"$srun_pid\" ]; then\n"
              "        echo \"dt: job %lld: %s received, forwarding it to srun (pid $srun_pid)\"\n"
              "        kill -%s \"$srun_pid\" 2>/dev/null\n"
              "    else\n"
              "        echo \"dt: job %lld: %s received before srun started, not forwarded\"\n"
              "    fi\n"
              "}\n"
              "not_ours() {\n"
              "    trapped=1\n"
              "    echo \"dt: job %lld: %s received and ignored: the warning signal is %s\"\n"
              "}\n"
              "trap forward_warning %s\n"
              "trap not_ours %s\n\n",
              j, sig, sig, j, sig, j, other, sig, sig, other);

    /* Slurm 22.05's srun does not take --cpus-per-task from the job
     * (SLURM_CPUS_PER_TASK is no longer read): pass it. GPUs: a step gets
     * all the job's GRES on its node by default. */
    sb_printf(&b, "srun --nodes=\"$SLURM_JOB_NUM_NODES\" --ntasks=\"$SLURM_JOB_NUM_NODES\""
                  " --ntasks-per-node=1 \\\n");
    if (d->cpus_per_task > 0)
        sb_printf(&b, "    --cpus-per-task=%u \\\n", d->cpus_per_task);
    sb_printf(&b,
              "    --kill-on-bad-exit=0 --mpi=none \\\n"
              "    '%s' --coord '%s' --job %lld --slots %d --signal %s",
              bc->agent_path, bc->coord_addr, j, ranks_per_node, sig);
    /* no --state-dir: the agent's default has the node's name in it, and
     * several slurmd may share a host */
    if (bc->engine_path != NULL)
        sb_printf(&b, " \\\n    --engine '%s'", bc->engine_path);
    if (bc->munge_socket != NULL)
        sb_printf(&b, " \\\n    --munge-socket '%s'", bc->munge_socket);
    if (bc->hang_timeout_ms > 0)
        sb_printf(&b, " \\\n    --hang-timeout %lldms", (long long)bc->hang_timeout_ms);
    sb_printf(&b, " &\n"
                  "srun_pid=$!\n");

    /* wait returns >128 when a trapped signal interrupts it. If srun is
     * alive, wait again; if it ended just then, a second wait gives its
     * status (127: the first wait already reported it). */
    sb_printf(&b, "\nstatus=0\n"
                  "while :; do\n"
                  "    trapped=0\n"
                  "    wait \"$srun_pid\"\n"
                  "    status=$?\n"
                  "    [ \"$trapped\" = 1 ] || break\n"
                  "    kill -0 \"$srun_pid\" 2>/dev/null && continue\n"
                  "    wait \"$srun_pid\" 2>/dev/null\n"
                  "    again=$?\n"
                  "    [ \"$again\" = 127 ] || status=$again\n"
                  "    break\n"
                  "done\n");
    sb_printf(&b,
              "\necho \"dt: job %lld: slurm job $SLURM_JOB_ID: agents ended with status $status\"\n"
              "# 0: the dt job completed; 1: it failed for good; %d: run it again.\n"
              "exit \"$status\"\n",
              j, DT_EXIT_REQUEUE);
    return b.p;
}

/* ---- dt_batch_make ------------------------------------------------------- */


/* A cuda job asks Slurm for one GPU per rank, a cpu job for one CPU each
 * (the spec's words are checked by dt_spec_check, the vocabulary's). */
static int device_of(const dt_spec_t *s, int *is_gpu, dt_emsg_t *em)
{
    enum dt_gpu_preset g;
    enum dt_device d;
    int rc;

    if ((s->gpu != NULL && (rc = dt_gpu_parse("gpu", s->gpu, &g, em)) < 0) ||
        (s->device != NULL && (rc = dt_device_parse("device", s->device, &d, em)) < 0))
        return rc;
    *is_gpu = dt_spec_device_id(s) == DT_DEVICE_CUDA;
    return 0;
}

static int check_inputs(int64_t job, const dt_spec_t *s, int nodes, int ranks_per_node,
                        const char *exclude, const dt_batch_conf_t *bc, dt_emsg_t *em)
{
    int rc;

    if (job < 0) /* 0: a dry run, the id is not known yet */
        return dt_emsg_set(em, DT_EINVAL, "job: %lld is not a job id", (long long)job);
    if (nodes < 1)
        return dt_emsg_set(em, DT_EINVAL, "nodes: %d, at least 1 is needed", nodes);
    if (ranks_per_node < 1 || ranks_per_node > 65535)
        return dt_emsg_set(em, DT_EINVAL, "ranks per node: %d is not in 1..65535", ranks_per_node);
    if (s->spares < 0)
        return dt_emsg_set(em, DT_EINVAL, "spares: %lld is negative", (long long)s->spares);
    if ((rc = check_set("slurm_agent", bc->agent_path, em)) < 0 ||
        (rc = check_set("slurm_coord_address", bc->coord_addr, em)) < 0 ||
        (rc = check_set("slurm_output_dir", bc->output_dir, em)) < 0 ||
        (rc = check_quotable("slurm_engine", bc->engine_path, em)) < 0 ||
        (rc = check_quotable("munge_socket", bc->munge_socket, em)) < 0 ||
        (rc = check_quotable("slurm_setup", bc->setup, em)) < 0 ||
        (rc = check_quotable("partition", s->partition, em)) < 0 ||
        (rc = check_quotable("account", s->account, em)) < 0 ||
        (rc = check_quotable("qos", s->qos, em)) < 0 ||
        (rc = check_quotable("constraint", s->constraint, em)) < 0 ||
        (rc = check_quotable("exclude", s->exclude, em)) < 0 ||
        (rc = check_quotable("exclude", exclude, em)) < 0)
        return rc;
    if (bc->output_dir[0] != '/')
        return dt_emsg_set(em, DT_EINVAL, "slurm_output_dir: '%s' is not an absolute path",
                           bc->output_dir);
    if (bc->env != NULL) {
        for (const char *const *e = bc->env; *e != NULL; e++) {
            const char *eq = strchr(*e, '=');
            if (eq == NULL || !valid_env_name(*e, (size_t)(eq - *e)))
                return dt_emsg_set(em, DT_EINVAL, "slurm_env: '%s' is not NAME=VALUE", *e);
            if ((rc = check_quotable("slurm_env", *e, em)) < 0)
                return rc;
        }
    }
    return 0;
}

/* The job's warning signal: the spec's, else the coordinator's default. */
static int warn_signal(const dt_spec_t *s, const dt_batch_conf_t *bc, int *sig, dt_emsg_t *em)
{
    const char *name = s->signal ? s->signal : bc->signal ? bc->signal : DT_BATCH_SIGNAL;

    *sig = dt_batch_signal_number(name);
    if (*sig == 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: '%s' is not USR1 or USR2 (srun forwards no other "
                           "signal to the agents unchanged)",
                           s->signal ? "signal" : "slurm_signal", name);
    return 0;
}

/* NCCL_PROXY_DUMP_SIGNAL in the job's environment, read as NCCL reads it
 * (strtoll base 0, trailing text ignored); -1 when unset or no number. */
static long long nccl_dump_signal(const dt_slurm_desc_t *d)
{
    static const char var[] = "NCCL_PROXY_DUMP_SIGNAL=";

    for (char **e = d->env; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, var, sizeof(var) - 1) != 0)
            continue;
        const char *v = *e + sizeof(var) - 1;
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 0);
        return end == v || errno != 0 ? -1 : x;
    }
    return -1;
}

int dt_batch_make(int64_t job, const dt_spec_t *s, int nodes, int ranks_per_node,
                  const char *exclude, const dt_batch_conf_t *bc, dt_slurm_desc_t *d, dt_emsg_t *em)
{
    int is_gpu = 0, sig = 0, rc;
    int64_t spare_nodes, lead_s;

    memset(d, 0, sizeof(*d));
    if ((rc = check_inputs(job, s, nodes, ranks_per_node, exclude, bc, em)) < 0 ||
        (rc = device_of(s, &is_gpu, em)) < 0 || (rc = warn_signal(s, bc, &sig, em)) < 0)
        return rc;
    spare_nodes = (s->spares + ranks_per_node - 1) / ranks_per_node;
    if ((int64_t)nodes + spare_nodes > UINT32_MAX / 2)
        return dt_emsg_set(em, DT_EINVAL, "nodes: %d plus %lld spare nodes is too many", nodes,
                           (long long)spare_nodes);

    d->name = job_name(job, bc->created_ms, s->name);
    d->partition = dup_or_null(s->partition);
    d->account = dup_or_null(s->account);
    d->qos = dup_or_null(s->qos);
    d->constraint = dup_or_null(s->constraint);
    d->exclude = merge_exclude(s->exclude, exclude);
    d->nodes = (uint32_t)(nodes + spare_nodes);
    d->cpus_per_task = is_gpu ? 0 : (uint32_t)ranks_per_node;
    d->gpus_per_node = is_gpu ? (uint32_t)ranks_per_node : 0;
    d->cpus_per_gpu = is_gpu ? (uint32_t)s->cpus_per_gpu : 0;
    d->time_min = s->time_limit_ms > 0 ? (uint32_t)((s->time_limit_ms + 59999) / 60000) : 0;
    lead_s = s->signal_lead_ms > 0 ? (s->signal_lead_ms + 999) / 1000 : DT_BATCH_SIGNAL_LEAD_S;
    if (d->time_min > 0 && lead_s > (int64_t)d->time_min * 60 / 2)
        lead_s = (int64_t)d->time_min * 60 / 2;
    if (lead_s > WARN_TIME_MAX)
        lead_s = WARN_TIME_MAX;
    d->signal_lead_s = (uint32_t)lead_s;
    d->warn_signal = sig;
    d->workdir = dt_xstrdup(bc->output_dir);
    d->output =
        dt_xasprintf("%s%sdt-%lld.out", bc->output_dir,
                     bc->output_dir[strlen(bc->output_dir) - 1] == '/' ? "" : "/", (long long)job);
    d->uid = bc->uid;
    d->gid = bc->gid;
    make_env(bc, d);
    if (nccl_dump_signal(d) == sig) {
        rc = dt_emsg_set(em, DT_EINVAL,
                         "signal = %s: the job's environment sets "
                         "NCCL_PROXY_DUMP_SIGNAL=%lld (slurm_env in dt.conf), so NCCL would take "
                         "Slurm's warning for a request to dump its state; use signal = %s",
                         dt_batch_signal_name(sig), nccl_dump_signal(d),
                         sig == SIGUSR1 ? "USR2" : "USR1");
        dt_slurm_desc_clear(d);
        return rc;
    }
    d->script = make_script(job, ranks_per_node, bc, d);
    return 0;
}
