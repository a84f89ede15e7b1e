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
    pthread_mutex_init(&mc->mu, NULL);
    pthread_cond_init(&mc->cv, NULL);
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

int dt_memckpt_due(dt_memckpt_t *mc, int64_t done, int64_t steps)
{
    /* the last step's state is the run's result, on disk: no copy */
    if (mc->fd[0] < 0 || mc->every <= 0 || done % mc->every != 0 || done >= steps)
        return 0;
    pthread_mutex_lock(&mc->mu);
    int off = mc->off;
    pthread_mutex_unlock(&mc->mu);
    return !off;
}

/* Write w into slot (the thread's or the caller's); a failure is said
 * and turns the copies off. */
static int write_slot(dt_memckpt_t *mc, int64_t done, int slot, dt_st_writer_t *w,
                      int64_t *bytes)
{
    dt_emsg_t em = { "" };
    char name[48];

    snprintf(name, sizeof(name), "in-memory checkpoint slot %d", slot);
    if (dt_st_write_fd(w, mc->fd[slot], name, NULL, bytes, &em) < 0) {
        fprintf(stderr, "%s: step %" PRId64 ": %s: no more in-memory checkpoints (disk "
                "checkpoints go on)\n", mc->cmd, done, em.s);
        return -1;
    }
    return 0;
}

/* The hashing thread: each copy written, oldest first, hashed from its
 * memory file and reported to the agent (the link is safe to send on from
 * here: wlink.h). */
static void *hasher(void *arg)
{
    dt_memckpt_t *mc = arg;

    pthread_mutex_lock(&mc->mu);
    for (;;) {
        int slot = -1;
        for (int i = 0; i < 2; i++)
            if (mc->queued[i] > 0 && (slot < 0 || mc->queued[i] < mc->queued[slot]))
                slot = i;
        if (slot < 0) {
            if (mc->quit)
                break;
            pthread_cond_wait(&mc->cv, &mc->mu);
            continue;
        }
        int64_t step = mc->queued[slot], bytes = mc->bytes[slot];
        dt_st_writer_t *w = mc->w[slot];
        pthread_mutex_unlock(&mc->mu);
        if (w != NULL) {
            /* the caller's memory, read until this is done (dt_memckpt_sync) */
            int rc = write_slot(mc, step, slot, w, &bytes);
            dt_st_writer_free(w);
            pthread_mutex_lock(&mc->mu);
            mc->w[slot] = NULL;
            mc->bytes[slot] = bytes;
            if (rc < 0) {
                mc->off = 1;
                mc->queued[slot] = 0;
            }
            pthread_cond_broadcast(&mc->cv);
            if (rc < 0)
                continue;
            pthread_mutex_unlock(&mc->mu);
        }
        char sha[65];
        int64_t n = dt_sha256_fd(mc->fd[slot], sha);
        if (n == bytes)
            dt_wlink_memckpt(step, slot, bytes, sha);
        else /* not offered: the recovery takes an older copy or the disk */
            fprintf(stderr, "%s: step %" PRId64 ": in-memory checkpoint slot %d: %s\n", mc->cmd,
                    step, slot, n < 0 ? strerror((int)-n) : "its size changed while hashed");
        pthread_mutex_lock(&mc->mu);
        mc->queued[slot] = 0;
        pthread_cond_broadcast(&mc->cv);
    }
    pthread_mutex_unlock(&mc->mu);
    return NULL;
}

/* The slot the next copy goes to: the one not holding the newest. */
static int next_slot(const dt_memckpt_t *mc)
{
    return mc->newest == 0 ? 1 : 0;
}

int dt_memckpt_ready(dt_memckpt_t *mc, int64_t done)
{
    if (mc->fd[0] < 0 || mc->every == 0)
        return 0;
    pthread_mutex_lock(&mc->mu);
    int off = mc->off, busy = mc->queued[next_slot(mc)] != 0;
    pthread_mutex_unlock(&mc->mu);
    if (off)
        return 0;
    if (busy) {
        if (mc->skipped++ == 0)
            fprintf(stderr, "%s: step %" PRId64 ": in-memory checkpoint skipped: the one before "
                    "it in slot %d is still being written or hashed (the state is large for "
                    "its steps; said once)\n", mc->cmd, done, next_slot(mc));
        return 0;
    }
    return 1;
}

