/* SPDX-License-Identifier: MIT
 *
 * Unit tests for coordinator/batch: the sbatch options dt asks for (cpu and
 * GPU jobs, spare nodes, exclusions, time and signal lead), that the
 * script's #SBATCH lines say the same as the desc (read back with sbatch's
 * own quoting rules), that the script is valid sh, that unsafe values are
 * refused naming their field, and the script's control flow run for real
 * under /bin/sh with a fake `srun` on PATH: the exit status of the agents
 * is the script's, the job's warning signal (USR2 unless set) sent to the
 * batch shell reaches srun and the other user signal does not end it, and
 * an NCCL_PROXY_DUMP_SIGNAL equal to the warning signal is refused. No
 * Slurm is needed.
 */
#include "common/fileio.h"
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/mem.h"
#include "coordinator/batch.h"

/*-- fixture ----------------------------------------------------------------*/

static char tmpdir[64];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_batch.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    if (tmpdir[0])
        dt_rmtree(tmpdir, NULL);
}

TestSuite(batch, .init = setup, .fini = teardown);

static const char *P(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *P(const char *fmt, ...)
{
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(b, sizeof(bufs[0]), fmt, ap);
    va_end(ap);
    return b;
}

#define assert_has(s, sub) cr_assert(strstr((s), (sub)) != NULL, "\"%s\" lacks \"%s\"", (s), (sub))
#define assert_lacks(s, sub) cr_assert(strstr((s), (sub)) == NULL, "\"%s\" has \"%s\"", (s), (sub))

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(chmod(path, mode), 0);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char *s = dt_xcalloc(1, 65536);
    size_t n;

    if (f == NULL)
        return s;
    n = fread(s, 1, 65535, f);
    s[n] = '\0';
    fclose(f);
    return s;
}

/*-- a job and a coordinator ------------------------------------------------*/

static dt_spec_t spec(const char *gpu)
{
    dt_spec_t s = { 0 };
    s.name = (char *)"myjob";
    s.kind = (char *)"train";
    s.gpu = (char *)gpu;
    s.time_limit_ms = 3600 * 1000;
    return s;
}

static dt_batch_conf_t conf(void)
{
    return (dt_batch_conf_t){
        .coord_addr = "10.0.0.1:7001",
        .agent_path = "/usr/sbin/dtagentd",
        .output_dir = "/var/log/dt",
        .uid = (uint32_t)getuid(),
        .gid = (uint32_t)getgid(),
    };
}

static void make_ok(int64_t job, const dt_spec_t *s, int nodes, int rpn, const char *exclude,
                    const dt_batch_conf_t *bc, dt_slurm_desc_t *d)
{
    dt_emsg_t em = { "" };
    int rc = dt_batch_make(job, s, nodes, rpn, exclude, bc, d, &em);
    cr_assert_eq(rc, 0, "dt_batch_make: %s (%s)", dt_err_name(rc), em.s);
    cr_assert_not_null(d->script);
}

static const char *env_get(const dt_slurm_desc_t *d, const char *name)
{
    size_t len = strlen(name);
    for (char **e = d->env; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
            return *e + len + 1;
    return NULL;
}

/*-- the options ------------------------------------------------------------*/

Test(batch, cpu_job_asks_cpus_per_task_and_no_gpus)
{
    dt_spec_t s = spec("cpu");
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;

    make_ok(7, &s, 2, 4, NULL, &bc, &d);
    cr_assert_str_eq(d.name, "dt-7.0-myjob");
    cr_assert_eq(d.nodes, 2);
    cr_assert_eq(d.cpus_per_task, 4);
    cr_assert_eq(d.gpus_per_node, 0);
    cr_assert_eq(d.time_min, 60);
    cr_assert_eq(d.signal_lead_s, DT_BATCH_SIGNAL_LEAD_S);
    cr_assert_str_eq(d.output, "/var/log/dt/dt-7.out");
    cr_assert_str_eq(d.workdir, "/var/log/dt");
    cr_assert_null(d.partition);
    cr_assert_null(d.account);
    cr_assert_null(d.qos);
    cr_assert_null(d.constraint);
    cr_assert_null(d.exclude);
    cr_assert_eq(d.uid, (uint32_t)getuid());
    cr_assert_eq(d.gid, (uint32_t)getgid());
    cr_assert_not_null(env_get(&d, "PATH"), "the job's environment has no PATH");
    assert_has(d.script, "#SBATCH --cpus-per-task=4\n");
    assert_lacks(d.script, "--gpus-per-node");
    assert_has(d.script, "    --cpus-per-task=4 \\\n"); /* srun gets it too */
    cr_assert_eq(strncmp(d.script, "#!/bin/sh\n", 10), 0);
    dt_slurm_desc_clear(&d);

    s.gpu = NULL; /* no preset is the cpu preset */
    make_ok(7, &s, 1, 3, NULL, &bc, &d);
    cr_assert_eq(d.cpus_per_task, 3);
    cr_assert_eq(d.gpus_per_node, 0);
    dt_slurm_desc_clear(&d);
}

Test(batch, a_dry_run_is_job_0)
{
    dt_spec_t s = spec("cpu");
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;

    make_ok(0, &s, 2, 4, NULL, &bc, &d);
    cr_assert_str_eq(d.name, "dt-0.0-myjob");
    assert_has(d.script, " --job 0 ");
    dt_slurm_desc_clear(&d);
}

Test(batch, gpu_job_asks_one_gpu_per_rank)
{
    const char *presets[] = { "h100-sxm", "h200" };
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;

    for (int i = 0; i < 2; i++) {
        dt_spec_t s = spec(presets[i]);
        make_ok(12, &s, 4, 8, NULL, &bc, &d);
        cr_assert_eq(d.nodes, 4, "%s", presets[i]);
        cr_assert_eq(d.gpus_per_node, 8, "%s", presets[i]);
        cr_assert_eq(d.cpus_per_task, 0, "%s", presets[i]);
        assert_has(d.script, "#SBATCH --gpus-per-node=8\n");
        assert_lacks(d.script, "--cpus-per-task");
        assert_has(d.script, "--slots 8");
        dt_slurm_desc_clear(&d);
    }
}

/* device = cuda asks for the GPUs, and cpus_per_gpu for their cores;
 * without cpus_per_gpu the site's default stands. */
Test(batch, cuda_job_asks_gpus_and_cpus_per_gpu)
{
    dt_spec_t s = spec(NULL);
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;

    s.device = (char *)"cuda";
    s.cpus_per_gpu = 6;
    make_ok(1, &s, 2, 4, NULL, &bc, &d);
    cr_assert_eq(d.gpus_per_node, 4);
    cr_assert_eq(d.cpus_per_gpu, 6);
    cr_assert_eq(d.cpus_per_task, 0);
    assert_has(d.script, "#SBATCH --gpus-per-node=4\n");
    assert_has(d.script, "#SBATCH --cpus-per-gpu=6\n");
    dt_slurm_desc_clear(&d);

    s.cpus_per_gpu = 0;
    make_ok(1, &s, 2, 4, NULL, &bc, &d);
    cr_assert_eq(d.cpus_per_gpu, 0);
    assert_lacks(d.script, "--cpus-per-gpu");
    dt_slurm_desc_clear(&d);

    /* a cpu job never asks for GPUs, whatever cpus_per_gpu says */
    s.device = (char *)"cpu";
    s.cpus_per_gpu = 6;
    make_ok(1, &s, 1, 2, NULL, &bc, &d);
    cr_assert_eq(d.gpus_per_node, 0);
    cr_assert_eq(d.cpus_per_gpu, 0);
    assert_lacks(d.script, "--gpus-per-node");
    dt_slurm_desc_clear(&d);
}

Test(batch, unknown_gpu_preset_is_refused)
{
    dt_spec_t s = spec("a100");
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_batch_make(1, &s, 1, 1, NULL, &bc, &d, &em), DT_EINVAL);
    assert_has(em.s, "gpu");
    assert_has(em.s, "a100");
    cr_assert_null(d.script);
}

