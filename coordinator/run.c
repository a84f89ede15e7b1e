/* SPDX-License-Identifier: MIT
 *
 * Generations of a job's workers on its agents (run.h). One jobrun_t per
 * job that has agents: the in-memory view of the current generation
 * (placement, the rank table and per-rank progress, the agents still to
 * report its end), its start on the live agents, the workers' exits, the
 * planned stop, the job's end, and the reload after a coordinator
 * restart. The database has the durable record: job state and events,
 * generations and ranks.
 *
 * A run also holds its checkpoints' state and its fences in flight; the
 * agents' reports about those come here first (the job's run found, a
 * fence's generation checked) and are handed to commit.c and fence.c,
 * which call nothing of this file. Messages to the agents go out through
 * push.c.
 *
 * Faults (a worker's failure, an agent lost or restarted, a generation
 * that no longer fits, the end of a planned stop) are reported up through
 * the coordinator's hooks; the recovery policy (recovery.c) decides and
 * calls back the primitives at the end of this file.
 *
 * Not here: the wire handling of each message (agent_req.c checks the
 * sender and the fields), the checkpoints' verification, commit and
 * pruning (commit.c), the fences' relay (fence.c), every recovery decision
 * (recovery.c), Slurm (alloc.c).
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/text.h"
#include "coordinator/commit.h"
#include "coordinator/fence.h"
#include "coordinator/goodput.h"
#include "coordinator/jobdir.h"
#include "coordinator/push.h"
#include "coordinator/recovery.h"
#include "coordinator/run.h"
#include "db/db.h"
#include "spec/spec.h"

/* A generation is aborting: what was sent, who has answered. */
enum phase {
    PH_WAITING = DT_GEN_WAITING,
    PH_STARTING = DT_GEN_STARTING,
    PH_RUNNING = DT_GEN_RUNNING,
    PH_ABORTING = DT_GEN_ABORTING,
    PH_STOPPING = DT_GEN_STOPPING,
    PH_DONE = DT_GEN_DONE,
};

#define ABORT_TIMEOUT_MS 30000 /* agents that never report the end are lost */
#define STOP_TIMEOUT_MS 600000 /* a planned stop (checkpoint first) that never ends */

typedef struct rank_info {
    int64_t agent, pid, step, steps, tokens;
    double loss, tokens_s, acc;
    int reported, exited, ok;
    const char *state; /* starting running exited failed hung killed lost */
} rank_info_t;

/* A worker's failure as its agent reported it. */
typedef struct worker_failure {
    int rank;
    int64_t agent;
    int64_t status, sig, step; /* status -1: none (the hold is empty) */
    int hung, stopped;
    char node[256];
    char err[300];  /* escaped (common/text.h) */
    char gpu[72];   /* the GPU's UUID (cuda), or "" */
} worker_failure_t;

#define HOLD_MS 2000 /* how long an agreed failure waits for its reason */

typedef struct dt_jobrun {
    int64_t job;
    char *spec_text;
    dt_spec_t spec;
    int R0;                 /* ranks of the plan: its workers (dp x ranks per ring) */
    int R;                  /* ranks of the current (or next) generation, all rings */
    int gen;
    enum phase phase;
    int64_t *agent_of;      /* [R] */
    rank_info_t *ranks;     /* [R] */
    int64_t *gen_agents;    /* distinct agents of the generation */
    char **gen_nodes;       /* [ngen] their node names */
    int *ended;             /* [ngen] GEN_ENDED (or lost) */
    int ngen;
    int nok;
    struct dt_fence *fences; /* in flight (fence.h) */
    char *job_dir;          /* JOBS_DIR/ID, the owner's; NULL when it could not be made */
    char *out_dir;          /* attn and prefill outputs; NULL as ck.root */
    char *dir_error;
    dt_commit_t ck;         /* its checkpoints (commit.h); ck.root NULL: why in dir_error */
    int64_t ckpt_every;
    int64_t resume_step;
    dt_fail_log_t fails;    /* failures seen, for the deterministic rule */
    worker_failure_t held;  /* a failure waiting for the report with its words */
    int64_t held_ms;
    char *lost_nodes;       /* nodes whose agents were lost ("a,b"), for a Slurm requeue */
    int stop_requeue;       /* the planned stop ends in a requeue, not a cancel */
    int64_t abort_ms;
    json_t *result;
    char *pending_reason;   /* why the generation is being aborted */
    dt_goodput_run_t gp;    /* its step history and failure costs (goodput.h) */
    int64_t bad_ms;         /* the generation's first sign of failure (wall ms), 0 none */
    char resumed[64];       /* "resumed step N from disk" once its ranks run; "" for none */
    int64_t mem_every;      /* the plan's mem_ckpt_every: 0, no in-memory checkpoints */
    struct memcopy {
        int64_t step, agent;
        int64_t pid; /* the agent process that holds it: a restarted agent holds none */
    } (*mem)[4];            /* [mem_R]: per rank the two newest in-memory checkpoints its
                             * own agent holds ([0], [1]) and the two newest replicas
                             * another agent holds ([2], [3]); step 0: none */
    int rep_failed_gen;     /* the generation whose replica failure was an event */
    int mem_R;
    int resumed_mem;        /* the current generation resumed from memory */
    const char *bad_what;   /* what it was: "worker", "agent", ...; NULL none */
    struct dt_jobrun *next;
} jobrun_t;

/*-- small helpers ---------------------------------------------------------------*/

static int transition(dt_coord_t *c, int64_t job, enum dt_job_state to, const char *kind,
                      const char *detail)
{
    dt_emsg_t em = { "" };
    int rc = dt_db_job_transition(c->db, job, to, kind, detail, &em);
    if (rc < 0)
        dt_log_error("job=%lld -> %s: %s", (long long)job, dt_job_state_name(to), em.s);
    return rc;
}

/* A rank's state in the database: shown by dtctl and read back after a
 * coordinator restart (only its agent, written by dt_db_gen_begin,
 * matters then). Not recorded: logged, the generation goes on. */
static void rank_record(dt_coord_t *c, jobrun_t *r, int rank)
{
    dt_emsg_t em = { "" };
    rank_info_t *ri = &r->ranks[rank];

    if (dt_db_rank_set(c->db, r->job, r->gen, rank, ri->state, ri->step, ri->pid, &em) < 0)
        dt_log_error("job=%lld gen=%d rank=%d %s: %s", (long long)r->job, r->gen, rank,
                     ri->state, em.s);
}

static jobrun_t *run_find(dt_coord_t *c, int64_t job)
{
    for (jobrun_t *r = c->runs; r; r = r->next)
        if (r->job == job)
            return r;
    return NULL;
}

static void gen_clear(jobrun_t *r)
{
    r->held.status = -1;
    for (int i = 0; r->gen_nodes && i < r->ngen; i++)
        free(r->gen_nodes[i]);
    free(r->gen_nodes);
    r->gen_nodes = NULL;
    free(r->agent_of);
    free(r->ranks);
    free(r->gen_agents);
    free(r->ended);
    r->agent_of = NULL;
    r->ranks = NULL;
    r->gen_agents = NULL;
    r->ended = NULL;
    r->ngen = 0;
    r->nok = 0;
    dt_fence_clear(&r->fences);
}

