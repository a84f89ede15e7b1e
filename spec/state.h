/* SPDX-License-Identifier: MIT
 *
 * The states of a job, its ranks and its agents, as every binary names
 * them: the job-state enum with its strings, the transition table (the
 * lifecycle dtctl(1) documents; db/ enforces it inside each transaction),
 * and the rank and agent state names the database accepts. Data and pure
 * functions only.
 */
#ifndef DT_SPEC_STATE_H
#define DT_SPEC_STATE_H

#include <stdbool.h>

/* X(name, string) in lifecycle order. */
#define DT_JOB_STATES(X)         \
    X(SUBMITTED, "submitted")    \
    X(PLANNED, "planned")        \
    X(QUEUED, "queued")          \
    X(STARTING, "starting")      \
    X(RUNNING, "running")        \
    X(RECOVERING, "recovering")  \
    X(COMPLETED, "completed")    \
    X(FAILED, "failed")          \
    X(CANCELLED, "cancelled")

enum dt_job_state {
#define DT_JOB_STATE_ENUM(name, str) DT_JOB_##name,
    DT_JOB_STATES(DT_JOB_STATE_ENUM)
#undef DT_JOB_STATE_ENUM
    DT_JOB_NSTATES
};

/* A value of the enum (not DT_JOB_NSTATES or beyond)? */
bool dt_job_state_valid(enum dt_job_state s);
/* "submitted", ...; "unknown" outside the enum. */
const char *dt_job_state_name(enum dt_job_state s);
/* The state named s; DT_EINVAL if none. */
int dt_job_state_parse(const char *s, enum dt_job_state *out);
/* The transition table (documented in dtctl(1)): is from -> to legal? */
bool dt_job_transition_ok(enum dt_job_state from, enum dt_job_state to);
/* completed, failed, cancelled */
bool dt_job_state_terminal(enum dt_job_state s);

/* Rank states: starting, running, exited, failed, hung, killed, lost. */
bool dt_rank_state_known(const char *s);
/* Agent states: registered, lost, gone. */
bool dt_agent_state_known(const char *s);

#endif /* DT_SPEC_STATE_H */
