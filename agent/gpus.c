/* SPDX-License-Identifier: MIT
 *
 * The node's GPUs, as `dtengine devices --json` sees them (gpus.h). The
 * agent never links CUDA (STYLE.md): it runs the engine it will start the
 * workers with, under the same environment (so under Slurm the job's own
 * CUDA_VISIBLE_DEVICES), reads its one JSON object, and gives up on it
 * after a deadline (a wedged driver must not keep the agent from
 * registering: it then registers no GPU, saying why).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "agent/gpus.h"
#include "common/clock.h"
#include "common/mem.h"
#include "common/text.h"

#define OUT_MAX (1 << 20) /* the engine's answer: a few hundred bytes per GPU */

/* Run `engine devices --json`; its stdout in *out (NUL-terminated). */
static int run_engine(const char *engine, int timeout_ms, char **out, dt_emsg_t *em)
{
    int p[2];
    char *buf = dt_xmalloc(OUT_MAX + 1);
    size_t n = 0;
    int rc = 0, st;

    *out = NULL;
    if (pipe2(p, O_CLOEXEC) < 0) {
        free(buf);
        return dt_emsg_set(em, -errno, "pipe: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        rc = dt_emsg_set(em, -errno, "fork: %s", strerror(errno));
        close(p[0]);
        close(p[1]);
        free(buf);
        return rc;
    }
    if (pid == 0) {
        int nul = open("/dev/null", O_RDWR);
        dup2(nul, 0);
        dup2(p[1], 1);
        dup2(nul, 2);
        execl(engine, engine, "devices", "--json", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    int64_t deadline = dt_clock_mono_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - dt_clock_mono_ms();
        struct pollfd pf = { .fd = p[0], .events = POLLIN };
        if (left <= 0) {
            rc = dt_emsg_set(em, DT_ETIMEDOUT, "%s devices: no answer in %d ms", engine,
                             timeout_ms);
            kill(pid, SIGKILL);
            break;
        }
        int k = poll(&pf, 1, (int)left);
        if (k < 0 && errno == EINTR)
            continue;
        if (k == 0)
            continue;
        ssize_t r = read(p[0], buf + n, OUT_MAX - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n == OUT_MAX) {
            rc = dt_emsg_set(em, DT_ERANGE, "%s devices: more than %d bytes", engine, OUT_MAX);
            kill(pid, SIGKILL);
            break;
        }
    }
    close(p[0]);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (rc == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        rc = dt_emsg_set(em, DT_EIO, "%s devices: %s %d", engine,
                         WIFEXITED(st) ? "exit status" : "killed by signal",
                         WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

int dt_gpus_parse(const char *text, dt_gpus_t *g, dt_emsg_t *em)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je), *devs, *d;
    size_t i;

    memset(g, 0, sizeof(*g));
    if (!json_is_object(o) || !json_is_array(devs = json_object_get(o, "devices"))) {
        json_decref(o);
        return dt_emsg_set(em, DT_EFORMAT, "dtengine devices: not a device list%s%s",
                           o ? "" : ": ", o ? "" : je.text);
    }
    size_t nd = json_array_size(devs);
    g->uuid = dt_xcalloc(nd + 1, sizeof(*g->uuid));
    g->cpus = dt_xcalloc(nd + 1, sizeof(*g->cpus));
    json_array_foreach(devs, i, d) {
        const char *u = json_string_value(json_object_get(d, "uuid"));
        const char *c = json_string_value(json_object_get(d, "cpus"));
        json_t *mem = json_object_get(d, "memory_bytes");
        /* a UUID goes into CUDA_VISIBLE_DEVICES and a log line: what
         * nvidia-smi prints, GPU-<hex and dashes>, nothing else */
        if (u == NULL || strncmp(u, "GPU-", 4) != 0 || strlen(u) > 64 ||
            u[4 + strspn(u + 4, "0123456789abcdef-")] != '\0' || !json_is_integer(mem)) {
            dt_gpus_free(g);
            json_decref(o);
            return dt_emsg_set(em, DT_EFORMAT, "dtengine devices: device %zu has no valid "
                               "uuid or memory_bytes", i);
        }
        g->uuid[g->n] = dt_xstrdup(u);
        /* the kernel's cpulist: digits, commas and dashes */
        g->cpus[g->n] = c && *c && c[strspn(c, "0123456789,-")] == '\0' ? dt_xstrdup(c) : NULL;
        int64_t m = (int64_t)json_integer_value(mem);
        if (g->n == 0 || m < g->mem_min)
            g->mem_min = m;
        g->n++;
    }
    const char *why = json_string_value(json_object_get(o, "error"));
    if (g->n == 0) {
        dt_gpus_free(g); /* nothing held for a node without GPUs */
        char *e = dt_text_escape(why ? why : "none found", 0);
        snprintf(g->why, sizeof(g->why), "%s", e);
        free(e);
    }
    json_decref(o);
    return 0;
}

void dt_gpus_probe(const char *engine, int timeout_ms, dt_gpus_t *g)
{
    dt_emsg_t em = { "" };
    char *text = NULL;

    if (run_engine(engine, timeout_ms, &text, &em) < 0 || dt_gpus_parse(text, g, &em) < 0) {
        memset(g, 0, sizeof(*g));
        snprintf(g->why, sizeof(g->why), "%s", em.s);
    }
    free(text);
}

void dt_gpus_free(dt_gpus_t *g)
{
    for (int i = 0; i < g->n; i++) {
        free(g->uuid[i]);
        free(g->cpus[i]);
    }
    free(g->uuid);
    free(g->cpus);
    memset(g, 0, sizeof(*g));
}