static void run_free(jobrun_t *r)
{
    gen_clear(r);
    dt_spec_free(&r->spec);
    free(r->spec_text);
    free(r->ck.root);
    free(r->out_dir);
    free(r->job_dir);
    free(r->dir_error);
    free(r->pending_reason);
    free(r->lost_nodes);
    free(r->mem);
    json_decref(r->result);
    free(r);
}

static jobrun_t *run_get(dt_coord_t *c, int64_t job)
{
    jobrun_t *r = run_find(c, job);
    dt_emsg_t em = { "" };
    dt_job_t j;

    if (r)
        return r;
    if (dt_db_job_get(c->db, job, &j, &em) < 0)
        return NULL;
    r = dt_xcalloc(1, sizeof(*r));
    r->job = job;
    r->ck.job = job;
    r->ck.asked = -1;
    r->held.status = -1;
    r->spec_text = dt_xstrdup(j.spec ? j.spec : "");
    if (dt_spec_parse("spec", r->spec_text, &r->spec, &em) < 0)
        dt_log_error("job=%lld: stored spec does not parse: %s", (long long)job, em.s);
    /* the processes to launch: the plan's workers (dp rings of its ranks);
     * a plan stored before dp has ranks only, which were all of them */
    json_t *plan = j.plan ? json_loads(j.plan, 0, NULL) : NULL;
    json_t *w = json_object_get(plan, "workers");
    r->R0 = r->R = (int)json_integer_value(w ? w : json_object_get(plan, "ranks"));
    r->mem_every = json_integer_value(json_object_get(plan, "mem_ckpt_every"));
    json_decref(plan);
    if (r->R < 1)
        r->R = r->R0 = (int)((r->spec.ranks > 0 ? r->spec.ranks : 1) *
                             (r->spec.dp > 1 ? r->spec.dp : 1));
    /* the job's directory, the owner's: the agents write its checkpoints
     * (unless the spec names a ckpt_dir) and rank logs there */
    if (dt_jobdir_ensure(c->jobs_fd, c->conf.jobs_dir, job, (uid_t)j.owner, &em) == 0) {
        r->job_dir = dt_jobdir_path(c->conf.jobs_dir, job);
    } else {
        dt_log_warn("job=%lld: %s", (long long)job, em.s);
        r->dir_error = dt_xstrdup(em.s);
    }
    if (r->spec.ckpt_dir)
        r->ck.root = dt_xstrdup(r->spec.ckpt_dir);
    else if (r->job_dir)
        r->ck.root = dt_xasprintf("%s/ckpt", r->job_dir);
    if (r->spec.output_dir)
        r->out_dir = dt_xstrdup(r->spec.output_dir);
    else if (r->job_dir)
        r->out_dir = dt_xasprintf("%s/output", r->job_dir);
    /* the key table's defaults (dt-spec(5)): train one checkpoint at the
     * end, prefill one per layer; 3 kept */
    r->ckpt_every = dt_spec_ckpt_every(&r->spec);
    r->ck.keep = dt_spec_int(&r->spec, "ckpt_keep");
    r->phase = PH_WAITING;
    r->next = c->runs;
    c->runs = r;
    dt_job_clear(&j);
    return r;
}

static int gen_index(const jobrun_t *r, int64_t agent)
{
    for (int i = 0; i < r->ngen; i++)
        if (r->gen_agents[i] == agent)
            return i;
    return -1;
}

static int live_usable(const dt_live_agent_t *a, int64_t job)
{
    return a->job == job && a->conn != NULL && a->slots > 0 && !a->suspect;
}

/*-- generations -----------------------------------------------------------------*/

static void end_job(dt_coord_t *c, jobrun_t *r, enum dt_job_state to, const char *why)
{
    const char *name = dt_job_state_name(to);

    r->phase = PH_DONE;
    for (dt_live_agent_t *a = c->agents; a; a = a->next)
        if (a->job == r->job) {
            if (to != DT_JOB_COMPLETED && r->gen)
                dt_push_abort(a, r->gen, why, -1);
            dt_push_job_end(a, r->job, name);
        }
    /* not recorded: logged (transition); the agents were told, and the
     * job's Slurm job ends all the same */
    transition(c, r->job, to, NULL, why);
    c->hooks->job_ended(c, r->job, to == DT_JOB_CANCELLED);
}

/* Report a fault of the job to the recovery policy. */
static int fault(dt_coord_t *c, jobrun_t *r, dt_fault_t *f)
{
    return c->hooks->fault(c, r->job, f);
}

/* Where rank k finds its copy of step for its new agent: 1 its own agent
 * holds it, 2 another live agent with a peer channel holds it (*from its
 * id), 0 nowhere. */
static int copy_at(dt_coord_t *c, const jobrun_t *r, int k, int64_t step, int64_t *from)
{
    for (int s = 0; s < 2; s++) {
        dt_live_agent_t *a = dt_coord_agent_find(c, r->mem[k][s].agent);
        if (r->mem[k][s].step == step && r->mem[k][s].agent == r->agent_of[k] && a &&
            a->pid == r->mem[k][s].pid)
            return 1;
    }
    /* replicas only: an agent keeps its own copies of ranks it runs, and
     * a recovery keeps rank blocks where they were (gen_start), so a rank
     * never moves to the agent holding its replica */
    for (int s = 2; s < 4; s++) {
        dt_live_agent_t *h = dt_coord_agent_find(c, r->mem[k][s].agent);
        if (r->mem[k][s].step == step && h && h->id != r->agent_of[k] && h->conn &&
            h->peer[0] && h->pid == r->mem[k][s].pid) {
            *from = h->id;
            return 2;
        }
    }
    return 0;
}

/* The newest step whose in-memory checkpoint every rank can have where it
 * is placed now (agent_of): its own agent's copy, or one fetched from the
 * agent holding its replica (a rank whose agent was lost). 0 none. */
static int64_t mem_resume_step(dt_coord_t *c, const jobrun_t *r)
{
    if (r->mem == NULL || r->mem_R != r->R || r->agent_of == NULL)
        return 0;
    int64_t best = 0;
    for (int k0 = 0; k0 < r->R; k0++)
        for (int s = 0; s < 4; s++) {
            int64_t step = r->mem[k0][s].step, from;
            int all = step > best;
            for (int k = 0; k < r->R && all; k++)
                all = copy_at(c, r, k, step, &from) != 0;
            if (all)
                best = step;
        }
    return best;
}

/* Start generation gen + 1 on the live agents: ranks in agent order, the
 * rest spare. */
