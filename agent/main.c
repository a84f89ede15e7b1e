/* SPDX-License-Identifier: MIT
 *
 * dtagentd: the node agent of one job (dtagentd(8)). main() reads as the
 * table of contents: options, log, state directory, PMIx server, link to
 * the coordinator, signals, the loop, teardown. It stays in the foreground:
 * srun (in the batch script) or `dtctl run --local` supervises it.
 *
 * Exit status: 0 when the coordinator said the job completed (or the job
 * was already over), 1 when the job ended otherwise or the agent failed,
 * 2 for bad options.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/conf.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/mem.h"
#include "common/path.h"

int64_t dt_agent_mono_ms(void)
{
    return dt_clock_mono_ms();
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dtagentd --coord unix:PATH|HOST:PORT --job ID [--node NAME] [--slots N]\n"
               "                [--state-dir DIR] [--engine PATH] [--munge-socket PATH]\n"
               "                [--hang-timeout DUR] [--start-timeout DUR] [--grace DUR]\n"
               "                [--signal USR1|USR2]\n"
               "                [--log-level LEVEL]\n"
               "                [-v] [-h]\n");
}

static void closed_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void dt_agent_stop(dt_agent_t *ag, int code)
{
    if (!ag->stopping) {
        ag->stopping = 1;
        ag->exit_code = code;
        uv_signal_stop(&ag->sig_term);
        uv_signal_stop(&ag->sig_int);
        uv_signal_stop(&ag->sig_usr[0]);
        uv_signal_stop(&ag->sig_usr[1]);
        if (dt_task_terminate(ag))
            return; /* back here from gen_maybe_ended when they are gone */
    }
    for (int i = 0; i < ag->nworkers; i++)
        if (ag->workers[i].proc_open || ag->workers[i].chan_open)
            return;
    dt_link_close(ag);
    dt_task_close(ag);
    uv_walk(ag->loop, closed_walk, NULL);
}

static void on_signal(uv_signal_t *s, int sig)
{
    dt_agent_t *ag = s->loop->data;
    dt_log_info("signal %d: stopping the workers and exiting", sig);
    dt_agent_stop(ag, 1);
}

/* Slurm's warning before the time limit or a preemption (the batch
 * script forwards its --signal=B:SIG through srun; SIG is --signal): the
 * coordinator decides, checkpointing the job and requeueing it. The other
 * user signal is not the job's (an NCCL dump asked of the whole step):
 * noted, not fatal. */
static void on_usr(uv_signal_t *s, int sig)
{
    dt_agent_t *ag = s->loop->data;
    const char *name = sig == SIGUSR1 ? "USR1" : "USR2";

    if (sig != ag->warn_signal) {
        dt_log_info("job=%lld SIG%s ignored: the job's warning signal is SIG%s", (long long)ag->job,
                    name, ag->warn_signal == SIGUSR1 ? "USR1" : "USR2");
        return;
    }
    dt_log_info("job=%lld SIG%s (Slurm's time limit or preemption warning): asking the "
                "coordinator for a checkpoint and a requeue", (long long)ag->job, name);
    dt_link_send_reliable(ag, DT_MSG_PREEMPT, json_pack("{s:s}", "signal", name));
}

static int64_t env_int(const char *name)
{
    const char *v = getenv(name);
    char *end;
    long long x = v ? strtoll(v, &end, 10) : 0;
    return v && *v && *end == '\0' && x > 0 ? x : 0;
}

/* dtengine next to this program (build tree: ../engine/dtengine; installed:
 * the bin directory beside sbin), else found in PATH by uv_spawn. */
static char *find_engine(void)
{
    static const char *const rel[] = { "../engine/dtengine", "../bin/dtengine", "dtengine" };
    char *dir = dt_path_self_dir();
    char *p = dt_path_beside(dir, rel, DT_ARRAY_SIZE(rel), 0);

    free(dir);
    return p ? p : dt_xstrdup("dtengine");
}

