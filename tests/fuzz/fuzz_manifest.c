/* SPDX-License-Identifier: MIT
 *
 * libFuzzer target for the checkpoint manifest parser (io/ckpt.c,
 * dt_ckpt_manifest_parse: what resume and the commit path read from a
 * step directory a job's owner controls). The input is the manifest's
 * text. It must be refused with a message, or accepted with every field in
 * its range: step and data cursor non-negative, 1 <= ranks <= 2^20, one
 * shard record per rank with its rank, the canonical file name (no path
 * can leave the directory), a non-negative size and 64 lowercase hex
 * digits; model, plan and rng objects. Any inconsistency aborts; a leak is
 * a finding.
 *
 * Built with clang -fsanitize=fuzzer by `make fuzz` and by
 * tests/integration/fuzz_replay.sh, and as a replay program over
 * tests/fuzz/corpus-manifest everywhere else (replay.c).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "fuzz_manifest: %s:%d: check failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                                    \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dt_ckpt_manifest_t m;
    dt_emsg_t em = { "" };
    int rc = dt_ckpt_manifest_parse("fuzz", (const char *)data, size, &m, &em);

    if (rc < 0) {
        CHECK(rc == DT_EFORMAT && em.s[0] != '\0');
        CHECK(m.shards == NULL && m.model == NULL && m.ranks == 0);
        return 0;
    }
    CHECK(m.step >= 0 && m.data_cursor >= 0);
    CHECK(m.ranks >= 1 && m.ranks <= DT_CKPT_MAX_RANKS);
    CHECK(json_is_object(m.model) && json_is_object(m.plan) && json_is_object(m.rng));
    for (int r = 0; r < m.ranks; r++) {
        char want[64];

        dt_ckpt_shard_name(r, m.ranks, want);
        CHECK(m.shards[r].rank == r);
        CHECK(strcmp(m.shards[r].file, want) == 0 && strchr(m.shards[r].file, '/') == NULL);
        CHECK(m.shards[r].bytes >= 0);
        CHECK(strlen(m.shards[r].sha256) == 64 &&
              strspn(m.shards[r].sha256, "0123456789abcdef") == 64);
    }
    dt_ckpt_manifest_close(&m);
    CHECK(m.shards == NULL && m.model == NULL);
    return 0;
}