static void gen_start(dt_coord_t *c, jobrun_t *r)
{
    dt_emsg_t em = { "" };
    dt_live_agent_t **live = NULL;
    int nlive = 0, slots = 0;
    char *resume = NULL;
    int64_t resume_step = 0;

    for (dt_live_agent_t *a = c->agents; a; a = a->next)
        if (live_usable(a, r->job))
            nlive++;
    live = dt_xcalloc((size_t)(nlive ? nlive : 1), sizeof(*live));
    nlive = 0;
    for (dt_live_agent_t *a = c->agents; a; a = a->next)
        if (live_usable(a, r->job))
            live[nlive++] = a;
    /* registration order (agent ids) makes placement reproducible */
    for (int i = 1; i < nlive; i++)
        for (int j = i; j > 0 && live[j - 1]->id > live[j]->id; j--) {
            dt_live_agent_t *t = live[j];
            live[j] = live[j - 1];
            live[j - 1] = t;
        }
    /* a recovery keeps each rank block where it was: the previous
     * generation's agents in its order, a lost one's place taken by a
     * spare (so their in-memory checkpoints stay where their ranks run),
     * then the other spares */
    if (r->gen_agents && r->ngen > 0) {
        dt_live_agent_t **order = dt_xcalloc((size_t)(nlive ? nlive : 1), sizeof(*order));
        char *used = dt_xcalloc((size_t)(nlive ? nlive : 1), 1);
        int n = 0;
        for (int g = 0; g < r->ngen; g++) {
            int at = -1;
            for (int i = 0; i < nlive && at < 0; i++)
                if (!used[i] && live[i]->id == r->gen_agents[g])
                    at = i;
            for (int i = 0; i < nlive && at < 0; i++) {
                int was = 0;
                for (int h = 0; h < r->ngen && !was; h++)
                    was = live[i]->id == r->gen_agents[h];
                if (!used[i] && !was)
                    at = i;
            }
            if (at >= 0) {
                used[at] = 1;
                order[n++] = live[at];
            }
        }
        for (int i = 0; i < nlive; i++)
            if (!used[i])
                order[n++] = live[i];
        free(used);
        free(live);
        live = order;
    }
    for (int i = 0; i < nlive; i++)
        slots += live[i]->slots;
    if (r->spec.kind == NULL) {
        free(live);
        end_job(c, r, DT_JOB_FAILED, "the stored spec does not parse (dtcoordd's log says why)");
        return;
    }
    if (r->ck.root == NULL) {
        char why[700];
        snprintf(why, sizeof(why), "no checkpoint directory: %s",
                 r->dir_error ? r->dir_error : "the job has no directory");
        free(live);
        end_job(c, r, DT_JOB_FAILED, why);
        return;
    }
    if (slots < r->R) {
        /* requeue, re-plan or fail: recovery decides (dt_run_replan
         * comes back here with fewer ranks) */
        dt_fault_t f = { .kind = DT_FAULT_SHORT, .rank = -1, .slots = slots };
        free(live);
        fault(c, r, &f);
        return;
    }
    gen_clear(r);
    r->gen++;
    r->agent_of = dt_xcalloc((size_t)r->R, sizeof(*r->agent_of));
    r->ranks = dt_xcalloc((size_t)r->R, sizeof(*r->ranks));
    r->gen_agents = dt_xcalloc((size_t)nlive, sizeof(*r->gen_agents));
    r->gen_nodes = dt_xcalloc((size_t)nlive, sizeof(*r->gen_nodes));
    r->ended = dt_xcalloc((size_t)nlive, sizeof(*r->ended));
    int64_t *node_of = dt_xcalloc((size_t)r->R, sizeof(*node_of));
    for (int i = 0, rank = 0; i < nlive && rank < r->R; i++) {
        r->gen_agents[r->ngen] = live[i]->id;
        r->gen_nodes[r->ngen] = dt_xstrdup(live[i]->node);
        for (int s = 0; s < live[i]->slots && rank < r->R; s++, rank++) {
            r->agent_of[rank] = live[i]->id;
            r->ranks[rank].agent = live[i]->id;
            r->ranks[rank].state = "starting";
            r->ranks[rank].loss = r->ranks[rank].acc = NAN; /* none yet */
            node_of[rank] = r->ngen;
        }
        r->ngen++;
    }
    dt_commit_resume(c, &r->ck, &resume, &resume_step);
    /* the agents' in-memory checkpoints when they are newer (or as new:
     * memory loads faster than the disk) */
    int64_t mem_step = mem_resume_step(c, r);
    r->resumed_mem = mem_step > 0 && mem_step >= resume_step;
    if (r->resumed_mem)
        resume_step = mem_step;
    r->resume_step = resume_step;
    dt_goodput_gen_start(&r->gp, r->gen, resume_step, dt_clock_wall_ms());
    r->resumed[0] = '\0';
    r->bad_ms = 0;
    r->bad_what = NULL;
    /* not recorded: logged, and the generation starts anyway; its ranks'
     * states (dt_db_rank_set) then fail and are logged too, and a
     * coordinator restart finds the previous generation */
    if (dt_db_gen_begin(c->db, r->job, r->gen, r->R, r->agent_of, resume_step, &em) < 0)
        dt_log_error("job=%lld gen=%d: %s", (long long)r->job, r->gen, em.s);
    char nspace[64];
    snprintf(nspace, sizeof(nspace), "dt.%lld.%d", (long long)r->job, r->gen);
    char every[32];
    snprintf(every, sizeof(every), "%lld", (long long)r->ckpt_every);
    /* dtengine KIND, the spec (the agent adds --spec), and what the
     * coordinator decides: where checkpoints and outputs go, which
     * checkpoint to resume from. It keeps the checkpoints: the engine never
     * prunes them. attn has no checkpoint: a new generation runs it again. */
    const char *argv[20];
    size_t na = 0;
    char mem_every[32], mem_from[32];
    snprintf(mem_every, sizeof(mem_every), "%lld", (long long)r->mem_every);
    snprintf(mem_from, sizeof(mem_from), "%lld", (long long)mem_step);
    argv[na++] = r->spec.kind;
    if (strcmp(r->spec.kind, "attn") != 0) {
        const char *ck[] = { "--ckpt-commit", "external", "--ckpt-dir", r->ck.root,
                             "--ckpt-every", every, "--ckpt-keep", "1000000" };
        for (size_t i = 0; i < DT_ARRAY_SIZE(ck); i++)
            argv[na++] = ck[i];
        argv[na++] = "--mem-ckpt-every";
        argv[na++] = mem_every;
        if (r->resumed_mem) {
            argv[na++] = "--resume-from-memory";
            argv[na++] = mem_from;
        } else if (resume) {
            argv[na++] = "--resume-from";
            argv[na++] = resume;
        }
    }
    if (strcmp(r->spec.kind, "train") != 0 && r->out_dir) {
        argv[na++] = "--out-dir";
        argv[na++] = r->out_dir;
    }
    char *logs = r->job_dir ? dt_xasprintf("%s/logs", r->job_dir) : NULL;
    /* each rank's replicas go to the agent of the next rank in the ring
     * that is on another agent (another node: one agent a node); and a
     * rank resuming from memory whose agent is new fetches its copy */
    const char **rep_to = dt_xcalloc((size_t)r->R, sizeof(*rep_to));
    const char **fetch = dt_xcalloc((size_t)r->R, sizeof(*fetch));
    for (int k = 0; k < r->R; k++) {
        rep_to[k] = fetch[k] = "";
        for (int d = 1; r->mem_every > 0 && d < r->R; d++) {
            int64_t other = r->agent_of[(k + d) % r->R];
            dt_live_agent_t *h = other != r->agent_of[k] ? dt_coord_agent_find(c, other) : NULL;
            if (h) {
                rep_to[k] = h->peer;
                break;
            }
        }
        int64_t from = 0;
        if (r->resumed_mem && copy_at(c, r, k, mem_step, &from) == 2)
            fetch[k] = dt_coord_agent_find(c, from)->peer;
    }
    dt_wire_gen_start_t gs = {
        .job = r->job, .gen = r->gen, .nspace = nspace, .ranks = r->R,
        .nodes = { (const char **)r->gen_nodes, (size_t)r->ngen },
        .procs = { node_of, (size_t)r->R },
        .spec = r->spec_text,
        .argv = { argv, na },
        .resume = r->resumed_mem ? NULL : resume, .log_dir = logs,
        .device = dt_spec_device(&r->spec), .mem_resume = r->resumed_mem ? mem_step : 0,
        .replica_to = { rep_to, (size_t)r->R },
        .fetch = { fetch, r->resumed_mem ? (size_t)r->R : 0 },
    };
    json_t *start = dt_wire_gen_start_encode(&gs);
    free(logs);
    free(rep_to);
    free(fetch);
    for (int i = 0; i < r->ngen; i++)
        dt_push_msg(dt_coord_agent_find(c, r->gen_agents[i]), DT_MSG_GEN_START, json_incref(start));
    json_decref(start);
    r->phase = PH_STARTING;
    dt_log_info("job=%lld gen=%d ranks=%d agents=%d resume_step=%lld started", (long long)r->job,
                r->gen, r->R, r->ngen, (long long)resume_step);
    free(node_of);
    free(resume);
    free(live);
}

