/* SPDX-License-Identifier: MIT
 *
 * pmixforeign: another local user's view of an agent's PMIx server, for
 * tests/integration/agent_security.sh. Everything it needs is public on
 * the host: the agent's pid (ps) gives the server's namespace
 * "pmix-server.PID", its TCP port is in /proc/net/tcp, and a generation's
 * namespace is "dt.JOB.GEN". Three ways in:
 *
 *   pmixforeign --uri URI --nspace NS --rank R
 *       a plain PMIx client (PMIx_Init) claiming rank R of NS: libpmix's
 *       "native" security compares the uid the client sends with the
 *       registered one;
 *   ... --claim-uid UID --claim-gid GID
 *       the same client claiming another user's uid and gid: over TCP that
 *       claim is all the "native" check sees (this program's geteuid and
 *       getegid, which libpmix calls, return them);
 *   pmixforeign --uri URI --raw SECONDS [--drip]
 *       a bare TCP connection that sends nothing for SECONDS; with --drip
 *       it sends a handshake header announcing 4096 bytes and then one
 *       byte every 500 ms (libpmix reads the handshake with a blocking
 *       recv on its only progress thread: that holds it).
 *
 * It prints one fact per line:
 *
 *   pmixforeign: PMIx_Init: STATUS                  refused (or not)
 *   pmixforeign: GOT job size N                     data the server gave
 *   pmixforeign: GOT fence                          a fence it took part in
 *   pmixforeign: closed by the server after X ms    (--raw)
 *   pmixforeign: still connected after S s          (--raw)
 *
 * Exit: 0 the server gave it something (a PMIx_Init that succeeded, data,
 * a fence; with --raw: the connection stayed open), 3 refused or closed, 2
 * usage, 1 any other failure. It never writes to the server beyond what
 * PMIx_Init, PMIx_Get and PMIx_Fence send.
 */
#include "config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pmix.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* libpmix's "native" credential over TCP is these two calls' results */
static long claim_uid = -1, claim_gid = -1;


uid_t geteuid(void)
{
    return claim_uid >= 0 ? (uid_t)claim_uid : getuid();
}

gid_t getegid(void)
{
    return claim_gid >= 0 ? (gid_t)claim_gid : getgid();
}

static double now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void usage(void)
{
    fprintf(stderr, "usage: pmixforeign --uri URI (--nspace NS --rank R [--claim-uid UID "
                    "--claim-gid GID] | --raw SECONDS [--drip])\n");
}

