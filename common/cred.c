/* SPDX-License-Identifier: MIT
 *
 * dt_cred_new over libmunge (cred.h).
 */
#include "config.h"

#include <munge.h>
#include <stdlib.h>

#include "common/cred.h"

int dt_cred_new(const char *munge_socket, char **cred, dt_emsg_t *em)
{
    munge_ctx_t ctx = munge_ctx_create();
    munge_err_t e = EMUNGE_NO_MEMORY;

    *cred = NULL;
    if (ctx && (munge_socket == NULL ||
                (e = munge_ctx_set(ctx, MUNGE_OPT_SOCKET, munge_socket)) == EMUNGE_SUCCESS))
        e = munge_encode(cred, ctx, NULL, 0);
    if (ctx)
        munge_ctx_destroy(ctx);
    if (e != EMUNGE_SUCCESS) {
        free(*cred);
        *cred = NULL;
        return dt_emsg_set(em, DT_ECOMM, "munge: %s (is munged running?)", munge_strerror(e));
    }
    return 0;
}

int dt_cred_check(const char *cred, const char *munge_socket, const char *who, uid_t *uid,
                  gid_t *gid, dt_emsg_t *em)
{
    munge_ctx_t ctx = munge_ctx_create();
    munge_err_t e;
    int rc = 0;

    if (ctx == NULL)
        return dt_emsg_set(em, DT_ENOMEM, "munge: cannot create a context");
    if (munge_socket && munge_ctx_set(ctx, MUNGE_OPT_SOCKET, munge_socket) != EMUNGE_SUCCESS) {
        rc = dt_emsg_set(em, DT_EINVAL, "munge: bad socket %s", munge_socket);
        goto out;
    }
    e = munge_decode(cred, ctx, NULL, NULL, uid, gid);
    if (e == EMUNGE_SOCKET) /* our munged, not the peer: a receiver-side failure */
        rc = dt_emsg_set(em, DT_EIO, "%s cannot reach munged: %s", who,
                         munge_ctx_strerror(ctx));
    else if (e != EMUNGE_SUCCESS)
        rc = dt_emsg_set(em, DT_EACCES, "munge credential refused: %s",
                         munge_ctx_strerror(ctx) ? munge_ctx_strerror(ctx) : munge_strerror(e));
out:
    munge_ctx_destroy(ctx);
    return rc;
}
