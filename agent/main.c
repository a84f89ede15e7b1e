/* SPDX-License-Identifier: MIT
 *
 * dtagentd: the node agent of one job (dtagentd(8)). main() reads as the
 * table of contents: options, log, state directory, PMIx server, link to
 * the coordinator, signals, the loop, teardown. It stays in the foreground:
 * srun (in the batch script) or `dtctl run --local` supervises it.
 *
 * This file also wires the modules together, and is the only one that
 * calls them by name: link.c (the coordinator link) gets the table of
 * handlers for what the coordinator pushes; task.c (workers, with pmix.c)
 * and files.c (checkpoint files) get the hooks of hooks.h. None of them
 * calls another, or back into this file, by name. The agent's lifecycle
 * (stopping, the exit status) is decided here.
 *
 * Exit status: 0 when the coordinator said the job completed (or the job
 * was already over), 1 when the job ended otherwise or the agent failed,
 * 2 for bad options.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/files.h"
#include "agent/gpus.h"
#include "agent/hooks.h"
#include "agent/link.h"
#include "agent/pmix.h"
#include "agent/task.h"
#include "common/conf.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/mem.h"
#include "common/path.h"
#include "common/wire.h"

/* dtagentd's one context, reached through loop->data (signals) and the
 * hooks' ud; touched by the loop thread only. The agent is one per node
 * per job: it registers with the coordinator, heartbeats, and runs the
 * ranks the coordinator places on it, one generation at a time; it keeps
 * them running while the coordinator is away and re-registers (with the
 * generation it runs) when it is back. */
/* How long dtengine devices may take before the node counts as having no
 * GPU: a CUDA runtime and driver start in well under a second. */
#define GPU_PROBE_MS 30000

typedef struct dt_agentd {
    uv_loop_t *loop;
    dt_link_conf_t link_conf;
    dt_task_conf_t task_conf;
    dt_link_t *link;
    dt_task_t *task;
    dt_agentd_hooks_t up;    /* given to task and files */
    uv_signal_t sig_term, sig_int;
    uv_signal_t sig_usr[2];  /* USR1, USR2: the one that is warn_signal warns */
    int warn_signal;         /* --signal: Slurm's warning signal (default SIGUSR1) */
    int stopping;
    int exit_code;
    dt_gpus_t gpus;          /* the node's, from dtengine devices */
} dt_agentd_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: dtagentd --coord unix:PATH|HOST:PORT --job ID [--node NAME] [--slots N]\n"
               "                [--state-dir DIR] [--engine PATH] [--munge-socket PATH]\n"
               "                [--peer-listen IP:PORT|none]\n"
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

/* End the agent with this exit code once the workers are gone: SIGTERM
 * them, SIGKILL after the grace period; called again (workers_gone) until
 * their handles have closed, then the link and the rest close and the loop
 * ends. */
static void agent_stop(dt_agentd_t *ag, int code)
{
    if (!ag->stopping) {
        ag->stopping = 1;
        ag->exit_code = code;
        uv_signal_stop(&ag->sig_term);
        uv_signal_stop(&ag->sig_int);
        uv_signal_stop(&ag->sig_usr[0]);
        uv_signal_stop(&ag->sig_usr[1]);
        if (dt_task_terminate(ag->task))
            return; /* back here from workers_gone when they are gone */
    }
    if (dt_task_busy(ag->task))
        return;
    if (ag->link)
        dt_link_close(ag->link);
    dt_task_close(ag->task);
    uv_walk(ag->loop, closed_walk, NULL);
}

/*-- hooks: what task.c and files.c may ask ------------------------------------*/

static void up_send(void *ud, uint16_t type, json_t *body)
{
    dt_agentd_t *ag = ud;
    dt_link_send(ag->link, type, body);
}

static void up_send_reliable(void *ud, uint16_t type, json_t *body)
{
    dt_agentd_t *ag = ud;
    dt_link_send_reliable(ag->link, type, body);
}

static void up_send_fence(void *ud, uint32_t gen, uint32_t seq, json_t *body)
{
    dt_agentd_t *ag = ud;
    dt_link_send_fence(ag->link, gen, seq, body);
}

