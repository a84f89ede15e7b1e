/* SPDX-License-Identifier: MIT
 *
 * libFuzzer target for the llm.c token shard header (engine/data/data.c,
 * dt_tok_parse_header: what dtengine train --data reads from every shard).
 * The input is a whole file, checked at its own size and, with the same
 * header, at sizes the input's last 8 bytes propose (a shard is mostly
 * tokens, which a fuzzer should not have to write out). A header must be
 * refused with a message, or accepted with a known format and a count that
 * fills the file exactly. Any inconsistency aborts.
 *
 * Built with clang -fsanitize=fuzzer by `make fuzz` and by
 * tests/integration/fuzz_replay.sh, and as a replay program over
 * tests/fuzz/corpus-tokshard everywhere else (replay.c).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokshard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "fuzz_tokshard: %s:%d: check failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                                    \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

static void one(const uint8_t *data, size_t size, int64_t file_size)
{
    enum dt_tok_format fmt = DT_TOK_U16;
    int64_t ntok = -1;
    dt_emsg_t em = { "" };
    int rc = dt_tok_parse_header("fuzz", data, size, file_size, &fmt, &ntok, &em);

    if (rc < 0) {
        CHECK(rc == DT_EFORMAT && em.s[0] != '\0');
        return;
    }
    CHECK(fmt == DT_TOK_U16 || fmt == DT_TOK_U32);
    CHECK(ntok >= 0 && ntok <= INT32_MAX);
    CHECK(DT_TOK_HEADER_BYTES + ntok * (fmt == DT_TOK_U16 ? 2 : 4) == file_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one(data, size, (int64_t)size);
    if (size >= DT_TOK_HEADER_BYTES + 8) {
        int64_t sizes[2];
        uint32_t v[2];

        memcpy(v, data + size - 8, 8);
        sizes[0] = (int64_t)v[0] + v[1];           /* anything, small or large */
        sizes[1] = INT64_MAX - (int64_t)(v[0] & 7); /* at the edge of int64 */
        for (int i = 0; i < 2; i++)
            one(data, size, sizes[i]);
    }
    return 0;
}
