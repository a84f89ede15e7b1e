/* SPDX-License-Identifier: MIT
 *
 * dtctl's side of the protocol: connect (Unix socket, or TCP with a munge
 * credential as the first frame), send one request, read its reply. Plain
 * blocking sockets with a receive timeout: dtctl does one thing at a time.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli/dtctl.h"
#include "common/cred.h"
#include "common/mem.h"
#include "common/msg.h"
#include "common/text.h"
#include "common/wire.h"

#define REPLY_TIMEOUT_S 60

static const char *socket_path(const dtctl_t *ctl)
{
    const char *env = getenv("DT_SOCKET");
    if (ctl->socket)
        return ctl->socket;
    if (env && *env)
        return env;
    return DT_LOCALSTATEDIR "/lib/dt/dtcoordd.sock";
}

static int connect_unix(const char *path, dt_emsg_t *em)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int fd;

    if (strlen(path) >= sizeof(sa.sun_path))
        return dt_emsg_set(em, DT_EINVAL, "socket path %s is too long", path);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        return dt_emsg_set(em, DT_ECOMM, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        close(fd);
        return dt_emsg_set(em, DT_ECOMM, "cannot reach the coordinator at %s: %s%s", path,
                           strerror(e),
                           e == ENOENT || e == ECONNREFUSED ? " (is dtcoordd running? "
                                                              "set DT_SOCKET or --socket)"
                                                            : "");
    }
    return fd;
}

int dtctl_parse_coord(const char *hostport, char *host, size_t hostlen, char port[6],
                      dt_emsg_t *em)
{
    const char *colon = strrchr(hostport, ':'), *h = hostport;
    size_t hl;

    if (colon == NULL)
        return dt_emsg_set(em, DT_EUSAGE, "'%s': expected HOST:PORT", hostport);
    hl = (size_t)(colon - hostport);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') { /* [v6]:port */
        h++;
        hl -= 2;
    } else if (memchr(h, ':', hl) != NULL) {
        return dt_emsg_set(em, DT_EUSAGE, "'%s': an IPv6 address goes in brackets, "
                           "[ADDRESS]:PORT", hostport);
    }
    if (hl == 0)
        return dt_emsg_set(em, DT_EUSAGE, "'%s': no host before the ':'", hostport);
    if (hl >= hostlen)
        return dt_emsg_set(em, DT_EUSAGE, "'%s': the host is longer than %zu bytes", hostport,
                           hostlen - 1);
    const char *pp = colon + 1;
    size_t pl = strlen(pp);
    if (pl == 0 || pl > 5 || strspn(pp, "0123456789") != pl || atoi(pp) < 1 || atoi(pp) > 65535)
        return dt_emsg_set(em, DT_EUSAGE, "'%s': the port must be a number from 1 to 65535",
                           hostport);
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(port, 6, "%d", atoi(pp));
    return 0;
}

int dtctl_parse_id(const char *s, long long *out)
{
    size_t n = strlen(s);

    errno = 0;
    if (n == 0 || strspn(s, "0123456789") != n)
        return DT_EUSAGE;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE || v <= 0)
        return DT_EUSAGE;
    *out = v;
    return 0;
}

static int connect_tcp(const char *hostport, dt_emsg_t *em)
{
    char host[256], port[6];
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
    int fd = -1, rc;

    if ((rc = dtctl_parse_coord(hostport, host, sizeof(host), port, em)) < 0)
        return rc;
    if ((rc = getaddrinfo(host, port, &hints, &res)) != 0)
        return dt_emsg_set(em, DT_ECOMM, "--coord %s: %s", hostport, gai_strerror(rc));
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return dt_emsg_set(em, DT_ECOMM, "cannot reach the coordinator at %s: %s", hostport,
                           strerror(errno));
    return fd;
}