Test(batch, spares_add_whole_nodes_rounded_up)
{
    static const struct {
        int64_t spares;
        int rpn, nodes;
        uint32_t want;
    } cases[] = {
        { 0, 4, 3, 3 }, { 1, 4, 3, 4 }, { 4, 4, 3, 4 }, { 5, 4, 3, 5 },
        { 8, 4, 3, 5 }, { 1, 1, 2, 3 }, { 3, 8, 1, 2 },
    };
    dt_batch_conf_t bc = conf();

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = spec("cpu");
        dt_slurm_desc_t d;
        s.spares = cases[i].spares;
        make_ok(3, &s, cases[i].nodes, cases[i].rpn, NULL, &bc, &d);
        cr_assert_eq(d.nodes, cases[i].want, "spares=%lld rpn=%d nodes=%d: got %u, want %u",
                     (long long)cases[i].spares, cases[i].rpn, cases[i].nodes, d.nodes,
                     cases[i].want);
        assert_has(d.script, P("#SBATCH --nodes=%u\n", cases[i].want));
        dt_slurm_desc_clear(&d);
    }
}

Test(batch, exclusions_are_merged_without_duplicates)
{
    static const struct {
        const char *spec, *arg, *want;
    } cases[] = {
        { NULL, NULL, NULL },
        { "", "", NULL },
        { "n1,n2", NULL, "n1,n2" },
        { NULL, "n3", "n3" },
        { "n1,n2", "n2,n3", "n1,n2,n3" },
        { "gpu[01-04]", "n9,gpu[01-04]", "gpu[01-04],n9" },
        { "n1,,n1", ",n2,", "n1,n2" },
    };
    dt_batch_conf_t bc = conf();

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = spec("cpu");
        dt_slurm_desc_t d;
        s.exclude = (char *)cases[i].spec;
        make_ok(3, &s, 1, 1, cases[i].arg, &bc, &d);
        if (cases[i].want == NULL) {
            cr_assert_null(d.exclude, "case %zu: got \"%s\"", i, d.exclude);
            assert_lacks(d.script, "--exclude");
        } else {
            cr_assert_not_null(d.exclude, "case %zu", i);
            cr_assert_str_eq(d.exclude, cases[i].want, "case %zu", i);
            assert_has(d.script, P("#SBATCH --exclude=%s\n", cases[i].want));
        }
        dt_slurm_desc_clear(&d);
    }
}

Test(batch, time_limit_is_rounded_up_to_minutes)
{
    static const struct {
        int64_t ms;
        uint32_t want;
    } cases[] = {
        { 0, 0 }, { 1000, 1 }, { 60000, 1 }, { 60001, 2 }, { 90000, 2 }, { 7200000, 120 },
    };
    dt_batch_conf_t bc = conf();

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = spec("cpu");
        dt_slurm_desc_t d;
        s.time_limit_ms = cases[i].ms;
        make_ok(3, &s, 1, 1, NULL, &bc, &d);
        cr_assert_eq(d.time_min, cases[i].want, "%lld ms: got %u min", (long long)cases[i].ms,
                     d.time_min);
        if (cases[i].want == 0)
            assert_lacks(d.script, "--time");
        else
            assert_has(d.script, P("#SBATCH --time=%u\n", cases[i].want));
        dt_slurm_desc_clear(&d);
    }
}

Test(batch, signal_lead_defaults_and_is_clamped)
{
    static const struct {
        int64_t time_ms, lead_ms;
        uint32_t want;
    } cases[] = {
        { 3600000, 0, DT_BATCH_SIGNAL_LEAD_S }, /* the default */
        { 3600000, 300000, 300 },               /* the spec's */
        { 3600000, 1500, 2 },                   /* rounded up to seconds */
        { 600000, 600000, 300 },                /* at most half of 10 min */
        { 60000, 0, 30 },                       /* half of 1 min beats the default */
        { 90000, 0, 60 },                       /* half of the 2 min Slurm applies */
        { 0, 0, DT_BATCH_SIGNAL_LEAD_S },       /* no limit: nothing to halve */
        { 0, 86400000, 65535 },                 /* Slurm's warn_time is 16 bits */
    };
    dt_batch_conf_t bc = conf();

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = spec("cpu");
        dt_slurm_desc_t d;
        s.time_limit_ms = cases[i].time_ms;
        s.signal_lead_ms = cases[i].lead_ms;
        make_ok(3, &s, 1, 1, NULL, &bc, &d);
        cr_assert_eq(d.signal_lead_s, cases[i].want, "time %lld ms lead %lld ms: got %u s",
                     (long long)cases[i].time_ms, (long long)cases[i].lead_ms, d.signal_lead_s);
        assert_has(d.script, P("#SBATCH --signal=B:USR2@%u\n", cases[i].want));
        dt_slurm_desc_clear(&d);
    }
}

