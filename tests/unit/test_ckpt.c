/* SPDX-License-Identifier: MIT
 *
 * Tests of io/ckpt: a 4-rank step written shard by shard, its manifest
 * and commit, verified and read back; what resume does with a corrupted
 * byte, a missing shard, a leftover temp directory, an unparsable or
 * foreign manifest, and the COMMITTED marker; keep-last-N pruning;
 * training shards (dt-train-1) written and read back, and every shard
 * that is not a slice refused; the manifest's model object, written and
 * parsed back strictly. Checks
 * are on files on disk, return codes and the messages a user would see.
 * Every test works in its own directory under /tmp, removed afterwards.
 */
#include "common/fileio.h"
#include "config.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/mem.h"
#include "io/ckpt.h"

/*-- fixture ----------------------------------------------------------------*/

static char tmpdir[64];
static char root[128];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_ckpt.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    snprintf(root, sizeof(root), "%s/ckpt", tmpdir);
}

static void teardown(void)
{
    if (tmpdir[0])
        dt_rmtree(tmpdir, NULL);
}

TestSuite(ckpt, .init = setup, .fini = teardown);

static const char *P(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *P(const char *fmt, ...)
{
    static char bufs[4][512];
    static int i;
    char *b = bufs[i++ % 4], rel[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(rel, sizeof(rel), fmt, ap);
    va_end(ap);
    snprintf(b, sizeof(bufs[0]), "%s/%s", root, rel);
    return b;
}

static bool exists(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0;
}

/* Rank r's tensors: a weight of (r+2) x 3 floats and an int64 step counter. */
static void write_rank(int64_t step, int rank, int ranks, dt_ckpt_shard_t *rec)
{
    float wgt[5 * 3];
    int64_t counter = step * 100 + rank, sw[] = { rank + 2, 3 }, sc[] = { 1 };
    dt_st_writer_t *w = dt_st_writer_new();
    dt_emsg_t em = { "" };

    for (int i = 0; i < (rank + 2) * 3; i++)
        wgt[i] = (float)(step + rank * 0.5 + i);
    cr_assert_eq(dt_st_writer_add(w, "layers.0.wq", DT_F32, 2, sw, wgt, &em), 0);
    cr_assert_eq(dt_st_writer_add(w, "counter", DT_I64, 1, sc, &counter, &em), 0);
    cr_assert_eq(dt_ckpt_write_shard(root, step, rank, ranks, w, rec, &em), 0, "%s", em.s);
    dt_st_writer_free(w);
}

/* A full step: begin, R shards, manifest, commit. */
static void write_step(int64_t step, int ranks)
{
    dt_ckpt_shard_t recs[8];
    dt_ckpt_manifest_t m = { 0 };
    dt_emsg_t em = { "" };
    char *dir = NULL;

    cr_assert_leq(ranks, 8);
    cr_assert_eq(dt_ckpt_begin(root, step, &em), 0, "%s", em.s);
    for (int r = ranks - 1; r >= 0; r--) /* any order */
        write_rank(step, r, ranks, &recs[r]);
    m.step = step;
    m.ranks = ranks;
    m.model = json_pack("{s:i, s:i, s:i, s:f}", "dim", 64, "layers", 2, "vocab", 256, "rope_theta",
                        500000.0);
    m.plan = json_pack("{s:s, s:i}", "layout", "zigzag", "tokens_per_rank", 1024);
    m.rng = json_pack("{s:I, s:I}", "seed", (json_int_t)1234, "offset", (json_int_t)step * 7);
    m.data_cursor = step * 4096;
    m.shards = recs;
    cr_assert_eq(dt_ckpt_write_manifest(root, &m, &em), 0, "%s", em.s);
    json_decref(m.model);
    json_decref(m.plan);
    json_decref(m.rng);
    cr_assert_eq(dt_ckpt_commit(root, step, &dir, &em), 0, "%s", em.s);
    cr_assert_str_eq(dir, P("step-%08lld", (long long)step));
    free(dir);
}

/* Records what dt_ckpt_latest skipped. */
typedef struct {
    int n;
    char dirs[8][256];
    char why[8][512];
    int err[8];
} skips_t;

static void on_skip(const char *dir, int err, const char *why, void *ud)
{
    skips_t *s = ud;

    cr_assert_lt(s->n, 8);
    snprintf(s->dirs[s->n], sizeof(s->dirs[0]), "%s", dir);
    snprintf(s->why[s->n], sizeof(s->why[0]), "%s", why);
    s->err[s->n++] = err;
}

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    unsigned char b;

    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    cr_assert_eq(pread(fd, &b, 1, off), 1);
    b ^= 0x01;
    cr_assert_eq(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

static void put_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

/*-- tests ------------------------------------------------------------------*/

Test(ckpt, four_ranks_write_commit_verify_and_read_back)
{
    dt_ckpt_manifest_t m;
    dt_emsg_t em = { "" };
    dt_st_reader_t *r;
    int64_t counter;
    float wgt[15];

    write_step(10, 4);
    cr_assert(!exists(P(".step-00000010.tmp")), "temp dir left after commit");
    for (int k = 0; k < 4; k++)
        cr_assert(exists(P("step-00000010/shard-%05d-of-00004.safetensors", k)));
    cr_assert_eq(dt_ckpt_verify(P("step-00000010"), &em), 0, "%s", em.s);

    cr_assert_eq(dt_ckpt_manifest_read(P("step-00000010"), &m, &em), 0, "%s", em.s);
    cr_assert_eq(m.step, 10);
    cr_assert_eq(m.ranks, 4);
    cr_assert_eq(m.data_cursor, 40960);
    cr_assert_eq(json_integer_value(json_object_get(m.model, "dim")), 64);
    cr_assert_str_eq(json_string_value(json_object_get(m.plan, "layout")), "zigzag");
    cr_assert_eq(json_integer_value(json_object_get(m.rng, "offset")), 70);
    cr_assert_str_eq(m.shards[3].file, "shard-00003-of-00004.safetensors");
    {
        char hex[65];
        struct stat st;
        cr_assert_eq(dt_sha256_file(P("step-00000010/%s", m.shards[2].file), hex, &em), 0);
        cr_assert_str_eq(hex, m.shards[2].sha256);
        cr_assert_eq(stat(P("step-00000010/%s", m.shards[2].file), &st), 0);
        cr_assert_eq((int64_t)st.st_size, m.shards[2].bytes);
    }
    dt_ckpt_manifest_close(&m);

    cr_assert_eq(dt_st_open(P("step-00000010/shard-00002-of-00004.safetensors"), &r, &em), 0, "%s",
                 em.s);
    cr_assert_eq(dt_st_read(r, "counter", &counter, sizeof(counter), &em), 0);
    cr_assert_eq(counter, 1002);
    cr_assert_eq(dt_st_read(r, "layers.0.wq", wgt, 4 * 3 * sizeof(float), &em), 0);
    cr_assert_eq(wgt[5], 10 + 1.0f + 5);
    dt_st_close(r);

    /* A committed step is never overwritten. */
    cr_assert_eq(dt_ckpt_begin(root, 10, &em), DT_EEXIST);
    cr_assert(strstr(em.s, "step 10 is already checkpointed") != NULL, "%s", em.s);
}

Test(ckpt, corrupt_byte_fails_verify_and_latest_falls_back)
{
    skips_t s = { 0 };
    dt_emsg_t em = { "" };
    char *dir;
    int64_t step = -1;
    struct stat st;

    write_step(10, 4);
    write_step(20, 4);
    /* One bit flipped in the middle of rank 2's data: the size is unchanged. */
    cr_assert_eq(stat(P("step-00000020/shard-00002-of-00004.safetensors"), &st), 0);
    flip_byte(P("step-00000020/shard-00002-of-00004.safetensors"), st.st_size - 5);

    cr_assert_eq(dt_ckpt_verify(P("step-00000020"), &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "shard shard-00002-of-00004.safetensors is corrupt: sha256") != NULL,
              "%s", em.s);
    cr_assert(strstr(em.s, "step-00000020") != NULL, "%s", em.s);

    cr_assert_eq(dt_ckpt_latest(root, 0, on_skip, &s, &dir, &step, &em), 0, "%s", em.s);
    cr_assert_not_null(dir);
    cr_assert_str_eq(dir, P("step-00000010"));
    cr_assert_eq(step, 10);
    cr_assert_eq(s.n, 1);
    cr_assert_str_eq(s.dirs[0], P("step-00000020"));
    cr_assert(strstr(s.why[0], "shard-00002-of-00004.safetensors is corrupt") != NULL, "%s",
              s.why[0]);
    free(dir);
}

Test(ckpt, leftover_temp_dir_is_skipped_and_replaced)
{
    dt_ckpt_shard_t rec;
    skips_t s = { 0 };
    dt_emsg_t em = { "" };
    char *dir;

    write_step(10, 4);
    /* A crash after two of four shards of step 20. */
    cr_assert_eq(dt_ckpt_begin(root, 20, &em), 0);
    write_rank(20, 0, 4, &rec);
    write_rank(20, 1, 4, &rec);
    cr_assert_eq(dt_ckpt_latest(root, 0, on_skip, &s, &dir, NULL, &em), 0);
    cr_assert_str_eq(dir, P("step-00000010"));
    cr_assert_eq(s.n, 1);
    cr_assert_str_eq(s.dirs[0], P(".step-00000020.tmp"));
    cr_assert(strstr(s.why[0], "partial checkpoint") != NULL, "%s", s.why[0]);
    free(dir);

    /* Commit of the partial step is refused and leaves it as it was. */
    cr_assert_eq(dt_ckpt_commit(root, 20, NULL, &em), DT_ENOENT);
    cr_assert(strstr(em.s, "manifest.json") != NULL, "%s", em.s);
    cr_assert(exists(P(".step-00000020.tmp/shard-00001-of-00004.safetensors")));
    cr_assert(!exists(P("step-00000020")));

    /* A new attempt at step 20 starts from an empty temp dir. */
    write_step(20, 2);
    cr_assert(!exists(P("step-00000020/shard-00001-of-00004.safetensors")));
    cr_assert_eq(dt_ckpt_verify(P("step-00000020"), &em), 0, "%s", em.s);
}

Test(ckpt, missing_shard_fails_verify_and_latest_falls_back)
{
    skips_t s = { 0 };
    dt_emsg_t em = { "" };
    char *dir;

    write_step(10, 4);
    write_step(20, 4);
    cr_assert_eq(unlink(P("step-00000020/shard-00003-of-00004.safetensors")), 0);
    cr_assert_eq(dt_ckpt_verify(P("step-00000020"), &em), DT_ENOENT);
    cr_assert(strstr(em.s, "shard shard-00003-of-00004.safetensors: No such file") != NULL, "%s",
              em.s);
    cr_assert_eq(dt_ckpt_latest(root, 0, on_skip, &s, &dir, NULL, &em), 0);
    cr_assert_str_eq(dir, P("step-00000010"));
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.err[0], DT_ENOENT);
    free(dir);
}

Test(ckpt, truncated_shard_fails_on_size)
{
    dt_emsg_t em = { "" };
    struct stat st;
    const char *sh = P("step-00000010/shard-00001-of-00004.safetensors");

    write_step(10, 4);
    cr_assert_eq(stat(sh, &st), 0);
    cr_assert_eq(truncate(sh, st.st_size - 1), 0);
    cr_assert_eq(dt_ckpt_verify(P("step-00000010"), &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "the manifest says") != NULL, "%s", em.s);
    cr_assert(strstr(em.s, "shard-00001-of-00004.safetensors is") != NULL, "%s", em.s);
}

Test(ckpt, bad_manifests_are_refused_with_reason)
{
    skips_t s = { 0 };
    dt_emsg_t em = { "" };
    dt_ckpt_manifest_t m;
    char *dir, *text;
    FILE *f;
    long n;

    write_step(10, 2);
    write_step(20, 2);
    write_step(30, 2);
    write_step(40, 2);
    put_file(P("step-00000040/manifest.json"), "{\"format\": \"dt-checkpoint\", ");
    cr_assert_eq(dt_ckpt_manifest_read(P("step-00000040"), &m, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "manifest.json: not valid JSON") != NULL, "%s", em.s);

    /* A future version, and a shard path that escapes the directory. */
    f = fopen(P("step-00000030/manifest.json"), "r");
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    text = calloc(1, (size_t)n + 1);
    cr_assert_eq(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    {
        char *v = strstr(text, "\"version\": 1");
        cr_assert_not_null(v);
        v[strlen("\"version\": ")] = '2';
        put_file(P("step-00000030/manifest.json"), text);
        v[strlen("\"version\": ")] = '1';
        v = strstr(text, "\"shard-00001-of-00002.safetensors\"");
        cr_assert_not_null(v);
        memcpy(v + 1, "../../", 6);
        put_file(P("step-00000020/manifest.json"), text);
    }
    free(text);
    cr_assert_eq(dt_ckpt_verify(P("step-00000030"), &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "checkpoint format version 2 is not supported") != NULL, "%s", em.s);
    cr_assert_eq(dt_ckpt_verify(P("step-00000020"), &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "shards[1]: 'file' is not \"shard-00001-of-00002.safetensors\"") != NULL,
              "%s", em.s);

    cr_assert_eq(dt_ckpt_latest(root, 0, on_skip, &s, &dir, NULL, &em), 0);
    cr_assert_str_eq(dir, P("step-00000010"));
    cr_assert_eq(s.n, 3);
    cr_assert(strstr(s.why[0], "not valid JSON") != NULL, "%s", s.why[0]);
    cr_assert(strstr(s.why[1], "version 2") != NULL, "%s", s.why[1]);
    cr_assert(strstr(s.why[2], "'file'") != NULL, "%s", s.why[2]);
    free(dir);

    /* A manifest copied into the wrong step directory. */
    rename(P("step-00000010"), P("step-00000011"));
    cr_assert_eq(dt_ckpt_verify(P("step-00000011"), &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "manifest says step 10") != NULL, "%s", em.s);
}

Test(ckpt, manifest_records_are_checked_before_writing)
{
    dt_ckpt_shard_t recs[2];
    dt_ckpt_manifest_t m = { 0 };
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_ckpt_begin(root, 5, &em), 0);
    write_rank(5, 0, 2, &recs[0]);
    write_rank(5, 1, 2, &recs[1]);
    m.step = 5;
    m.ranks = 2;
    m.model = json_object();
    m.shards = recs;
    recs[1].bytes += 1;
    cr_assert_eq(dt_ckpt_write_manifest(root, &m, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "shard shard-00001-of-00002.safetensors is") != NULL, "%s", em.s);
    recs[1].bytes -= 1;
    recs[1].rank = 0;
    cr_assert_eq(dt_ckpt_write_manifest(root, &m, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "shard record 1 is not rank 1's") != NULL, "%s", em.s);
    recs[1].rank = 1;
    cr_assert(!exists(P(".step-00000005.tmp/manifest.json")));
    cr_assert_eq(dt_ckpt_write_manifest(root, &m, &em), 0, "%s", em.s);
    json_decref(m.model);
    cr_assert_eq(dt_ckpt_commit(root, 5, NULL, &em), 0, "%s", em.s);
    cr_assert_eq(dt_ckpt_verify(P("step-00000005"), &em), 0, "%s", em.s);
}

Test(ckpt, committed_marker_hook)
{
    skips_t s = { 0 };
    dt_emsg_t em = { "" };
    char *dir;
    char hex[65], line[80] = "";
    FILE *f;

    write_step(10, 2);
    write_step(20, 2);
    cr_assert(!dt_ckpt_is_committed(P("step-00000010")));
    cr_assert_eq(dt_ckpt_mark_committed(P("step-00000010"), &em), 0, "%s", em.s);
    cr_assert(dt_ckpt_is_committed(P("step-00000010")));
    cr_assert_eq(dt_sha256_file(P("step-00000010/manifest.json"), hex, &em), 0);
    f = fopen(P("step-00000010/COMMITTED"), "r");
    cr_assert_not_null(fgets(line, sizeof(line), f));
    fclose(f);
    cr_assert_eq(strncmp(line, hex, 64), 0);

    cr_assert_eq(dt_ckpt_latest(root, DT_CKPT_REQUIRE_COMMITTED, on_skip, &s, &dir, NULL, &em), 0);
    cr_assert_str_eq(dir, P("step-00000010"));
    cr_assert_eq(s.n, 1);
    cr_assert(strstr(s.why[0], "no COMMITTED marker") != NULL, "%s", s.why[0]);
    free(dir);
    cr_assert_eq(dt_ckpt_latest(root, 0, NULL, NULL, &dir, NULL, &em), 0);
    cr_assert_str_eq(dir, P("step-00000020"));
    free(dir);
}

/* Under external commits, a step an earlier generation left: committed is
 * kept (and not written again), uncommitted is moved out of step-* and
 * removed, none is none; another step is untouched. */
Test(ckpt, supersede_keeps_committed_and_removes_uncommitted)
{
    dt_emsg_t em = { "" }, warn = { "" };
    DIR *d;
    struct dirent *e;
    int left = 0;

    write_step(10, 2);
    write_step(20, 2);
    cr_assert_eq(dt_ckpt_mark_committed(P("step-00000010"), &em), 0, "%s", em.s);
    cr_assert_eq(dt_ckpt_supersede(root, 30, &warn, &em), DT_CKPT_NONE, "%s", em.s);
    cr_assert_eq(dt_ckpt_supersede(root, 10, &warn, &em), DT_CKPT_KEEP, "%s", em.s);
    cr_assert(exists(P("step-00000010/COMMITTED")), "a committed step stays");
    cr_assert_eq(dt_ckpt_supersede(root, 20, &warn, &em), DT_CKPT_REDONE, "%s", em.s);
    cr_assert_str_empty(warn.s, "%s", warn.s);
    cr_assert(!exists(P("step-00000020")), "the uncommitted step is gone");
    cr_assert_not_null(d = opendir(root));
    while ((e = readdir(d)) != NULL)
        left += strstr(e->d_name, "superseded") != NULL;
    closedir(d);
    cr_assert_eq(left, 0, "the renamed directory was removed");
    cr_assert(exists(P("step-00000010/manifest.json")));
}

Test(ckpt, latest_without_checkpoints)
{
    dt_emsg_t em = { "" };
    char *dir = (char *)1;

    cr_assert_eq(dt_ckpt_latest(root, 0, NULL, NULL, &dir, NULL, &em), 0);
    cr_assert_null(dir);
    cr_assert_eq(mkdir(root, 0777), 0);
    put_file(P("step-1"), "not canonical: ignored");
    cr_assert_eq(dt_ckpt_latest(root, 0, NULL, NULL, &dir, NULL, &em), 0);
    cr_assert_null(dir);
    put_file(P("../plain"), "");
    cr_assert_eq(dt_ckpt_latest(P("../plain"), 0, NULL, NULL, &dir, NULL, &em), DT_EIO);
    cr_assert(strstr(em.s, "cannot list") != NULL, "%s", em.s);
}

Test(ckpt, prune_keeps_the_newest_n)
{
    dt_ckpt_shard_t rec;
    dt_emsg_t em = { "" };

    for (int s = 1; s <= 5; s++)
        write_step(s, 2);
    /* A stale temp dir older than what is kept, and one in flight. */
    cr_assert_eq(dt_ckpt_begin(root, 2, &em), DT_EEXIST);
    cr_assert_eq(mkdir(P(".step-00000000.tmp"), 0777), 0);
    cr_assert_eq(dt_ckpt_begin(root, 9, &em), 0);
    write_rank(9, 0, 2, &rec);

    cr_assert_eq(dt_ckpt_prune(root, 0, &em), DT_EINVAL);
    cr_assert_eq(dt_ckpt_prune(root, 2, &em), 4, "%s", em.s);
    for (int s = 1; s <= 3; s++)
        cr_assert(!exists(P("step-%08d", s)), "step %d not pruned", s);
    cr_assert(exists(P("step-00000004")));
    cr_assert(exists(P("step-00000005")));
    cr_assert(!exists(P(".step-00000000.tmp")));
    cr_assert(exists(P(".step-00000009.tmp/shard-00000-of-00002.safetensors")));
    cr_assert_eq(dt_ckpt_verify(P("step-00000004"), &em), 0, "%s", em.s);

    /* A broken newest step does not count towards the kept ones. */
    cr_assert_eq(unlink(P("step-00000005/shard-00001-of-00002.safetensors")), 0);
    cr_assert_eq(dt_ckpt_prune(root, 1, &em), 0, "%s", em.s);
    cr_assert(exists(P("step-00000004")));
    cr_assert(exists(P("step-00000005")));
    /* Once a newer good step exists, everything older goes, broken or not. */
    write_step(6, 2);
    cr_assert_eq(dt_ckpt_prune(root, 1, &em), 2, "%s", em.s);
    cr_assert(!exists(P("step-00000004")));
    cr_assert(!exists(P("step-00000005")));
    cr_assert(exists(P("step-00000006")));
    cr_assert(exists(P(".step-00000009.tmp")), "a step in flight is never pruned");
}

/*-- hardening: modes, links, self-consistent but broken shards ---------------*/

static mode_t mode_of(const char *path)
{
    struct stat st;

    cr_assert_eq(lstat(path, &st), 0, "%s: %s", path, strerror(errno));
    return st.st_mode & 07777;
}

/* A checkpoint holds a model's weights: with umask 0 still, the root this
 * creates and the step directory are 0700, shards, manifest and marker
 * 0600. */
Test(ckpt, files_and_directories_are_private)
{
    dt_emsg_t em = { "" };
    mode_t old = umask(0);

    write_step(10, 2);
    cr_assert_eq(dt_ckpt_mark_committed(P("step-00000010"), &em), 0, "%s", em.s);
    umask(old);
    cr_assert_eq(mode_of(root), 0700, "root %o", (unsigned)mode_of(root));
    cr_assert_eq(mode_of(P("step-00000010")), 0700, "%o", (unsigned)mode_of(P("step-00000010")));
    cr_assert_eq(mode_of(P("step-00000010/manifest.json")), 0600);
    cr_assert_eq(mode_of(P("step-00000010/shard-00001-of-00002.safetensors")), 0600);
    cr_assert_eq(mode_of(P("step-00000010/COMMITTED")), 0600);
}

static void put_victim(const char *path)
{
    put_file(path, "precious\n");
}

static void assert_victim(const char *path)
{
    char line[32] = "";
    FILE *f = fopen(path, "r");

    cr_assert_not_null(f);
    cr_assert_not_null(fgets(line, sizeof(line), f));
    fclose(f);
    cr_assert_str_eq(line, "precious\n", "%s was written through a link", path);
}

/* The commit marker may be written by a process running as someone else
 * than the directory's owner: links planted at COMMITTED, at its temp name
 * or in place of the directory itself are never written through, and a
 * link is not a marker. */
Test(ckpt, mark_committed_does_not_follow_planted_links)
{
    char tmpname[256];
    dt_emsg_t em = { "" };

    write_step(10, 2);
    put_victim(P("../victim1"));
    put_victim(P("../victim2"));
    cr_assert_eq(symlink(P("../victim1"), P("step-00000010/COMMITTED")), 0);
    cr_assert(!dt_ckpt_is_committed(P("step-00000010")), "a link is not a marker");
    snprintf(tmpname, sizeof(tmpname), "%s/.COMMITTED.tmp.%ld", P("step-00000010"),
             (long)getpid());
    cr_assert_eq(symlink(P("../victim2"), tmpname), 0);
    cr_assert_eq(dt_ckpt_mark_committed(P("step-00000010"), &em), 0, "%s", em.s);
    assert_victim(P("../victim1"));
    assert_victim(P("../victim2"));
    cr_assert(dt_ckpt_is_committed(P("step-00000010")));
    cr_assert_eq(mode_of(P("step-00000010/COMMITTED")) & 0077, 0);

    /* the step directory itself a link to somewhere else: refused */
    cr_assert_eq(mkdir(P("../elsewhere"), 0700), 0);
    cr_assert_eq(symlink(P("../elsewhere"), P("step-00000020")), 0);
    cr_assert_eq(dt_ckpt_mark_committed(P("step-00000020"), &em) < 0, 1);
    cr_assert(!exists(P("../elsewhere/COMMITTED")), "marker written through a linked directory");
    /* a manifest that is a link (to a file of someone else's) is not hashed */
    write_step(30, 1);
    cr_assert_eq(rename(P("step-00000030/manifest.json"), P("../m.json")), 0);
    cr_assert_eq(symlink(P("../m.json"), P("step-00000030/manifest.json")), 0);
    cr_assert_lt(dt_ckpt_mark_committed(P("step-00000030"), &em), 0);
    cr_assert(strstr(em.s, "symbolic link"), "%s", em.s);
    cr_assert(!exists(P("step-00000030/COMMITTED")));
}

/* Readers do not follow links either: a shard or manifest that is a link
 * fails verification, and resume passes over that step. */
Test(ckpt, verify_refuses_linked_shards_and_manifests)
{
    skips_t s = { 0 };
    dt_emsg_t em = { "" };
    dt_ckpt_manifest_t m;
    char *dir = NULL;

    write_step(10, 1);
    write_step(20, 1);
    cr_assert_eq(rename(P("step-00000020/shard-00000-of-00001.safetensors"), P("../s")), 0);
    cr_assert_eq(symlink(P("../s"), P("step-00000020/shard-00000-of-00001.safetensors")), 0);
    cr_assert_lt(dt_ckpt_verify(P("step-00000020"), &em), 0);
    cr_assert(strstr(em.s, "not a regular file (a symbolic link)"), "%s", em.s);
    write_step(30, 1);
    cr_assert_eq(rename(P("step-00000030/manifest.json"), P("../m")), 0);
    cr_assert_eq(symlink(P("../m"), P("step-00000030/manifest.json")), 0);
    cr_assert_eq(dt_ckpt_manifest_read(P("step-00000030"), &m, &em), DT_EFORMAT, "%s", em.s);
    cr_assert(strstr(em.s, "symbolic link"), "%s", em.s);
    cr_assert_eq(dt_ckpt_latest(root, 0, on_skip, &s, &dir, NULL, &em), 0);
    cr_assert_str_eq(dir, P("step-00000010"));
    cr_assert_eq(s.n, 2);
    free(dir);
}

/* Rewrite DIR's manifest so that shard `rank` has its current size and
 * hash: the manifest agrees with a shard that is broken. */
static void reseal(const char *dir, int rank)
{
    char *mpath = dt_xasprintf("%s/manifest.json", dir), *spath, hex[65];
    json_t *doc = json_load_file(mpath, 0, NULL), *sh;
    dt_emsg_t em = { "" };
    struct stat st;

    cr_assert_not_null(doc);
    sh = json_array_get(json_object_get(doc, "shards"), (size_t)rank);
    spath = dt_xasprintf("%s/%s", dir, json_string_value(json_object_get(sh, "file")));
    cr_assert_eq(stat(spath, &st), 0);
    cr_assert_eq(dt_sha256_file(spath, hex, &em), 0, "%s", em.s);
    json_object_set_new(sh, "bytes", json_integer(st.st_size));
    json_object_set_new(sh, "sha256", json_string(hex));
    cr_assert_eq(json_dump_file(doc, mpath, JSON_INDENT(2)), 0);
    json_decref(doc);
    free(spath);
    free(mpath);
}

/* A shard cut short whose manifest was resealed to match (size and hash
 * agree) is still not a checkpoint: verification opens its safetensors
 * header, and resume falls back to the step before. */
Test(ckpt, truncated_shard_with_a_matching_manifest_fails_verify)
{
    skips_t s = { 0 };
    dt_emsg_t em = { "" };
    char *dir = NULL;

    write_step(10, 2);
    write_step(20, 2);
    cr_assert_eq(truncate(P("step-00000020/shard-00001-of-00002.safetensors"), 100), 0);
    reseal(P("step-00000020"), 1);
    cr_assert_eq(dt_ckpt_verify(P("step-00000020"), &em), DT_EFORMAT, "%s", em.s);
    cr_assert(strstr(em.s, "shard shard-00001-of-00002.safetensors is not a valid safetensors "
                           "file"), "%s", em.s);
    cr_assert_eq(dt_ckpt_latest(root, 0, on_skip, &s, &dir, NULL, &em), 0);
    cr_assert_str_eq(dir, P("step-00000010"));
    cr_assert_eq(s.n, 1);
    cr_assert(strstr(s.why[0], "not a valid safetensors file"), "%s", s.why[0]);
    free(dir);
}

/*-- training checkpoints (dt-train-1): every offset checked -----------------*/

/* One shard of a dt-train-1 checkpoint: `len` values starting at value
 * base, with the metadata given as text (NULL: left out). */
typedef struct {
    const char *offset, *nparams;
    int64_t len;
    dt_dtype_t dtype; /* of "params" */
    int ndim;               /* of "params": 1, or 2 as (len, 1) */
    int64_t mlen;           /* of "adam_m": len when 0 */
} tshard_t;

static void write_train(int64_t step, int ranks, const tshard_t *sh)
{
    dt_ckpt_shard_t recs[8];
    dt_ckpt_manifest_t m = { 0 };
    dt_emsg_t em = { "" };
    float buf[4096];

    cr_assert_leq(ranks, 8);
    for (int i = 0; i < 4096; i++)
        buf[i] = (float)i;
    cr_assert_eq(dt_ckpt_begin(root, step, &em), 0, "%s", em.s);
    for (int r = 0; r < ranks; r++) {
        dt_st_writer_t *w = dt_st_writer_new();
        int64_t shape[2] = { sh[r].len, 1 }, mshape[1] = { sh[r].mlen ? sh[r].mlen : sh[r].len };
        cr_assert_eq(dt_st_writer_add(w, "params", sh[r].dtype, sh[r].ndim ? sh[r].ndim : 1,
                                      shape, buf, &em), 0, "%s", em.s);
        cr_assert_eq(dt_st_writer_add(w, "adam_m", DT_F32, 1, mshape, buf, &em), 0);
        cr_assert_eq(dt_st_writer_add(w, "adam_v", DT_F32, 1, shape, buf, &em), 0);
        cr_assert_eq(dt_st_writer_meta(w, "format", "dt-train-1", &em), 0);
        if (sh[r].offset)
            cr_assert_eq(dt_st_writer_meta(w, "offset", sh[r].offset, &em), 0);
        if (sh[r].nparams)
            cr_assert_eq(dt_st_writer_meta(w, "nparams", sh[r].nparams, &em), 0);
        cr_assert_eq(dt_ckpt_write_shard(root, step, r, ranks, w, &recs[r], &em), 0, "%s", em.s);
        dt_st_writer_free(w);
    }
    m.step = step;
    m.ranks = ranks;
    m.model = json_pack("{s:i}", "dim", 8);
    m.shards = recs;
    cr_assert_eq(dt_ckpt_write_manifest(root, &m, &em), 0, "%s", em.s);
    json_decref(m.model);
    cr_assert_eq(dt_ckpt_commit(root, step, NULL, &em), 0, "%s", em.s);
}

/* Read checkpoint `step` as n parameters; rc, message in em. Guard values
 * around P catch a write outside it. */
static int read_train(int64_t step, int64_t n, float *Pout, dt_emsg_t *em)
{
    dt_ckpt_manifest_t m;
    float *M = calloc((size_t)n, sizeof(float)), *V = calloc((size_t)n, sizeof(float));
    int rc;

    cr_assert_eq(dt_ckpt_manifest_read(P("step-%08lld", (long long)step), &m, em), 0, "%s",
                 em->s);
    rc = dt_ckpt_read_train(P("step-%08lld", (long long)step), &m, n, Pout, M, V, NULL, NULL, em);
    dt_ckpt_manifest_close(&m);
    free(M);
    free(V);
    return rc;
}

Test(ckpt, train_shards_read_back_in_slices)
{
    tshard_t sh[3] = { { "0", "10", 3, DT_F32, 1, 0 },
                       { "3", "10", 3, DT_F32, 1, 0 },
                       { "6", "10", 4, DT_F32, 1, 0 } };
    float out[10];
    dt_emsg_t em = { "" };

    write_train(1, 3, sh);
    cr_assert_eq(read_train(1, 10, out, &em), 0, "%s", em.s);
    cr_assert(out[0] == 0 && out[2] == 2 && out[3] == 0 && out[6] == 0 && out[9] == 3);
}

/* A self-consistent checkpoint (manifest and hashes agree) whose shard
 * says "offset" = INT64_MAX - 5: offset + length wrapped negative and
 * passed the bounds check, and the slice was written 24 bytes before the
 * parameters (heap corruption: "corrupted size vs. prev_size", SIGABRT). */
Test(ckpt, train_offset_near_int64_max_is_refused)
{
    tshard_t sh[1] = { { "9223372036854775802", "1000", 1000, DT_F32, 1, 0 } };
    int64_t n = 1000;
    float *buf = calloc((size_t)n + 64, sizeof(float)), *out = buf + 32;
    dt_emsg_t em = { "" };

    for (int i = 0; i < 32; i++)
        buf[i] = buf[32 + n + i] = -7.0f;
    write_train(1, 1, sh);
    cr_assert_eq(read_train(1, n, out, &em), DT_EFORMAT, "%s", em.s);
    cr_assert(strstr(em.s, "shard-00000-of-00001.safetensors"), "%s", em.s);
    cr_assert(strstr(em.s, "offset 9223372036854775802"), "%s", em.s);
    for (int i = 0; i < 32; i++)
        cr_assert(buf[i] == -7.0f && buf[32 + n + i] == -7.0f, "written outside the parameters at %d", i);
    free(buf);
}

/* Every other way a shard may not be a slice of n parameters. */
Test(ckpt, train_shards_that_are_not_slices_are_refused)
{
    static const struct {
        tshard_t sh[2];
        int ranks;
        const char *words;
    } cases[] = {
        { { { "abc", "8", 8, DT_F32, 1, 0 } }, 1, "'offset' is 'abc', not a decimal integer" },
        { { { "0x0", "8", 8, DT_F32, 1, 0 } }, 1, "'offset' is '0x0'" },
        { { { " 0", "8", 8, DT_F32, 1, 0 } }, 1, "'offset' is ' 0'" },
        { { { "-1", "8", 8, DT_F32, 1, 0 } }, 1, "'offset' is '-1'" },
        { { { "99999999999999999999", "8", 8, DT_F32, 1, 0 } }, 1, "'offset' is '9999" },
        { { { NULL, "8", 8, DT_F32, 1, 0 } }, 1, "no 'offset'" },
        { { { "0", "8x", 8, DT_F32, 1, 0 } }, 1, "'nparams' is '8x'" },
        { { { "0", "9", 8, DT_F32, 1, 0 } }, 1, "nparams 9, this model has 8" },
        { { { "0", NULL, 8, DT_F32, 1, 0 } }, 1, "no 'nparams'" },
        { { { "1", "8", 8, DT_F32, 1, 0 } }, 1, "[1, 9) is outside [0, 8)" },
        { { { "0", "8", 8, DT_U8, 1, 0 } }, 1, "'params' is U8 [8], not a 1-D F32 tensor" },
        { { { "0", "8", 8, DT_F32, 2, 0 } }, 1, "'params' is F32 [8, 1]" },
        { { { "0", "8", 8, DT_F32, 1, 7 } }, 1, "'adam_m'" },
        { { { "0", "8", 4, DT_F32, 1, 0 }, { "5", "8", 3, DT_F32, 1, 0 } },
          2, "starts at 5, the shard before it ends at 4" },
        { { { "0", "8", 4, DT_F32, 1, 0 }, { "3", "8", 5, DT_F32, 1, 0 } },
          2, "starts at 3, the shard before it ends at 4" },
        { { { "0", "8", 4, DT_F32, 1, 0 }, { "4", "8", 3, DT_F32, 1, 0 } },
          2, "the shards end at 7, this model has 8 parameters" },
    };
    dt_emsg_t em = { "" };
    float out[8];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_train((int64_t)i + 1, cases[i].ranks, cases[i].sh);
        int rc = read_train((int64_t)i + 1, 8, out, &em);
        cr_assert_eq(rc, DT_EFORMAT, "case %zu: rc %d: %s", i, rc, em.s);
        cr_assert(strstr(em.s, "shard-0000"), "case %zu: no shard named: %s", i, em.s);
        cr_assert(strstr(em.s, cases[i].words), "case %zu: '%s' not in: %s", i, cases[i].words,
                  em.s);
    }
}

/* dt_ckpt_train_writer_new's shards, one slice per rank as dtengine train
 * writes them, read back whole by the reader, metadata and all. */
Test(ckpt, train_writer_shards_read_back)
{
    enum { N = 10, RANKS = 3 };
    float p[N], m[N], v[N], P2[N], M2[N], V2[N];
    dt_ckpt_shard_t recs[RANKS];
    dt_ckpt_manifest_t man = { 0 }, back;
    dt_emsg_t em = { "" };

    for (int i = 0; i < N; i++) {
        p[i] = (float)i;
        m[i] = 100.0f + (float)i;
        v[i] = 200.0f + (float)i;
    }
    cr_assert_eq(dt_ckpt_begin(root, 1, &em), 0, "%s", em.s);
    for (int r = 0; r < RANKS; r++) {
        int64_t off = N * r / RANKS, len = N * (r + 1) / RANKS - off;
        dt_st_writer_t *w = dt_ckpt_train_writer_new(N, off, len, p + off, m + off, v + off);
        cr_assert_eq(dt_ckpt_write_shard(root, 1, r, RANKS, w, &recs[r], &em), 0, "%s", em.s);
        dt_st_writer_free(w);
    }
    man.step = 1;
    man.ranks = RANKS;
    man.model = json_pack("{s:i}", "dim", 8);
    man.shards = recs;
    cr_assert_eq(dt_ckpt_write_manifest(root, &man, &em), 0, "%s", em.s);
    json_decref(man.model);
    cr_assert_eq(dt_ckpt_commit(root, 1, NULL, &em), 0, "%s", em.s);

    const char *dir = P("step-%08d", 1);
    cr_assert_eq(dt_ckpt_verify(dir, &em), 0, "%s", em.s);
    cr_assert_eq(dt_ckpt_manifest_read(dir, &back, &em), 0, "%s", em.s);
    cr_assert_eq(dt_ckpt_read_train(dir, &back, N, P2, M2, V2, NULL, NULL, &em), 0, "%s", em.s);
    for (int i = 0; i < N; i++)
        cr_assert(P2[i] == p[i] && M2[i] == m[i] && V2[i] == v[i], "value %d differs", i);
    dt_st_reader_t *r = NULL;
    int64_t off, len;
    cr_assert_eq(dt_st_open(P("step-%08d/%s", 1, recs[1].file), &r, &em), 0, "%s", em.s);
    cr_assert_str_eq(dt_st_meta(r, "format"), DT_CKPT_TRAIN_FORMAT);
    cr_assert_eq(dt_ckpt_train_slice("shard 1", r, N, &off, &len, &em), 0, "%s", em.s);
    cr_assert(off == 3 && len == 3, "slice [%lld, +%lld)", (long long)off, (long long)len);
    dt_st_close(r);
    dt_ckpt_manifest_close(&back);
}

/* The parameters alone (an export): M and V NULL, the moments unread. */
Test(ckpt, train_params_read_without_the_moments)
{
    tshard_t sh[2] = { { "0", "7", 3, DT_F32, 1, 0 }, { "3", "7", 4, DT_F32, 1, 0 } };
    dt_ckpt_manifest_t m;
    dt_emsg_t em = { "" };
    float out[7];
    const char *dir = P("step-%08d", 1);

    write_train(1, 2, sh);
    cr_assert_eq(dt_ckpt_manifest_read(dir, &m, &em), 0, "%s", em.s);
    cr_assert_eq(dt_ckpt_read_train(dir, &m, 7, out, NULL, NULL, NULL, NULL, &em), 0, "%s", em.s);
    cr_assert(out[0] == 0 && out[2] == 2 && out[3] == 0 && out[6] == 3);
    cr_assert_eq(dt_ckpt_read_train(dir, &m, 7, out, out, NULL, NULL, NULL, &em), DT_EINVAL);
    dt_ckpt_manifest_close(&m);
}

/*-- the manifest's model object ------------------------------------------*/

static dt_model_cfg_t scaled_model(void)
{
    dt_model_cfg_t c = { .name = "custom", .dim = 48, .layers = 3, .heads = 4, .kv_heads = 2,
                         .ffn = 96, .vocab = 100, .head_dim = 16, .norm_eps = 1e-6f,
                         .tied = false,
                         .rope = { .theta = 500000, .factor = 8, .low_freq_factor = 1,
                                   .high_freq_factor = 4, .original_max_pos = 8192 } };
    return c;
}

/* What manifests have always held, byte for byte: a resume compares the
 * object with json_equal, so a checkpoint written before the move to
 * io/ckpt must still match. */
Test(ckpt, model_json_is_what_manifests_hold)
{
    dt_model_cfg_t c;
    dt_emsg_t em = { "" };
    char *text;
    json_t *j;

    cr_assert_eq(dt_model_preset("tiny", &c, &em), 0, "%s", em.s);
    j = dt_ckpt_model_json(&c);
    text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    cr_assert_str_eq(text, "{\"dim\":256,\"layers\":4,\"heads\":8,\"kv_heads\":2,\"ffn\":768,"
                           "\"vocab\":512,\"rope_theta\":10000.0,"
                           "\"norm_eps\":9.9999997473787516e-6,\"tied\":true}");
    free(text);
    json_decref(j);
    c = scaled_model();
    j = dt_ckpt_model_json(&c);
    text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    cr_assert(strstr(text, ",\"tied\":false,\"head_dim\":16,\"rope_scaling\":{\"rope_type\":"
                           "\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                           "\"high_freq_factor\":4.0,\"original_max_pos\":8192.0}}"),
              "%s", text);
    free(text);
    json_decref(j);
}

/* parse(json(cfg)) is cfg, and its JSON the same object again. */
Test(ckpt, model_parse_inverts_model_json)
{
    const char *presets[] = { "tiny", "llama3-8b", "llama3-70b" };
    dt_model_cfg_t cfgs[4], back;
    dt_emsg_t em = { "" };

    for (int i = 0; i < 3; i++)
        cr_assert_eq(dt_model_preset(presets[i], &cfgs[i], &em), 0, "%s", em.s);
    cfgs[3] = scaled_model();
    for (int i = 0; i < 4; i++) {
        const dt_model_cfg_t *c = &cfgs[i];
        json_t *j = dt_ckpt_model_json(c), *j2;
        char *text = json_dumps(j, JSON_COMPACT);
        json_t *reread = json_loads(text, 0, NULL); /* as a manifest is read */

        cr_assert_eq(dt_ckpt_model_parse(reread, &back, &em), 0, "%d: %s", i, em.s);
        cr_assert(back.dim == c->dim && back.layers == c->layers && back.heads == c->heads &&
                      back.kv_heads == c->kv_heads && back.ffn == c->ffn &&
                      back.vocab == c->vocab && back.tied == c->tied,
                  "%d: shape", i);
        cr_assert_eq(dt_model_head_dim(&back), dt_model_head_dim(c), "%d", i);
        cr_assert(back.norm_eps == c->norm_eps, "%d: norm_eps %.9g, want %.9g", i,
                  (double)back.norm_eps, (double)c->norm_eps);
        cr_assert(back.rope.theta == c->rope.theta && back.rope.factor == c->rope.factor &&
                      back.rope.low_freq_factor == c->rope.low_freq_factor &&
                      back.rope.high_freq_factor == c->rope.high_freq_factor &&
                      back.rope.original_max_pos == c->rope.original_max_pos,
                  "%d: rope", i);
        j2 = dt_ckpt_model_json(&back);
        cr_assert(json_equal(j, j2), "%d: %s", i, text);
        json_decref(j2);
        json_decref(reread);
        json_decref(j);
        free(text);
    }
}

/* Strict: each bad object refused with DT_EFORMAT naming the key. */
Test(ckpt, model_parse_refuses_bad_objects_naming_the_key)
{
#define BASE "\"dim\":32,\"layers\":2,\"heads\":4,\"kv_heads\":2,\"ffn\":64,\"vocab\":128,"
#define TAIL "\"rope_theta\":500000.0,\"norm_eps\":1e-5,\"tied\":false"
#define RS(x) "{" BASE TAIL ",\"rope_scaling\":" x "}"
    static const struct {
        const char *json, *words;
        int rc;
    } cases[] = {
        { "[1, 2]", "model: not a JSON object", DT_EFORMAT },
        { "{\"layers\":2,\"heads\":4,\"kv_heads\":2,\"ffn\":64,\"vocab\":128," TAIL "}",
          "'dim' is missing", DT_EFORMAT },
        { "{\"dim\":\"32\",\"layers\":2,\"heads\":4,\"kv_heads\":2,\"ffn\":64,\"vocab\":128," TAIL
          "}", "'dim' is not an integer", DT_EFORMAT },
        { "{\"dim\":32.0,\"layers\":2,\"heads\":4,\"kv_heads\":2,\"ffn\":64,\"vocab\":128," TAIL
          "}", "'dim' is not an integer", DT_EFORMAT },
        { "{\"dim\":32,\"layers\":2,\"heads\":4,\"kv_heads\":2,\"ffn\":64,\"vocab\":4294967296,"
          TAIL "}", "'vocab' is not an integer", DT_EFORMAT },
        { "{" BASE "\"norm_eps\":1e-5,\"tied\":false}", "'rope_theta' is missing", DT_EFORMAT },
        { "{" BASE "\"rope_theta\":\"big\",\"norm_eps\":1e-5,\"tied\":false}",
          "'rope_theta' is not a number", DT_EFORMAT },
        { "{" BASE "\"rope_theta\":500000.0,\"norm_eps\":1e300,\"tied\":false}",
          "'norm_eps' 1e+300 is out of a float's range", DT_EFORMAT },
        { "{" BASE "\"rope_theta\":500000.0,\"norm_eps\":1e-5,\"tied\":0}",
          "'tied' is not a boolean", DT_EFORMAT },
        { "{" BASE "\"rope_theta\":500000.0,\"norm_eps\":1e-5}", "'tied' is missing",
          DT_EFORMAT },
        { "{" BASE TAIL ",\"head_dim\":8.5}", "'head_dim' is not an integer", DT_EFORMAT },
        { "{" BASE TAIL ",\"dropout\":0.1}", "unknown key 'dropout'", DT_EFORMAT },
        { RS("\"llama3\""), "model.rope_scaling: not a JSON object", DT_EFORMAT },
        { RS("{\"rope_type\":\"yarn\",\"factor\":8.0,\"low_freq_factor\":1.0,"
             "\"high_freq_factor\":4.0,\"original_max_pos\":8192.0}"),
          "'rope_type' is not \"llama3\"", DT_EFORMAT },
        { RS("{\"rope_type\":\"llama3\",\"low_freq_factor\":1.0,"
             "\"high_freq_factor\":4.0,\"original_max_pos\":8192.0}"),
          "model.rope_scaling: 'factor' is missing", DT_EFORMAT },
        { RS("{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
             "\"high_freq_factor\":4.0,\"original_max_pos\":8192.0,\"beta\":1}"),
          "model.rope_scaling: unknown key 'beta'", DT_EFORMAT },
        { RS("{\"rope_type\":\"llama3\",\"factor\":0.0,\"low_freq_factor\":1.0,"
             "\"high_freq_factor\":4.0,\"original_max_pos\":8192.0}"),
          "'factor' 0 is not positive", DT_EFORMAT },
        /* well-formed, but not a model: dt_model_cfg_check's words */
        { "{\"dim\":32,\"layers\":2,\"heads\":3,\"kv_heads\":1,\"ffn\":64,\"vocab\":128," TAIL
          "}", "heads 3 do not divide dim 32", DT_EINVAL },
        { "{\"dim\":32,\"layers\":0,\"heads\":4,\"kv_heads\":2,\"ffn\":64,\"vocab\":128," TAIL
          "}", "must all be positive", DT_EINVAL },
    };
#undef RS
#undef TAIL
#undef BASE
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_error_t jerr;
        json_t *j = json_loads(cases[i].json, JSON_DECODE_ANY, &jerr);
        dt_model_cfg_t c;
        dt_emsg_t em = { "" };

        cr_assert_not_null(j, "case %zu: %s", i, jerr.text);
        int rc = dt_ckpt_model_parse(j, &c, &em);
        cr_assert_eq(rc, cases[i].rc, "case %zu: rc %d: %s", i, rc, em.s);
        cr_assert(strstr(em.s, cases[i].words), "case %zu: '%s' not in: %s", i, cases[i].words,
                  em.s);
        json_decref(j);
    }
}