/* Every agent of an aborting generation has reported its end (or is
 * lost): record it and start the next one. */
static void maybe_next(dt_coord_t *c, jobrun_t *r)
{
    dt_emsg_t em = { "" };

    if (r->phase != PH_ABORTING)
        return;
    for (int i = 0; i < r->ngen; i++)
        if (!r->ended[i])
            return;
    if (dt_db_gen_end(c->db, r->job, r->gen,
                      r->pending_reason ? r->pending_reason : "aborted", &em) < 0)
        dt_log_warn("job=%lld gen=%d end: %s", (long long)r->job, r->gen, em.s);
    gen_start(c, r);
}

/* Tell every agent of the generation to abort it (RANK the failed one, -1
 * none): the next generation starts when they have all reported its end
 * (maybe_next). */
static void abort_gen(dt_coord_t *c, jobrun_t *r, const char *why, int rank)
{
    dt_goodput_fault(c->db, r->job, &r->gp, r->bad_what ? r->bad_what : "restart", r->bad_ms,
                     dt_clock_wall_ms());
    free(r->pending_reason);
    r->pending_reason = dt_xstrdup(why);
    r->phase = PH_ABORTING;
    r->abort_ms = dt_clock_mono_ms();
    for (int i = 0; i < r->ngen; i++)
        dt_push_abort(dt_coord_agent_find(c, r->gen_agents[i]), r->gen, why, rank);
}

static int64_t max_step(const jobrun_t *r)
{
    int64_t s = r->resume_step;
    for (int i = 0; r->ranks && i < r->R; i++)
        if (r->ranks[i].step > s)
            s = r->ranks[i].step;
    return s;
}

/* The lowest rank AGENT runs in the current generation, -1 none. */
static int first_rank(const jobrun_t *r, int64_t agent)
{
    for (int i = 0; r->agent_of && i < r->R; i++)
        if (r->agent_of[i] == agent)
            return i;
    return -1;
}

/* Ranks of the generation whose exit has not been reported. */
static int ranks_alive(const jobrun_t *r)
{
    int n = 0;
    for (int i = 0; r->ranks && i < r->R; i++)
        n += !r->ranks[i].exited && strcmp(r->ranks[i].state ? r->ranks[i].state : "", "lost");
    return n;
}

/* A worker's failure decides the generation: recovery.c says how. */
static void worker_failed(dt_coord_t *c, jobrun_t *r, const worker_failure_t *w)
{
    dt_fault_t f = { .kind = DT_FAULT_WORKER, .rank = w->rank, .agent = w->agent,
                     .status = w->status,
                     .sig = w->sig, .step = w->step, .hung = w->hung, .stopped = w->stopped,
                     .node = w->node, .err = w->err, .gpu = w->gpu };
    fault(c, r, &f);
}

/*-- handlers ---------------------------------------------------------------------*/

void dt_run_registered(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_register_t *reg)
{
    jobrun_t *r = run_get(c, a->job);
    dt_emsg_t em = { "" };
    dt_job_t j;
    int64_t gen = reg->gen; /* a malformed one reads as none: gen 0 */

    if (r == NULL || r->phase == PH_DONE)
        return;
    int gi = gen_index(r, a->id);
    if (r->phase == PH_WAITING) {
        int slots = 0;
        for (dt_live_agent_t *b = c->agents; b; b = b->next)
            if (live_usable(b, r->job))
                slots += b->slots;
        if (slots < r->R)
            return;
        if (dt_db_job_get(c->db, r->job, &j, &em) < 0)
            return;
        enum dt_job_state st = j.state;
        dt_job_clear(&j);
        if (st == DT_JOB_QUEUED && transition(c, r->job, DT_JOB_STARTING, NULL,
                                              "agents registered") < 0)
            return;
        gen_start(c, r);
        return;
    }
    if (gi < 0)
        return; /* a spare, or an agent that came back after its generation */
    if (gen == r->gen) {
        dt_coord_event(c, r->job, "agent_reattached", "agent %lld (%s) came back with gen=%d's "
                       "workers running: they go on", (long long)a->id, a->node, r->gen);
        if (r->phase == PH_ABORTING) /* it may have missed the abort */
            dt_push_abort(a, r->gen, r->pending_reason ? r->pending_reason : "aborted", -1);
        return;
    }
    /* it runs nothing of the current generation: its workers are gone */
    if (r->phase == PH_ABORTING) {
        r->ended[gi] = 1;
        maybe_next(c, r);
    } else if (gen == 0 && r->phase == PH_RUNNING) {
        dt_fault_t f = { .kind = DT_FAULT_AGENT_RESTARTED, .rank = first_rank(r, a->id),
                         .agent = a->id, .node = a->node };
        r->ended[gi] = 1;
        if (r->bad_ms == 0) {
            r->bad_ms = dt_clock_wall_ms();
            r->bad_what = "agent_restarted";
        }
        fault(c, r, &f);
    } else if (gen == 0 && r->phase == PH_STARTING) {
        /* GEN_START may not have reached it: send it again */
        r->bad_what = "agent_restarted";
        abort_gen(c, r, "restarted: an agent missed the start", -1);
        r->ended[gi] = 1;
        maybe_next(c, r);
    }
}

/* what SHOW prints of a number the worker did not know (NaN): 0 */
static double known(double v)
{
    return isfinite(v) ? v : 0.0;
}

/* A real for a reply; null when not finite (an attn or prefill rank has no
 * loss or accuracy while it runs). */
static json_t *real_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

