/* SPDX-License-Identifier: MIT
 *
 * libFuzzer target for the headers of token files (io/tokshard.c,
 * dt_tok_parse_header: what dtengine train and prefill --data read from
 * every file): llm.c shards and, behind the "\x93NUMPY" magic, .npy arrays
 * of token ids (through io/npy.c's parser). The input is a whole file,
 * checked at its own size and, with the same header, at sizes the input's
 * last 8 bytes propose (a token file is mostly tokens, which a fuzzer should
 * not have to write out). A header must be refused with a message, or
 * accepted with a known format and a count that fills the file exactly
 * after the data offset. Any inconsistency aborts.
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
    dt_tok_info_t info = { .fmt = DT_TOK_U16, .ntok = -1, .data_offset = -1 };
    dt_emsg_t em = { "" };
    int rc = dt_tok_parse_header("fuzz", data, size, file_size, &info, &em);
    int64_t w;

    if (rc < 0) {
        CHECK((rc == DT_EFORMAT || rc == DT_EDTYPE) && em.s[0] != '\0');
        CHECK(info.ntok == 0 && info.data_offset == 0);
        return;
    }
    if (info.fmt == DT_TOK_U16 || info.fmt == DT_TOK_U32) {
        CHECK(info.ntok >= 0 && info.ntok <= INT32_MAX);
        CHECK(info.data_offset == DT_TOK_HEADER_BYTES);
        w = info.fmt == DT_TOK_U16 ? 2 : 4;
    } else {
        CHECK(info.fmt == DT_TOK_NPY_I32 || info.fmt == DT_TOK_NPY_I64);
        CHECK(size >= 6 && memcmp(data, "\x93NUMPY", 6) == 0);
        /* the whole header was in the input, and the data starts after it */
        CHECK(info.ntok >= 0 && info.data_offset >= 10 && info.data_offset <= (int64_t)size);
        w = info.fmt == DT_TOK_NPY_I32 ? 4 : 8;
        CHECK(info.ntok <= (INT64_MAX - info.data_offset) / w);
    }
    CHECK(info.data_offset + info.ntok * w == file_size);
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
