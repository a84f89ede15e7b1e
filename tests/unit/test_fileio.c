/* SPDX-License-Identifier: MIT
 *
 * Unit tests for common/fileio (the atomic writer, mkdir -p and dt_rmtree),
 * common/clock and common/path: what lands where with which mode, what is
 * left behind after each kind of failure (nothing), that planted links are
 * replaced or refused and never written through, and that a recursive
 * delete removes a link, not what it points to.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fileio.h"
#include "common/mem.h"
#include "common/path.h"

static char tmpdir[64];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_fileio.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    if (tmpdir[0])
        dt_rmtree(tmpdir, NULL);
}

TestSuite(fileio, .init = setup, .fini = teardown);

/* tmpdir/name, in one of a few rotating static buffers. */
static const char *P(const char *name)
{
    static char bufs[4][256];
    static int k;
    char *b = bufs[k++ % 4];

    snprintf(b, sizeof(bufs[0]), "%s/%s", tmpdir, name);
    return b;
}

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    cr_assert_not_null(d);
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

static void expect_text(const char *path, const char *want)
{
    char *buf;
    size_t len;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_read_regular(path, 0, 1 << 20, &buf, &len, &em), 0, "%s", em.s);
    cr_expect_str_eq(buf, want, "%s", path);
    free(buf);
}

static mode_t mode_of(const char *path)
{
    struct stat st;

    cr_assert_eq(lstat(path, &st), 0, "%s: %s", path, strerror(errno));
    return st.st_mode;
}

Test(fileio, write_atomic_replaces_with_mode)
{
    dt_emsg_t em = { "" };
    mode_t old = umask(0);

    put(P("f"), "old");
    cr_assert_eq(dt_file_write_atomic(P("f"), "new", 3, 0600, 0, &em), 0, "%s", em.s);
    expect_text(P("f"), "new");
    cr_expect_eq(mode_of(P("f")) & 07777, 0600);
    cr_assert_eq(dt_file_write_atomic(P("g"), "", 0, 0640, DT_ATOMIC_DIRFD, &em), 0, "%s", em.s);
    cr_expect_eq(mode_of(P("g")) & 07777, 0640);
    umask(old);
    cr_expect_eq(entries(tmpdir), 2, "a temp file was left behind");
}

Test(fileio, streaming_and_abort)
{
    dt_emsg_t em = { "" };
    dt_atomic_t af;

    cr_assert_eq(dt_atomic_open(&af, P("s"), 0600, 0, &em), 0, "%s", em.s);
    cr_expect(strstr(af.tmp, "/.s.tmp.") != NULL, "%s", af.tmp);
    cr_assert_eq(dt_atomic_write(&af, "ab", 2, &em), 0);
    cr_assert_eq(dt_atomic_sync(&af, &em), 0);
    cr_assert_eq(dt_atomic_write(&af, "cd", 2, &em), 0);
    cr_expect_eq(access(P("s"), F_OK), -1, "visible before the commit");
    cr_assert_eq(dt_atomic_commit(&af, &em), 0, "%s", em.s);
    expect_text(P("s"), "abcd");
    dt_atomic_abort(&af); /* released by the commit: nothing to do */

    cr_assert_eq(dt_atomic_open(&af, P("t"), 0600, 0, &em), 0, "%s", em.s);
    cr_assert_eq(dt_atomic_write(&af, "x", 1, &em), 0);
    dt_atomic_abort(&af);
    dt_atomic_abort(&af);
    cr_expect_eq(entries(tmpdir), 1, "only s: the aborted file left nothing");
}

/* A link planted at the temp name is replaced, and one at the target is
 * replaced by the file: neither target is written through. */
Test(fileio, planted_links_not_followed)
{
    char tmpname[256];
    dt_emsg_t em = { "" };

    put(P("victim1"), "precious");
    put(P("victim2"), "precious");
    cr_assert_eq(symlink(P("victim1"), P("out")), 0);
    snprintf(tmpname, sizeof(tmpname), "%s/.out.tmp.%ld", tmpdir, (long)getpid());
    cr_assert_eq(symlink(P("victim2"), tmpname), 0);
    for (unsigned flags = 0; flags <= DT_ATOMIC_DIRFD; flags += DT_ATOMIC_DIRFD) {
        cr_assert_eq(dt_file_write_atomic(P("out"), "mine", 4, 0600, flags, &em), 0, "%s", em.s);
        cr_expect(S_ISREG(mode_of(P("out"))));
        expect_text(P("out"), "mine");
    }
    expect_text(P("victim1"), "precious");
    expect_text(P("victim2"), "precious");
}

Test(fileio, dirfd_refuses_a_linked_directory)
{
    dt_emsg_t em = { "" };

    cr_assert_eq(mkdir(P("real"), 0700), 0);
    cr_assert_eq(symlink(P("real"), P("link")), 0);
    cr_expect_eq(dt_file_write_atomic(P("link/f"), "x", 1, 0600, DT_ATOMIC_DIRFD, &em),
                 DT_EINVAL);
    cr_expect(strstr(em.s, "is a symbolic link") != NULL, "%s", em.s);
    cr_expect_eq(entries(P("real")), 0);
    /* without the flag the path is taken as it is */
    cr_expect_eq(dt_file_write_atomic(P("link/f"), "x", 1, 0600, 0, &em), 0, "%s", em.s);
    cr_expect_eq(entries(P("real")), 1);
}

