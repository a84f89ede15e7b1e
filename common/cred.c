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
