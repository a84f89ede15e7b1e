/* SPDX-License-Identifier: MIT
 *
 * libFuzzer target for the .npy header reader (io/npy.c,
 * dt_npy_parse_header: what dtengine attn reads from every input). The
 * input is a whole file. It must be refused with a message, or accepted
 * with a supported dtype, 0 to 8 non-negative dimensions whose product is
 * the element count, and a size that is exactly the data offset plus the
 * data (no trailing bytes), all without overflow. Any inconsistency aborts.
 *
 * Built with clang -fsanitize=fuzzer by `make fuzz` and by
 * tests/integration/fuzz_replay.sh, and as a replay program over
 * tests/fuzz/corpus-npy everywhere else (replay.c).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "fuzz_npy: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    int rc = dt_npy_parse_header("fuzz", data, size, &info, &em);
    uint64_t count = 1, bytes;

    if (rc < 0) {
        CHECK((rc == DT_EFORMAT || rc == DT_EDTYPE) && em.s[0] != '\0');
        CHECK(info.ndim == 0 && info.count == 0);
        return 0;
    }
    CHECK(info.dtype == DT_F32 || info.dtype == DT_F16 || info.dtype == DT_F64 ||
          info.dtype == DT_I32 || info.dtype == DT_I64 || info.dtype == DT_U8 ||
          info.dtype == DT_BOOL);
    CHECK(info.ndim >= 0 && info.ndim <= DT_NPY_MAXDIM);
    for (int d = 0; d < info.ndim; d++) {
        CHECK(info.shape[d] >= 0);
        CHECK(!__builtin_mul_overflow(count, (uint64_t)info.shape[d], &count));
    }
    CHECK(count == (uint64_t)info.count);
    CHECK(!__builtin_mul_overflow(count, dt_npy_dtype_size(info.dtype), &bytes));
    CHECK(info.data_offset >= 10 && info.data_offset <= size);
    CHECK(info.data_offset + bytes == size);
    return 0;
}