Test(batch, job_name_is_sanitised_and_cut)
{
    dt_spec_t s = spec("cpu");
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;

    s.name = (char *)"long context/run #2 'x'\nwith a name well over forty characters";
    make_ok(42, &s, 1, 1, NULL, &bc, &d);
    cr_assert_str_eq(d.name, "dt-42.0-long_context_run__2__x__with_a_name_well");
    cr_assert_eq(strlen(d.name) - strlen("dt-42.0-"), 40);
    dt_slurm_desc_clear(&d);

    s.name = NULL;
    make_ok(42, &s, 1, 1, NULL, &bc, &d);
    cr_assert_str_eq(d.name, "dt-42.0-job");
    dt_slurm_desc_clear(&d);
}

/* dtcoordd finds a Slurm job it submitted but did not record by its name:
 * the name must be the same for the same dt job and differ for another
 * coordinator's job of the same id (another creation time). */
Test(batch, job_name_carries_the_creation_time)
{
    static const struct {
        int64_t created_ms;
        const char *want;
    } cases[] = {
        { 1764100000123, "dt-9.miezlbp7-myjob" },
        { 1764100000124, "dt-9.miezlbp8-myjob" },
        { 35, "dt-9.z-myjob" },
        { 36, "dt-9.10-myjob" },
        { 0, "dt-9.0-myjob" },
    };
    dt_spec_t s = spec("cpu");

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_batch_conf_t bc = conf();
        dt_slurm_desc_t d;
        bc.created_ms = cases[i].created_ms;
        make_ok(9, &s, 1, 1, NULL, &bc, &d);
        cr_assert_str_eq(d.name, cases[i].want);
        assert_has(d.script, P("#SBATCH --job-name=%s\n", cases[i].want));
        dt_slurm_desc_clear(&d);
    }
}

/*-- the warning signal -----------------------------------------------------*/

Test(batch, warning_signal_is_usr2_unless_the_spec_or_the_conf_says)
{
    static const struct {
        const char *spec, *conf;
        int want;
    } cases[] = {
        { NULL, NULL, SIGUSR2 },   /* the default: NCCL may catch USR1 */
        { NULL, "USR1", SIGUSR1 }, /* dt.conf's slurm_signal */
        { "USR1", NULL, SIGUSR1 }, /* the spec's signal */
        { "USR2", "USR1", SIGUSR2 }, /* the spec wins */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = spec("cpu");
        dt_batch_conf_t bc = conf();
        dt_slurm_desc_t d;
        const char *name = cases[i].want == SIGUSR1 ? "USR1" : "USR2";
        const char *other = cases[i].want == SIGUSR1 ? "USR2" : "USR1";

        s.signal = (char *)cases[i].spec;
        bc.signal = cases[i].conf;
        make_ok(4, &s, 1, 1, NULL, &bc, &d);
        cr_assert_eq(d.warn_signal, cases[i].want, "case %zu: signal %d", i, d.warn_signal);
        assert_has(d.script, P("#SBATCH --signal=B:%s@%u\n", name, d.signal_lead_s));
        assert_has(d.script, P("trap forward_warning %s\n", name));
        assert_has(d.script, P("kill -%s \"$srun_pid\"", name));
        assert_has(d.script, P("trap not_ours %s\n", other));
        assert_has(d.script, P(" --signal %s", name)); /* the agents' */
        cr_assert_str_eq(dt_batch_signal_name(d.warn_signal), name);
        cr_assert_eq(dt_batch_signal_number(name), cases[i].want);
        dt_slurm_desc_clear(&d);
    }
}

Test(batch, a_signal_other_than_usr1_or_usr2_is_refused_naming_its_key)
{
    /* srun turns TERM, INT, HUP and QUIT into a kill of the step and does
     * not forward the rest; KILL and STOP cannot be caught at all */
    static const char *const bad[] = { "TERM", "HUP", "INT", "KILL", "STOP", "SIGUSR2", "usr2",
                                       "10", "" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        for (int in_conf = 0; in_conf < 2; in_conf++) {
            dt_spec_t s = spec("cpu");
            dt_batch_conf_t bc = conf();
            dt_slurm_desc_t d;
            dt_emsg_t em = { "" };
            if (in_conf)
                bc.signal = bad[i];
            else
                s.signal = (char *)bad[i];
            cr_assert_eq(dt_batch_make(1, &s, 1, 1, NULL, &bc, &d, &em), DT_EINVAL, "'%s'",
                         bad[i]);
            cr_assert_str_eq(em.s, P("%s: '%s' is not USR1 or USR2 (srun forwards no other "
                                     "signal to the agents unchanged)",
                                     in_conf ? "slurm_signal" : "signal", bad[i]));
            cr_assert_null(d.script);
        }
        cr_assert_eq(dt_batch_signal_number(bad[i]), 0, "'%s'", bad[i]);
    }
}

