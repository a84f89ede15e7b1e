/* SPDX-License-Identifier: MIT
 *
 * Who may connect to dtagentd's PMIx server (accept_gate.c): a process-wide
 * accept(2). libpmix's listener is TCP on 127.0.0.1, which every local user
 * can reach, and over TCP libpmix's "native" security takes the uid and gid
 * a client claims. The accept() defined in accept_gate.c is the one
 * libpmix's listener thread calls: a connection whose other end the kernel
 * does not place in a socket of our effective uid is closed before libpmix
 * reads it. So another user cannot claim a rank, read a namespace's data,
 * take part in a fence, abort a job, or hold libpmix's progress thread in a
 * handshake.
 *
 * Its API is accept(2) itself: nothing calls into it by name. A program
 * that runs the PMIx server (agent/pmix.c) links accept_gate.c beside it,
 * or its server is open to every local user (dtagentd and
 * tests/tools/pmixhost do; tests/integration/pmix.sh and agent_security.sh
 * see the gate's handshake timeout).
 *
 * Not here: the PMIx server (pmix.c), the server directory's ownership
 * checks (dt_pmix_new).
 */
#ifndef DT_AGENT_ACCEPT_GATE_H
#define DT_AGENT_ACCEPT_GATE_H

/* How long libpmix may wait for a client's handshake (it reads it with a
 * blocking recv on its only progress thread), per read: shorter than
 * DT_PMIX_CB_TIMEOUT_MS (agent/pmix.h), so that the server's own calls
 * still get through. */
#define DT_ACCEPT_GATE_HANDSHAKE_TIMEOUT_MS 5000

#endif /* DT_AGENT_ACCEPT_GATE_H */
