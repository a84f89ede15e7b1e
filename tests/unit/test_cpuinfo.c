/* SPDX-License-Identifier: MIT
 *
 * Unit tests for common/cpuinfo: the OpenBLAS core dtengine asks for, from
 * the core a user set, the core the BLAS runs and the CPU's features (a
 * Prescott core on CPUs with AVX-512 or with AVX2 only, a core the user
 * set, up-to-date and unknown cores, CPUs with partial AVX-512); the
 * feature levels; this machine's cpuid against the compiler's own probe;
 * the per-core peak of measured and unknown machines.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <string.h>

#include "common/cpuinfo.h"

/* Feature sets of real CPUs as cpuid reports them (XCR0 saving all). */
#define F_SSE (DT_CPU_SSE3 | DT_CPU_SSSE3 | DT_CPU_SSE41 | DT_CPU_SSE42)
#define F_AVX (F_SSE | DT_CPU_AVX)
#define F_AVX2 (F_AVX | DT_CPU_AVX2 | DT_CPU_FMA)
#define F_AVX512                                                                      \
    (F_AVX2 | DT_CPU_AVX512F | DT_CPU_AVX512CD | DT_CPU_AVX512BW | DT_CPU_AVX512DQ | \
     DT_CPU_AVX512VL)
/* Intel Xeon family 6 model 207 (AMX too) and AMD Zen 5 */
#define F_EMR (F_AVX512 | DT_CPU_AVX512BF16 | DT_CPU_AMX)
/* Knights Landing: AVX-512 F and CD without BW, DQ, VL */
#define F_KNL (F_AVX2 | DT_CPU_AVX512F | DT_CPU_AVX512CD)

static void expect_core(const char *user, const char *running, unsigned f, const char *want)
{
    const char *got = dt_cpu_blas_core(user, running, f);
    if (want == NULL)
        cr_expect_null(got, "user=%s running=%s features=%#x: %s, expected none",
                       user ? user : "(unset)", running ? running : "(null)", f, got);
    else
        cr_expect(got != NULL && strcmp(got, want) == 0,
                  "user=%s running=%s features=%#x: %s, expected %s", user ? user : "(unset)",
                  running ? running : "(null)", f, got ? got : "none", want);
}

Test(cpuinfo, prescott_on_avx512_asks_skylakex)
{
    expect_core(NULL, "Prescott", F_EMR, "SkylakeX");
    expect_core("", "Prescott", F_AVX512, "SkylakeX");
    expect_core(NULL, "prescott", F_AVX512, "SkylakeX"); /* case ignored */
    expect_core(NULL, "Core2", F_AVX512, "SkylakeX");
    expect_core(NULL, "Nehalem", F_AVX512, "SkylakeX");
    expect_core(NULL, "Sandybridge", F_AVX512, "SkylakeX");
}

Test(cpuinfo, prescott_on_avx2_asks_haswell)
{
    expect_core(NULL, "Prescott", F_AVX2, "Haswell");
    expect_core(NULL, "Barcelona", F_AVX2, "Haswell");
    expect_core(NULL, "Bulldozer", F_AVX2, "Haswell");
    /* partial AVX-512 is not SkylakeX's set: Haswell */
    expect_core(NULL, "Prescott", F_KNL, "Haswell");
}

Test(cpuinfo, older_vector_core_on_avx512_asks_skylakex)
{
    /* Debian's 0.3.21 on AMD Zen 5: Haswell kernels on an AVX-512 core */
    expect_core(NULL, "Haswell", F_AVX512, "SkylakeX");
    expect_core(NULL, "Zen", F_AVX512, "SkylakeX");
}

Test(cpuinfo, a_core_the_user_set_is_kept)
{
    expect_core("Prescott", "Prescott", F_AVX512, NULL);
    expect_core("Haswell", "Prescott", F_AVX512, NULL);
    expect_core("SkylakeX", "SkylakeX", F_AVX2, NULL);
    expect_core("nonsense", "Prescott", F_AVX2, NULL);
}

Test(cpuinfo, an_up_to_date_core_is_kept)
{
    expect_core(NULL, "SkylakeX", F_AVX512, NULL);
    expect_core(NULL, "Cooperlake", F_EMR, NULL);
    expect_core(NULL, "SapphireRapids", F_EMR, NULL);
    expect_core(NULL, "Haswell", F_AVX2, NULL);
    expect_core(NULL, "Zen", F_AVX2, NULL);
    expect_core(NULL, "Excavator", F_AVX2, NULL);
}

