/* SPDX-License-Identifier: MIT
 *
 * Full reads and writes, directory fsync, atomic replacement of a file and
 * recursive delete.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/mem.h"

int64_t dt_pread_full(int fd, void *buf, size_t n, int64_t off)
{
    size_t done = 0;

    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + (int64_t)done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return dt_err_errno(errno);
        }
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (int64_t)done;
}

int dt_write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;

    while (done < n) {
        ssize_t r = write(fd, (const char *)buf + done, n - done);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return dt_err_errno(errno);
        }
        done += (size_t)r;
    }
    return 0;
}

int dt_pwrite_full(int fd, const void *buf, size_t n, int64_t off)
{
    size_t done = 0;

    while (done < n) {
        ssize_t r = pwrite(fd, (const char *)buf + done, n - done, (off_t)(off + (int64_t)done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return dt_err_errno(errno);
        }
        done += (size_t)r;
    }
    return 0;
}

int dt_open_regular_flags(const char *path, unsigned flags, int64_t *size, dt_emsg_t *em)
{
    struct stat st;
    int fd, e, rc;

    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK |
                        ((flags & DT_OPEN_NOFOLLOW) ? O_NOFOLLOW : 0));
    if (fd < 0) {
        e = errno;
        if (e == ELOOP && (flags & DT_OPEN_NOFOLLOW) && lstat(path, &st) == 0 &&
            S_ISLNK(st.st_mode))
            return dt_emsg_set(em, DT_EINVAL, "%s: is a symbolic link (not followed here)", path);
        return dt_emsg_set(em, dt_err_errno(e), "%s: cannot open: %s", path, strerror(e));
    }
    if (fstat(fd, &st) < 0) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot stat: %s", path, strerror(e));
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = dt_emsg_set(em, DT_EINVAL, "%s: %s", path,
                         S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file");
        close(fd);
        return rc;
    }
    if (size)
        *size = (int64_t)st.st_size;
    return fd;
}

int dt_open_regular(const char *path, int64_t *size, dt_emsg_t *em)
{
    return dt_open_regular_flags(path, 0, size, em);
}

int dt_read_regular(const char *path, unsigned flags, size_t max, char **buf, size_t *len,
                    dt_emsg_t *em)
{
    int64_t size = 0, got;
    char *p;
    int fd;

    *buf = NULL;
    *len = 0;
    if ((fd = dt_open_regular_flags(path, flags, &size, em)) < 0)
        return fd;
    if (size < 0 || (uint64_t)size > max) {
        close(fd);
        return dt_emsg_set(em, DT_ERANGE, "%s: larger than the limit of %zu bytes", path, max);
    }
    /* one byte past the size seen, so a file that grew since is seen */
    p = dt_xmalloc((size_t)size + 2);
    got = dt_pread_full(fd, p, (size_t)size + 1, 0);
    close(fd);
    if (got < 0) {
        free(p);
        return dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
    }
    if (got != size) {
        free(p);
        return dt_emsg_set(em, DT_EIO, "%s: changed while it was read (%" PRId64
                           " bytes, then %" PRId64 ")", path, size, got);
    }
    p[got] = '\0';
    *buf = p;
    *len = (size_t)got;
    return 0;
}

int dt_fsync_dir(const char *dir, dt_emsg_t *em)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), e, rc = 0;

    if (fd < 0) {
        e = errno;
        return dt_emsg_set(em, dt_err_errno(e), "%s: cannot open to fsync: %s", dir, strerror(e));
    }
    if (fsync(fd) < 0 && errno != EINVAL && errno != ENOTSUP) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: fsync failed: %s", dir, strerror(e));
    }
    close(fd);
    return rc;
}

/* mkdir -p on p, a copy of the path: 0, or -errno with p cut to the
 * directory that could not be made. */
static int mkdirs(char *p, mode_t mode)
{
    /* each prefix that ends before a '/', then the whole (a leading '/'
     * is no prefix: mkdir("") would fail) */
    for (char *s = p + (*p == '/');; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, mode) < 0 && errno != EEXIST)
            return -errno;
        *s = c;
        if (c == '\0')
            return 0;
    }
}