Test(batch, nccl_catching_the_warning_signal_is_refused)
{
    static const struct {
        const char *nccl, *signal;
        int refused;
    } cases[] = {
        { "NCCL_PROXY_DUMP_SIGNAL=12", NULL, 1 },   /* USR2, the default */
        { "NCCL_PROXY_DUMP_SIGNAL=10", "USR1", 1 }, /* NCCL's own example */
        { "NCCL_PROXY_DUMP_SIGNAL=0x0c", NULL, 1 }, /* NCCL reads it with strtoll base 0 */
        { "NCCL_PROXY_DUMP_SIGNAL=10", NULL, 0 },   /* NCCL on USR1, dt on USR2 */
        { "NCCL_PROXY_DUMP_SIGNAL=12", "USR1", 0 },
        { "NCCL_PROXY_DUMP_SIGNAL=-1", NULL, 0 },   /* NCCL's "off" */
        { "NCCL_PROXY_DUMP_SIGNAL=", NULL, 0 },
        { "NCCL_DEBUG=12", NULL, 0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *env[] = { "A=1", cases[i].nccl, NULL };
        dt_spec_t s = spec("cpu");
        dt_batch_conf_t bc = conf();
        dt_slurm_desc_t d;
        dt_emsg_t em = { "" };

        bc.env = env;
        s.signal = (char *)cases[i].signal;
        int rc = dt_batch_make(1, &s, 1, 1, NULL, &bc, &d, &em);
        if (!cases[i].refused) {
            cr_assert_eq(rc, 0, "%s: %s", cases[i].nccl, em.s);
            dt_slurm_desc_clear(&d);
            continue;
        }
        const char *sig = cases[i].signal ? cases[i].signal : "USR2";
        cr_assert_eq(rc, DT_EINVAL, "%s signal %s: accepted", cases[i].nccl, sig);
        cr_assert_str_eq(em.s, P("signal = %s: the job's environment sets "
                                 "NCCL_PROXY_DUMP_SIGNAL=%d (slurm_env in dt.conf), so NCCL "
                                 "would take Slurm's warning for a request to dump its state; "
                                 "use signal = %s",
                                 sig, strcmp(sig, "USR1") == 0 ? 10 : 12,
                                 strcmp(sig, "USR1") == 0 ? "USR2" : "USR1"));
        cr_assert_null(d.script);
        cr_assert_null(d.env);
    }
}

Test(batch, environment_has_path_owner_and_configured_entries)
{
    const char *env[] = { "FOO=bar baz", "PATH=/opt/dt/bin:/usr/bin", "EMPTY=", NULL };
    dt_spec_t s = spec("cpu");
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;
    size_t n = 0;

    bc.env = env;
    make_ok(5, &s, 1, 1, NULL, &bc, &d);
    cr_assert_str_eq(env_get(&d, "PATH"), "/opt/dt/bin:/usr/bin", "the configured PATH wins");
    cr_assert_str_eq(env_get(&d, "FOO"), "bar baz");
    cr_assert_str_eq(env_get(&d, "EMPTY"), "");
    for (char **e = d.env; *e != NULL; e++)
        n += strncmp(*e, "PATH=", 5) == 0;
    cr_assert_eq(n, 1, "PATH is in the environment %zu times", n);
    if (getenv("HOME") != NULL && getuid() == 0)
        cr_assert_not_null(env_get(&d, "HOME"));
    assert_has(d.script, "export FOO='bar baz'\n");
    assert_has(d.script, "export EMPTY=''\n");
    dt_slurm_desc_clear(&d);
}

Test(batch, desc_clear_frees_and_zeroes)
{
    dt_spec_t s = spec("cpu");
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d, zero;

    memset(&zero, 0, sizeof(zero));
    s.partition = (char *)"debug";
    s.exclude = (char *)"n1";
    make_ok(5, &s, 1, 1, NULL, &bc, &d);
    dt_slurm_desc_clear(&d);
    cr_assert_eq(memcmp(&d, &zero, sizeof(d)), 0, "the desc is not zeroed");
    dt_slurm_desc_clear(&d); /* twice is harmless */
    dt_slurm_desc_clear(NULL);
}

/*-- the #SBATCH lines ------------------------------------------------------*/

/* One argument of an #SBATCH line as sbatch's _get_argument reads it:
 * quotes group, a backslash escapes, an unquoted '#' ends the line.
 * Returns the characters consumed, 0 at the end. */
static size_t sbatch_arg(const char *line, char *out, size_t cap)
{
    const char *p = line;
    char q = 0;
    size_t n = 0;
    int esc = 0;

    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\0')
        return 0;
    while ((q || (*p != ' ' && *p != '\t')) && *p != '\0') {
        if (esc) {
            esc = 0;
        } else if (*p == '\\') {
            esc = 1;
            p++;
            continue;
        } else if (q) {
            if (*p == q) {
                q = 0;
                p++;
                continue;
            }
        } else if (*p == '"' || *p == '\'') {
            q = *p++;
            continue;
        } else if (*p == '#') {
            break;
        }
        cr_assert_lt(n + 1, cap);
        out[n++] = *p++;
    }
    cr_assert_eq(q, 0, "unmatched quote in [%s]", line);
    out[n] = '\0';
    return n == 0 ? 0 : (size_t)(p - line);
}

#define MAX_OPTS 32

/* The options sbatch would read from the script: "--name=value" strings.
 * Also checks that no #SBATCH line comes after the first command (sbatch
 * stops reading there). */
static int sbatch_options(const char *script, char opts[MAX_OPTS][1024])
{
    int n = 0, reading = 1;
    const char *line = script;

    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[2048];

        cr_assert_lt(len, sizeof(buf));
        memcpy(buf, line, len);
        buf[len] = '\0';
        if (strncmp(buf, "#SBATCH", 7) == 0) {
            cr_assert(reading, "an #SBATCH line after the first command: [%s]", buf);
            const char *p = buf + 7;
            size_t used;
            while ((used = sbatch_arg(p, opts[n], sizeof(opts[0]))) > 0) {
                cr_assert_lt(n + 1, MAX_OPTS);
                n++;
                p += used;
            }
        } else {
            const char *p = buf;
            while (*p == ' ' || *p == '\t')
                p++;
            if (*p != '\0' && *p != '#')
                reading = 0;
        }
        line += len + (end != NULL);
    }
    return n;
}