void dt_run_progress(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_progress_t *p)
{
    jobrun_t *r = run_find(c, a->job);
    int64_t rank = p->rank;

    if (r == NULL || p->gen != r->gen || rank < 0 || rank >= r->R || r->agent_of[rank] != a->id)
        return;
    rank_info_t *ri = &r->ranks[rank];
    ri->step = p->step;
    ri->steps = p->steps;
    ri->tokens = p->tokens;
    ri->pid = p->pid;
    ri->loss = p->loss;
    ri->tokens_s = known(p->tokens_s);
    ri->acc = p->acc;
    if (rank == 0) {
        int64_t now = dt_clock_wall_ms();
        if (r->gp.gen != r->gen) /* reloaded after a coordinator restart */
            dt_goodput_gen_start(&r->gp, r->gen, r->resume_step, now);
        dt_goodput_progress(c->db, r->job, &r->gp, p->step, p->tokens, p->loss, p->tokens_s, now);
    }
    if (!ri->reported) {
        ri->reported = 1;
        ri->state = "running";
        rank_record(c, r, (int)rank);
    }
    if (r->phase == PH_STARTING) {
        for (int i = 0; i < r->R; i++)
            if (!r->ranks[i].reported)
                return;
        r->phase = PH_RUNNING;
        char d[96];
        snprintf(d, sizeof(d), "gen=%d: all %d ranks running", r->gen, r->R);
        transition(c, r->job, DT_JOB_RUNNING, NULL, d);
        /* where a recovery (or a resumed job) went on from */
        if (r->gen > 1 || r->resume_step > 0) {
            if (r->resume_step > 0)
                snprintf(r->resumed, sizeof(r->resumed), "resumed step %" PRId64 " from %s",
                         r->resume_step, r->resumed_mem ? "memory" : "disk");
            else
                snprintf(r->resumed, sizeof(r->resumed), "started again from step 0 (no "
                         "checkpoint yet)");
            dt_coord_event(c, r->job, "resumed_step", "gen=%d: %s", r->gen, r->resumed);
        }
    }
}

void dt_run_worker_exit(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_worker_exit_t *x)
{
    jobrun_t *r = run_find(c, a->job);
    dt_emsg_t em = { "" };
    int64_t rank = x->rank, status = x->status, sig = x->signal, step = x->step;
    int hung = x->hung;
    const char *err = x->error;

    if (r == NULL || x->gen != r->gen || rank < 0 || rank >= r->R)
        return;
    /* the agent's text goes into an event: escaped, and cut to fit whole */
    char errt[300] = "";
    if (err) {
        char *e = dt_text_escape(err, 0);
        snprintf(errt, sizeof(errt), "%.*s", dt_text_fit(e, sizeof(errt) - 1), e);
        free(e);
    }
    rank_info_t *ri = &r->ranks[rank];
    if (ri->exited)
        return;
    if (r->phase == PH_STOPPING) {
        ri->exited = 1;
        ri->ok = (status == DT_EXIT_OK || status == DT_EXIT_STOPPED) && sig == 0;
        ri->state = ri->ok ? "exited" : "failed";
        if (step > ri->step)
            ri->step = step;
        rank_record(c, r, (int)rank);
        int all = 1;
        for (int i = 0; i < r->R; i++)
            all &= r->ranks[i].exited;
        if (!ri->ok || all) {
            char d[600];
            snprintf(d, sizeof(d), "%s; %s at step %lld",
                     r->pending_reason ? r->pending_reason : "cancelled",
                     ri->ok ? "stopped after a checkpoint" : "the stop was interrupted by a failure",
                     (long long)max_step(r));
            /* not recorded: logged; the stop goes on (a requeue or the
             * cancel ends the generation's record anyway) */
            if (dt_db_gen_end(c->db, r->job, r->gen, "stopped", &em) < 0)
                dt_log_error("job=%lld gen=%d end: %s", (long long)r->job, r->gen, em.s);
            dt_fault_t f = { .kind = DT_FAULT_STOPPED, .rank = (int)rank, .detail = d };
            fault(c, r, &f);
        }
        return;
    }
    ri->exited = 1;
    ri->ok = status == DT_EXIT_OK && sig == 0;
    ri->state = ri->ok ? "exited" : hung ? "hung" : sig ? "killed" : "failed";
    if (step > ri->step)
        ri->step = step;
    rank_record(c, r, (int)rank);
    if (ri->ok) {
        if (x->result) {
            json_decref(r->result);
            r->result = json_deep_copy(x->result);
            dt_msg_escape_strings(r->result, NULL); /* stored, and shown by watch */
        }
        if (++r->nok == r->R && (r->phase == PH_RUNNING || r->phase == PH_STARTING)) {
            char *rt = r->result ? json_dumps(r->result, JSON_COMPACT) : NULL;
            if (rt && dt_db_job_set_result(c->db, r->job, rt, &em) < 0)
                dt_log_error("job=%lld result: %s", (long long)r->job, em.s);
            free(rt);
            /* not recorded: logged; the job completes all the same (its
             * state is what counts, and a finished job is not reloaded) */
            if (dt_db_gen_end(c->db, r->job, r->gen, "completed", &em) < 0)
                dt_log_error("job=%lld gen=%d end: %s", (long long)r->job, r->gen, em.s);
            char d[200];
            /* a generation that resumed at the last step has nothing to
             * run: its ranks finish before any reports progress, and the
             * job (starting or recovering) passes through running, the
             * only state a job completes from */
            if (r->phase == PH_STARTING) {
                snprintf(d, sizeof(d), "gen=%d: all %d ranks resumed at the last step",
                         r->gen, r->R);
                r->phase = PH_RUNNING;
                transition(c, r->job, DT_JOB_RUNNING, NULL, d);
            }
            snprintf(d, sizeof(d), "gen=%d: all %d ranks finished", r->gen, r->R);
            end_job(c, r, DT_JOB_COMPLETED, d);
        }
        return;
    }
    if (r->phase != PH_STARTING && r->phase != PH_RUNNING) {
        /* a GPU that failed after another rank's failure began the abort
         * still makes its node suspect: recovery decides, nothing else
         * is left to do */
        if (status == DT_EXIT_DEVICE && !sig && !hung && r->phase == PH_ABORTING) {
            worker_failure_t dev = { .rank = (int)rank, .agent = a->id, .status = status,
                                     .step = ri->step };
            snprintf(dev.node, sizeof(dev.node), "%s", a->node);
            snprintf(dev.err, sizeof(dev.err), "%s", errt);
            snprintf(dev.gpu, sizeof(dev.gpu), "%s", x->gpu ? x->gpu : "");
            worker_failed(c, r, &dev);
        }
        return;
    }
    if (r->bad_ms == 0) {
        r->bad_ms = dt_clock_wall_ms();
        r->bad_what = hung ? "hung" : "worker";
    }
    worker_failure_t f = { .rank = (int)rank, .agent = a->id, .status = status, .sig = sig,
                           .hung = hung, .stopped = x->stopped, .step = ri->step };
    snprintf(f.node, sizeof(f.node), "%s", a->node);
    snprintf(f.err, sizeof(f.err), "%s", errt);
    snprintf(f.gpu, sizeof(f.gpu), "%s", x->gpu ? x->gpu : "");
    /* An exit status the ranks agree on is printed by one rank only
     * (dtengine(1)): when this report does not carry the words, wait a
     * moment for the one that does (dt_run_tick ends the wait). */
    int agreed = !hung && !sig && status != DT_EXIT_PEER && status != DT_EXIT_AGENT_LOST &&
                 status != DT_EXIT_DEVICE;
    if (r->held.status >= 0) {
        if (agreed && err && status == r->held.status)
            r->held = f; /* the same failure, with its reason */
        else if (!(agreed && !err && status == r->held.status))
            ; /* another kind of failure: the first one stays the cause */
        else if (ranks_alive(r) > 0)
            return;
        f = r->held;
        r->held.status = -1;
    } else if (agreed && !err && ranks_alive(r) > 0) {
        r->held = f;
        r->held_ms = dt_clock_mono_ms();
        return;
    }
    worker_failed(c, r, &f);
}