static int send_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return DT_ECOMM;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One round trip on an open connection. */
static int round_trip(int fd, uint16_t type, uint32_t id, json_t *body, json_t **result,
                      dt_emsg_t *em)
{
    uint8_t *frame, *buf = NULL;
    size_t len, have = 0, cap = 0;
    int rc;

    rc = dt_msg_encode(type, id, body, &frame, &len);
    json_decref(body); /* consumed, as dtctl_request promises */
    if (rc < 0)
        return dt_emsg_set(em, rc, "request too large");
    /* a coordinator that refuses the connection says why and closes it,
     * maybe before the request is out: read its reply all the same */
    int send_err = send_all(fd, frame, len) < 0 ? errno : 0;
    free(frame);
    for (;;) {
        dt_msg_t m;
        int used = dt_msg_decode(buf, have, &m, em);
        if (used < 0) {
            free(buf);
            return used;
        }
        if (used > 0) {
            free(buf);
            if (m.type == DT_MSG_OK) {
                *result = m.body;
                m.body = NULL;
                return 0;
            }
            dt_wire_error_t e;
            dt_emsg_t bad = { "" };
            if (dt_wire_error_decode(&m, &e, &bad) < 0)
                e = (dt_wire_error_t){ .code = DT_EPROTO, .error = "error" };
            rc = e.code < 0 && e.code > INT_MIN ? (int)e.code : DT_EPROTO;
            /* the message may quote what someone else stored: escaped here,
             * once, for every place that prints em */
            char *text = dt_text_escape(e.error, 0);
            dt_emsg_set(em, rc, "%.*s", dt_text_fit(text, sizeof(em->s) - 1), text);
            free(text);
            /* a refusal by the planner is its own outcome */
            if (e.refused)
                rc = DT_ENOSPC == rc || rc == DT_ELAYOUT || rc == DT_ERANGE ? rc : DT_ENOSPC;
            dt_msg_clear(&m);
            return rc;
        }
        if (cap - have < 65536) {
            cap = have + 65536;
            buf = dt_xrealloc(buf, cap);
        }
        ssize_t r = recv(fd, buf + have, cap - have, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            free(buf);
            if (send_err)
                return dt_emsg_set(em, DT_ECOMM, "sending to the coordinator failed: %s",
                                   strerror(send_err));
            return dt_emsg_set(em, DT_ECOMM, "the coordinator closed the connection%s%s",
                               r < 0 ? ": " : "", r < 0 ? strerror(errno) : "");
        }
        have += (size_t)r;
    }
}

int dtctl_request(dtctl_t *ctl, uint16_t type, json_t *body, json_t **result, dt_emsg_t *em)
{
    struct timeval tv = { REPLY_TIMEOUT_S, 0 };
    int fd, rc;

    *result = NULL;
    fd = ctl->coord ? connect_tcp(ctl->coord, em) : connect_unix(socket_path(ctl), em);
    if (fd < 0) {
        json_decref(body);
        return fd;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (ctl->coord) {
        char *cred = NULL;
        json_t *ok = NULL;
        if ((rc = dt_cred_new(ctl->munge_socket, &cred, em)) < 0) {
            json_decref(body);
            close(fd);
            return rc;
        }
        dt_wire_auth_t auth = { .cred = cred };
        rc = round_trip(fd, DT_MSG_AUTH, 1, dt_wire_auth_encode(&auth), &ok, em);
        free(cred);
        json_decref(ok);
        if (rc < 0) {
            json_decref(body);
            close(fd);
            return rc;
        }
    }
    rc = round_trip(fd, type, 2, body ? body : json_object(), result, em);
    close(fd);
    return rc;
}

void dtctl_error(const dtctl_t *ctl, const char *cmd, const char *what, const char *msg)
{
    char *e = dt_text_escape(msg, 0);

    fprintf(stderr, "%s %s: %s%s\n", ctl->prog, cmd, what ? what : "", e);
    free(e);
}

int dtctl_fail(dtctl_t *ctl, const char *cmd, int rc, const dt_emsg_t *em)
{
    dtctl_error(ctl, cmd, NULL, em->s[0] ? em->s : dt_strerror(rc));
    switch (rc) {
    case DT_ECOMM:
        return DTCTL_NOCOORD;
    case DT_ENOENT:
        return DTCTL_NOTFOUND;
    case DT_EPERM:
    case DT_EACCES:
        return DTCTL_DENIED;
    case DT_ENOSPC:
    case DT_ELAYOUT:
    case DT_ERANGE:
        return DTCTL_REFUSED;
    case DT_ECONF:
    case DT_EINVAL:
    case DT_EUSAGE:
        return DTCTL_USAGE;
    default:
        return DTCTL_ERROR;
    }
}

int dtctl_result(dtctl_t *ctl, const char *cmd, uint16_t type, const json_t *res, void *out)
{
    const dt_wire_schema_t *s = dt_wire_schema(type, true);
    dt_emsg_t em = { "" };

    if (s == NULL || dt_wire_decode(s, res, out, &em) < 0) {
        dtctl_error(ctl, cmd, "the coordinator's reply: ", s ? em.s : "no result expected");
        return DTCTL_ERROR;
    }
    return 0;
}

void dtctl_sanitize(const dtctl_t *ctl, json_t *reply)
{
    static const char *const multi_line[] = { "spec", "script", NULL };

    if (!ctl->json)
        dt_msg_escape_strings(reply, multi_line);
}

void dtctl_print_json(const json_t *v)
{
    char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) {
        puts(s);
        free(s);
    }
}
