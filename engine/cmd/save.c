/* SPDX-License-Identifier: MIT
 *
 * A checkpoint step written by every rank (engine/cmd/save.h).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "common/mem.h"
#include "common/sha256.h"
#include "engine/cmd/save.h"
#include "engine/wlink.h"
#include "io/ckpt.h"

enum { TAG_SHARD = 351 };

/* External commits, rank 0: what an earlier generation left at the step. */
static int supersede(const dt_cmd_save_t *sv, int *skip, dt_emsg_t *em)
{
    dt_emsg_t warn = { "" };
    char *dir = dt_ckpt_step_dir(sv->root, sv->step);
    int rc = dt_ckpt_supersede(sv->root, sv->step, &warn, em);

    *skip = rc == DT_CKPT_KEEP;
    if (rc == DT_CKPT_KEEP)
        fprintf(stderr, "%s: %s is already committed: not written again\n", sv->cmd, dir);
    if (rc == DT_CKPT_REDONE)
        fprintf(stderr, "%s: %s was never committed: writing it again\n", sv->cmd, dir);
    if (warn.s[0])
        fprintf(stderr, "%s: %s\n", sv->cmd, warn.s);
    free(dir);
    return rc < 0 ? rc : 0;
}

/* Rank 0: the manifest from every rank's record, the rename into place,
 * and (self commits) the pruning; *sha and *bytes the manifest's, for the
 * agent. */
static int finish(dt_comm_t *comm, const dt_cmd_save_t *sv, dt_ckpt_shard_t *recs,
                  char sha[65], int64_t *bytes, dt_emsg_t *em)
{
    int R = dt_comm_size(comm), rc = 0;

    for (int q = 1; q < R && rc == 0; q++)
        if ((rc = dt_comm_recv(comm, &recs[q], sizeof(recs[q]), q, TAG_SHARD)) < 0)
            dt_emsg_set(em, rc, "step %lld: receiving rank %d's shard record failed",
                        (long long)sv->step, q);
    if (rc < 0)
        return rc;
    dt_ckpt_manifest_t man = { .step = sv->step, .ranks = R, .model = sv->model,
                               .plan = sv->plan, .rng = sv->rng,
                               .data_cursor = sv->data_cursor, .shards = recs };
    if ((rc = dt_ckpt_write_manifest(sv->root, &man, em)) < 0 ||
        (rc = dt_ckpt_commit(sv->root, sv->step, NULL, em)) < 0)
        return rc;
    if (!sv->external && dt_ckpt_prune(sv->root, sv->keep, em) < 0)
        em->s[0] = '\0'; /* pruning is housekeeping: the checkpoint is safe */
    if (!dt_wlink_active())
        return 0;
    char *sdir = dt_ckpt_step_dir(sv->root, sv->step);
    char *path = dt_xasprintf("%s/%s", sdir, DT_CKPT_MANIFEST);
    struct stat st;
    if ((rc = dt_sha256_file(path, sha, em)) == 0 && stat(path, &st) == 0)
        *bytes = (int64_t)st.st_size;
    free(path);
    free(sdir);
    return rc;
}

int dt_cmd_save(dt_comm_t *comm, const dt_cmd_save_t *sv, dt_st_writer_t *w, int *skipped,
                dt_emsg_t *em)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm), rc = 0, who, skip = 0;
    dt_ckpt_shard_t *recs = me == 0 ? dt_xcalloc((size_t)R, sizeof(*recs)) : NULL, mine;
    int64_t man_bytes = 0;
    char man_sha[65] = "";

    *skipped = 0;
    dt_wlink_heartbeat();
    if (me == 0 && sv->external)
        rc = supersede(sv, &skip, em);
    if (me == 0 && rc == 0 && !skip)
        rc = dt_ckpt_begin(sv->root, sv->step, em);
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0 ||
        (rc = dt_comm_bcast_int(comm, &skip)) < 0 || skip)
        goto out;
    rc = dt_ckpt_write_shard(sv->root, sv->step, me, R, w, &mine, em);
    dt_wlink_heartbeat();
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0)
        goto out;
    if (me != 0) {
        rc = dt_comm_send(comm, &mine, sizeof(mine), 0, TAG_SHARD);
    } else {
        recs[0] = mine;
        rc = finish(comm, sv, recs, man_sha, &man_bytes, em);
        dt_wlink_heartbeat();
    }
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0 || !dt_wlink_active())
        goto out;
    /* renamed into place: only now do the files have their final names;
     * the agent, elsewhere, needs the directory absolute */
    char *sdir = dt_ckpt_step_dir(sv->root, sv->step), *dir = realpath(sdir, NULL);
    dt_wlink_shard(sv->step, dir ? dir : sdir, mine.file, mine.bytes, mine.sha256, 0);
    if (me == 0)
        dt_wlink_shard(sv->step, dir ? dir : sdir, DT_CKPT_MANIFEST, man_bytes, man_sha, 1);
    free(dir);
    free(sdir);
out:
    *skipped = skip;
    free(recs);
    return rc;
}
