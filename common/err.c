/* SPDX-License-Identifier: MIT
 *
 * dt_strerror and friends: the messages of the X-macro table in err.h.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>

#include "err.h"

const char *dt_strerror(int err)
{
    static _Thread_local char unknown[32];

    switch (err) {
    case DT_OK:
        return "success";
#define DT_ERR_MSG(name, value, msg) \
    case DT_##name:                  \
        return msg;
        DT_ERRNO_MAP(DT_ERR_MSG)
#undef DT_ERR_MSG
    }
    snprintf(unknown, sizeof(unknown), "unknown error %d", err);
    return unknown;
}

const char *dt_err_name(int err)
{
    switch (err) {
    case DT_OK:
        return "DT_OK";
#define DT_ERR_NAME(name, value, msg) \
    case DT_##name:                   \
        return "DT_" #name;
        DT_ERRNO_MAP(DT_ERR_NAME)
#undef DT_ERR_NAME
    }
    return "DT_E?";
}

int dt_err_errno(int errnum)
{
    switch (-errnum) {
#define DT_ERR_ERRNO(name, value, msg) \
    case DT_##name:                    \
        return (value) > -4096 ? DT_##name : DT_EIO;
        DT_ERRNO_MAP(DT_ERR_ERRNO)
#undef DT_ERR_ERRNO
    }
    return DT_EIO;
}

int dt_emsg_set(dt_emsg_t *em, int err, const char *fmt, ...)
{
    va_list ap;

    if (em == NULL)
        return err;
    va_start(ap, fmt);
    vsnprintf(em->s, sizeof(em->s), fmt, ap);
    va_end(ap);
    return err;
}