/* Ready to take a copy into slot (dt_memckpt_ready, and the thread
 * started): 1 with the agent told the slot is being overwritten, else 0
 * (the copy is skipped). */
static int begin(dt_memckpt_t *mc, int64_t done, int slot)
{
    if (!dt_memckpt_ready(mc, done))
        return 0;
    if (!mc->started) {
        int e = pthread_create(&mc->thread, NULL, hasher, mc);
        if (e != 0) {
            fprintf(stderr, "%s: step %" PRId64 ": no thread to hash in-memory checkpoints "
                    "with: %s: no more of them (disk checkpoints go on)\n", mc->cmd, done,
                    strerror(e));
            mc->every = 0;
            return 0;
        }
        mc->started = 1;
    }
    /* the agent forgets what the slot held before it is overwritten */
    dt_wlink_memckpt_writing(done, slot);
    return 1;
}

/* Hand slot's copy of step done to the thread: w to write (or NULL:
 * written), then hashed and reported. */
static void queue(dt_memckpt_t *mc, int64_t done, int slot, dt_st_writer_t *w, int64_t bytes)
{
    mc->newest = slot;
    pthread_mutex_lock(&mc->mu);
    mc->queued[slot] = done;
    mc->bytes[slot] = bytes;
    mc->w[slot] = w;
    pthread_cond_broadcast(&mc->cv);
    pthread_mutex_unlock(&mc->mu);
}

void dt_memckpt_write(dt_memckpt_t *mc, int64_t done, dt_st_writer_t *w)
{
    int64_t bytes = 0;
    int slot = next_slot(mc);

    if (!begin(mc, done, slot))
        return;
    if (write_slot(mc, done, slot, w, &bytes) < 0) {
        mc->every = 0;
        return;
    }
    queue(mc, done, slot, NULL, bytes);
}

void dt_memckpt_write_async(dt_memckpt_t *mc, int64_t done, dt_st_writer_t *w)
{
    int slot = next_slot(mc);

    if (!begin(mc, done, slot)) {
        dt_st_writer_free(w);
        return;
    }
    queue(mc, done, slot, w, 0);
}

void dt_memckpt_sync(dt_memckpt_t *mc)
{
    if (!mc->started)
        return;
    pthread_mutex_lock(&mc->mu);
    while (mc->w[0] != NULL || mc->w[1] != NULL)
        pthread_cond_wait(&mc->cv, &mc->mu);
    pthread_mutex_unlock(&mc->mu);
}

void dt_memckpt_close(dt_memckpt_t *mc)
{
    if (mc->started) {
        pthread_mutex_lock(&mc->mu);
        mc->quit = 1;
        pthread_cond_broadcast(&mc->cv);
        pthread_mutex_unlock(&mc->mu);
        pthread_join(mc->thread, NULL);
        mc->started = 0;
    }
    if (mc->skipped > 1)
        fprintf(stderr, "%s: %" PRId64 " in-memory checkpoints skipped in all (their slots were "
                "still being hashed)\n", mc->cmd, mc->skipped);
}

int dt_memckpt_open_resume(dt_memckpt_t *mc, int64_t step, const char *format,
                           dt_st_reader_t **r, dt_emsg_t *em)
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
                           "%.12s... is not the %.12s... its agent holds", step,
                           mc->resume_slot, sha, mc->resume_sha);
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int rc = dt_st_open(path, r, em);
    if (rc < 0) {
        dt_emsg_t why = *em;
        return dt_emsg_set(em, DT_ECKPT, "--resume-from-memory %" PRId64 ": %s", step, why.s);
    }
    const char *f = dt_st_meta(*r, "format");
    if (f == NULL || strcmp(f, format) != 0) {
        dt_st_close(*r);
        *r = NULL;
        return dt_emsg_set(em, DT_ECKPT, "--resume-from-memory %" PRId64 ": not a copy of "
                           "format %s (format %.40s)", step, format, f ? f : "none");
    }
    mc->newest = mc->resume_slot;
    return 0;
}

int dt_memckpt_meta_int(const dt_st_reader_t *r, const char *key, long long *v, dt_emsg_t *em)
{
    const char *s = dt_st_meta(r, key);
    char *end;

    if (s != NULL) {
        errno = 0;
        *v = strtoll(s, &end, 10);
        if (errno == 0 && end != s && *end == '\0')
            return 0;
    }
    return dt_emsg_set(em, DT_ECKPT, "the in-memory checkpoint has no integer '%s'", key);
}
