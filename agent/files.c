/* SPDX-License-Identifier: MIT
 *
 * The job's checkpoint files, as the job's owner: the work the coordinator
 * asks for but never does itself (it may run as root, and these paths are
 * the user's: dtcoordd(8) SECURITY). CKPT_COMMIT writes a step's COMMITTED
 * marker (dt_ckpt_mark_committed never follows a planted link); CKPT_PRUNE
 * removes old step directories (dt_rmtree never follows a link out of
 * them), or sets corrupt ones aside as step-N.corrupt so that the engine
 * writes the step again. Each runs on the thread pool and is answered with CKPT_DONE.
 *
 * Not here: reading shards back after a worker wrote them (task.c), the
 * checkpoint format (io/ckpt.c), the link (reached through the hooks).
 */
#include "config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/files.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/mem.h"
#include "io/ckpt.h"

typedef struct file_op {
    uv_work_t req;
    const dt_agentd_hooks_t *up;
    int commit;       /* else prune */
    char *tag;        /* prune: set the steps aside as step-N.TAG instead of deleting them */
    char *root;
    int64_t *steps;
    size_t n;
    int ok;
    char why[512];
} file_op_t;

static void op_work(uv_work_t *req)
{
    file_op_t *op = req->data;
    dt_emsg_t em = { "" };

    op->ok = 1;
    for (size_t i = 0; i < op->n; i++) {
        char *dir = dt_ckpt_step_dir(op->root, op->steps[i]);
        int rc = op->commit ? dt_ckpt_mark_committed(dir, &em)
                 : op->tag  ? dt_ckpt_set_aside(op->root, op->steps[i], op->tag, NULL, &em)
                            : dt_rmtree(dir, &em);
        if (rc < 0 && op->ok) {
            op->ok = 0;
            snprintf(op->why, sizeof(op->why), "%s", em.s);
        }
        free(dir);
    }
}

static void op_done(uv_work_t *req, int status)
{
    file_op_t *op = req->data;
    const dt_agentd_hooks_t *up = op->up;
    int64_t step = op->n ? op->steps[op->n - 1] : 0;

    if (status != 0) {
        op->ok = 0;
        snprintf(op->why, sizeof(op->why), "not run: %s", uv_strerror(status));
    }
    if (op->ok)
        dt_log_info("%s step=%lld%s done", op->commit ? "commit" : "prune", (long long)step,
                    op->n > 1 ? " and older" : "");
    else
        dt_log_error("%s step=%lld: %s", op->commit ? "commit" : "prune", (long long)step,
                     op->why);
    if (!up->stopping(up->ud) || op->commit) {
        dt_wire_ckpt_done_t d = { .agent = up->agent_id(up->ud),
                                  .op = op->commit ? "commit" : "prune", .step = step,
                                  .ok = op->ok, .error = op->ok ? NULL : op->why };
        up->send_reliable(up->ud, DT_MSG_CKPT_DONE, dt_wire_ckpt_done_encode(&d));
    }
    free(op->root);
    free(op->tag);
    free(op->steps);
    free(op);
}

/* Queue the operation on the thread pool; root and tag are copied. */
static void queue(uv_loop_t *loop, const dt_agentd_hooks_t *hooks, bool commit, const char *root,
                  const int64_t *steps, size_t n, const char *tag)
{
    const char *what = commit ? "CKPT_COMMIT" : "CKPT_PRUNE";

    if (root[0] != '/') {
        dt_log_error("%s without an absolute 'dir': ignored", what);
        return;
    }
    if (tag && (tag[0] == '\0' || strspn(tag, "abcdefghijklmnopqrstuvwxyz") != strlen(tag))) {
        dt_log_error("%s set_aside '%.32s': not a lowercase word: ignored", what, tag);
        return;
    }
    file_op_t *op = dt_xcalloc(1, sizeof(*op));
    op->req.data = op;
    op->up = hooks;
    op->commit = commit;
    op->root = dt_xstrdup(root);
    op->tag = tag ? dt_xstrdup(tag) : NULL;
    op->steps = dt_xcalloc(n, sizeof(*op->steps));
    memcpy(op->steps, steps, n * sizeof(*op->steps));
    op->n = n;
    if (uv_queue_work(loop, &op->req, op_work, op_done) < 0)
        op_done(&op->req, UV_ECANCELED);
}

void dt_files_commit(uv_loop_t *loop, const dt_agentd_hooks_t *hooks,
                     const dt_wire_ckpt_commit_t *cm)
{
    queue(loop, hooks, true, cm->dir, &cm->step, 1, NULL);
}

void dt_files_prune(uv_loop_t *loop, const dt_agentd_hooks_t *hooks,
                    const dt_wire_ckpt_prune_t *pr)
{
    queue(loop, hooks, false, pr->dir, pr->steps.v, pr->steps.n, pr->set_aside);
}
