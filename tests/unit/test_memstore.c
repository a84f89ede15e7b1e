/* SPDX-License-Identifier: MIT
 *
 * agent/memstore.c: the in-memory checkpoints an agent holds, with real
 * memory files (memfd_create): a rank's two files, what each holds, the
 * replicas kept for ranks that run elsewhere, and what goes when a rank
 * moves away.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/memstore.h"

static const char sha_a[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
static const char sha_b[] = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

static int is_open(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0;
}

Test(memstore, a_ranks_two_files_and_what_they_hold)
{
    dt_memstore_t *m = dt_memstore_new(7);
    dt_emsg_t em = { "" };
    int fds[2], again[2];
    dt_memcopy_t c;

    cr_assert_eq(dt_memstore_fds(m, 3, fds, &em), 0, "%s", em.s);
    cr_assert(fds[0] >= 0 && fds[1] >= 0 && fds[0] != fds[1]);
    cr_assert_eq(dt_memstore_fds(m, 3, again, &em), 0);
    cr_assert(again[0] == fds[0] && again[1] == fds[1], "the same files on every call");
    char link[64], name[256] = "";
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fds[1]);
    cr_assert_gt(readlink(link, name, sizeof(name) - 1), 0);
    cr_assert(strstr(name, "memfd:dt-job7-rank3-slot1") != NULL, "named %s", name);
    cr_assert_eq(dt_memstore_find(m, 3, 5, NULL), -1, "nothing verified yet");
    dt_memstore_set(m, 3, 1, 5, 100, sha_a);
    dt_memstore_set(m, 3, 0, 6, 120, sha_b);
    cr_assert_eq(dt_memstore_find(m, 3, 5, &c), 1);
    cr_assert_eq(c.bytes, 100);
    cr_assert_str_eq(c.sha256, sha_a);
    cr_assert_eq(dt_memstore_bytes(m), 220);
    dt_memstore_clear(m, 3, 1); /* being rewritten */
    cr_assert_eq(dt_memstore_find(m, 3, 5, NULL), -1);
    cr_assert_eq(dt_memstore_find(m, 3, 6, NULL), 0);
    dt_memstore_set(m, 9, 0, 6, 1, sha_a); /* an unknown rank: ignored */
    cr_assert_eq(dt_memstore_find(m, 9, 6, NULL), -1);
    dt_memstore_free(m);
    cr_assert(!is_open(fds[0]) && !is_open(fds[1]), "the memory goes with the store");
}

Test(memstore, replicas_stay_when_a_rank_moves_away)
{
    dt_memstore_t *m = dt_memstore_new(1);
    dt_emsg_t em = { "" };
    int own[2], slot = -1;
    int64_t bytes = 0;
    char sha[65] = "";

    cr_assert_eq(dt_memstore_fds(m, 0, own, &em), 0, "%s", em.s);
    dt_memstore_set(m, 0, 0, 4, 10, sha_a);
    /* replicas of rank 2 (its agent elsewhere): the older slot each time */
    int r1 = dt_memstore_replica_sink(m, 2, &slot, &em);
    cr_assert(r1 >= 0, "%s", em.s);
    cr_assert_eq(slot, 0);
    dt_memstore_replica_set(m, 2, slot, 8, 30, sha_b);
    int r2 = dt_memstore_replica_sink(m, 2, &slot, &em);
    cr_assert_eq(slot, 1);
    cr_assert_neq(r1, r2);
    dt_memstore_replica_set(m, 2, slot, 9, 31, sha_a);
    cr_assert_eq(dt_memstore_replica_sink(m, 2, &slot, &em), r1, "step 8's is the older");
    cr_assert_eq(slot, 0);
    dt_memstore_replica_set(m, 2, 0, 10, 32, sha_b);
    cr_assert_eq(dt_memstore_lookup(m, 2, 10, &bytes, sha), r1);
    cr_assert_eq(bytes, 32);
    cr_assert_str_eq(sha, sha_b);
    cr_assert_eq(dt_memstore_lookup(m, 0, 4, &bytes, sha), own[0], "its own copies too");
    cr_assert_eq(dt_memstore_lookup(m, 2, 8, &bytes, sha), -1, "overwritten");
    /* rank 0 moves away, nothing runs here: its own files go, rank 2's
     * replicas stay */
    dt_memstore_keep(m, NULL, 0);
    cr_assert(!is_open(own[0]) && !is_open(own[1]));
    cr_assert_eq(dt_memstore_lookup(m, 0, 4, &bytes, sha), -1);
    cr_assert_eq(dt_memstore_lookup(m, 2, 10, &bytes, sha), r1);
    cr_assert(is_open(r1) && is_open(r2));
    cr_assert_eq(dt_memstore_ranks(m), 1);
    dt_memstore_free(m);
    cr_assert(!is_open(r1) && !is_open(r2));
}
