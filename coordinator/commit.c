/* SPDX-License-Identifier: MIT
 *
 * A job's checkpoints as the coordinator keeps them (commit.h): the
 * shards the agents report checked against the manifest, the commit
 * marker asked of an agent and the step committed once it is written, the
 * newest ckpt_keep committed steps kept and the older ones pruned, a
 * corrupt step set aside, and the newest committed step to resume from.
 *
 * The coordinator never opens a job's files: they belong to the job's
 * owner and the coordinator may run as root (dtcoordd(8) SECURITY). The
 * agents, running as the owner, read every shard back and the manifest,
 * and report what they found; the coordinator decides from those reports
 * and the database, and sends the file work (the commit marker, pruning)
 * back to an agent. A resume checkpoint is verified by the engine, which
 * exits DT_EXIT_CKPT when it does not verify.
 *
 * Not here: which run a report is for (run.c, which calls this file; this
 * file calls nothing of it), recording the shards and the manifest as
 * they are reported (jobs.c), checkpoint file formats (io/ckpt.c; only
 * its path names are used here), what a checkpoint that does not verify
 * means for the job (recovery.c).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/proto.h"
#include "common/wire.h"
#include "coordinator/commit.h"
#include "coordinator/push.h"
#include "db/db.h"
#include "io/ckpt.h"

/* A step found corrupt. Not recorded: logged; the step stays pending,
 * which no generation resumes from, and an agent sets its directory
 * aside all the same. */
static void ckpt_corrupt(dt_coord_t *c, const dt_commit_t *ck, int64_t step)
{
    dt_emsg_t em = { "" };

    if (dt_db_checkpoint_set_state(c->db, ck->job, step, "corrupt", &em) < 0)
        dt_log_error("job=%lld step=%lld -> corrupt: %s", (long long)ck->job, (long long)step,
                     em.s);
}

typedef struct ck_list {
    int64_t *steps;
    char **states;
    int n;
} ck_list_t;

static int ck_cb(const dt_checkpoint_t *ck, void *arg)
{
    ck_list_t *l = arg;
    l->steps = dt_xrealloc(l->steps, (size_t)(l->n + 1) * sizeof(*l->steps));
    l->states = dt_xrealloc(l->states, (size_t)(l->n + 1) * sizeof(*l->states));
    l->steps[l->n] = ck->step;
    l->states[l->n++] = dt_xstrdup(ck->state);
    return 0;
}

static void ck_list_free(ck_list_t *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->states[i]);
    free(l->steps);
    free(l->states);
}

/* The agent to carry out the job's checkpoint file work: rank 0's in the
 * current generation when it is connected, else any connected agent of
 * the job (they all run as the job's owner and see its files). */
static dt_live_agent_t *file_agent(dt_coord_t *c, const dt_commit_t *ck, const int64_t *agent_of)
{
    dt_live_agent_t *a = agent_of ? dt_coord_agent_find(c, agent_of[0]) : NULL;

    if (a && a->conn)
        return a;
    for (a = c->agents; a; a = a->next)
        if (a->job == ck->job && a->conn)
            return a;
    return NULL;
}

/* Keep the newest ckpt_keep committed checkpoints: older ones are marked
 * deleted (the row first, so a crash leaves a directory nobody resumes
 * from), then an agent removes their directories. */
static void prune(dt_coord_t *c, dt_commit_t *ck, const int64_t *agent_of)
{
    ck_list_t l = { 0 };
    dt_emsg_t em = { "" };
    int64_t *steps = NULL;
    size_t n = 0;
    int kept = 0;

    if (dt_db_checkpoints(c->db, ck->job, ck_cb, &l, &em) < 0)
        goto out;
    steps = dt_xcalloc((size_t)l.n + 1, sizeof(*steps));
    for (int i = l.n - 1; i >= 0; i--) {
        if (strcmp(l.states[i], "committed") != 0 || ++kept <= ck->keep)
            continue;
        if (dt_db_checkpoint_set_state(c->db, ck->job, l.steps[i], "deleted", &em) == 0)
            steps[n++] = l.steps[i];
    }
    if (n > 0) {
        dt_live_agent_t *a = file_agent(c, ck, agent_of);
        if (a)
            dt_push_prune(a, ck->root, steps, n, NULL);
        else
            dt_log_warn("job=%lld: no agent connected to remove %zu old checkpoints",
                        (long long)ck->job, n);
    }
out:
    free(steps);
    ck_list_free(&l);
}

