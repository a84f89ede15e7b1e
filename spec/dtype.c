/* SPDX-License-Identifier: MIT
 *
 * Sizes and names of the element types of spec/dtype.h.
 */
#include "config.h"

#include "spec/dtype.h"

size_t dt_dtype_size(dt_dtype_t t)
{
    switch (t) {
    case DT_F32: case DT_I32: return 4;
    case DT_F16: case DT_BF16: return 2;
    case DT_I64: case DT_F64: return 8;
    case DT_U8: case DT_BOOL: return 1;
    }
    return 0;
}

const char *dt_dtype_name(dt_dtype_t t)
{
    switch (t) {
    case DT_F32: return "fp32";
    case DT_F16: return "fp16";
    case DT_BF16: return "bf16";
    case DT_I64: return "i64";
    case DT_I32: return "i32";
    case DT_U8: return "u8";
    case DT_F64: return "fp64";
    case DT_BOOL: return "bool";
    }
    return "?";
}
