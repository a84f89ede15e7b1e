/* SPDX-License-Identifier: MIT
 *
 * The coordinator's request table: message type -> handler, with what the
 * peer must be (authenticated, or anyone for AUTH and PING). Every request
 * gets exactly one reply. Set as the coordinator's dispatch hook: conn.c
 * calls it through that pointer, never by name.
 */
#ifndef DT_COORD_RPC_H
#define DT_COORD_RPC_H

#include "common/msg.h"
#include "coordinator/conn.h"

void dt_rpc_dispatch(dt_conn_t *k, const dt_msg_t *m);

#endif /* DT_COORD_RPC_H */