/* A TCP connection to the URI's address that sends nothing, or drips. */
static int raw(const char *uri, int seconds, int drip)
{
    const char *t = strstr(uri, "tcp4://");
    char host[64];
    unsigned port;
    struct sockaddr_in sa = { .sin_family = AF_INET };
    int fd;

    if (t == NULL || sscanf(t, "tcp4://%63[0-9.]:%u", host, &port) != 2 || port > 65535 ||
        inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "pmixforeign: %s: not a tcp4 URI\n", uri);
        return 2;
    }
    sa.sin_port = htons((uint16_t)port);
    if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
        connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        printf("pmixforeign: cannot connect to %s:%u: %m\n", host, port);
        return 3;
    }
    printf("pmixforeign: connected to %s:%u\n", host, port);
    double t0 = now_ms(), t_drip = t0;
    struct pollfd p = { .fd = fd, .events = POLLIN };
    char c, zero = 0;
    if (drip) {
        /* libpmix's pmix_ptl_hdr_t, host order: pindex, tag, nbytes */
        struct {
            int32_t pindex;
            uint32_t tag;
            uint64_t nbytes;
        } hdr = { -1, 0, 4096 };
        if (send(fd, &hdr, sizeof(hdr), MSG_NOSIGNAL) != (ssize_t)sizeof(hdr))
            printf("pmixforeign: cannot send a header: %m\n");
    }
    while (now_ms() - t0 < seconds * 1e3) {
        if (drip && now_ms() - t_drip >= 500) {
            t_drip = now_ms();
            if (send(fd, &zero, 1, MSG_NOSIGNAL) != 1) {
                printf("pmixforeign: closed by the server after %.0f ms\n", now_ms() - t0);
                close(fd);
                return 3;
            }
        }
        int n = poll(&p, 1, 100);
        if (n > 0 && recv(fd, &c, 1, MSG_PEEK) <= 0) {
            printf("pmixforeign: closed by the server after %.0f ms\n", now_ms() - t0);
            close(fd);
            return 3;
        }
    }
    printf("pmixforeign: still connected after %d s\n", seconds);
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    const char *uri = NULL, *nspace = NULL;
    long rank = -1, raw_s = -1;
    int drip = 0;
    pmix_proc_t me, all;
    pmix_value_t *v = NULL;
    pmix_status_t st;
    int got = 0;

    for (int i = 1; i < argc; i++) {
        long *num = NULL;
        if (strcmp(argv[i], "--drip") == 0) {
            drip = 1;
            continue;
        }
        if (i + 1 >= argc) {
            usage();
            return 2;
        }
        if (strcmp(argv[i], "--uri") == 0)
            uri = argv[++i];
        else if (strcmp(argv[i], "--nspace") == 0)
            nspace = argv[++i];
        else if (strcmp(argv[i], "--rank") == 0)
            num = &rank;
        else if (strcmp(argv[i], "--claim-uid") == 0)
            num = &claim_uid;
        else if (strcmp(argv[i], "--claim-gid") == 0)
            num = &claim_gid;
        else if (strcmp(argv[i], "--raw") == 0)
            num = &raw_s;
        else {
            usage();
            return 2;
        }
        if (num) {
            char *end;
            *num = strtol(argv[++i], &end, 10);
            if (*end || *num < 0 || *num > 1L << 30) {
                fprintf(stderr, "pmixforeign: %s %s: not a number\n", argv[i - 1], argv[i]);
                return 2;
            }
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (uri == NULL) {
        usage();
        return 2;
    }
    if (raw_s >= 0)
        return raw(uri, (int)raw_s, drip);
    if (nspace == NULL || rank < 0) {
        usage();
        return 2;
    }
    /* what PMIx_server_setup_fork gives a real worker */
    char r[32];
    snprintf(r, sizeof(r), "%ld", rank);
    setenv("PMIX_NAMESPACE", nspace, 1);
    setenv("PMIX_RANK", r, 1);
    setenv("PMIX_SERVER_URI41", uri, 1);
    setenv("PMIX_SERVER_URI4", uri, 1);
    setenv("PMIX_SERVER_URI3", uri, 1);
    setenv("PMIX_SERVER_URI2", uri, 1);
    setenv("PMIX_SERVER_URI21", uri, 1);
    setenv("PMIX_SECURITY_MODE", "native", 1);
    setenv("PMIX_BFROP_BUFFER_TYPE", "PMIX_BFROP_BUFFER_NON_DESC", 1);
    setenv("PMIX_GDS_MODULE", "hash", 1);
    setenv("PMIX_MCA_gds", "hash", 1);
    setenv("PMIX_MCA_ptl_base_handshake_wait_time", "5", 1);

    st = PMIx_Init(&me, NULL, 0);
    printf("pmixforeign: PMIx_Init: %s\n", PMIx_Error_string(st));
    if (st != PMIX_SUCCESS)
        return 3;
    PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
    if (PMIx_Get(&all, PMIX_JOB_SIZE, NULL, 0, &v) == PMIX_SUCCESS && v) {
        printf("pmixforeign: GOT job size %u\n", v->data.uint32);
        PMIX_VALUE_RELEASE(v);
        got = 1;
    }
    /* a fence of this one rank: libpmix completes it locally */
    if ((st = PMIx_Fence(&me, 1, NULL, 0)) == PMIX_SUCCESS) {
        printf("pmixforeign: GOT fence\n");
        got = 1;
    } else {
        printf("pmixforeign: PMIx_Fence: %s\n", PMIx_Error_string(st));
    }
    PMIx_Finalize(NULL, 0);
    (void)got;
    return 0;
}