void dt_run_gen_ended(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_agent_ref_t *e)
{
    jobrun_t *r = run_find(c, a->job);

    if (r == NULL || e->gen != r->gen)
        return;
    int gi = gen_index(r, a->id);
    if (gi < 0)
        return;
    r->ended[gi] = 1;
    if (r->phase == PH_RUNNING || r->phase == PH_STARTING) {
        /* its workers are all gone but no failure was reported: the exits
         * decide (a completed generation ends this way too) */
        return;
    }
    maybe_next(c, r);
}

void dt_run_shard(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_shard_written_t *s)
{
    jobrun_t *r = run_find(c, a->job);

    if (r == NULL)
        return;
    if (s->gen == r->gen)
        dt_goodput_ckpt(&r->gp);
    dt_commit_shard(c, &r->ck, r->agent_of, s->step);
}

void dt_run_mem_ckpt(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_mem_ckpt_t *m)
{
    jobrun_t *r = run_find(c, a->job);
    int64_t rank = m->rank;

    if (r == NULL || m->gen != r->gen || r->agent_of == NULL || rank < 0 || rank >= r->R ||
        (!m->replica && r->agent_of[rank] != a->id) ||
        (m->replica && r->agent_of[rank] == a->id))
        return;
    if (m->error) {
        /* a replica that could not be sent: the copies stay on their own
         * agent (a node lost takes them with it); once per generation */
        if (r->rep_failed_gen != r->gen) {
            r->rep_failed_gen = r->gen;
            char *e = dt_text_escape(m->error, 0);
            dt_coord_event(c, r->job, "replica_failed",
                           "gen=%d rank %lld step %lld: %s; its in-memory checkpoints are on "
                           "its own agent only", r->gen, (long long)rank, (long long)m->step, e);
            free(e);
        }
        return;
    }
    if (r->mem_R != r->R) {
        free(r->mem);
        r->mem = dt_xcalloc((size_t)r->R, sizeof(*r->mem));
        r->mem_R = r->R;
    }
    /* the own agent's two slots, or the replicas' two: this step's, or
     * the older one's */
    struct memcopy *mc = r->mem[rank] + (m->replica ? 2 : 0);
    int s = mc[0].step == m->step ? 0 : mc[1].step == m->step ? 1 : mc[0].step <= mc[1].step ? 0 : 1;
    mc[s].step = m->step;
    mc[s].agent = a->id;
    mc[s].pid = a->pid;
}

void dt_run_mem_state(dt_coord_t *c, int64_t job, int64_t *step, double *coverage,
                      double *replicas)
{
    jobrun_t *r = run_find(c, job);

    *step = 0;
    *coverage = 0;
    if (replicas)
        *replicas = 0;
    if (r == NULL || r->mem == NULL || r->mem_R != r->R || r->R < 1)
        return;
    *step = mem_resume_step(c, r);
    int64_t newest = 0;
    for (int k = 0; k < r->R; k++)
        for (int s = 0; s < 2; s++)
            if (r->mem[k][s].step > newest)
                newest = r->mem[k][s].step;
    int have = 0;
    for (int k = 0; k < r->R; k++)
        have += r->mem[k][0].step == newest || r->mem[k][1].step == newest;
    *coverage = newest > 0 ? (double)have / r->R : 0;
    if (replicas) {
        /* the share of ranks whose newest own copy also has a replica */
        int rep = 0;
        for (int k = 0; k < r->R; k++) {
            int64_t own = r->mem[k][0].step > r->mem[k][1].step ? r->mem[k][0].step
                                                                : r->mem[k][1].step;
            rep += own > 0 && (r->mem[k][2].step == own || r->mem[k][3].step == own);
        }
        *replicas = (double)rep / r->R;
    }
}

void dt_run_mem_forget(dt_coord_t *c, int64_t job)
{
    jobrun_t *r = run_find(c, job);
    if (r == NULL)
        return;
    free(r->mem);
    r->mem = NULL;
    r->mem_R = 0;
}

void dt_run_ckpt_done(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_ckpt_done_t *d)
{
    jobrun_t *r = run_get(c, a->job);

    if (r)
        dt_commit_done(c, &r->ck, r->agent_of, a, d);
}

void dt_run_fence(dt_conn_t *k, dt_live_agent_t *a, uint32_t id, const dt_wire_fence_t *fm)
{
    dt_coord_t *c = k->coord;
    jobrun_t *r = run_find(c, a->job);
    int64_t gen = fm->gen, seq = fm->seq;

    /* a stopping generation still fences: MPI_Finalize does */
    if (r == NULL || gen != r->gen || gen_index(r, a->id) < 0 ||
        (r->phase != PH_STARTING && r->phase != PH_RUNNING && r->phase != PH_STOPPING)) {
        dt_conn_error(k, id, DT_ESTATE, "fence %lld of generation %lld: not running",
                      (long long)seq, (long long)gen);
        return;
    }
    dt_fence_add(k, &r->fences, r->gen_agents, r->ngen, id, a->id, fm);
}

void dt_run_agent_lost(dt_coord_t *c, int64_t job, int64_t agent, int64_t heard_ms)
{
    jobrun_t *r = run_find(c, job);

    if (r == NULL || r->phase == PH_DONE)
        return;
    int gi = gen_index(r, agent);
    if (gi < 0)
        return; /* a spare */
    if (r->bad_ms == 0 && r->phase != PH_ABORTING) {
        r->bad_ms = heard_ms;
        r->bad_what = "agent";
    }
    r->ended[gi] = 1;
    if (r->gen_nodes && r->gen_nodes[gi]) {
        char *l = r->lost_nodes ? dt_xasprintf("%s,%s", r->lost_nodes, r->gen_nodes[gi])
                                : dt_xstrdup(r->gen_nodes[gi]);
        free(r->lost_nodes);
        r->lost_nodes = l;
    }
    for (int i = 0; i < r->R; i++)
        if (r->agent_of[i] == agent && !r->ranks[i].exited)
            r->ranks[i].state = "lost";
    if (r->phase == PH_ABORTING) {
        maybe_next(c, r);
        return;
    }
    dt_fault_t f = { .kind = DT_FAULT_AGENT_LOST, .rank = first_rank(r, agent),
                     .agent = agent, .node = r->gen_nodes ? r->gen_nodes[gi] : NULL };
    fault(c, r, &f);
}

/* An attn job writes no checkpoint: a failed generation runs the call
 * again. */
static int no_checkpoints(const jobrun_t *r, const char *what, dt_emsg_t *em)
{
    if (r->spec.kind == NULL || strcmp(r->spec.kind, "attn") != 0)
        return 0;
    return dt_emsg_set(em, DT_ENOTSUP, "job %lld is kind = attn, which has no checkpoints (a "
                       "failed generation runs the attention again): %s", (long long)r->job,
                       what);
}

int dt_run_checkpoint(dt_coord_t *c, int64_t job, int *gen, dt_emsg_t *em)
{
    jobrun_t *r = run_find(c, job);
    int rc;

    if (r == NULL || r->phase != PH_RUNNING)
        return dt_emsg_set(em, DT_ESTATE, "job %lld has no running generation",
                           (long long)job);
    if ((rc = no_checkpoints(r, "nothing to write", em)) < 0)
        return rc;
    dt_wire_gen_ref_t ck = { .gen = r->gen };
    for (int i = 0; i < r->ngen; i++)
        dt_push_msg(dt_coord_agent_find(c, r->gen_agents[i]), DT_MSG_CKPT_REQUEST,
                    dt_wire_ckpt_request_encode(&ck));
    dt_coord_event(c, job, "checkpoint_requested", "gen=%d at step %lld", r->gen, (long long)max_step(r));
    *gen = r->gen;
    return 0;
}

