/* SPDX-License-Identifier: MIT
 *
 * The simulator's NCCL between processes (sim_net.h). A sender connects
 * once to each peer's abstract socket "\0dt-sim-nccl-KEY-RANK" and writes
 * its rank, then frames { seq, bytes } + bytes; a receiver accepts, reads
 * the rank, and keeps whole frames in a mailbox until the receive that
 * wants them. All descriptors are non-blocking.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tests/gpu/sim/sim_net.h"

typedef struct frame {
    struct frame *next;
    int peer;
    uint64_t seq;
    size_t bytes, off; /* off: written so far (out), or read (in) */
    unsigned char *data;
} frame_t;

typedef struct conn_in {
    int fd;
    int peer; /* -1 until its first 4 bytes */
    unsigned char hdr[16];
    size_t hlen;
    frame_t *cur; /* the frame being read */
} conn_in_t;

struct sim_net {
    uint64_t key;
    int rank, n;
    int lfd;
    int *out_fd;        /* per peer: connected, or -1 */
    int *said_hello;    /* per peer: our rank written */
    int *closed;        /* per peer: its connection to us ended */
    double *first_try;  /* per peer: when connecting began */
    frame_t **out_head; /* per peer: frames to write, in order */
    conn_in_t *in;      /* accepted connections */
    int nin, capin;
    frame_t *mail; /* arrived, not yet received */
    char err[256];
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fail(sim_net_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(sim_net_t *t, const char *fmt, ...)
{
    va_list ap;

    if (t->err[0])
        return;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof(t->err), fmt, ap);
    va_end(ap);
}

static socklen_t addr_of(uint64_t key, int rank, struct sockaddr_un *a)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "dt-sim-nccl-%016llx-%d",
                     (unsigned long long)key, rank);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

sim_net_t *sim_net_open(uint64_t key, int rank, int n)
{
    struct sockaddr_un a;
    socklen_t len = addr_of(key, rank, &a);
    sim_net_t *t = calloc(1, sizeof(*t));

    t->key = key;
    t->rank = rank;
    t->n = n;
    t->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (t->lfd < 0 || bind(t->lfd, (struct sockaddr *)&a, len) < 0 || listen(t->lfd, 64) < 0) {
        fprintf(stderr, "sim: nccl rank %d: cannot listen on @%s: %s\n", rank, a.sun_path + 1,
                strerror(errno));
        if (t->lfd >= 0)
            close(t->lfd);
        free(t);
        return NULL;
    }
    t->out_fd = malloc((size_t)n * sizeof(int));
    t->said_hello = calloc((size_t)n, sizeof(int));
    t->closed = calloc((size_t)n, sizeof(int));
    t->first_try = calloc((size_t)n, sizeof(double));
    t->out_head = calloc((size_t)n, sizeof(frame_t *));
    for (int i = 0; i < n; i++)
        t->out_fd[i] = -1;
    return t;
}

void sim_net_send(sim_net_t *t, int peer, uint64_t seq, const void *buf, size_t bytes)
{
    frame_t *f = calloc(1, sizeof(*f)), **pp = &t->out_head[peer];

    f->peer = peer;
    f->seq = seq;
    f->bytes = bytes;
    f->data = malloc(bytes + 16);
    memcpy(f->data, &seq, 8);
    memcpy(f->data + 8, &(uint64_t){ bytes }, 8);
    memcpy(f->data + 16, buf, bytes);
    while (*pp)
        pp = &(*pp)->next;
    *pp = f;
}

/* Connect to peer (again later while it is not listening yet). */
static void connect_peer(sim_net_t *t, int peer)
{
    struct sockaddr_un a;
    socklen_t len = addr_of(t->key, peer, &a);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (t->first_try[peer] == 0)
        t->first_try[peer] = now();
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, len) == 0) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        t->out_fd[peer] = fd;
        return;
    }
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (now() - t->first_try[peer] > SIM_NET_CONNECT_S)
        fail(t, "rank %d cannot reach rank %d for %d s: %s", t->rank, peer, SIM_NET_CONNECT_S,
             strerror(e));
}

static void write_out(sim_net_t *t, int peer)
{
    if (t->out_head[peer] == NULL)
        return;
    if (t->out_fd[peer] < 0)
        connect_peer(t, peer);
    int fd = t->out_fd[peer];
    if (fd < 0)
        return;
    if (!t->said_hello[peer]) {
        int32_t me = t->rank;
        if (send(fd, &me, 4, MSG_NOSIGNAL) != 4) {
            fail(t, "rank %d: writing to rank %d failed", t->rank, peer);
            return;
        }
        t->said_hello[peer] = 1;
    }
    while (t->out_head[peer]) {
        frame_t *f = t->out_head[peer];
        ssize_t k = send(fd, f->data + f->off, f->bytes + 16 - f->off, MSG_NOSIGNAL);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (k <= 0) {
            fail(t, "rank %d: writing to rank %d failed: %s", t->rank, peer,
                 k < 0 ? strerror(errno) : "closed");
            return;
        }
        f->off += (size_t)k;
        if (f->off < f->bytes + 16)
            return;
        t->out_head[peer] = f->next;
        free(f->data);
        free(f);
    }
}