Test(fileio, failures_leave_nothing)
{
    dt_emsg_t em = { "" };

    cr_expect_eq(dt_file_write_atomic(P("no/such/dir/f"), "x", 1, 0600, 0, &em), DT_ENOENT);
    cr_expect(strstr(em.s, "cannot create") != NULL, "%s", em.s);
    cr_expect(strncmp(em.s, P("no/such/dir/f: "), strlen(P("no/such/dir/f: "))) == 0, "%s",
              em.s);
    cr_expect_eq(dt_file_write_atomic(P("dir/"), "x", 1, 0600, 0, &em), DT_EINVAL);
    cr_expect(strstr(em.s, "not a file name") != NULL, "%s", em.s);
    /* the rename fails: a non-empty directory is in the way */
    cr_assert_eq(mkdir(P("d"), 0700), 0);
    put(P("d/x"), "x");
    cr_expect_lt(dt_file_write_atomic(P("d"), "x", 1, 0600, 0, &em), 0);
    cr_expect(strstr(em.s, "cannot rename") != NULL, "%s", em.s);
    cr_expect_eq(entries(tmpdir), 1, "only d: no temp file left");
}

Test(fileio, rmtree)
{
    dt_emsg_t em = { "" };

    put(P("outside"), "keep");
    cr_assert_eq(dt_mkdirs(P("t/a/b"), 0700), 0);
    put(P("t/a/b/f"), "x");
    put(P("t/g"), "x");
    cr_assert_eq(symlink(P("outside"), P("t/a/link")), 0);
    cr_assert_eq(symlink(tmpdir, P("t/a/dirlink")), 0);
    cr_expect_eq(dt_rmtree(P("t"), &em), 0, "%s", em.s);
    cr_expect_eq(access(P("t"), F_OK), -1);
    expect_text(P("outside"), "keep");
    cr_expect_eq(dt_rmtree(P("t"), &em), 0, "a missing path is removed already");
    /* a link itself: only the link goes */
    cr_assert_eq(symlink(P("outside"), P("l")), 0);
    cr_expect_eq(dt_rmtree(P("l"), &em), 0, "%s", em.s);
    expect_text(P("outside"), "keep");
    cr_expect_eq(dt_rmtree(P("outside"), &em), 0, "%s", em.s);
    cr_expect_eq(entries(tmpdir), 0);
}

Test(fileio, mkdirs)
{
    dt_emsg_t em = { "" };

    cr_expect_eq(dt_mkdirs(P("m/a/b/"), 0700), 0);
    cr_expect(S_ISDIR(mode_of(P("m/a/b"))));
    cr_expect_eq(dt_mkdirs(P("m/a/b"), 0700), 0, "existing directories are left as they are");
    cr_expect_eq(dt_mkdirs_checked(P("m/a/c/d"), 0700, &em), 0, "%s", em.s);
    cr_expect_eq(mode_of(P("m/a/c/d")) & 07777, 0700);
    cr_expect_eq(dt_mkdirs_checked(P("m/a/c/d"), 0700, &em), 0, "%s", em.s);
    /* a file where a directory should be: dt_mkdirs lets the last one
     * pass, the checked form does not */
    put(P("m/f"), "x");
    cr_expect_eq(dt_mkdirs(P("m/f"), 0700), 0);
    cr_expect_eq(dt_mkdirs_checked(P("m/f"), 0700, &em), DT_EINVAL);
    cr_expect_str_eq(em.s, P("m/f: not a directory"));
    /* below a file: the first directory that could not be made is named */
    cr_expect_eq(dt_mkdirs(P("m/f/g/h"), 0700), -ENOTDIR);
    cr_expect_eq(errno, ENOTDIR);
    cr_expect_lt(dt_mkdirs_checked(P("m/f/g/h"), 0700, &em), 0);
    cr_expect(strstr(em.s, P("m/f/g: ")) == em.s, "%s", em.s);
    cr_expect_lt(dt_mkdirs_checked("", 0700, &em), 0, "an empty path is no directory");
}

Test(fileio, clocks)
{
    struct timespec d, now;
    double s0 = dt_clock_now();
    int64_t m0 = dt_clock_mono_ms(), w0 = dt_clock_wall_ms();

    usleep(20000);
    cr_expect_geq(dt_clock_mono_ms() - m0, 19);
    cr_expect_geq(dt_clock_now() - s0, 0.019);
    cr_expect(w0 > (int64_t)1600000000 * 1000, "wall ms %lld", (long long)w0);
    cr_expect_lt(llabs((long long)(w0 / 1000 - (int64_t)time(NULL))), 2);
    dt_clock_deadline(&d, 1999);
    clock_gettime(CLOCK_MONOTONIC, &now);
    double ahead = (double)(d.tv_sec - now.tv_sec) + 1e-9 * (double)(d.tv_nsec - now.tv_nsec);
    cr_expect(ahead > 1.9 && ahead <= 1.999, "deadline %.3f s ahead", ahead);
    cr_expect(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
}

Test(fileio, programs_beside_self)
{
    const char *const rel[] = { "no-such-program", "test_fileio" };
    char *dir = dt_path_self_dir(), *p;

    cr_assert_not_null(dir);
    p = dt_path_beside(dir, rel, 2, 0);
    cr_assert_not_null(p);
    cr_expect_eq(access(p, X_OK), 0, "%s", p);
    cr_expect(strstr(p, "/test_fileio") != NULL, "%s", p);
    free(p);
    p = dt_path_beside(dir, rel, 1, DT_PATH_REAL);
    cr_expect_null(p);
    cr_expect_null(dt_path_beside(NULL, rel, 2, 0));
    free(dir);
}