/* The state directory must be ours and closed to others: in /tmp another
 * user could have made /tmp/dtagentd-UID first. Checks DIR, and with the
 * default (in_tmp) its parent /tmp/dtagentd-UID too. */
static int own_dir(int in_tmp, const char *dir, dt_emsg_t *em)
{
    char *parent = in_tmp ? dt_xasprintf("/tmp/dtagentd-%u", (unsigned)getuid()) : NULL;
    const char *check[2] = { dir, parent };
    int rc = 0;

    for (int i = 0; i < 2 && rc == 0 && check[i]; i++) {
        struct stat st;
        if (lstat(check[i], &st) < 0)
            rc = dt_emsg_set(em, dt_err_errno(errno), "%s: %s", check[i], strerror(errno));
        else if (!S_ISDIR(st.st_mode) || st.st_uid != getuid())
            rc = dt_emsg_set(em, DT_EPERM, "%s is not a directory of uid %u (someone else made "
                             "it?)", check[i], (unsigned)getuid());
        else if ((st.st_mode & 022) != 0)
            rc = dt_emsg_set(em, DT_EPERM, "%s is writable by others (mode %o)", check[i],
                             (unsigned)(st.st_mode & 07777));
    }
    free(parent);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        { "coord", 1, NULL, 'c' },        { "job", 1, NULL, 'j' },
        { "node", 1, NULL, 'n' },         { "slots", 1, NULL, 's' },
        { "state-dir", 1, NULL, 'd' },    { "engine", 1, NULL, 'e' },
        { "munge-socket", 1, NULL, 'm' }, { "hang-timeout", 1, NULL, 'H' },
        { "grace", 1, NULL, 'g' },        { "log-level", 1, NULL, 'l' },
        { "signal", 1, NULL, 'S' },       { "start-timeout", 1, NULL, 'T' },
        { "version", 0, NULL, 'v' },      { "help", 0, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    dt_agent_t ag = { .slots = 1, .hang_ms = 60000, .start_ms = 300000, .grace_ms = 5000,
                      .warn_signal = SIGUSR1 };
    enum dt_log_level level = DT_LOG_INFO;
    char host[256] = "localhost", *engine = NULL, *state_dir = NULL;
    dt_emsg_t em = { "" };
    int64_t v;
    int c, rc;

    dt_log_init("dtagentd", DT_LOG_INFO);
    gethostname(host, sizeof(host) - 1);
    /* under srun the node is Slurm's name for it (several slurmd may share
     * a host), else the host name */
    ag.node = getenv("SLURMD_NODENAME") && *getenv("SLURMD_NODENAME") ? getenv("SLURMD_NODENAME")
                                                                       : host;
    ag.slurm_id = env_int("SLURM_JOB_ID");
    ag.slurm_restart = env_int("SLURM_RESTART_COUNT");
    while ((c = getopt_long(argc, argv, "vh", lo, NULL)) != -1) {
        rc = 0;
        switch (c) {
        case 'c': ag.coord = optarg; break;
        case 'j': rc = dt_conf_parse_int(optarg, 1, INT64_MAX, &ag.job); break;
        case 'n': ag.node = optarg; break;
        case 's': rc = dt_conf_parse_int(optarg, 1, 1 << 16, &v), ag.slots = (int)v; break;
        case 'd': ag.state_dir = optarg; break;
        case 'e': ag.engine = optarg; break;
        case 'm': ag.munge_socket = optarg; break;
        case 'H': rc = dt_conf_parse_duration(optarg, &ag.hang_ms); break;
        case 'T': rc = dt_conf_parse_duration(optarg, &ag.start_ms); break;
        case 'g': rc = dt_conf_parse_duration(optarg, &ag.grace_ms); break;
        case 'l': rc = dt_log_parse_level(optarg, &level); break;
        case 'S':
            ag.warn_signal = strcmp(optarg, "USR1") == 0   ? SIGUSR1
                             : strcmp(optarg, "USR2") == 0 ? SIGUSR2
                                                           : 0;
            rc = ag.warn_signal ? 0 : DT_EINVAL;
            break;
        case 'v': printf("dtagentd %s\n", PACKAGE_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (rc < 0) {
            const char *name = "?";
            for (const struct option *o = lo; o->name; o++)
                if (o->val == c)
                    name = o->name;
            fprintf(stderr, "dtagentd: --%s '%s': not a valid value\n", name, optarg);
            return 2;
        }
    }
    if (optind < argc || ag.coord == NULL || ag.job == 0) {
        fprintf(stderr, "dtagentd: %s\n", optind < argc ? "unexpected argument"
                                                        : "--coord and --job are required");
        usage(stderr);
        return 2;
    }
    if (*ag.node == '\0' || strlen(ag.node) > 255 || strchr(ag.node, ',')) {
        fprintf(stderr, "dtagentd: --node '%s': 1 to 255 characters, no commas\n", ag.node);
        return 2;
    }
    if (ag.hang_ms < 100 || ag.grace_ms < 0) {
        fprintf(stderr, "dtagentd: --hang-timeout must be at least 100ms\n");
        return 2;
    }
    dt_log_set_level(level);
    dt_log_set_timestamps(1);
    char tag[300];
    snprintf(tag, sizeof(tag), "node=%s", ag.node);
    dt_log_set_tag(tag);

    /* what the agent and its workers create is the job owner's alone
     * (checkpoints, rank logs, the PMIx rendezvous): dtagentd(8) */
    umask(077);
    /* state directory: generations' files, the PMIx server's rendezvous */
    if (ag.state_dir == NULL)
        ag.state_dir = state_dir = dt_xasprintf("/tmp/dtagentd-%u/%lld-%s", (unsigned)getuid(),
                                                (long long)ag.job, ag.node);
    if ((rc = dt_mkdirs(ag.state_dir, 0700)) < 0)
        dt_emsg_set(&em, rc, "%s", strerror(-rc));
    else
        rc = own_dir(state_dir != NULL, ag.state_dir, &em);
    if (rc < 0) {
        fprintf(stderr, "dtagentd: state directory %s: %s\n", ag.state_dir, em.s);
        free(state_dir);
        return 1;
    }
    if (ag.engine == NULL)
        ag.engine = engine = find_engine();

    signal(SIGPIPE, SIG_IGN); /* children get the default back from uv_spawn */
    srand((unsigned)(getpid() ^ (unsigned)time(NULL)));
    ag.loop = uv_default_loop();
    ag.loop->data = &ag;

    if ((rc = dt_task_init(&ag, &em)) < 0) {
        dt_log_error("PMIx server: %s", em.s);
        free(engine);
        free(state_dir);
        return 1;
    }
    dt_link_start(&ag);
    uv_signal_init(ag.loop, &ag.sig_term);
    uv_signal_init(ag.loop, &ag.sig_int);
    uv_signal_start(&ag.sig_term, on_signal, SIGTERM);
    uv_signal_start(&ag.sig_int, on_signal, SIGINT);
    uv_signal_init(ag.loop, &ag.sig_usr[0]);
    uv_signal_start(&ag.sig_usr[0], on_usr, SIGUSR1);
    uv_signal_init(ag.loop, &ag.sig_usr[1]);
    uv_signal_start(&ag.sig_usr[1], on_usr, SIGUSR2);
    dt_log_info("job=%lld node=%s slots=%d coord=%s engine=%s state=%s started",
                (long long)ag.job, ag.node, ag.slots, ag.coord, ag.engine, ag.state_dir);

    uv_run(ag.loop, UV_RUN_DEFAULT);

    uv_loop_close(ag.loop);
    free(ag.rbuf);
    free(engine);
    free(state_dir);
    if (dt_pmix_abandoned()) {
        /* libpmix's threads may hold its locks: no exit handlers */
        dt_log_info("exiting with status %d (libpmix left running)", ag.exit_code);
        fflush(NULL);
        _exit(ag.exit_code);
    }
    dt_log_info("exiting with status %d", ag.exit_code);
    return ag.exit_code;
}
