/* SPDX-License-Identifier: MIT
 *
 * Daemonising with a status pipe, and the locked pidfile.
 */
#include "config.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coordinator/daemon.h"

int dt_daemon_start(int *status_fd, dt_emsg_t *em)
{
    int p[2];
    pid_t pid;

    if (pipe(p) < 0)
        return dt_emsg_set(em, dt_err_errno(errno), "pipe: %s", strerror(errno));
    if ((pid = fork()) < 0)
        return dt_emsg_set(em, dt_err_errno(errno), "fork: %s", strerror(errno));
    if (pid > 0) {
        /* parent: wait for the child's word */
        char buf[600];
        ssize_t n, got = 0;
        close(p[1]);
        while ((n = read(p[0], buf + got, sizeof(buf) - 1 - (size_t)got)) > 0)
            got += n;
        buf[got > 0 ? got : 0] = '\0';
        if (got == 1 && buf[0] == '\0')
            _exit(0);
        if (got == 0) {
            int st;
            waitpid(pid, &st, 0);
            fprintf(stderr, "dtcoordd: start-up failed (exit status %d)\n",
                    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        } else {
            fprintf(stderr, "dtcoordd: %s\n", buf);
        }
        _exit(1);
    }
    close(p[0]);
    if (setsid() < 0)
        return dt_emsg_set(em, dt_err_errno(errno), "setsid: %s", strerror(errno));
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        if (null > 2)
            close(null);
    }
    *status_fd = p[1];
    return 0;
}

void dt_daemon_ready(int status_fd, const char *errmsg)
{
    if (status_fd < 0)
        return;
    if (errmsg == NULL) {
        ssize_t w = write(status_fd, "", 1);
        (void)w;
        /* from now on stderr is the log or nothing */
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 2);
            if (null > 2)
                close(null);
        }
    } else {
        ssize_t w = write(status_fd, errmsg, strlen(errmsg));
        (void)w;
    }
    close(status_fd);
}

int dt_pidfile_lock(const char *path, dt_emsg_t *em)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    char buf[32];

    if (fd < 0)
        return dt_emsg_set(em, dt_err_errno(errno), "%s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        buf[n > 0 ? n : 0] = '\0';
        buf[strcspn(buf, "\n")] = '\0';
        close(fd);
        return dt_emsg_set(em, DT_EEXIST, "another dtcoordd (pid %s) holds %s", buf[0] ? buf : "?",
                           path);
    }
    int n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
        close(fd);
        return dt_emsg_set(em, DT_EIO, "%s: cannot write the pid", path);
    }
    return fd;
}
