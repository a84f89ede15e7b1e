/* SPDX-License-Identifier: MIT
 *
 * In-memory checkpoints written into the agent's memory files
 * (engine/cmd/memckpt.h).
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sha256.h"
#include "engine/cmd/memckpt.h"
#include "engine/wlink.h"

/* A file descriptor number from s, [0, 65535], ending at *end. */
static int parse_fd(const char *s, char **end)
{
    errno = 0;
    long v = strtol(s, end, 10);
    if (errno != 0 || *end == s || v < 0 || v > 65535)
        return -1;
    return (int)v;
}

int dt_memckpt_init(dt_memckpt_t *mc, const char *cmd, int64_t every, dt_emsg_t *em)
{
    const char *fds = getenv(DT_MEMCKPT_ENV), *res = getenv(DT_MEMCKPT_RESUME_ENV);
    char *end;

    *mc = (dt_memckpt_t){ .fd = { -1, -1 }, .newest = -1, .resume_slot = -1, .cmd = cmd };
    if (fds == NULL || fds[0] == '\0')
        return 0;
    int a = parse_fd(fds, &end), b = -1;
    if (a >= 0 && *end == ',')
        b = parse_fd(end + 1, &end);
    if (a < 0 || b < 0 || *end != '\0' || a == b)
        return dt_emsg_set(em, DT_EUSAGE, "%s=%.40s: not two file descriptors FD0,FD1",
                           DT_MEMCKPT_ENV, fds);
    if (res != NULL && res[0] != '\0') {
        if (!((res[0] == '0' || res[0] == '1') && res[1] == ':' && strlen(res + 2) == 64 &&
              strspn(res + 2, "0123456789abcdef") == 64))
            return dt_emsg_set(em, DT_EUSAGE, "%s=%.80s: not SLOT:SHA256", DT_MEMCKPT_RESUME_ENV,
                               res);
        mc->resume_slot = res[0] - '0';
        memcpy(mc->resume_sha, res + 2, 65);
    }
    mc->fd[0] = a;
    mc->fd[1] = b;
    mc->every = every > 0 ? every : 0;
    return 0;
}

int dt_memckpt_due(const dt_memckpt_t *mc, int64_t done, int64_t steps)
{
    /* the last step's state is the run's result, on disk: no copy */
    return mc->fd[0] >= 0 && mc->every > 0 && done % mc->every == 0 && done < steps;
}

void dt_memckpt_write(dt_memckpt_t *mc, int64_t done, dt_st_writer_t *w)
{
    dt_emsg_t em = { "" };
    char sha[65], name[48];
    int64_t bytes = 0;
    int slot = mc->newest == 0 ? 1 : 0;

    if (mc->fd[0] < 0 || mc->every == 0)
        return;
    snprintf(name, sizeof(name), "in-memory checkpoint slot %d", slot);
    if (dt_st_write_fd(w, mc->fd[slot], name, sha, &bytes, &em) < 0) {
        fprintf(stderr, "%s: step %" PRId64 ": %s: no more in-memory checkpoints (disk "
                "checkpoints go on)\n", mc->cmd, done, em.s);
        mc->every = 0;
        return;
    }
    mc->newest = slot;
    dt_wlink_memckpt(done, slot, bytes, sha);
}

int dt_memckpt_open_resume(dt_memckpt_t *mc, int64_t step, dt_st_reader_t **r, dt_emsg_t *em)
{
    char sha[65], path[48];

    *r = NULL;
    if (mc->fd[0] < 0 || mc->resume_slot < 0)
        return dt_emsg_set(em, DT_ECKPT, "--resume-from-memory %" PRId64 ": the agent gave no "
                           "in-memory checkpoint (%s)", step,
                           mc->fd[0] < 0 ? "no " DT_MEMCKPT_ENV : "no " DT_MEMCKPT_RESUME_ENV);
    int fd = mc->fd[mc->resume_slot];
    int64_t n = dt_sha256_fd(fd, sha);
    if (n < 0)
        return dt_emsg_set(em, DT_ECKPT, "--resume-from-memory %" PRId64 ": reading slot %d: %s",
                           step, mc->resume_slot, strerror((int)-n));
    if (strcmp(sha, mc->resume_sha) != 0)
        return dt_emsg_set(em, DT_ECKPT, "--resume-from-memory %" PRId64 ": slot %d's SHA-256 "
                           "%.12s... is not the %.12s... its agent verified", step,
                           mc->resume_slot, sha, mc->resume_sha);
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int rc = dt_st_open(path, r, em);
    if (rc < 0) {
        dt_emsg_t why = *em;
        return dt_emsg_set(em, DT_ECKPT, "--resume-from-memory %" PRId64 ": %s", step, why.s);
    }
    mc->newest = mc->resume_slot;
    return 0;
}
