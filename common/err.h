/* SPDX-License-Identifier: MIT
 *
 * Error codes of dt. 0 is success; failures are negative DT_E* values. Where
 * an errno fits, the code is the negated errno (DT_ENOMEM == -ENOMEM), so a
 * system call's failure translates once, at the edge, with dt_err_errno().
 * The codes and their messages come from one X-macro table; dt_strerror()
 * never returns NULL. This is not a place for foreign error spaces (SQLite,
 * CUDA, MPI): those translate into these codes in the module that calls them.
 */
#ifndef DT_ERR_H
#define DT_ERR_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message). Values below -4096 are dt's own. */
#define DT_ERRNO_MAP(X)                                                      \
    X(EPERM, -EPERM, "operation not permitted")                             \
    X(ENOENT, -ENOENT, "no such file or directory")                         \
    X(EIO, -EIO, "input/output error")                                      \
    X(ENOMEM, -ENOMEM, "out of memory")                                     \
    X(EACCES, -EACCES, "permission denied")                                 \
    X(EEXIST, -EEXIST, "already exists")                                    \
    X(EINVAL, -EINVAL, "invalid argument")                                  \
    X(ENOSPC, -ENOSPC, "no space left on device")                           \
    X(ERANGE, -ERANGE, "value out of range")                                \
    X(ENOTSUP, -ENOTSUP, "not supported")                                   \
    X(ETIMEDOUT, -ETIMEDOUT, "timed out")                                   \
    X(ECANCELED, -ECANCELED, "cancelled")                                   \
    X(EFORMAT, -4097, "malformed file")                                     \
    X(ESHAPE, -4098, "tensor shapes do not agree")                          \
    X(EDTYPE, -4099, "unsupported tensor dtype or order")                   \
    X(ECONF, -4100, "configuration error")                                  \
    X(ECOMM, -4101, "communication failed")                                 \
    X(EPROTO, -4102, "protocol error")                                      \
    X(ELAYOUT, -4103, "unsupported layout for this job")                    \
    X(EUSAGE, -4104, "usage error")                                         \
    X(ESTATE, -4105, "not allowed in the job's current state")               \
    X(EDIVERGED, -4106, "training diverged (non-finite loss or gradient)") \
    X(EDEVICE, -4107, "GPU error")                                          \
    X(ECKPT, -4108, "checkpoint does not verify")

enum dt_err {
    DT_OK = 0,
#define DT_ERR_ENUM(name, value, msg) DT_##name = (value),
    DT_ERRNO_MAP(DT_ERR_ENUM)
#undef DT_ERR_ENUM
};

/* Message for a dt error code (or "unknown error <n>" in a static buffer for
 * codes outside the table). Never NULL; the string is borrowed. */
const char *dt_strerror(int err);

/* Symbolic name ("DT_ENOENT") of a code; "DT_OK" for 0; "DT_E?" if unknown. */
const char *dt_err_name(int err);

/* The dt code for an errno value (positive), e.g. after a failed syscall.
 * Errnos without their own entry map to DT_EIO. */
int dt_err_errno(int errnum);

/* A message for the user that says what was wrong and where ("q.npy: shape
 * (100, 8, 64) but k.npy has 96 rows"). Functions that check input take a
 * dt_emsg_t * (which may be NULL), fill it on failure, and return the code. */
typedef struct dt_emsg {
    char s[512];
} dt_emsg_t;

/* Format into em (no-op when em is NULL); returns err so callers can write
 * `return dt_emsg_set(em, DT_EINVAL, "...")`. */
int dt_emsg_set(dt_emsg_t *em, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif

#endif /* DT_ERR_H */