void dt_commit_set_aside(dt_coord_t *c, dt_commit_t *ck, const int64_t *agent_of, int64_t step)
{
    dt_live_agent_t *a = ck->root ? file_agent(c, ck, agent_of) : NULL;

    if (a)
        dt_push_prune(a, ck->root, &step, 1, "corrupt");
}

typedef struct shard_cmp {
    json_t *man; /* the manifest's sha256 per rank */
    int n, bad;
} shard_cmp_t;

static int shard_cb(const dt_shard_t *s, void *arg)
{
    shard_cmp_t *x = arg;
    const char *want = json_string_value(json_array_get(x->man, (size_t)s->rank));
    x->n++;
    if (want == NULL || strcmp(s->sha256, want) != 0)
        x->bad = 1;
    return 0;
}

void dt_commit_shard(dt_coord_t *c, dt_commit_t *ck, const int64_t *agent_of, int64_t step)
{
    dt_emsg_t em = { "" };
    char *text = NULL;
    shard_cmp_t x = { 0 };

    if (ck->root == NULL || step == ck->asked ||
        dt_db_checkpoint_manifest(c->db, ck->job, step, &text, &em) < 0 || text == NULL)
        goto out;
    x.man = json_loads(text, 0, NULL);
    if (!json_is_array(x.man) || json_array_size(x.man) == 0)
        goto out;
    if (dt_db_shards(c->db, ck->job, step, shard_cb, &x, &em) < 0 ||
        (size_t)x.n < json_array_size(x.man))
        goto out;
    if (x.bad || (size_t)x.n != json_array_size(x.man)) {
        dt_coord_event(c, ck->job, "checkpoint_rejected", "step=%lld: a shard's sha256 differs from "
                       "the manifest's, or its ranks do not match", (long long)step);
        ckpt_corrupt(c, ck, step);
        dt_commit_set_aside(c, ck, agent_of, step);
        goto out;
    }
    dt_live_agent_t *a = file_agent(c, ck, agent_of);
    if (a == NULL) {
        dt_log_warn("job=%lld step=%lld: complete, but no agent is connected to commit it",
                    (long long)ck->job, (long long)step);
        goto out;
    }
    ck->asked = step;
    dt_wire_ckpt_commit_t cm = { .dir = ck->root, .step = step };
    dt_push_msg(a, DT_MSG_CKPT_COMMIT, dt_wire_ckpt_commit_encode(&cm));
out:
    json_decref(x.man);
    free(text);
}

void dt_commit_done(dt_coord_t *c, dt_commit_t *ck, const int64_t *agent_of, dt_live_agent_t *a,
                    const dt_wire_ckpt_done_t *d)
{
    dt_emsg_t em = { "" };
    const char *op = d->op, *err = d->error;
    int64_t step = d->step;
    int ok = d->ok;

    if (strcmp(op, "prune") == 0) {
        if (!ok)
            dt_coord_event(c, ck->job, "checkpoint_prune_failed", "agent %lld (%s): %s",
                           (long long)a->id, a->node, err ? err : "?");
        return;
    }
    if (ck->asked == step)
        ck->asked = -1;
    if (!ok) {
        dt_coord_event(c, ck->job, "checkpoint_rejected", "step=%lld: agent %lld (%s) could not "
                       "write the commit marker: %s", (long long)step, (long long)a->id, a->node,
                       err ? err : "?");
        ckpt_corrupt(c, ck, step);
        dt_commit_set_aside(c, ck, agent_of, step);
        return;
    }
    if (dt_db_checkpoint_set_state(c->db, ck->job, step, "committed", &em) < 0) {
        dt_log_warn("job=%lld step=%lld commit: %s", (long long)ck->job, (long long)step, em.s);
        return;
    }
    prune(c, ck, agent_of);
}

void dt_commit_resume(dt_coord_t *c, const dt_commit_t *ck, char **dir, int64_t *step)
{
    ck_list_t l = { 0 };
    dt_emsg_t em = { "" };

    *dir = NULL;
    *step = 0;
    if (dt_db_checkpoints(c->db, ck->job, ck_cb, &l, &em) < 0) {
        dt_log_error("job=%lld checkpoints: %s", (long long)ck->job, em.s);
        return;
    }
    for (int i = l.n - 1; i >= 0 && *dir == NULL && ck->root; i--)
        if (strcmp(l.states[i], "committed") == 0) {
            *dir = dt_ckpt_step_dir(ck->root, l.steps[i]);
            *step = l.steps[i];
        }
    ck_list_free(&l);
}
