/* SPDX-License-Identifier: MIT
 *
 * Agree across ranks, report once: the one way the engine's commands end
 * a phase that every rank took. Each rank brings its own outcome; all
 * learn the worst (dt_comm_agree), and exactly one rank, the one holding
 * the original failure, prints it. Not here: the collective itself
 * (engine/comm/comm.h), exit codes (engine/cmd/cmd.h).
 */
#ifndef DT_ENGINE_AGREE_H
#define DT_ENGINE_AGREE_H

#include "common/err.h"
#include "common/macros.h"
#include "engine/comm/comm.h"

/* Agree on rc over every rank of comm. When the agreed code is a failure,
 * the rank chosen to report it prints "<what>: <msg>\n" to stderr, msg
 * being this rank's message, or dt_strerror of the code when msg is empty.
 * A message that starts with "rank " repeats another rank's failure (it
 * names the rank it heard from): among equal codes, a rank with the
 * original is chosen. *printed (may be NULL) is 1 on the rank that
 * printed, 0 elsewhere. Returns the agreed code: 0 when every rank
 * succeeded, DT_ECOMM when the agreement itself failed (every rank then
 * reports its own message). A rank whose own GPU failed (rc DT_EDEVICE,
 * not relayed) does not take part: the others may be blocked in a
 * transfer with it and never come to the agreement. It prints its message
 * and gets DT_EDEVICE back at once (dtengine then exits 7 without waiting
 * for its peers, whom the failure event of its exit ends). Should an
 * agreement still see DT_EDEVICE (relayed), it is returned only to the
 * ranks that brought it; the others get DT_ECOMM, so that only a rank
 * whose own GPU failed exits 7 (dtengine(1)). */
DT_MUST_CHECK int dt_agree_report(dt_comm_t *comm, int rc, const char *what, const char *msg,
                                  int *printed);

#endif /* DT_ENGINE_AGREE_H */
