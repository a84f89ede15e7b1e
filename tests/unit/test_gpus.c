/* SPDX-License-Identifier: MIT
 *
 * The agent's view of its node's GPUs (agent/gpus.c): `dtengine devices
 * --json` parsed, what is refused in it, and the probe's bounds (an engine
 * that hangs, fails or is missing leaves the node with no GPU and says
 * why). Engines here are small shell scripts standing in for dtengine.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "agent/gpus.h"
#include "common/clock.h"
#include "common/fileio.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/test_gpus.XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    dt_emsg_t em = { "" };
    (void)dt_rmtree(dir, &em);
}

TestSuite(gpus, .init = setup, .fini = teardown);

static const char TWO[] =
    "{\"cuda\": true, \"driver\": 12040, \"devices\": ["
    "{\"index\": 0, \"name\": \"H100\", \"uuid\": \"GPU-0a1b2c3d-0000-1111-2222-333344445555\", "
    "\"memory_bytes\": 85899345920, \"pci_bus_id\": \"0000:1b:00.0\", \"cpus\": \"0-31\"}, "
    "{\"index\": 1, \"name\": \"H100\", \"uuid\": \"GPU-ffffffff-0000-1111-2222-333344445555\", "
    "\"memory_bytes\": 80000000000, \"pci_bus_id\": \"0000:2b:00.0\"}]}";

Test(gpus, two_devices)
{
    dt_gpus_t g;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_gpus_parse(TWO, &g, &em), 0, "%s", em.s);
    cr_assert_eq(g.n, 2);
    cr_assert_str_eq(g.uuid[0], "GPU-0a1b2c3d-0000-1111-2222-333344445555");
    cr_assert_str_eq(g.cpus[0], "0-31");
    cr_assert_null(g.cpus[1], "no cpulist: no pinning");
    cr_assert_eq(g.mem_min, 80000000000);
    cr_assert_str_eq(g.why, "");
    dt_gpus_free(&g);
    cr_assert_eq(g.n, 0);
}

Test(gpus, none_and_why)
{
    dt_gpus_t g;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_gpus_parse("{\"cuda\": true, \"devices\": [], \"error\": \"no NVIDIA "
                               "driver is loaded\\u001b[2J\"}",
                               &g, &em),
                 0, "%s", em.s);
    cr_assert_eq(g.n, 0);
    cr_assert_str_eq(g.why, "no NVIDIA driver is loaded\\x1b[2J", "escaped: it is logged");
    dt_gpus_free(&g);
}

Test(gpus, refused)
{
    static const char *const bad[] = {
        "[]",
        "{\"devices\": 3}",
        "not json",
        "{\"devices\": [{\"uuid\": \"0\", \"memory_bytes\": 1}]}",
        "{\"devices\": [{\"uuid\": \"GPU-1,GPU-2\", \"memory_bytes\": 1}]}",
        "{\"devices\": [{\"uuid\": \"GPU-00\\n\", \"memory_bytes\": 1}]}",
        "{\"devices\": [{\"uuid\": \"GPU-00\"}]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dt_gpus_t g;
        dt_emsg_t em = { "" };
        cr_assert_eq(dt_gpus_parse(bad[i], &g, &em), DT_EFORMAT, "%s", bad[i]);
        cr_assert_not_null(strstr(em.s, "dtengine devices"), "%s: %s", bad[i], em.s);
        cr_assert_eq(g.n, 0);
    }
    /* a cpulist that is not one is dropped, the GPU kept */
    dt_gpus_t g;
    dt_emsg_t em = { "" };
    cr_assert_eq(dt_gpus_parse("{\"devices\": [{\"uuid\": \"GPU-00\", \"memory_bytes\": 1, "
                               "\"cpus\": \"0-3;rm -rf\"}]}",
                               &g, &em),
                 0, "%s", em.s);
    cr_assert_eq(g.n, 1);
    cr_assert_null(g.cpus[0]);
    dt_gpus_free(&g);
}

/* An engine script at dir/NAME with the body given. */
static const char *engine(const char *name, const char *body)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    cr_assert_eq(chmod(path, 0755), 0);
    return path;
}

Test(gpus, probe_runs_the_engine)
{
    char body[1024];
    dt_gpus_t g;

    snprintf(body, sizeof(body), "[ \"$1 $2\" = 'devices --json' ] || exit 9\ncat <<'J'\n%s\nJ",
             TWO);
    dt_gpus_probe(engine("ok", body), 5000, &g);
    cr_assert_eq(g.n, 2, "%s", g.why);
    dt_gpus_free(&g);
}

Test(gpus, probe_bounds)
{
    dt_gpus_t g;

    int64_t t0 = dt_clock_mono_ms();
    dt_gpus_probe(engine("hang", "exec sleep 30"), 300, &g);
    cr_assert_eq(g.n, 0);
    cr_assert_not_null(strstr(g.why, "no answer in 300 ms"), "%s", g.why);
    cr_assert_lt(dt_clock_mono_ms() - t0, 5000, "the probe waited out the engine");

    dt_gpus_probe(engine("fails", "echo '{\"devices\": []}'; exit 3"), 5000, &g);
    cr_assert_eq(g.n, 0);
    cr_assert_not_null(strstr(g.why, "exit status 3"), "%s", g.why);

    dt_gpus_probe("/nonexistent/dtengine", 5000, &g);
    cr_assert_eq(g.n, 0);
    cr_assert_not_null(strstr(g.why, "exit status 127"), "%s", g.why);

    dt_gpus_probe(engine("garbage", "echo hello"), 5000, &g);
    cr_assert_eq(g.n, 0);
    cr_assert_not_null(strstr(g.why, "not a device list"), "%s", g.why);
}
