/* SPDX-License-Identifier: MIT
 *
 * The step history and the failures' costs (goodput.h), between run.c's
 * reports and the database.
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/goodput.h"

void dt_goodput_gen_start(dt_goodput_run_t *g, int gen, int64_t resume_step, int64_t now_ms)
{
    g->gen = gen;
    g->last_step = resume_step;
    g->last_ms = 0;
    g->start_ms = now_ms;
    g->ckpt = 0;
}

void dt_goodput_ckpt(dt_goodput_run_t *g)
{
    g->ckpt = 1;
}

/* Cost the pending failure against generation g->gen (until_ms 0: it
 * finished a step; else when it failed first). Logged; the job goes on. */
static void cost_pending(dt_db_t *db, int64_t job, dt_goodput_run_t *g, int64_t until_ms)
{
    dt_emsg_t em = { "" };
    dt_fail_cost_t fc = { .gen = g->fail_gen, .next = g->gen, .what = g->fail_what,
                          .fault_ms = g->fault_ms, .decided_ms = g->decided_ms,
                          .until_ms = until_ms };

    g->fail_gen = 0;
    if (dt_db_failure_cost(db, job, &fc, &em) < 0) {
        dt_log_warn("job=%" PRId64 " gen=%d: failure cost not recorded: %s", job, fc.gen, em.s);
        return;
    }
    dt_log_info("job=%" PRId64 " gen=%d failure_cost fault=%s detect_s=%.3f restart_s=%.3f "
                "load_s=%.3f resume_step=%" PRId64 " recomputed_steps=%" PRId64
                " recomputed_s=%.3f",
                job, fc.gen, fc.what, fc.detect_s, fc.restart_s, fc.load_s, fc.resume_step,
                fc.recomputed_steps, fc.recomputed_s);
}

void dt_goodput_fault(dt_db_t *db, int64_t job, dt_goodput_run_t *g, const char *what,
                      int64_t fault_ms, int64_t now_ms)
{
    if (g->gen == 0 || g->fail_gen == g->gen)
        return;
    int64_t at = fault_ms > 0 && fault_ms <= now_ms ? fault_ms : now_ms;
    if (g->fail_gen != 0)
        cost_pending(db, job, g, at);
    g->fail_gen = g->gen;
    snprintf(g->fail_what, sizeof(g->fail_what), "%s", what);
    g->fault_ms = at;
    g->decided_ms = now_ms;
}

/* The own time of the steps from g->last_step to step, in ms. */
static double own_ms(const dt_goodput_run_t *g, int64_t step, int64_t tokens, double tokens_s,
                     int64_t now_ms)
{
    if (isfinite(tokens_s) && tokens_s > 0 && tokens > 0) {
        /* tokens count every step from 0: the same share each */
        double per_step = (double)tokens / (double)step;
        return per_step * (double)(step - g->last_step) / tokens_s * 1000.0;
    }
    int64_t from = g->last_ms ? g->last_ms : g->start_ms;
    return now_ms > from ? (double)(now_ms - from) : 0.0;
}

void dt_goodput_progress(dt_db_t *db, int64_t job, dt_goodput_run_t *g, int64_t step,
                         int64_t tokens, double loss, double tokens_s, int64_t now_ms)
{
    dt_emsg_t em = { "" };

    if (step < 1 || step <= g->last_step)
        return; /* a report of no new step (attn's "running") */
    double own = own_ms(g, step, tokens, tokens_s, now_ms), stall = 0;
    if (g->ckpt && g->last_ms > 0) {
        double gap = (double)(now_ms - g->last_ms) - own;
        stall = gap > 0 ? gap : 0;
    }
    g->ckpt = 0;
    dt_step_row_t s = { .job = job, .gen = g->gen, .step = step, .at_ms = now_ms,
                        .step_ms = own, .loss = loss,
                        .tokens_s = isfinite(tokens_s) && tokens_s > 0 ? tokens_s : NAN };
    if (dt_db_step_add(db, &s, stall, &em) < 0)
        /* a step already recorded (a coordinator restart mid-generation)
         * or a database error: the history misses it, the job goes on */
        dt_log_debug("job=%" PRId64 " gen=%d step=%" PRId64 ": %s", job, g->gen, step, em.s);
    g->last_step = step;
    g->last_ms = now_ms;
    if (g->fail_gen != 0 && g->gen > g->fail_gen)
        cost_pending(db, job, g, 0);
}