/* The options the desc asks for, as sbatch would take them. */
static int desc_options(const dt_slurm_desc_t *d, char want[MAX_OPTS][1024])
{
    int n = 0;

#define WANT(...) snprintf(want[n++], sizeof(want[0]), __VA_ARGS__)
    WANT("--job-name=%s", d->name);
    WANT("--nodes=%u", d->nodes);
    WANT("--ntasks-per-node=1");
    if (d->cpus_per_task)
        WANT("--cpus-per-task=%u", d->cpus_per_task);
    if (d->gpus_per_node)
        WANT("--gpus-per-node=%u", d->gpus_per_node);
    if (d->cpus_per_gpu)
        WANT("--cpus-per-gpu=%u", d->cpus_per_gpu);
    if (d->time_min)
        WANT("--time=%u", d->time_min);
    if (d->signal_lead_s)
        WANT("--signal=B:%s@%u", dt_batch_signal_name(d->warn_signal), d->signal_lead_s);
    WANT("--requeue");
    WANT("--open-mode=append");
    WANT("--no-kill");
    WANT("--output=%s", d->output);
    WANT("--chdir=%s", d->workdir);
    if (d->partition)
        WANT("--partition=%s", d->partition);
    if (d->account)
        WANT("--account=%s", d->account);
    if (d->qos)
        WANT("--qos=%s", d->qos);
    if (d->constraint)
        WANT("--constraint=%s", d->constraint);
    if (d->exclude)
        WANT("--exclude=%s", d->exclude);
#undef WANT
    return n;
}

static void assert_sbatch_agrees(const dt_slurm_desc_t *d)
{
    static char got[MAX_OPTS][1024], want[MAX_OPTS][1024];
    int ng = sbatch_options(d->script, got), nw = desc_options(d, want);

    for (int i = 0; i < nw; i++) {
        int found = 0;
        for (int j = 0; j < ng; j++)
            found += strcmp(want[i], got[j]) == 0;
        cr_assert_eq(found, 1, "%s: found %d times in the #SBATCH lines of\n%s", want[i], found,
                     d->script);
    }
    for (int j = 0; j < ng; j++) {
        int found = 0;
        for (int i = 0; i < nw; i++)
            found += strcmp(want[i], got[j]) == 0;
        cr_assert_eq(found, 1, "#SBATCH %s is not in the desc", got[j]);
    }
    cr_assert_eq(ng, nw);
}

Test(batch, sbatch_lines_agree_with_the_desc)
{
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;

    { /* plain values */
        dt_spec_t s = spec("cpu");
        make_ok(9, &s, 2, 4, NULL, &bc, &d);
        assert_sbatch_agrees(&d);
        dt_slurm_desc_clear(&d);
    }
    { /* every option set */
        dt_spec_t s = spec("h200");
        s.partition = (char *)"gpu";
        s.account = (char *)"proj-42";
        s.qos = (char *)"high";
        s.constraint = (char *)"nvlink&ib";
        s.exclude = (char *)"n[1-3]";
        s.spares = 2;
        s.signal_lead_ms = 300000;
        s.cpus_per_gpu = 12;
        make_ok(9, &s, 2, 8, "n7", &bc, &d);
        assert_sbatch_agrees(&d);
        dt_slurm_desc_clear(&d);
    }
    { /* values sbatch must read back from quotes: a space, a '#', a '"', '\' */
        dt_spec_t s = spec("cpu");
        s.time_limit_ms = 0;
        s.constraint = (char *)"a|b #c";
        bc.output_dir = "/data/dt runs/\"x\"/back\\slash#1";
        make_ok(9, &s, 1, 1, NULL, &bc, &d);
        cr_assert_eq(d.time_min, 0);
        cr_assert_str_eq(d.output, "/data/dt runs/\"x\"/back\\slash#1/dt-9.out");
        assert_sbatch_agrees(&d);
        dt_slurm_desc_clear(&d);
    }
}

/*-- the script as sh reads it ----------------------------------------------*/

