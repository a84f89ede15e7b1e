/* SPDX-License-Identifier: MIT
 *
 * Job, rank and agent states and the job transition table (spec/state.h).
 */
#include "config.h"

#include <string.h>

#include "common/err.h"
#include "common/macros.h"
#include "spec/state.h"

static const char *const state_names[DT_JOB_NSTATES] = {
#define STATE_NAME(name, str) [DT_JOB_##name] = str,
    DT_JOB_STATES(STATE_NAME)
#undef STATE_NAME
};

/* The legal transitions (also in dtctl(1)). A state never moves to itself.
 *
 *   from         to
 *   submitted    planned, failed, cancelled
 *   planned      queued, failed, cancelled
 *   queued       starting, failed, cancelled
 *   starting     running, recovering, failed, cancelled
 *   running      recovering, completed, failed, cancelled,
 *                queued (the Slurm job was requeued or preempted)
 *   recovering   running (same workers resumed), starting (a new
 *                generation), queued (requeue without the bad node),
 *                failed, cancelled
 *   failed       queued (resume)
 *   cancelled    queued (resume)
 *   completed    nothing: terminal
 */
#define TO(s) (1u << DT_JOB_##s)
static const unsigned legal_next[DT_JOB_NSTATES] = {
    [DT_JOB_SUBMITTED] = TO(PLANNED) | TO(FAILED) | TO(CANCELLED),
    [DT_JOB_PLANNED] = TO(QUEUED) | TO(FAILED) | TO(CANCELLED),
    [DT_JOB_QUEUED] = TO(STARTING) | TO(FAILED) | TO(CANCELLED),
    [DT_JOB_STARTING] = TO(RUNNING) | TO(RECOVERING) | TO(FAILED) | TO(CANCELLED),
    [DT_JOB_RUNNING] = TO(RECOVERING) | TO(COMPLETED) | TO(FAILED) | TO(CANCELLED) | TO(QUEUED),
    [DT_JOB_RECOVERING] = TO(RUNNING) | TO(STARTING) | TO(QUEUED) | TO(FAILED) | TO(CANCELLED),
    [DT_JOB_COMPLETED] = 0,
    [DT_JOB_FAILED] = TO(QUEUED),
    [DT_JOB_CANCELLED] = TO(QUEUED),
};
#undef TO

bool dt_job_state_valid(enum dt_job_state s)
{
    return (unsigned)s < DT_JOB_NSTATES;
}

const char *dt_job_state_name(enum dt_job_state s)
{
    return dt_job_state_valid(s) ? state_names[s] : "unknown";
}

int dt_job_state_parse(const char *s, enum dt_job_state *out)
{
    for (int i = 0; i < DT_JOB_NSTATES; i++)
        if (s != NULL && strcmp(s, state_names[i]) == 0) {
            *out = (enum dt_job_state)i;
            return 0;
        }
    return DT_EINVAL;
}

bool dt_job_transition_ok(enum dt_job_state from, enum dt_job_state to)
{
    return dt_job_state_valid(from) && dt_job_state_valid(to) && (legal_next[from] & (1u << to)) != 0;
}

bool dt_job_state_terminal(enum dt_job_state s)
{
    return s == DT_JOB_COMPLETED || s == DT_JOB_FAILED || s == DT_JOB_CANCELLED;
}

static const char *const rank_states[] = {
    "starting", "running", "exited", "failed", "hung", "killed", "lost",
};

bool dt_rank_state_known(const char *s)
{
    for (size_t i = 0; i < DT_ARRAY_SIZE(rank_states); i++)
        if (s != NULL && strcmp(s, rank_states[i]) == 0)
            return true;
    return false;
}

bool dt_agent_state_known(const char *s)
{
    return s != NULL && (strcmp(s, "registered") == 0 || strcmp(s, "lost") == 0 ||
                         strcmp(s, "gone") == 0);
}
