/* SPDX-License-Identifier: MIT
 *
 * Job directories (jobdir.h): the one place where dtcoordd makes a path
 * that a job's owner then controls. JOBS_DIR (dt.conf jobs_dir) belongs to
 * the coordinator, mode 0711: users may pass through it to their own job's
 * directory but not list it, and only the coordinator adds entries. Each
 * job gets JOBS_DIR/ID, made with mkdirat and opened with O_NOFOLLOW
 * relative to the descriptor of JOBS_DIR, then given to the job's owner
 * (fchown on that descriptor, mode 0700). From then on the coordinator
 * never opens, creates or deletes anything inside it: the agents and
 * workers, running as the owner, write checkpoints and logs there.
 *
 * Not here: what goes inside a job directory (agents and engine), the
 * files of the coordinator's own state (main.c).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/mem.h"
#include "coordinator/jobdir.h"

int dt_jobdir_open_root(const char *jobs_dir, dt_emsg_t *em)
{
    struct stat st;
    int fd, e;

    if (dt_mkdirs(jobs_dir, 0711) < 0) {
        e = errno;
        return dt_emsg_set(em, dt_err_errno(e), "jobs_dir %s: %s", jobs_dir, strerror(e));
    }
    fd = open(jobs_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        e = errno;
        return dt_emsg_set(em, dt_err_errno(e), "jobs_dir %s: %s", jobs_dir,
                           e == ELOOP ? "is a symbolic link" : strerror(e));
    }
    if (fstat(fd, &st) < 0) {
        e = errno;
        close(fd);
        return dt_emsg_set(em, dt_err_errno(e), "jobs_dir %s: %s", jobs_dir, strerror(e));
    }
    if (st.st_uid != geteuid()) {
        close(fd);
        return dt_emsg_set(em, DT_EPERM, "jobs_dir %s belongs to uid %u, not to dtcoordd's uid "
                           "%u: another user could plant entries in it", jobs_dir,
                           (unsigned)st.st_uid, (unsigned)geteuid());
    }
    /* ours: traversable by all (each user reaches their own job), listable
     * and writable by nobody else */
    if ((st.st_mode & 07777) != 0711 && fchmod(fd, 0711) < 0) {
        e = errno;
        close(fd);
        return dt_emsg_set(em, dt_err_errno(e), "jobs_dir %s: chmod 0711: %s", jobs_dir,
                           strerror(e));
    }
    return fd;
}

char *dt_jobdir_path(const char *jobs_dir, int64_t job)
{
    return dt_xasprintf("%s/%" PRId64, jobs_dir, job);
}

int dt_jobdir_ensure(int root_fd, const char *jobs_dir, int64_t job, uid_t owner,
                     dt_emsg_t *em)
{
    char name[32], *path = dt_jobdir_path(jobs_dir, job);
    struct stat st;
    int fd, e, made = 0, rc = 0;

    snprintf(name, sizeof(name), "%" PRId64, job);
    fd = openat(root_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        if (mkdirat(root_fd, name, 0700) < 0 && errno != EEXIST) {
            e = errno;
            rc = dt_emsg_set(em, dt_err_errno(e), "job directory %s: %s", path, strerror(e));
            goto out;
        }
        made = 1;
        fd = openat(root_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "job directory %s: %s", path,
                         e == ELOOP || e == ENOTDIR ? "exists and is not a directory"
                                                    : strerror(e));
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "job directory %s: %s", path, strerror(e));
        goto out;
    }
    if (st.st_uid == owner)
        goto out; /* already the owner's (made now by the owner's own coordinator, or before) */
    if (!made && st.st_uid != geteuid()) {
        rc = dt_emsg_set(em, DT_EPERM, "job directory %s belongs to uid %u, not to the job's "
                         "owner (uid %u)", path, (unsigned)st.st_uid, (unsigned)owner);
        goto out;
    }
    /* ours, new or left over from a hand-over that failed: give it away */
    struct passwd pw, *pwp = NULL;
    char buf[4096];
    gid_t gid = st.st_gid;
    if (getpwuid_r(owner, &pw, buf, sizeof(buf), &pwp) == 0 && pwp)
        gid = pw.pw_gid;
    if (fchown(fd, owner, gid) < 0 || fchmod(fd, 0700) < 0) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "job directory %s: cannot give it to uid %u: %s%s",
                         path, (unsigned)owner, strerror(e),
                         e == EPERM ? " (dtcoordd is not root: give the job a ckpt_dir of its "
                                      "own, or run dtcoordd as root)" : "");
        unlinkat(root_fd, name, AT_REMOVEDIR); /* empty and ours: nobody could use it */
    }
out:
    if (fd >= 0)
        close(fd);
    free(path);
    return rc;
}