Test(cpuinfo, nothing_to_gain_or_nothing_known)
{
    /* a CPU without AVX2: no core to ask for */
    expect_core(NULL, "Prescott", F_SSE, NULL);
    expect_core(NULL, "Prescott", F_AVX, NULL);
    expect_core(NULL, "Nehalem", F_SSE, NULL);
    /* a core this table does not know (newer OpenBLAS, another BLAS) */
    expect_core(NULL, "Zen5", F_AVX512, NULL);
    expect_core(NULL, "", F_AVX512, NULL);
    expect_core(NULL, NULL, F_AVX512, NULL);
    /* features the OS does not save count as absent (cpuinfo reads XCR0):
     * AVX-512 bits without AVX2 reach no level */
    expect_core(NULL, "Prescott", F_SSE | DT_CPU_AVX512F | DT_CPU_AVX512BW, NULL);
}

Test(cpuinfo, levels)
{
    cr_expect_eq(dt_cpu_level(0), DT_CPU_LEVEL_BASE);
    cr_expect_eq(dt_cpu_level(F_SSE), DT_CPU_LEVEL_V2);
    cr_expect_eq(dt_cpu_level(F_AVX), DT_CPU_LEVEL_AVX);
    cr_expect_eq(dt_cpu_level(F_AVX2), DT_CPU_LEVEL_V3);
    cr_expect_eq(dt_cpu_level(F_AVX2 & ~DT_CPU_FMA), DT_CPU_LEVEL_AVX);
    cr_expect_eq(dt_cpu_level(F_KNL), DT_CPU_LEVEL_V3);
    cr_expect_eq(dt_cpu_level(F_AVX512), DT_CPU_LEVEL_V4);
    cr_expect_eq(dt_cpu_level(F_EMR), DT_CPU_LEVEL_V4);
    cr_expect_eq(dt_cpu_blas_core_level("SkylakeX"), DT_CPU_LEVEL_V4);
    cr_expect_eq(dt_cpu_blas_core_level("HASWELL"), DT_CPU_LEVEL_V3);
    cr_expect_eq(dt_cpu_blas_core_level("Prescott"), DT_CPU_LEVEL_BASE);
    cr_expect_eq(dt_cpu_blas_core_level("Zen5"), -1);
}

Test(cpuinfo, this_machine_agrees_with_the_compiler)
{
    const dt_cpu_t *c = dt_cpu_this();
#if defined(__x86_64__)
    __builtin_cpu_init();
    cr_expect(c->vendor[0] != '\0', "no vendor from cpuid");
    cr_expect_eq((c->features & DT_CPU_AVX2) != 0, __builtin_cpu_supports("avx2") != 0);
    cr_expect_eq((c->features & DT_CPU_AVX512F) != 0, __builtin_cpu_supports("avx512f") != 0);
    cr_expect_eq(dt_cpu_level(c->features) >= DT_CPU_LEVEL_V3,
                 __builtin_cpu_supports("x86-64-v3") != 0);
    cr_expect_eq(dt_cpu_level(c->features) >= DT_CPU_LEVEL_V4,
                 __builtin_cpu_supports("x86-64-v4") != 0);
    cr_expect(c->family > 0);
#endif
    cr_expect(strlen(dt_cpu_describe()) > 0);
    cr_expect_eq(dt_cpu_this(), c, "read once");
}

Test(cpuinfo, peaks)
{
    double eff = 0.0;
    dt_cpu_t zen5 = { .vendor = "AuthenticAMD", .family = 26, .model = 2, .features = F_EMR };
    cr_expect_eq(dt_cpu_peak(&zen5, &eff), 270e9);
    cr_expect_eq(eff, 0.55);
    /* an unknown AVX-512 Intel at 3 GHz: 16 lanes x 2 x 2 pipes x 3e9 */
    dt_cpu_t intel = { .vendor = "GenuineIntel", .family = 6, .model = 143, .features = F_AVX512,
                       .ghz = 3.0 };
    cr_expect_float_eq(dt_cpu_peak(&intel, &eff), 192e9, 1e-3);
    cr_expect_eq(eff, 0.5);
    /* an AVX2 machine of unknown clock: 8 x 2 x 2 x 2.5e9 */
    dt_cpu_t avx2 = { .vendor = "AuthenticAMD", .family = 23, .model = 49, .features = F_AVX2 };
    cr_expect_float_eq(dt_cpu_peak(&avx2, NULL), 80e9, 1e-3);
    /* nothing known at all: still a positive peak */
    dt_cpu_t none = { .vendor = "" };
    cr_expect(dt_cpu_peak(&none, NULL) > 0.0);
    cr_expect(dt_cpu_peak(dt_cpu_this(), NULL) > 0.0);
}