int dt_mkdirs(const char *path, mode_t mode)
{
    char *p = dt_xstrdup(path);
    int rc = mkdirs(p, mode);

    free(p);
    if (rc < 0)
        errno = -rc;
    return rc;
}

int dt_mkdirs_checked(const char *path, mode_t mode, dt_emsg_t *em)
{
    char *p = dt_xstrdup(path);
    struct stat st;
    int rc = mkdirs(p, mode);

    if (rc < 0)
        rc = dt_emsg_set(em, dt_err_errno(-rc), "%s: %s", p, strerror(-rc));
    free(p);
    if (rc < 0)
        return rc;
    if (stat(path, &st) < 0)
        return dt_emsg_set(em, dt_err_errno(errno), "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dt_emsg_set(em, DT_EINVAL, "%s: not a directory", path);
    return 0;
}

/*-- atomic replacement -----------------------------------------------------*/

static void atomic_free(dt_atomic_t *af)
{
    if (af->fd >= 0)
        close(af->fd);
    if (af->dfd >= 0)
        close(af->dfd);
    free(af->path);
    free(af->tmp);
    free(af->dir);
    free(af->name);
    free(af->tmpname);
    memset(af, 0, sizeof(*af));
    af->fd = af->dfd = -1;
}

/* DIR opened as a directory, refusing a symbolic link in its place. */
static int open_dir_nofollow(const char *dir, dt_emsg_t *em)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), e;
    struct stat st;

    if (fd >= 0)
        return fd;
    e = errno;
    if ((e == ELOOP || e == ENOTDIR) && lstat(dir, &st) == 0 && S_ISLNK(st.st_mode))
        return dt_emsg_set(em, DT_EINVAL, "%s: is a symbolic link (not followed here)", dir);
    return dt_emsg_set(em, dt_err_errno(e), "%s: cannot open: %s", dir, strerror(e));
}

/* The temp file, relative to the directory descriptor or by name. */
static int tmp_create(dt_atomic_t *af, mode_t mode)
{
    const int oflags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;

    if (af->dfd >= 0)
        return openat(af->dfd, af->tmpname, oflags, mode);
    return open(af->tmp, oflags, mode);
}

static int tmp_unlink(const dt_atomic_t *af)
{
    return af->dfd >= 0 ? unlinkat(af->dfd, af->tmpname, 0) : unlink(af->tmp);
}

int dt_atomic_open(dt_atomic_t *af, const char *path, mode_t mode, unsigned flags,
                   dt_emsg_t *em)
{
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    int rc, e;

    memset(af, 0, sizeof(*af));
    af->fd = af->dfd = -1;
    if (*base == '\0')
        return dt_emsg_set(em, DT_EINVAL, "%s: not a file name", path);
    af->path = dt_xstrdup(path);
    af->name = dt_xstrdup(base);
    if (slash == path)
        af->dir = dt_xstrdup("/");
    else if (slash)
        af->dir = dt_xasprintf("%.*s", (int)(slash - path), path);
    else
        af->dir = dt_xstrdup(".");
    af->tmpname = dt_xasprintf(".%s.tmp.%ld", base, (long)getpid());
    af->tmp = dt_xasprintf("%s/%s", slash == path ? "" : af->dir, af->tmpname);
    if ((flags & DT_ATOMIC_DIRFD) && (rc = af->dfd = open_dir_nofollow(af->dir, em)) < 0) {
        af->dfd = -1;
        goto fail;
    }
    /* A temp file with our pid was left by a crashed process that had the
     * same pid (containers reuse pids): garbage, replaced. (Two writers of
     * one target at once in one process would collide here: a caller bug.) */
    af->fd = tmp_create(af, mode);
    if (af->fd < 0 && errno == EEXIST && tmp_unlink(af) == 0)
        af->fd = tmp_create(af, mode);
    if (af->fd < 0) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot create %s: %s", path, af->tmp,
                         strerror(e));
        goto fail;
    }
    return 0;
fail:
    atomic_free(af);
    return rc;
}

int dt_atomic_write(dt_atomic_t *af, const void *buf, size_t n, dt_emsg_t *em)
{
    int rc = dt_write_full(af->fd, buf, n);

    if (rc < 0)
        dt_emsg_set(em, rc, "%s: cannot write %s: %s", af->path, af->tmp, dt_strerror(rc));
    return rc;
}