int dt_run_stop(dt_coord_t *c, int64_t job, const char *why, bool requeue, dt_emsg_t *em)
{
    jobrun_t *r = run_find(c, job);
    int rc;

    if (r == NULL || r->phase != PH_RUNNING)
        return dt_emsg_set(em, DT_ESTATE, "job %lld has no running generation to stop",
                           (long long)job);
    /* a requeue stops an attn job all the same (its workers are ended at
     * the agents' grace); a user's planned stop would wait for nothing */
    if (!requeue && (rc = no_checkpoints(r, "cancel it without --checkpoint", em)) < 0)
        return rc;
    free(r->pending_reason);
    r->pending_reason = dt_xstrdup(why);
    r->stop_requeue = requeue;
    r->phase = PH_STOPPING;
    r->abort_ms = dt_clock_mono_ms();
    dt_wire_stop_t st = { .gen = r->gen, .checkpoint = true };
    for (int i = 0; i < r->ngen; i++)
        dt_push_msg(dt_coord_agent_find(c, r->gen_agents[i]), DT_MSG_STOP,
                    dt_wire_stop_encode(&st));
    if (!requeue) /* a requeue's event is recovery's (preempt_requested) */
        dt_coord_event(c, job, "stop_requested", "gen=%d at step %lld: checkpoint, then stop "
                       "(%s)", r->gen, (long long)max_step(r), why);
    return 0;
}

void dt_run_requeued(dt_coord_t *c, int64_t job)
{
    jobrun_t *r = run_find(c, job);
    dt_emsg_t em = { "" };
    dt_gen_t g = { 0 };

    /* the old run's agents exit (75) if Slurm has not killed them yet */
    for (dt_live_agent_t *a = c->agents, *next; a; a = next) {
        next = a->next;
        if (a->job != job)
            continue;
        if (r && r->gen && gen_index(r, a->id) >= 0 && r->phase != PH_WAITING)
            dt_push_abort(a, r->gen, "requeued", -1);
        dt_push_job_end(a, job, "requeued");
        if (dt_db_agent_set_state(c->db, a->id, "gone", dt_clock_wall_ms(), &em) < 0)
            dt_log_warn("agent=%lld: %s", (long long)a->id, em.s);
        if (a->conn)
            a->conn->agent = 0;
        dt_coord_agent_remove(c, a->id);
    }
    if (r == NULL)
        return;
    /* not recorded: logged; the next run's generation supersedes it */
    if (dt_db_gen_last(c->db, job, &g, &em) == 0 && g.gen > 0 && g.ended_ms == 0 &&
        dt_db_gen_end(c->db, job, g.gen, "requeued", &em) < 0)
        dt_log_error("job=%lld gen=%d end: %s", (long long)job, g.gen, em.s);
    dt_gen_clear(&g);
    gen_clear(r);
    free(r->lost_nodes);
    r->lost_nodes = NULL;
    free(r->pending_reason);
    r->pending_reason = NULL;
    r->stop_requeue = 0;
    r->phase = PH_WAITING;
}

void dt_run_resumed(dt_coord_t *c, int64_t job)
{
    for (jobrun_t **pp = &c->runs; *pp; pp = &(*pp)->next)
        if ((*pp)->job == job) {
            jobrun_t *r = *pp;
            *pp = r->next;
            run_free(r);
            return;
        }
}

void dt_run_cancelled(dt_coord_t *c, int64_t job)
{
    jobrun_t *r = run_find(c, job);
    for (dt_live_agent_t *a = c->agents; a; a = a->next)
        if (a->job == job) {
            if (r && r->gen)
                dt_push_abort(a, r->gen, "cancelled", -1);
            dt_push_job_end(a, job, "cancelled");
        }
    if (r)
        r->phase = PH_DONE;
}

void dt_run_show(dt_coord_t *c, int64_t job, json_t *reply)
{
    jobrun_t *r = run_find(c, job);
    dt_emsg_t em = { "" };
    char *res = NULL;

    if (dt_db_job_result(c->db, job, &res, &em) == 0 && res) {
        json_t *jr = json_loads(res, 0, NULL);
        json_object_set_new(json_object_get(reply, "job"), "result", jr ? jr : json_null());
    } else {
        json_object_set_new(json_object_get(reply, "job"), "result", json_null());
    }
    free(res);
    json_t *agents = json_object_get(reply, "agents"), *ag;
    size_t i;
    json_array_foreach(agents, i, ag) {
        int64_t id = json_integer_value(json_object_get(ag, "id"));
        dt_live_agent_t *a = dt_coord_agent_find(c, id);
        json_object_set_new(ag, "pid", json_integer(a ? a->pid : 0));
        json_object_set_new(ag, "connected", json_boolean(a && a->conn));
        json_object_set_new(ag, "spare", json_boolean(r && r->gen && gen_index(r, id) < 0));
        json_object_set_new(ag, "gpus", json_integer(a ? a->gpus : 0));
        json_object_set_new(ag, "suspect", json_boolean(a && a->suspect));
    }
    if (r == NULL || r->gen == 0 || r->ranks == NULL) {
        json_object_set_new(reply, "gen", json_null());
        json_object_set_new(reply, "ranks", json_array());
        return;
    }
    json_object_set_new(reply, "gen", json_pack("{s:i, s:i, s:I, s:o}", "gen", r->gen, "ranks",
                                                r->R, "resume_step", (json_int_t)r->resume_step,
                                                "resumed", r->resumed[0] ? json_string(r->resumed)
                                                                         : json_null()));
    json_t *ranks = json_array();
    for (int k = 0; k < r->R; k++) {
        rank_info_t *ri = &r->ranks[k];
        dt_live_agent_t *a = dt_coord_agent_find(c, ri->agent);
        json_array_append_new(
            ranks, json_pack("{s:i, s:I, s:s, s:s, s:I, s:I, s:I, s:o, s:f, s:o}", "rank", k,
                             "agent", (json_int_t)ri->agent, "node", a ? a->node : "?", "state",
                             ri->state ? ri->state : "starting", "pid", (json_int_t)ri->pid,
                             "step", (json_int_t)ri->step, "steps", (json_int_t)ri->steps, "loss",
                             real_or_null(ri->loss), "tokens_s", ri->tokens_s, "acc",
                             real_or_null(ri->acc)));
    }
    json_object_set_new(reply, "ranks", ranks);
}