static int64_t up_agent_id(void *ud)
{
    dt_agentd_t *ag = ud;
    return ag->link ? dt_link_agent_id(ag->link) : 0;
}

static int up_stopping(void *ud)
{
    dt_agentd_t *ag = ud;
    return ag->stopping;
}

static void up_workers_gone(void *ud)
{
    dt_agentd_t *ag = ud;
    if (ag->stopping)
        agent_stop(ag, ag->exit_code);
}

/*-- the link's handler table: what the coordinator pushes --------------------*/

/* Each decodes the push (common/wire.h); one that does not decode is the
 * coordinator's bug or not the coordinator: logged and ignored. */
static bool decoded(const dt_msg_t *m, int rc, const dt_emsg_t *em)
{
    if (rc < 0)
        dt_log_error("coordinator sent a bad %s: %s: ignored", dt_msg_type_name(m->type), em->s);
    return rc >= 0;
}

static void on_gen_start(void *ud, const dt_msg_t *m)
{
    dt_wire_gen_start_t gs;
    dt_emsg_t em = { "" };

    if (decoded(m, dt_wire_gen_start_decode(m, &gs, &em), &em))
        dt_task_gen_start(((dt_agentd_t *)ud)->task, &gs);
    dt_wire_gen_start_clear(&gs);
}

static void on_gen_abort(void *ud, const dt_msg_t *m)
{
    dt_wire_gen_abort_t ga;
    dt_emsg_t em = { "" };

    if (decoded(m, dt_wire_gen_abort_decode(m, &ga, &em), &em))
        dt_task_gen_abort(((dt_agentd_t *)ud)->task, &ga);
}

static void on_fence_done(void *ud, const dt_msg_t *m)
{
    dt_wire_fence_done_t fd;
    dt_emsg_t em = { "" };

    if (decoded(m, dt_wire_fence_done_decode(m, &fd, &em), &em))
        dt_task_fence_done(((dt_agentd_t *)ud)->task, &fd);
}

static void on_ckpt_request(void *ud, const dt_msg_t *m)
{
    dt_wire_gen_ref_t g;
    dt_emsg_t em = { "" };

    if (decoded(m, dt_wire_ckpt_request_decode(m, &g, &em), &em))
        dt_task_ckpt_request(((dt_agentd_t *)ud)->task, g.gen);
}

static void on_ckpt_commit(void *ud, const dt_msg_t *m)
{
    dt_agentd_t *ag = ud;
    dt_wire_ckpt_commit_t cm;
    dt_emsg_t em = { "" };

    if (decoded(m, dt_wire_ckpt_commit_decode(m, &cm, &em), &em))
        dt_files_commit(ag->loop, &ag->up, &cm);
}

static void on_ckpt_prune(void *ud, const dt_msg_t *m)
{
    dt_agentd_t *ag = ud;
    dt_wire_ckpt_prune_t pr;
    dt_emsg_t em = { "" };

    if (decoded(m, dt_wire_ckpt_prune_decode(m, &pr, &em), &em))
        dt_files_prune(ag->loop, &ag->up, &pr);
    dt_wire_ckpt_prune_clear(&pr);
}

static void on_stop(void *ud, const dt_msg_t *m)
{
    dt_wire_stop_t st;
    dt_emsg_t em = { "" };

    if (decoded(m, dt_wire_stop_decode(m, &st, &em), &em))
        dt_task_stop(((dt_agentd_t *)ud)->task, &st);
}

static void on_job_end(void *ud, const dt_msg_t *m)
{
    dt_agentd_t *ag = ud;
    dt_wire_job_end_t je;
    dt_emsg_t em = { "" };
    /* a JOB_END that does not decode still ends the job here: failed */
    const char *st = decoded(m, dt_wire_job_end_decode(m, &je, &em), &em) ? je.state : NULL;

    dt_log_info("job=%lld ended: %s", (long long)ag->link_conf.job, st ? st : "?");
    /* the exit status is the batch script's under Slurm: dtagentd(8) */
    agent_stop(ag, st && strcmp(st, "completed") == 0   ? 0
                   : st && strcmp(st, "requeued") == 0 ? DT_EXIT_REQUEUE
                                                       : 1);
}

