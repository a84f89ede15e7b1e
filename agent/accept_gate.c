/* SPDX-License-Identifier: MIT
 *
 * The process-wide accept(2) gate in front of libpmix's listener, to the
 * contract in agent/accept_gate.h: a TCP connection is handed to the
 * caller only when the kernel (sock_diag) says its other end is a socket
 * of our effective uid; any other is closed and logged, at most one
 * warning a second. It knows nothing of PMIx beyond that libpmix reads a
 * handshake on what it accepts, and holds no state but the log's rate
 * limit. Called on libpmix's listener thread; thread-safe.
 */
#include "config.h"

#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "agent/accept_gate.h"
#include "common/err.h"
#include "common/log.h"

/* The uid owning the other end of a TCP connection on this host, from the
 * kernel (sock_diag: the peer's socket by its exact address pair). 0 with
 * *uid set, or a DT_E* code: not on this host, gone, or an orphan (a
 * socket closed by its process has no owner left). */
static int peer_uid(int fd, uid_t *uid)
{
    struct sockaddr_storage self, peer;
    socklen_t sl = sizeof(self), pl = sizeof(peer);
    struct {
        struct nlmsghdr nh;
        struct inet_diag_req_v2 r;
    } req = {
        .nh = { .nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
                .nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = 1 },
        .r = { .sdiag_protocol = IPPROTO_TCP, .idiag_states = ~0U,
               .id.idiag_cookie = { INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE } },
    };
    union {
        struct nlmsghdr nh;
        char b[1024];
    } ans;
    int nl, rc = DT_ENOENT;

    if (getsockname(fd, (struct sockaddr *)&self, &sl) < 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) < 0)
        return dt_err_errno(errno);
    if (self.ss_family != peer.ss_family)
        return DT_EINVAL;
    req.r.sdiag_family = (uint8_t)self.ss_family;
    /* the peer's socket: its local end is our peer, its remote end us */
    if (self.ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const void *)&self, *p4 = (const void *)&peer;
        req.r.id.idiag_sport = p4->sin_port;
        req.r.id.idiag_dport = s4->sin_port;
        memcpy(req.r.id.idiag_src, &p4->sin_addr, 4);
        memcpy(req.r.id.idiag_dst, &s4->sin_addr, 4);
    } else if (self.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const void *)&self, *p6 = (const void *)&peer;
        req.r.id.idiag_sport = p6->sin6_port;
        req.r.id.idiag_dport = s6->sin6_port;
        memcpy(req.r.id.idiag_src, &p6->sin6_addr, 16);
        memcpy(req.r.id.idiag_dst, &s6->sin6_addr, 16);
    } else {
        return DT_EINVAL;
    }
    if ((nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)) < 0)
        return dt_err_errno(errno);
    struct timeval tv = { .tv_sec = 1 };
    setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (send(nl, &req, sizeof(req), 0) != (ssize_t)sizeof(req)) {
        rc = dt_err_errno(errno);
        goto out;
    }
    ssize_t got = recv(nl, &ans, sizeof(ans), 0);
    if (got < 0) {
        rc = dt_err_errno(errno);
        goto out;
    }
    int left = (int)got;
    for (struct nlmsghdr *h = &ans.nh; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
        if (h->nlmsg_type == NLMSG_ERROR) {
            const struct nlmsgerr *e = NLMSG_DATA(h);
            rc = e->error < 0 ? dt_err_errno(-e->error) : DT_ENOENT;
            break;
        }
        if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
            h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
            continue;
        const struct inet_diag_msg *m = NLMSG_DATA(h);
        if (m->id.idiag_sport != req.r.id.idiag_sport || m->id.idiag_dport != req.r.id.idiag_dport)
            continue;
        if (m->idiag_inode == 0) {
            rc = DT_ENOENT; /* orphaned or time-wait: its owner is gone */
            break;
        }
        *uid = (uid_t)m->idiag_uid;
        rc = 0;
        break;
    }
out:
    close(nl);
    return rc;
}

/* One warning a second at most: another user may connect in a loop. */
static void log_refused(const char *why)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static struct timespec last;
    static unsigned long quiet;
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    pthread_mutex_lock(&mu);
    if (last.tv_sec != 0 && now.tv_sec - last.tv_sec < 1) {
        quiet++;
        pthread_mutex_unlock(&mu);
        return;
    }
    unsigned long q = quiet;
    quiet = 0;
    last = now;
    pthread_mutex_unlock(&mu);
    if (q)
        dt_log_warn("PMIx server: %s (and %lu more refused in the last second)", why, q);
    else
        dt_log_warn("PMIx server: %s", why);
}

/* libpmix takes its clients on its listener thread with accept(2); being
 * defined in the program, this accept() is the one it calls. A TCP
 * connection is kept only when the kernel says its other end belongs to
 * our effective uid: another user's (or one that cannot be placed: a
 * remote host, an end already closed) is closed at once and libpmix is
 * told ECONNABORTED, which it skips. What libpmix keeps also gets
 * FD_CLOEXEC (it sets none: each worker would inherit the connections of
 * those spawned before it) and a receive timeout of
 * DT_ACCEPT_GATE_HANDSHAKE_TIMEOUT_MS, so that a client that stops in the middle
 * of its handshake (libpmix reads it with a blocking recv on its only
 * progress thread) does not hold every other client and
 * PMIx_server_finalize for ever; one that sends a byte now and then still
 * can: that is a user against their own job, and dt_pmix_free's deadline
 * covers it. Other kinds of socket pass unchanged; dtagentd accepts
 * nothing else. Thread-safe. */
int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    struct sockaddr_storage self;
    socklen_t sl = sizeof(self);
    char why[160];
    uid_t uid = (uid_t)-1;
    int c, rc;

    if ((c = accept4(fd, addr, len, SOCK_CLOEXEC)) < 0)
        return c;
    if (getsockname(c, (struct sockaddr *)&self, &sl) < 0 ||
        (self.ss_family != AF_INET && self.ss_family != AF_INET6))
        return c;
    if ((rc = peer_uid(c, &uid)) == 0 && uid == geteuid()) {
        struct timeval tv = { .tv_sec = DT_ACCEPT_GATE_HANDSHAKE_TIMEOUT_MS / 1000,
                              .tv_usec = (DT_ACCEPT_GATE_HANDSHAKE_TIMEOUT_MS % 1000) * 1000 };
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        return c;
    }
    if (rc == 0)
        snprintf(why, sizeof(why), "connection from uid %u refused (only uid %u may connect)",
                 (unsigned)uid, (unsigned)geteuid());
    else
        snprintf(why, sizeof(why), "connection refused: its owner cannot be checked: %s",
                 dt_strerror(rc));
    log_refused(why);
    close(c);
    errno = ECONNABORTED;
    return -1;
}
