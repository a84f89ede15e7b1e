/* SPDX-License-Identifier: MIT
 *
 * Element types, one enum for every place that names one: a job's compute
 * precision (fp32 | bf16 | fp16), the tensors of .npy and safetensors
 * files, and the device kernels' inputs. Each user accepts the subset it
 * supports and says so when given another. How a file format spells a type
 * ("<f4", "F32") is the format's business (io/); this is the vocabulary.
 * Header and a few pure functions; C and C++ (the CUDA kernels include it).
 */
#ifndef DT_SPEC_DTYPE_H
#define DT_SPEC_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_dtype {
    DT_F32 = 0, /* IEEE binary32 */
    DT_F16,     /* IEEE binary16 */
    DT_BF16,    /* bfloat16: binary32's exponent, 7 stored mantissa bits */
    DT_I64,
    DT_I32,
    DT_U8,
    DT_F64, /* IEEE binary64: read from .npy files (reference values), never computed in */
    DT_BOOL, /* one byte, 0 or 1: read from .npy files (masks) */
} dt_dtype_t;

/* Bytes per element; 0 for a value outside the enum. */
size_t dt_dtype_size(dt_dtype_t t);
/* "fp32", "fp16", "bf16", "i64", "i32", "u8", "fp64" (the spelling of specs and
 * messages); "?" for a value outside the enum. */
const char *dt_dtype_name(dt_dtype_t t);

#ifdef __cplusplus
}
#endif

#endif /* DT_SPEC_DTYPE_H */