static const dt_link_handler_t handlers[] = {
    { .type = DT_MSG_GEN_START, .fn = on_gen_start },
    { .type = DT_MSG_GEN_ABORT, .fn = on_gen_abort },
    { .type = DT_MSG_FENCE_DONE, .fn = on_fence_done },
    { .type = DT_MSG_CKPT_REQUEST, .fn = on_ckpt_request },
    { .type = DT_MSG_CKPT_COMMIT, .fn = on_ckpt_commit },
    { .type = DT_MSG_CKPT_PRUNE, .fn = on_ckpt_prune },
    { .type = DT_MSG_STOP, .fn = on_stop },
    { .type = DT_MSG_JOB_END, .fn = on_job_end },
};

static void link_status(void *ud, dt_wire_register_t *reg)
{
    dt_agentd_t *ag = ud;
    dt_task_status(ag->task, reg);
}

/* The job is over (DT_ESTATE) or not ours: nothing to wait for. */
static void link_refused(void *ud, int code)
{
    agent_stop(ud, code == DT_ESTATE ? 0 : 1);
}

static void on_signal(uv_signal_t *s, int sig)
{
    dt_agentd_t *ag = s->loop->data;
    dt_log_info("signal %d: stopping the workers and exiting", sig);
    agent_stop(ag, 1);
}

/* Slurm's warning before the time limit or a preemption (the batch
 * script forwards its --signal=B:SIG through srun; SIG is --signal): the
 * coordinator decides, checkpointing the job and requeueing it. The other
 * user signal is not the job's (an NCCL dump asked of the whole step):
 * noted, not fatal. */