static int sh_n(const char *script)
{
    const char *path = P("%s/syntax.sh", tmpdir);
    write_file(path, script, 0644);
    int st = system(P("/bin/sh -n '%s' 2>'%s/syntax.err'", path, tmpdir));
    cr_assert_neq(st, -1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(batch, script_passes_sh_n)
{
    const char *env[] = { "FOO=bar $HOME `x`", "OMP_NUM_THREADS=1", NULL };
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;

    { /* the smallest */
        dt_spec_t s = spec("cpu");
        make_ok(1, &s, 1, 1, NULL, &bc, &d);
        cr_assert_eq(sh_n(d.script), 0, "sh -n: %s\n%s", read_file(P("%s/syntax.err", tmpdir)),
                     d.script);
        dt_slurm_desc_clear(&d);
    }
    { /* everything set, values full of shell syntax */
        dt_spec_t s = spec("h100-sxm");
        s.partition = (char *)"gpu";
        bc.engine_path = "/opt/dt $(x)/dtengine";
        bc.munge_socket = "/run/munge/munge.socket.2";
        bc.setup = "/etc/dt/setup; rm -rf /.sh";
        bc.env = env;
        bc.hang_timeout_ms = 30000;
        bc.agent_path = "/opt/dt \"x\" `y` $z/dtagentd";
        make_ok(2, &s, 3, 8, "n1", &bc, &d);
        cr_assert_eq(sh_n(d.script), 0, "sh -n: %s\n%s", read_file(P("%s/syntax.err", tmpdir)),
                     d.script);
        dt_slurm_desc_clear(&d);
    }
    /* and the check can fail */
    cr_assert_neq(sh_n("#!/bin/sh\nif true; then\n"), 0);
}

Test(batch, quote_or_newline_is_refused_naming_the_field)
{
    enum {
        AGENT,
        COORD,
        ENGINE,
        MUNGE,
        OUTDIR,
        SETUP,
        ENV,
        PARTITION,
        ACCOUNT,
        QOS,
        CONSTRAINT,
        SPEC_EXCLUDE,
        ARG_EXCLUDE,
        NFIELDS
    };
    static const char *const names[NFIELDS] = {
        "slurm_agent",  "slurm_coord_address", "slurm_engine",
        "munge_socket", "slurm_output_dir",    "slurm_setup",
        "slurm_env",    "partition",           "account",
        "qos",          "constraint",          "exclude",
        "exclude",
    };
    static const char *const bad[] = { "/a/it's", "/a/b\nc", "/a/b\rc" };

    for (int f = 0; f < NFIELDS; f++) {
        for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
            dt_spec_t s = spec("cpu");
            dt_batch_conf_t bc = conf();
            dt_slurm_desc_t d;
            dt_emsg_t em = { "" };
            const char *arg_exclude = NULL;
            char envbuf[64];
            const char *env[] = { envbuf, NULL };
            const char *v = bad[b];

            snprintf(envbuf, sizeof(envbuf), "X=%s", v);
            switch (f) {
            case AGENT:
                bc.agent_path = v;
                break;
            case COORD:
                bc.coord_addr = v;
                break;
            case ENGINE:
                bc.engine_path = v;
                break;
            case MUNGE:
                bc.munge_socket = v;
                break;
            case OUTDIR:
                bc.output_dir = v;
                break;
            case SETUP:
                bc.setup = v;
                break;
            case ENV:
                bc.env = env;
                break;
            case PARTITION:
                s.partition = (char *)v;
                break;
            case ACCOUNT:
                s.account = (char *)v;
                break;
            case QOS:
                s.qos = (char *)v;
                break;
            case CONSTRAINT:
                s.constraint = (char *)v;
                break;
            case SPEC_EXCLUDE:
                s.exclude = (char *)v;
                break;
            case ARG_EXCLUDE:
                arg_exclude = v;
                break;
            }
            memset(&d, 0xff, sizeof(d));
            int rc = dt_batch_make(1, &s, 1, 1, arg_exclude, &bc, &d, &em);
            cr_assert_eq(rc, DT_EINVAL, "%s with bad value %zu: %s", names[f], b, dt_err_name(rc));
            cr_assert_eq(strncmp(em.s, names[f], strlen(names[f])), 0,
                         "message \"%s\" does not name %s", em.s, names[f]);
            assert_has(em.s, b == 0 ? "quote" : "newline");
            cr_assert_null(d.script, "*d is not cleared on error");
            cr_assert_null(d.env);
        }
    }
}

Test(batch, missing_or_bad_settings_are_refused)
{
    static const struct {
        const char *field, *want;
    } cases[] = {
        { "agent", "slurm_agent: not set" },
        { "coord", "slurm_coord_address: not set" },
        { "outdir", "slurm_output_dir: not set" },
        { "relative", "slurm_output_dir: 'logs' is not an absolute path" },
        { "env", "slurm_env: 'NOEQUALS' is not NAME=VALUE" },
        { "envname", "slurm_env: '1X=2' is not NAME=VALUE" },
        { "nodes", "nodes" },
        { "rpn", "ranks per node" },
        { "job", "job" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = spec("cpu");
        dt_batch_conf_t bc = conf();
        dt_slurm_desc_t d;
        dt_emsg_t em = { "" };
        const char *env1[] = { "NOEQUALS", NULL }, *env2[] = { "1X=2", NULL };
        int nodes = 1, rpn = 1;
        int64_t job = 1;
        const char *f = cases[i].field;

        if (strcmp(f, "agent") == 0)
            bc.agent_path = NULL;
        else if (strcmp(f, "coord") == 0)
            bc.coord_addr = "";
        else if (strcmp(f, "outdir") == 0)
            bc.output_dir = NULL;
        else if (strcmp(f, "relative") == 0)
            bc.output_dir = "logs";
        else if (strcmp(f, "env") == 0)
            bc.env = env1;
        else if (strcmp(f, "envname") == 0)
            bc.env = env2;
        else if (strcmp(f, "nodes") == 0)
            nodes = 0;
        else if (strcmp(f, "rpn") == 0)
            rpn = 0;
        else
            job = -1; /* 0 is a dry run's */
        int rc = dt_batch_make(job, &s, nodes, rpn, NULL, &bc, &d, &em);
        cr_assert_eq(rc, DT_EINVAL, "%s: %s", f, dt_err_name(rc));
        cr_assert_eq(strncmp(em.s, cases[i].want, strlen(cases[i].want)), 0,
                     "%s: message \"%s\", want \"%s\"", f, em.s, cases[i].want);
        cr_assert_null(d.script);
    }
}

/*-- the script run under /bin/sh with a fake srun ---------------------------*/

/* Records its arguments (one per line) and two variables the script's
 * setup and env set, says it is ready, then exits FAKE_STATUS; with
 * FAKE_WAIT it first waits up to FAKE_WAIT_N / 20 s, and a USR1 or USR2
 * makes it write the signal's name to a marker and exit FAKE_SIG_STATUS. */
static const char fake_srun[] =
    "#!/bin/sh\n"
    "d=\"$FAKE_DIR\"\n"
    "for a in \"$@\"; do printf '%s\\n' \"$a\"; done >\"$d/argv\"\n"
    "printf 'SETUP_RAN=%s\\nFOO=%s\\n' \"${SETUP_RAN:-}\" \"${FOO:-}\" >\"$d/env\"\n"
    "on_sig() { echo \"$1\" >\"$d/got\"; exit \"$FAKE_SIG_STATUS\"; }\n"
    "trap 'on_sig USR1' USR1\n"
    "trap 'on_sig USR2' USR2\n"
    "echo ready >\"$d/ready\"\n"
    "if [ \"$FAKE_WAIT\" = 1 ]; then\n"
    "    n=0\n"
    "    while [ $n -lt \"$FAKE_WAIT_N\" ]; do sleep 0.05; n=$((n + 1)); done\n"
    "    echo timeout >\"$d/timeout\"\n"
    "fi\n"
    "exit \"$FAKE_STATUS\"\n";

static int fake_wait_n = 200; /* how long the fake srun waits for a signal: 10 s */

static int file_exists(const char *path)
{
    return access(path, F_OK) == 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Run `script` as Slurm would (sh SCRIPT in the job's environment) with
 * the fake srun first on PATH; with a signal `sig`, send it to the batch
 * shell once srun runs (srun exits sig_status when it gets one). Returns
 * the script's exit status. */
static int run_script(const char *script, int fake_status, int sig, int sig_status)
{
    const char *path = P("%s/batch.sh", tmpdir);
    char env[13][512];
    char *envp[14];
    int n = 0, st = 0;
    pid_t pid;

    mkdir(P("%s/bin", tmpdir), 0755);
    write_file(P("%s/bin/srun", tmpdir), fake_srun, 0755);
    write_file(path, script, 0644);
    unlink(P("%s/ready", tmpdir));
    unlink(P("%s/got", tmpdir));
    unlink(P("%s/timeout", tmpdir));

    snprintf(env[n++], sizeof(env[0]), "PATH=%s/bin:/usr/bin:/bin", tmpdir);
    snprintf(env[n++], sizeof(env[0]), "SLURM_JOB_ID=123");
    snprintf(env[n++], sizeof(env[0]), "SLURM_JOB_NODELIST=n[1-2]");
    snprintf(env[n++], sizeof(env[0]), "SLURM_JOB_NUM_NODES=2");
    snprintf(env[n++], sizeof(env[0]), "SLURM_RESTART_COUNT=1");
    snprintf(env[n++], sizeof(env[0]), "TMPDIR=%s", tmpdir);
    snprintf(env[n++], sizeof(env[0]), "FAKE_DIR=%s", tmpdir);
    snprintf(env[n++], sizeof(env[0]), "FAKE_STATUS=%d", fake_status);
    snprintf(env[n++], sizeof(env[0]), "FAKE_WAIT=%d", sig != 0);
    snprintf(env[n++], sizeof(env[0]), "FAKE_WAIT_N=%d", fake_wait_n);
    snprintf(env[n++], sizeof(env[0]), "FAKE_SIG_STATUS=%d", sig_status);
    for (int i = 0; i < n; i++)
        envp[i] = env[i];
    envp[n] = NULL;

    pid = fork();
    cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
    if (pid == 0) {
        sigset_t none;
        int fd = open(P("%s/out", tmpdir), O_WRONLY | O_CREAT | O_APPEND, 0644);
        /* A signal ignored at entry cannot be trapped by sh: start clean. */
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGUSR1, SIG_DFL);
        signal(SIGUSR2, SIG_DFL);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execle("/bin/sh", "sh", path, (char *)NULL, envp);
        _exit(126);
    }
    if (sig) {
        for (int i = 0; i < 1000 && !file_exists(P("%s/ready", tmpdir)); i++)
            sleep_ms(10);
        cr_assert(file_exists(P("%s/ready", tmpdir)), "the fake srun never started");
        sleep_ms(50);
        cr_assert_eq(kill(pid, sig), 0);
    }
    for (int i = 0; i < 2000; i++) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            cr_assert(WIFEXITED(st), "the script died of signal %d; output:\n%s",
                      WIFSIGNALED(st) ? WTERMSIG(st) : 0, read_file(P("%s/out", tmpdir)));
            return WEXITSTATUS(st);
        }
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    cr_assert_fail("the script did not end in 20 s; output:\n%s", read_file(P("%s/out", tmpdir)));
    return -1;
}

Test(batch, script_exit_status_is_the_agents)
{
    static const int statuses[] = { 0, 1, DT_EXIT_REQUEUE, 137 };
    dt_spec_t s = spec("cpu");
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;

    make_ok(7, &s, 2, 4, NULL, &bc, &d);
    for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++) {
        unlink(P("%s/out", tmpdir));
        int got = run_script(d.script, statuses[i], 0, 0);
        char *out = read_file(P("%s/out", tmpdir));
        cr_assert_eq(got, statuses[i], "srun exited %d, the script %d; output:\n%s", statuses[i],
                     got, out);
        assert_has(out, "dt: job 7: slurm job 123 run 1 on n[1-2]: starting agents");
        assert_has(out, P("dt: job 7: slurm job 123: agents ended with status %d", statuses[i]));
        free(out);
    }
    dt_slurm_desc_clear(&d);
}

Test(batch, srun_gets_the_agent_command_line_verbatim)
{
    const char *env[] = { "FOO=a \"b\" $HOME", NULL };
    dt_spec_t s = spec("cpu");
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;
    char *argv_txt, *env_txt, *want;
    /* a copy: P()'s buffers are reused by run_script */
    char *agent =
        dt_xstrdup(P("%s/dt $(touch %s/pwned) `touch %s/pwned2`/dtagentd", tmpdir, tmpdir, tmpdir));
    const char *setup_path = P("%s/setup $x.sh", tmpdir);

    write_file(setup_path, "SETUP_RAN=yes; export SETUP_RAN\n: \"${NOT_SET_ANYWHERE}\"\n", 0644);
    bc.agent_path = agent;
    bc.engine_path = "/opt/dt/bin/dtengine";
    bc.munge_socket = "/run/munge/munge.socket.2";
    bc.hang_timeout_ms = 30000;
    bc.setup = setup_path;
    bc.env = env;
    make_ok(7, &s, 2, 4, NULL, &bc, &d);
    cr_assert_eq(run_script(d.script, 0, 0, 0), 0, "output:\n%s", read_file(P("%s/out", tmpdir)));

    argv_txt = read_file(P("%s/argv", tmpdir));
    want = dt_xasprintf("--nodes=2\n--ntasks=2\n--ntasks-per-node=1\n--cpus-per-task=4\n"
                        "--kill-on-bad-exit=0\n--mpi=none\n%s\n--coord\n10.0.0.1:7001\n"
                        "--job\n7\n--slots\n4\n--signal\nUSR2\n"
                        "--engine\n/opt/dt/bin/dtengine\n--munge-socket\n"
                        "/run/munge/munge.socket.2\n--hang-timeout\n30000ms\n",
                        agent);
    cr_assert_str_eq(argv_txt, want);
    cr_assert(!file_exists(P("%s/pwned", tmpdir)) && !file_exists(P("%s/pwned2", tmpdir)),
              "a value was expanded by the shell");
    env_txt = read_file(P("%s/env", tmpdir));
    cr_assert_str_eq(env_txt, "SETUP_RAN=yes\nFOO=a \"b\" $HOME\n");
    free(want);
    free(argv_txt);
    free(env_txt);
    dt_slurm_desc_clear(&d);

    /* without the optional settings the agent gets none of their flags */
    bc = conf();
    make_ok(8, &s, 1, 2, NULL, &bc, &d);
    cr_assert_eq(run_script(d.script, 0, 0, 0), 0);
    argv_txt = read_file(P("%s/argv", tmpdir));
    assert_lacks(argv_txt, "--engine");
    assert_lacks(argv_txt, "--munge-socket");
    assert_lacks(argv_txt, "--hang-timeout");
    assert_lacks(argv_txt, "\n--node\n"); /* the agent reads $SLURMD_NODENAME */
    free(argv_txt);
    free(agent);
    dt_slurm_desc_clear(&d);
}

Test(batch, missing_setup_file_fails_the_job)
{
    dt_spec_t s = spec("cpu");
    dt_batch_conf_t bc = conf();
    dt_slurm_desc_t d;

    bc.setup = P("%s/no such setup.sh", tmpdir);
    make_ok(7, &s, 1, 1, NULL, &bc, &d);
    cr_assert_eq(run_script(d.script, 0, 0, 0), 1);
    char *out = read_file(P("%s/out", tmpdir));
    assert_has(out, "the setup file is not readable");
    assert_has(out, "no such setup.sh");
    cr_assert(!file_exists(P("%s/argv", tmpdir)), "srun ran without the setup");
    free(out);
    dt_slurm_desc_clear(&d);
}

Test(batch, the_warning_signal_to_the_batch_shell_reaches_srun)
{
    static const struct {
        const char *spec;
        int sig;
    } cases[] = { { NULL, SIGUSR2 }, { "USR1", SIGUSR1 }, { "USR2", SIGUSR2 } };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = spec("cpu");
        dt_batch_conf_t bc = conf();
        dt_slurm_desc_t d;
        const char *name = cases[i].sig == SIGUSR1 ? "USR1" : "USR2";

        s.signal = (char *)cases[i].spec;
        make_ok(7, &s, 2, 4, NULL, &bc, &d);
        unlink(P("%s/out", tmpdir));
        /* srun exits 75 once it has the signal: the script must keep
         * waiting through the trap and exit with srun's status, not
         * wait's 128 + the signal */
        int got = run_script(d.script, 0, cases[i].sig, DT_EXIT_REQUEUE);
        char *out = read_file(P("%s/out", tmpdir)), *marker = read_file(P("%s/got", tmpdir));
        cr_assert_str_eq(marker, P("%s\n", name), "srun got \"%s\", not %s; output:\n%s", marker,
                         name, out);
        cr_assert(!file_exists(P("%s/timeout", tmpdir)), "srun waited out its time");
        cr_assert_eq(got, DT_EXIT_REQUEUE, "exit %d; output:\n%s", got, out);
        assert_has(out, P("dt: job 7: %s received, forwarding it to srun (pid ", name));
        assert_has(out, P("agents ended with status %d", DT_EXIT_REQUEUE));
        free(marker);
        free(out);
        dt_slurm_desc_clear(&d);
    }
}