void dt_run_tick(dt_coord_t *c)
{
    int64_t now = dt_clock_mono_ms();
    dt_emsg_t em = { "" };

    /* agents of finished jobs were told so: they are gone, not lost */
    for (dt_live_agent_t *a = c->agents, *next; a; a = next) {
        next = a->next;
        jobrun_t *r = run_find(c, a->job);
        if (r == NULL || r->phase != PH_DONE)
            continue;
        if (dt_db_agent_set_state(c->db, a->id, "gone", dt_clock_wall_ms(), &em) < 0)
            dt_log_warn("agent=%lld: %s", (long long)a->id, em.s);
        if (a->conn)
            a->conn->agent = 0;
        dt_coord_agent_remove(c, a->id);
    }
    for (jobrun_t *r = c->runs; r; r = r->next) {
        if (r->held.status >= 0 && now - r->held_ms >= HOLD_MS) {
            worker_failure_t f = r->held;
            r->held.status = -1;
            if (r->phase == PH_STARTING || r->phase == PH_RUNNING)
                worker_failed(c, r, &f);
        }
        if (r->phase == PH_STOPPING && now - r->abort_ms >= STOP_TIMEOUT_MS) {
            dt_fault_t f = { .kind = DT_FAULT_STOP_TIMEOUT, .rank = -1 };
            fault(c, r, &f);
            continue;
        }
        if (r->phase != PH_ABORTING || now - r->abort_ms < ABORT_TIMEOUT_MS)
            continue;
        for (int i = 0; i < r->ngen; i++)
            if (!r->ended[i]) {
                dt_coord_event(c, r->job, "agent_unresponsive", "agent %lld did not report the end of "
                      "gen=%d within %d s", (long long)r->gen_agents[i], r->gen,
                      ABORT_TIMEOUT_MS / 1000);
                r->ended[i] = 1;
            }
        maybe_next(c, r);
    }
}

static int reload_rank_cb(const dt_rank_t *rk, void *arg)
{
    jobrun_t *r = arg;
    if (rk->rank >= 0 && rk->rank < r->R) {
        r->agent_of[rk->rank] = rk->agent;
        r->ranks[rk->rank].agent = rk->agent;
        r->ranks[rk->rank].step = rk->step;
        r->ranks[rk->rank].pid = rk->pid;
        r->ranks[rk->rank].state = "starting";
        r->ranks[rk->rank].loss = r->ranks[rk->rank].acc = NAN;
    }
    return 0;
}

static int reload_job_cb(const dt_job_t *j, void *arg)
{
    dt_coord_t *c = arg;
    dt_emsg_t em = { "" };
    dt_gen_t g = { 0 };

    if (j->state != DT_JOB_STARTING && j->state != DT_JOB_RUNNING &&
        j->state != DT_JOB_RECOVERING)
        return 0;
    jobrun_t *r = run_get(c, j->id);
    if (r == NULL || dt_db_gen_last(c->db, j->id, &g, &em) < 0 || g.gen == 0) {
        dt_gen_clear(&g);
        return 0;
    }
    r->gen = g.gen;
    r->R = g.ranks;
    r->resume_step = g.resume_step;
    r->agent_of = dt_xcalloc((size_t)r->R, sizeof(*r->agent_of));
    r->ranks = dt_xcalloc((size_t)r->R, sizeof(*r->ranks));
    /* ranks that cannot be read: no agent can reattach to them, so the
     * generation is treated as ending (below) and the next one starts */
    int ranks_ok = dt_db_gen_ranks(c->db, j->id, g.gen, reload_rank_cb, r, &em) == 0;
    if (!ranks_ok)
        dt_log_error("job=%lld gen=%d ranks: %s", (long long)j->id, g.gen, em.s);
    r->gen_agents = dt_xcalloc((size_t)r->R, sizeof(*r->gen_agents));
    r->ended = dt_xcalloc((size_t)r->R, sizeof(*r->ended));
    for (int i = 0; i < r->R; i++)
        if (gen_index(r, r->agent_of[i]) < 0)
            r->gen_agents[r->ngen++] = r->agent_of[i];
    /* progress comes back with the agents; a generation that was ending
     * waits for their reports again */
    if (g.ended_ms != 0 || j->state == DT_JOB_RECOVERING || !ranks_ok) {
        r->phase = PH_ABORTING;
        r->abort_ms = dt_clock_mono_ms();
        r->pending_reason = dt_xstrdup(g.reason ? g.reason : "aborted before a restart");
    } else {
        r->phase = j->state == DT_JOB_RUNNING ? PH_RUNNING : PH_STARTING;
        for (int i = 0; i < r->R; i++)
            r->ranks[i].reported = j->state == DT_JOB_RUNNING;
    }
    dt_coord_event(c, j->id, "coordinator_restarted", "dtcoordd pid %ld reloaded gen=%d of %d "
                   "ranks (%s): %s", (long)getpid(), r->gen, r->R, dt_job_state_name(j->state),
                   r->phase == PH_ABORTING ? "waiting for its agents to report its end"
                                           : "waiting for its agents to reattach");
    dt_gen_clear(&g);
    return 0;
}

int dt_run_reload(dt_coord_t *c, dt_emsg_t *em)
{
    return dt_db_job_list(c->db, -1, reload_job_cb, c, em);
}

void dt_run_free_all(dt_coord_t *c)
{
    while (c->runs) {
        jobrun_t *r = c->runs;
        c->runs = r->next;
        run_free(r);
    }
}

/*-- primitives of the recovery policy ----------------------------------------------*/

void dt_run_view(dt_coord_t *c, int64_t job, dt_job_view_t *v)
{
    jobrun_t *r = run_find(c, job);

    if (r == NULL) {
        v->phase = DT_GEN_NONE;
        return;
    }
    v->phase = (enum dt_gen_phase)r->phase;
    v->gen = r->gen;
    v->ranks = r->R;
    v->step = max_step(r);
    v->resume_step = r->resume_step;
    v->resumed_memory = r->resumed_mem != 0;
    v->stop_requeue = r->stop_requeue;
    v->lost_nodes = r->lost_nodes;
    v->fails = &r->fails;
}

void dt_run_abort(dt_coord_t *c, int64_t job, const char *why, int rank)
{
    jobrun_t *r = run_find(c, job);
    if (r)
        abort_gen(c, r, why, rank);
}

void dt_run_next(dt_coord_t *c, int64_t job)
{
    jobrun_t *r = run_find(c, job);
    if (r)
        maybe_next(c, r);
}

void dt_run_replan(dt_coord_t *c, int64_t job, int ranks)
{
    jobrun_t *r = run_find(c, job);
    if (r == NULL || ranks < 1 || ranks >= r->R)
        return;
    r->R = ranks;
    gen_start(c, r);
}

void dt_run_end(dt_coord_t *c, int64_t job, enum dt_job_state to, const char *why)
{
    jobrun_t *r = run_find(c, job);
    if (r)
        end_job(c, r, to, why);
}

void dt_run_suspect(dt_coord_t *c, int64_t job, int64_t agent)
{
    jobrun_t *r = run_find(c, job);
    dt_live_agent_t *a = dt_coord_agent_find(c, agent);

    if (a == NULL || a->job != job || a->suspect)
        return;
    a->suspect = 1;
    if (r) {
        char *l = r->lost_nodes ? dt_xasprintf("%s,%s", r->lost_nodes, a->node)
                                : dt_xstrdup(a->node);
        free(r->lost_nodes);
        r->lost_nodes = l;
    }
    dt_log_warn("job=%lld agent=%lld node=%s suspect: no more ranks on it", (long long)job,
                (long long)agent, a->node);
}

void dt_run_set_aside(dt_coord_t *c, int64_t job, int64_t step)
{
    jobrun_t *r = run_find(c, job);
    if (r)
        dt_commit_set_aside(c, &r->ck, r->agent_of, step);
}
