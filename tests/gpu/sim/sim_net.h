/* SPDX-License-Identifier: MIT
 *
 * The simulator's NCCL between processes (sim_net.c): what lets the
 * simulated-device build of dtengine (tests/gpu/dtengine-sim) run one rank
 * per process, as the real engine does under mpirun, srun or dtagentd.
 *
 * Each rank of a communicator listens on an abstract Unix socket named by
 * the communicator's unique id and its rank, so ranks meet on one host
 * only (the simulated cluster is one machine). A send is copied and
 * queued when its NCCL group starts, written without blocking, and
 * complete once written out; a receive completes when the frame with its
 * peer and sequence number has arrived. Every call moves the I/O on (sim_net_pump); nothing here
 * blocks. A peer that closes its end, or that cannot be reached for
 * SIM_NET_CONNECT_S seconds, puts the communicator in error, which
 * ncclCommGetAsyncError then reports, as a real NCCL reports a dead peer.
 */
#ifndef DT_TESTS_GPU_SIM_NET_H
#define DT_TESTS_GPU_SIM_NET_H

#include <stddef.h>
#include <stdint.h>

#define SIM_NET_CONNECT_S 60

typedef struct sim_net sim_net_t;

/* Rank `rank` of n of the communicator `key` (from its unique id): the
 * listening socket. NULL, with a message on stderr, when it cannot be
 * made. */
sim_net_t *sim_net_open(uint64_t key, int rank, int n);
/* Queue bytes for peer under sequence number seq (copied now). */
void sim_net_send(sim_net_t *t, int peer, uint64_t seq, const void *buf, size_t bytes);
/* Move the I/O on; then 1 when the frame (peer, seq) has arrived and was
 * copied into buf (it must have `bytes`: else an error), 0 not yet, -1
 * when the communicator is in error. */
int sim_net_recv(sim_net_t *t, int peer, uint64_t seq, void *buf, size_t bytes);
/* Move the I/O on: connect, accept, read, write what can be. */
void sim_net_pump(sim_net_t *t);
/* Whether every queued send has been written out; whether the one to peer
 * with sequence number seq has (it is no longer queued). */
int sim_net_flushed(sim_net_t *t);
int sim_net_sent(const sim_net_t *t, int peer, uint64_t seq);
/* NULL, or why the communicator is in error. */
const char *sim_net_error(const sim_net_t *t);
/* Close every socket (peers see the end) and free. NULL is a no-op. */
void sim_net_close(sim_net_t *t);

#endif