/* USR1 asked of a USR2 job (an NCCL state dump sent to the whole job, say)
 * must neither end the batch shell nor reach the agents as a warning. */
Test(batch, the_other_user_signal_neither_ends_the_job_nor_reaches_srun)
{
    static const struct {
        const char *spec;
        int sig;
    } cases[] = { { NULL, SIGUSR1 }, { "USR1", SIGUSR2 } };

    fake_wait_n = 20; /* srun ends by itself after 1 s */
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = spec("cpu");
        dt_batch_conf_t bc = conf();
        dt_slurm_desc_t d;
        const char *name = cases[i].sig == SIGUSR1 ? "USR1" : "USR2";

        s.signal = (char *)cases[i].spec;
        make_ok(7, &s, 2, 4, NULL, &bc, &d);
        unlink(P("%s/out", tmpdir));
        int got = run_script(d.script, 0, cases[i].sig, DT_EXIT_REQUEUE);
        char *out = read_file(P("%s/out", tmpdir));
        cr_assert(!file_exists(P("%s/got", tmpdir)), "srun got %s; output:\n%s", name, out);
        cr_assert(file_exists(P("%s/timeout", tmpdir)), "srun did not run to its end");
        cr_assert_eq(got, 0, "exit %d; output:\n%s", got, out);
        assert_has(out, P("dt: job 7: %s received and ignored: the warning signal is %s", name,
                          cases[i].sig == SIGUSR1 ? "USR2" : "USR1"));
        assert_has(out, "agents ended with status 0");
        free(out);
        dt_slurm_desc_clear(&d);
    }
}