static void on_usr(uv_signal_t *s, int sig)
{
    dt_agentd_t *ag = s->loop->data;
    const char *name = sig == SIGUSR1 ? "USR1" : "USR2";

    if (sig != ag->warn_signal) {
        dt_log_info("job=%lld SIG%s ignored: the job's warning signal is SIG%s",
                    (long long)ag->link_conf.job,
                    name, ag->warn_signal == SIGUSR1 ? "USR1" : "USR2");
        return;
    }
    dt_log_info("job=%lld SIG%s (Slurm's time limit or preemption warning): asking the "
                "coordinator for a checkpoint and a requeue",
                (long long)ag->link_conf.job, name);
    dt_wire_preempt_t p = { .agent = dt_link_agent_id(ag->link), .signal = name };
    dt_link_send_reliable(ag->link, DT_MSG_PREEMPT, dt_wire_preempt_encode(&p));
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

#define LOCK_WAIT_MS 30000 /* for the agent before us in this state directory to exit */

/* The state directory is this agent's while it lives (a lock held to its
 * exit, never inherited): an agent of the job's previous run on this node
 * (a Slurm requeue starts the next at once) is waited for while it exits,
 * since its PMIx server removes its files as it ends; then the generation
 * directories an agent killed before it could remove them go. */
static void clear_dead_gens(const char *dir)
{
    char *lock = dt_xasprintf("%s/agent.lock", dir);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600), n = 0, held = 1;
    dt_emsg_t em = { "" };

    for (int waited = 0; fd >= 0 && (held = flock(fd, LOCK_EX | LOCK_NB) < 0) &&
                         errno == EWOULDBLOCK && waited < LOCK_WAIT_MS;
         waited += 100) {
        if (waited == 0)
            dt_log_info("%s: held by another agent: waiting up to %d s for it to exit", lock,
                        LOCK_WAIT_MS / 1000);
        struct timespec ts = { 0, 100 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    if (fd < 0) {
        dt_log_warn("%s: %s: generation directories of dead agents left", lock,
                    strerror(errno));
    } else if (held) {
        dt_log_warn("%s: held by another live agent: its generation directories left", lock);
        close(fd);
    } else if (dt_gen_dirs_remove(dir, &n, &em) < 0) {
        dt_log_warn("%s", em.s);
    } else if (n > 0) {
        dt_log_info("removed %d generation director%s a dead agent left in %s", n,
                    n == 1 ? "y" : "ies", dir);
    }
    /* fd stays open (the lock) until the agent exits */
    free(lock);
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
        { "peer-listen", 1, NULL, 'P' },
        { "version", 0, NULL, 'v' },      { "help", 0, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    dt_agentd_t ag = {
        .link_conf = { .slots = 1 },
        .task_conf = { .hang_ms = 60000, .start_ms = 300000, .grace_ms = 5000 },
        .warn_signal = SIGUSR1,
    };
    dt_link_conf_t *lc = &ag.link_conf;
    dt_task_conf_t *tc = &ag.task_conf;
    enum dt_log_level level = DT_LOG_INFO;
    char host[256] = "localhost", *engine = NULL, *state_dir = NULL;
    dt_emsg_t em = { "" };
    int64_t v;
    int c, rc;

    dt_log_init("dtagentd", DT_LOG_INFO);
    gethostname(host, sizeof(host) - 1);
    /* under srun the node is Slurm's name for it (several slurmd may share
     * a host), else the host name */
    lc->node = getenv("SLURMD_NODENAME") && *getenv("SLURMD_NODENAME") ? getenv("SLURMD_NODENAME")
                                                                       : host;
    lc->slurm_id = env_int("SLURM_JOB_ID");
    lc->slurm_restart = env_int("SLURM_RESTART_COUNT");
    while ((c = getopt_long(argc, argv, "vh", lo, NULL)) != -1) {
        rc = 0;
        switch (c) {
        case 'c': lc->coord = optarg; break;
        case 'j': rc = dt_conf_parse_int(optarg, 1, INT64_MAX, &lc->job); break;
        case 'n': lc->node = optarg; break;
        case 's': rc = dt_conf_parse_int(optarg, 1, 1 << 16, &v), lc->slots = (int)v; break;
        case 'd': tc->state_dir = optarg; break;
        case 'e': tc->engine = optarg; break;
        case 'm': lc->munge_socket = optarg; break;
        case 'P': tc->peer_listen = optarg; break;
        case 'H': rc = dt_conf_parse_duration(optarg, &tc->hang_ms); break;
        case 'T': rc = dt_conf_parse_duration(optarg, &tc->start_ms); break;
        case 'g': rc = dt_conf_parse_duration(optarg, &tc->grace_ms); break;
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
    if (optind < argc || lc->coord == NULL || lc->job == 0) {
        fprintf(stderr, "dtagentd: %s\n", optind < argc ? "unexpected argument"
                                                        : "--coord and --job are required");
        usage(stderr);
        return 2;
    }
    if (*lc->node == '\0' || strlen(lc->node) > 255 || strchr(lc->node, ',')) {
        fprintf(stderr, "dtagentd: --node '%s': 1 to 255 characters, no commas\n", lc->node);
        return 2;
    }
    if (tc->hang_ms < 100 || tc->grace_ms < 0) {
        fprintf(stderr, "dtagentd: --hang-timeout must be at least 100ms\n");
        return 2;
    }
    dt_log_set_level(level);
    dt_log_set_timestamps(1);
    char tag[300];
    snprintf(tag, sizeof(tag), "node=%s", lc->node);
    dt_log_set_tag(tag);

    /* what the agent and its workers create is the job owner's alone
     * (checkpoints, rank logs, the PMIx rendezvous): dtagentd(8) */
    umask(077);
    /* state directory: generations' files, the PMIx server's rendezvous */
    if (tc->state_dir == NULL)
        tc->state_dir = state_dir = dt_xasprintf("/tmp/dtagentd-%u/%lld-%s", (unsigned)getuid(),
                                                (long long)lc->job, lc->node);
    if ((rc = dt_mkdirs(tc->state_dir, 0700)) < 0)
        dt_emsg_set(&em, rc, "%s", strerror(-rc));
    else
        rc = own_dir(state_dir != NULL, tc->state_dir, &em);
    if (rc < 0) {
        fprintf(stderr, "dtagentd: state directory %s: %s\n", tc->state_dir, em.s);
        free(state_dir);
        return 1;
    }
    /* the peer channel (replicas): a Unix socket in the state directory
     * when the coordinator is on this host (a Unix socket too: the agents
     * are), else TCP on every interface, announced by node name */
    static char peer_sock[4200]; /* lives as long as the agent: no path to free it on */
    if (tc->peer_listen == NULL) {
        snprintf(peer_sock, sizeof(peer_sock), "unix:%s/peer.sock", tc->state_dir);
        tc->peer_listen = strncmp(lc->coord, "unix:", 5) == 0 ? peer_sock : "0.0.0.0:0";
    }
    else if (strcmp(tc->peer_listen, "none") == 0)
        tc->peer_listen = NULL;
    tc->munge_socket = lc->munge_socket;
    clear_dead_gens(tc->state_dir);
    if (tc->engine == NULL)
        tc->engine = engine = find_engine();
    /* the node's GPUs, as the engine sees them: registered, and a cuda
     * generation's workers take one each */
    dt_gpus_probe(tc->engine, GPU_PROBE_MS, &ag.gpus);
    tc->gpus = lc->gpus = &ag.gpus;

    signal(SIGPIPE, SIG_IGN); /* children get the default back from uv_spawn */
    srand((unsigned)(getpid() ^ (unsigned)time(NULL)));
    ag.loop = uv_default_loop();
    ag.loop->data = &ag;

    /* signals before the workers can exist: an agent that could not be
     * told to stop would leave them behind */
    const struct {
        uv_signal_t *h;
        uv_signal_cb cb;
        int sig;
    } sigs[] = {
        { .h = &ag.sig_term, .cb = on_signal, .sig = SIGTERM },
        { .h = &ag.sig_int, .cb = on_signal, .sig = SIGINT },
        { .h = &ag.sig_usr[0], .cb = on_usr, .sig = SIGUSR1 },
        { .h = &ag.sig_usr[1], .cb = on_usr, .sig = SIGUSR2 },
    };
    for (size_t i = 0; i < DT_ARRAY_SIZE(sigs); i++)
        if ((rc = uv_signal_init(ag.loop, sigs[i].h)) < 0 ||
            (rc = uv_signal_start(sigs[i].h, sigs[i].cb, sigs[i].sig)) < 0) {
            dt_log_error("signal %d: %s", sigs[i].sig, uv_strerror(rc));
            free(engine);
            free(state_dir);
            dt_gpus_free(&ag.gpus);
            return 1;
        }

    /* the modules, wired: task and files reach the link through ag.up,
     * the link reaches them through its handler table */
    tc->node = lc->node;
    tc->job = lc->job;
    ag.up = (dt_agentd_hooks_t){
        .ud = &ag,
        .send = up_send,
        .send_reliable = up_send_reliable,
        .send_fence = up_send_fence,
        .agent_id = up_agent_id,
        .stopping = up_stopping,
        .workers_gone = up_workers_gone,
    };
    if ((rc = dt_task_new(ag.loop, tc, &ag.up, &ag.task, &em)) < 0) {
        dt_log_error("PMIx server: %s", em.s);
        free(engine);
        free(state_dir);
        dt_gpus_free(&ag.gpus);
        return 1;
    }
    const dt_link_hooks_t link_hooks = {
        .ud = &ag,
        .handlers = handlers,
        .nhandlers = DT_ARRAY_SIZE(handlers),
        .status = link_status,
        .refused = link_refused,
        .stopping = up_stopping,
    };
    ag.link = dt_link_new(ag.loop, lc, &link_hooks);
    char gpus[320];
    if (ag.gpus.n)
        snprintf(gpus, sizeof(gpus), "%d", ag.gpus.n);
    else
        snprintf(gpus, sizeof(gpus), "0 (%s)", ag.gpus.why);
    dt_log_info("job=%lld node=%s slots=%d gpus=%s coord=%s engine=%s state=%s started",
                (long long)lc->job, lc->node, lc->slots, gpus, lc->coord, tc->engine,
                tc->state_dir);

    uv_run(ag.loop, UV_RUN_DEFAULT);

    uv_loop_close(ag.loop);
    if (dt_pmix_abandoned()) {
        /* libpmix's threads may hold its locks: no exit handlers */
        dt_log_info("exiting with status %d (libpmix left running)", ag.exit_code);
        fflush(NULL);
        _exit(ag.exit_code);
    }
    dt_link_free(ag.link);
    dt_task_free(ag.task);
    free(engine);
    free(state_dir);
    dt_gpus_free(&ag.gpus);
    dt_log_info("exiting with status %d", ag.exit_code);
    return ag.exit_code;
}
