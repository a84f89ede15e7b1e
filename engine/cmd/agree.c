/* SPDX-License-Identifier: MIT
 *
 * Agree across ranks, report once (engine/cmd/agree.h).
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "engine/cmd/agree.h"

int dt_agree_report(dt_comm_t *comm, int rc, const char *what, const char *msg, int *printed)
{
    int relayed = strncmp(msg, "rank ", 5) == 0;

    /* this rank's GPU failed: the others may be blocked in a transfer with
     * it, and would never join the agreement; say why and go (the agent's
     * failure event ends them) */
    if (rc == DT_EDEVICE && !relayed) {
        fprintf(stderr, "%s: %s\n", what, msg[0] ? msg : dt_strerror(rc));
        if (printed)
            *printed = 1;
        return rc;
    }
    int who, agreed = dt_comm_agree(comm, rc, relayed, &who);
    int mine = agreed < 0 && who == dt_comm_rank(comm);

    if (mine)
        fprintf(stderr, "%s: %s\n", what, msg[0] ? msg : dt_strerror(agreed));
    if (printed)
        *printed = mine;
    /* a GPU that failed is its own rank's: the others' are fine, and they
     * must not exit 7 too (the coordinator would take every node for
     * suspect), so they end as after any peer's failure */
    if (agreed == DT_EDEVICE && rc != DT_EDEVICE)
        return DT_ECOMM;
    return agreed;
}