int dt_atomic_sync(dt_atomic_t *af, dt_emsg_t *em)
{
    int e;

    if (fsync(af->fd) < 0) {
        e = errno;
        return dt_emsg_set(em, dt_err_errno(e), "%s: cannot fsync %s: %s", af->path, af->tmp,
                           strerror(e));
    }
    af->synced = 1;
    return 0;
}

int dt_atomic_commit(dt_atomic_t *af, dt_emsg_t *em)
{
    dt_emsg_t sub = { "" };
    int rc = 0, e;

    if (!af->synced && (rc = dt_atomic_sync(af, em)) < 0)
        goto fail;
    /* close can report a deferred write error (NFS): it counts. */
    rc = close(af->fd);
    af->fd = -1;
    if (rc < 0) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot close %s: %s", af->path, af->tmp,
                         strerror(e));
        goto fail;
    }
    if ((af->dfd >= 0 ? renameat(af->dfd, af->tmpname, af->dfd, af->name)
                      : rename(af->tmp, af->path)) < 0) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot rename %s over it: %s", af->path,
                         af->tmp, strerror(e));
        goto fail;
    }
    /* The file is in place; what is left makes the rename durable. */
    if (af->dfd >= 0) {
        if (fsync(af->dfd) < 0 && errno != EINVAL && errno != ENOTSUP) {
            e = errno;
            rc = dt_emsg_set(&sub, dt_err_errno(e), "%s: fsync failed: %s", af->dir,
                             strerror(e));
        }
    } else {
        rc = dt_fsync_dir(af->dir, &sub);
    }
    if (rc < 0)
        dt_emsg_set(em, rc, "%s: written, but %s", af->path, sub.s);
    atomic_free(af);
    return rc;
fail:
    dt_atomic_abort(af);
    return rc;
}

void dt_atomic_abort(dt_atomic_t *af)
{
    if (af->tmp == NULL) /* released already */
        return;
    if (af->fd >= 0) {
        close(af->fd);
        af->fd = -1;
    }
    tmp_unlink(af);
    atomic_free(af);
}

int dt_file_write_atomic(const char *path, const void *buf, size_t n, mode_t mode,
                         unsigned flags, dt_emsg_t *em)
{
    dt_atomic_t af;
    int rc;

    if ((rc = dt_atomic_open(&af, path, mode, flags, em)) < 0)
        return rc;
    if ((rc = dt_atomic_write(&af, buf, n, em)) < 0) {
        dt_atomic_abort(&af);
        return rc;
    }
    return dt_atomic_commit(&af, em);
}

/*-- recursive delete -------------------------------------------------------*/

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)ftw;
    if ((flag == FTW_DP ? rmdir(p) : unlink(p)) < 0 && errno != ENOENT)
        return errno;
    return 0;
}

int dt_gen_dirs_remove(const char *state_dir, int *removed, dt_emsg_t *em)
{
    const size_t np = strlen(DT_GEN_DIR_PREFIX);
    DIR *d = opendir(state_dir);
    struct dirent *e;
    int rc = 0, n = 0;

    if (removed != NULL)
        *removed = 0;
    if (d == NULL)
        return errno == ENOENT ? 0
                               : dt_emsg_set(em, dt_err_errno(errno), "%s: %s", state_dir,
                                             strerror(errno));
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, DT_GEN_DIR_PREFIX, np) != 0)
            continue;
        char *p = dt_xasprintf("%s/%s", state_dir, e->d_name);
        if ((rc = dt_rmtree(p, em)) == 0)
            n++;
        free(p);
    }
    closedir(d);
    if (removed != NULL)
        *removed = n;
    return rc;
}

int dt_rmtree(const char *path, dt_emsg_t *em)
{
    struct stat st;
    int rc;

    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0
                               : dt_emsg_set(em, dt_err_errno(errno), "%s: cannot remove: %s",
                                             path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) /* a file, or a link: only the entry itself goes */
        rc = unlink(path) < 0 && errno != ENOENT ? errno : 0;
    else
        rc = nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    if (rc < 0)
        rc = errno;
    return rc ? dt_emsg_set(em, dt_err_errno(rc), "%s: cannot remove: %s", path, strerror(rc))
              : 0;
}