/* Read what one accepted connection has; 0 while it lives. */
static int read_in(sim_net_t *t, conn_in_t *c)
{
    for (;;) {
        unsigned char *dst;
        size_t want;
        if (c->peer < 0) {
            dst = c->hdr + c->hlen;
            want = 4 - c->hlen;
        } else if (c->cur == NULL) {
            dst = c->hdr + c->hlen;
            want = 16 - c->hlen;
        } else {
            dst = c->cur->data + c->cur->off;
            want = c->cur->bytes - c->cur->off;
        }
        ssize_t k = want ? recv(c->fd, dst, want, 0) : 0;
        if (want && k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        if (want && k <= 0) {
            if (c->peer >= 0 && k == 0 && c->cur == NULL && c->hlen == 0) {
                if (c->peer < t->n)
                    t->closed[c->peer] = 1;
                return -1; /* a clean end between frames */
            }
            fail(t, "rank %d: the connection from rank %d broke: %s", t->rank, c->peer,
                 k < 0 ? strerror(errno) : "closed mid-frame");
            return -1;
        }
        if (c->peer < 0) {
            c->hlen += (size_t)k;
            if (c->hlen == 4) {
                int32_t p;
                memcpy(&p, c->hdr, 4);
                if (p < 0 || p >= t->n) {
                    fail(t, "rank %d: a connection from rank %d of %d", t->rank, (int)p, t->n);
                    return -1;
                }
                c->peer = p;
                c->hlen = 0;
            }
        } else if (c->cur == NULL) {
            c->hlen += (size_t)k;
            if (c->hlen == 16) {
                frame_t *f = calloc(1, sizeof(*f));
                uint64_t n;
                memcpy(&f->seq, c->hdr, 8);
                memcpy(&n, c->hdr + 8, 8);
                f->bytes = (size_t)n;
                f->peer = c->peer;
                f->data = malloc(f->bytes ? f->bytes : 1);
                c->cur = f;
                c->hlen = 0;
            }
        } else {
            c->cur->off += (size_t)k;
        }
        if (c->cur && c->cur->off == c->cur->bytes) {
            c->cur->next = t->mail;
            t->mail = c->cur;
            c->cur = NULL;
        }
    }
}

void sim_net_pump(sim_net_t *t)
{
    int fd;

    while ((fd = accept4(t->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        if (t->nin == t->capin) {
            t->capin = t->capin ? 2 * t->capin : 8;
            t->in = realloc(t->in, (size_t)t->capin * sizeof(*t->in));
        }
        t->in[t->nin++] = (conn_in_t){ .fd = fd, .peer = -1 };
    }
    for (int i = 0; i < t->nin; i++)
        if (t->in[i].fd >= 0 && read_in(t, &t->in[i]) < 0) {
            close(t->in[i].fd);
            t->in[i].fd = -1;
        }
    for (int p = 0; p < t->n; p++)
        write_out(t, p);
}

int sim_net_recv(sim_net_t *t, int peer, uint64_t seq, void *buf, size_t bytes)
{
    sim_net_pump(t);
    for (frame_t **pp = &t->mail; *pp; pp = &(*pp)->next) {
        frame_t *f = *pp;
        if (f->peer != peer || f->seq != seq)
            continue;
        if (f->bytes != bytes) {
            fail(t, "rank %d: %zu bytes from rank %d, %zu expected", t->rank, f->bytes, peer,
                 bytes);
            return -1;
        }
        memcpy(buf, f->data, bytes);
        *pp = f->next;
        free(f->data);
        free(f);
        return 1;
    }
    if (t->closed[peer])
        fail(t, "rank %d: rank %d closed its end with a transfer to us still to come", t->rank,
             peer);
    return t->err[0] ? -1 : 0;
}

int sim_net_sent(const sim_net_t *t, int peer, uint64_t seq)
{
    for (const frame_t *f = t->out_head[peer]; f; f = f->next)
        if (f->seq == seq)
            return 0;
    return 1;
}

int sim_net_flushed(sim_net_t *t)
{
    for (int p = 0; p < t->n; p++)
        if (t->out_head[p])
            return 0;
    return 1;
}

const char *sim_net_error(const sim_net_t *t)
{
    return t->err[0] ? t->err : NULL;
}

void sim_net_close(sim_net_t *t)
{
    if (t == NULL)
        return;
    close(t->lfd);
    for (int p = 0; p < t->n; p++) {
        if (t->out_fd[p] >= 0)
            close(t->out_fd[p]);
        while (t->out_head[p]) {
            frame_t *f = t->out_head[p];
            t->out_head[p] = f->next;
            free(f->data);
            free(f);
        }
    }
    for (int i = 0; i < t->nin; i++) {
        if (t->in[i].fd >= 0)
            close(t->in[i].fd);
        if (t->in[i].cur) {
            free(t->in[i].cur->data);
            free(t->in[i].cur);
        }
    }
    while (t->mail) {
        frame_t *f = t->mail;
        t->mail = f->next;
        free(f->data);
        free(f);
    }
    free(t->in);
    free(t->out_fd);
    free(t->said_hello);
    free(t->closed);
    free(t->first_try);
    free(t->out_head);
    free(t);
}
