/* SPDX-License-Identifier: MIT
 *
 * Listening on the Unix socket and on TCP, and making room for the peers:
 * the descriptor limit is raised as far as max_connections needs.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "coordinator/conn.h"
#include "coordinator/listen.h"

static void on_unix(uv_stream_t *s, int status)
{
    if (status == 0)
        dt_conn_accept(s->data, s, 0);
}

static void on_tcp(uv_stream_t *s, int status)
{
    if (status == 0)
        dt_conn_accept(s->data, s, 1);
}

/* Is something answering on this Unix socket path? */
static int socket_alive(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), alive;

    if (fd < 0)
        return 0;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    alive = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return alive;
}

/* Descriptors for max_connections, root's reserve and the daemon itself:
 * raise the soft limit toward the hard one (as Redis does for maxclients);
 * what still does not fit lowers the limit in force (dt_conn_cap). */
static void room_for_peers(const dt_coord_t *c)
{
    rlim_t want = (rlim_t)c->conf.max_connections + DT_COORD_ROOT_RESERVE + DT_COORD_FD_RESERVE;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        getrlimit(RLIMIT_NOFILE, &rl);
    if (dt_conn_cap(c) < c->conf.max_connections)
        dt_log_warn("max_connections %lld lowered to %lld: the descriptor limit "
                    "(RLIMIT_NOFILE) is %llu", (long long)c->conf.max_connections,
                    (long long)dt_conn_cap(c), (unsigned long long)rl.rlim_cur);
}

int dt_listen_unix(dt_coord_t *c, const char *path, dt_emsg_t *em)
{
    struct sockaddr_un sa;
    int rc;

    if (strlen(path) >= sizeof(sa.sun_path))
        return dt_emsg_set(em, DT_EINVAL, "socket path %s is longer than %zu bytes", path,
                           sizeof(sa.sun_path) - 1);
    room_for_peers(c);
    if (access(path, F_OK) == 0) {
        if (socket_alive(path))
            return dt_emsg_set(em, DT_EEXIST, "%s: another coordinator is listening there", path);
        unlink(path); /* stale, from a coordinator that died */
    }
    if ((rc = uv_pipe_init(c->loop, &c->unix_srv, 0)) < 0)
        return dt_emsg_set(em, DT_EIO, "uv_pipe_init: %s", uv_strerror(rc));
    c->unix_srv.data = c;
    c->have_unix = 1;
    if ((rc = uv_pipe_bind(&c->unix_srv, path)) < 0)
        return dt_emsg_set(em, DT_EIO, "%s: bind: %s", path, uv_strerror(rc));
    chmod(path, 0666); /* anyone may connect; SO_PEERCRED says who they are */
    if ((rc = uv_listen((uv_stream_t *)&c->unix_srv, 128, on_unix)) < 0)
        return dt_emsg_set(em, DT_EIO, "%s: listen: %s", path, uv_strerror(rc));
    return 0;
}

int dt_listen_parse(const char *hostport, struct sockaddr_storage *ss, dt_emsg_t *em)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    char *end;

    if (colon == NULL || colon - hostport >= (long)sizeof(host))
        return dt_emsg_set(em, DT_EINVAL, "'%s': expected HOST:PORT", hostport);
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 0 || port > 65535 || colon[1] == '\0')
        return dt_emsg_set(em, DT_EINVAL, "'%s': bad port (0 to 65535)", hostport);
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    if (host[0] == '\0')
        strcpy(host, "0.0.0.0");
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) != 0 &&
        uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss) != 0)
        return dt_emsg_set(em, DT_EINVAL, "'%s': '%s' is not an IPv4 or IPv6 address (no "
                           "host names)", hostport, host);
    return 0;
}

int dt_listen_tcp(dt_coord_t *c, const char *hostport, dt_emsg_t *em)
{
    struct sockaddr_storage ss;
    int rc;

    if ((rc = dt_listen_parse(hostport, &ss, em)) < 0) {
        char why[sizeof(em->s)];
        snprintf(why, sizeof(why), "%s", em->s);
        return dt_emsg_set(em, rc, "listen: %s", why);
    }
    if ((rc = uv_tcp_init(c->loop, &c->tcp_srv)) < 0)
        return dt_emsg_set(em, DT_EIO, "uv_tcp_init: %s", uv_strerror(rc));
    c->tcp_srv.data = c;
    c->have_tcp = 1;
    if ((rc = uv_tcp_bind(&c->tcp_srv, (struct sockaddr *)&ss, 0)) < 0 ||
        (rc = uv_listen((uv_stream_t *)&c->tcp_srv, 4096, on_tcp)) < 0)
        return dt_emsg_set(em, rc == UV_EADDRINUSE ? DT_EEXIST : DT_EIO, "listen = %s: %s",
                           hostport, uv_strerror(rc));
    return 0;
}