/* slurm_setup may set what slurm_env did not show dt_batch_make */
Test(batch, nccl_dump_signal_set_by_the_setup_file_fails_the_job)
{
    static const struct {
        const char *value;
        int fails;
    } cases[] = { { "12", 1 }, { "0x0C", 1 }, { "10", 0 }, { "-1", 0 }, { "junk", 0 } };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = spec("cpu");
        dt_batch_conf_t bc = conf();
        dt_slurm_desc_t d;
        const char *setup = P("%s/setup.sh", tmpdir);

        write_file(setup, P("NCCL_PROXY_DUMP_SIGNAL=%s\nexport NCCL_PROXY_DUMP_SIGNAL\n",
                            cases[i].value), 0644);
        bc.setup = setup;
        make_ok(7, &s, 1, 1, NULL, &bc, &d);
        unlink(P("%s/out", tmpdir));
        unlink(P("%s/argv", tmpdir));
        int got = run_script(d.script, 0, 0, 0);
        char *out = read_file(P("%s/out", tmpdir));
        if (cases[i].fails) {
            cr_assert_eq(got, 1, "NCCL_PROXY_DUMP_SIGNAL=%s: exit %d; output:\n%s",
                         cases[i].value, got, out);
            assert_has(out, P("dt: job 7: NCCL_PROXY_DUMP_SIGNAL=%s is the job's warning signal "
                              "(USR2): NCCL would catch it; set signal = USR1 in the spec",
                              cases[i].value));
            cr_assert(!file_exists(P("%s/argv", tmpdir)), "srun ran");
        } else {
            cr_assert_eq(got, 0, "NCCL_PROXY_DUMP_SIGNAL=%s: exit %d; output:\n%s",
                         cases[i].value, got, out);
            cr_assert(file_exists(P("%s/argv", tmpdir)), "srun did not run");
        }
        free(out);
        dt_slurm_desc_clear(&d);
    }
}
