/* SPDX-License-Identifier: MIT
 *
 * libFuzzer target for the safetensors reader (io/safetensors.c) and
 * the training-shard slice check over it (io/ckpt.c,
 * dt_ckpt_train_slice, what dtengine train --resume runs on every shard).
 * The input is a whole file: dt_st_parse must refuse it with a message or
 * accept it, and what it accepts must hold together: tensors in offset
 * order tiling [0, data size) exactly, each one's byte range equal to its
 * shape times its dtype size, the data ending where the file ends. The
 * slice check is then asked about the tensors for three parameter counts,
 * and a slice it accepts must lie inside [0, n). Any inconsistency aborts;
 * a leak is a finding.
 *
 * Built with clang -fsanitize=fuzzer by `make fuzz` and by
 * tests/integration/fuzz_replay.sh, and as a replay program over
 * tests/fuzz/corpus-safetensors everywhere else (replay.c).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/ckpt.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "fuzz_safetensors: %s:%d: check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                                    \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int64_t ns[] = { 0, 1000, INT64_MAX };
    dt_st_reader_t *r = NULL;
    dt_emsg_t em = { "" };
    uint64_t end = 0, hlen = 0;
    int rc = dt_st_parse("fuzz", data, size, &r, &em);

    if (rc < 0) {
        CHECK(r == NULL && em.s[0] != '\0');
        return 0;
    }
    CHECK(r != NULL && size >= 8);
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | data[i];
    for (size_t i = 0; i < dt_st_count(r); i++) {
        const dt_st_tensor_t *t = dt_st_tensor(r, i);
        uint64_t bytes = dt_st_dtype_size(t->dtype);

        CHECK(t->begin == end && t->end >= t->begin);
        CHECK(t->ndim >= 0 && t->ndim <= DT_ST_MAXDIM);
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] >= 0);
            CHECK(!__builtin_mul_overflow(bytes, (uint64_t)t->shape[d], &bytes));
        }
        CHECK(bytes == t->end - t->begin);
        CHECK(dt_st_find(r, t->name) == t);
        end = t->end;
    }
    CHECK(8 + hlen + end == size);
    for (size_t i = 0; i < dt_st_meta_count(r); i++) {
        const char *k, *v;
        dt_st_meta_at(r, i, &k, &v);
        CHECK(k != NULL && v != NULL && dt_st_meta(r, k) != NULL);
    }
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
        int64_t off = -1, len = -1;

        em.s[0] = '\0';
        rc = dt_ckpt_train_slice("fuzz", r, ns[i], &off, &len, &em);
        if (rc < 0) {
            CHECK(rc == DT_EFORMAT && em.s[0] != '\0');
            continue;
        }
        CHECK(off >= 0 && len >= 0 && off <= ns[i] && len <= ns[i] - off);
    }
    dt_st_close(r);
    return 0;
}
