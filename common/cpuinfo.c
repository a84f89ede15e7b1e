/* SPDX-License-Identifier: MIT
 *
 * cpuid, XCR0 and the kernel's clock, read once; the OpenBLAS core table
 * and the measured per-core peaks (cpuinfo.h).
 */
#include "config.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define DT_CPUID 1
#endif

#include "common/cpuinfo.h"
#include "common/macros.h"

static dt_cpu_t cpu;
static char described[160];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* The largest clock the kernel reports, in GHz: cpufreq's maximum, else
 * the first "cpu MHz" of /proc/cpuinfo (a VM's nominal clock), else 0. */
static double read_ghz(void)
{
    double ghz = 0.0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
    if (f != NULL) {
        long khz = 0;
        if (fscanf(f, "%ld", &khz) == 1 && khz > 0)
            ghz = (double)khz / 1e6;
        fclose(f);
        if (ghz > 0.0)
            return ghz;
    }
    if ((f = fopen("/proc/cpuinfo", "r")) == NULL)
        return 0.0;
    char line[256];
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *colon = strchr(line, ':');
        double mhz;
        if (strncmp(line, "cpu MHz", 7) == 0 && colon != NULL &&
            sscanf(colon + 1, "%lf", &mhz) == 1 && mhz > 0) {
            ghz = mhz / 1000.0;
            break;
        }
    }
    fclose(f);
    return ghz;
}

#ifdef DT_CPUID
static unsigned long long xcr0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void read_cpuid(dt_cpu_t *c)
{
    unsigned a = 0, b = 0, cx = 0, d = 0, max = 0;

    if (!__get_cpuid(0, &max, &b, &cx, &d))
        return;
    memcpy(c->vendor, &b, 4);
    memcpy(c->vendor + 4, &d, 4);
    memcpy(c->vendor + 8, &cx, 4);
    c->vendor[12] = '\0';

    __get_cpuid(1, &a, &b, &cx, &d);
    int fam = (int)((a >> 8) & 0xf), mod = (int)((a >> 4) & 0xf);
    if (fam == 0xf)
        fam += (int)((a >> 20) & 0xff);
    if (fam == 0x6 || fam >= 0xf)
        mod += (int)((a >> 16) & 0xf) << 4;
    c->family = fam;
    c->model = mod;

    unsigned f = 0;
    f |= (cx & bit_SSE3) ? DT_CPU_SSE3 : 0;
    f |= (cx & bit_SSSE3) ? DT_CPU_SSSE3 : 0;
    f |= (cx & bit_SSE4_1) ? DT_CPU_SSE41 : 0;
    f |= (cx & bit_SSE4_2) ? DT_CPU_SSE42 : 0;
    int osx = (cx & bit_OSXSAVE) != 0;
    unsigned long long x = osx ? xcr0() : 0;
    int ymm = (x & 0x6) == 0x6;            /* SSE and AVX state */
    int zmm = ymm && (x & 0xe0) == 0xe0;   /* opmask, ZMM_Hi256, Hi16_ZMM */
    int tiles = (x & 0x60000) == 0x60000; /* XTILECFG, XTILEDATA */
    if (ymm) {
        f |= (cx & bit_AVX) ? DT_CPU_AVX : 0;
        f |= (cx & bit_FMA) ? DT_CPU_FMA : 0;
    }
    if (max >= 7) {
        unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
        __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7);
        if (ymm)
            f |= (b7 & bit_AVX2) ? DT_CPU_AVX2 : 0;
        if (zmm) {
            f |= (b7 & bit_AVX512F) ? DT_CPU_AVX512F : 0;
            f |= (b7 & bit_AVX512DQ) ? DT_CPU_AVX512DQ : 0;
            f |= (b7 & bit_AVX512CD) ? DT_CPU_AVX512CD : 0;
            f |= (b7 & bit_AVX512BW) ? DT_CPU_AVX512BW : 0;
            f |= (b7 & bit_AVX512VL) ? DT_CPU_AVX512VL : 0;
            if (a7 >= 1) {
                unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
                __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
                f |= (a71 & (1u << 5)) ? DT_CPU_AVX512BF16 : 0;
            }
        }
        if (tiles && (d7 & (1u << 24)))
            f |= DT_CPU_AMX;
    }
    c->features = f;

    __get_cpuid(0x80000000, &max, &b, &cx, &d);
    if (max >= 0x80000004) {
        unsigned r[12] = { 0 };
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002 + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        char s[49];
        memcpy(s, r, 48);
        s[48] = '\0';
        /* trim, and squeeze the runs of spaces some vendors pad with */
        size_t n = 0;
        for (const char *p = s; *p; p++) {
            if (!isprint((unsigned char)*p))
                continue;
            if (*p == ' ' && (n == 0 || c->brand[n - 1] == ' '))
                continue;
            c->brand[n++] = *p;
        }
        while (n > 0 && c->brand[n - 1] == ' ')
            n--;
        c->brand[n] = '\0';
    }
}
#endif

static const char *level_name(enum dt_cpu_level l)
{
    switch (l) {
    case DT_CPU_LEVEL_V4:
        return "avx512";
    case DT_CPU_LEVEL_V3:
        return "avx2";
    case DT_CPU_LEVEL_AVX:
        return "avx";
    case DT_CPU_LEVEL_V2:
        return "sse4.2";
    case DT_CPU_LEVEL_BASE:
        break;
    }
    return "sse2";
}

static void read_once(void)
{
#ifdef DT_CPUID
    read_cpuid(&cpu);
#endif
    cpu.ghz = read_ghz();
    const char *name = cpu.brand[0] ? cpu.brand : cpu.vendor[0] ? cpu.vendor : "unknown CPU";
    if (cpu.vendor[0])
        snprintf(described, sizeof(described), "%s (family %d model %d, %s)", name, cpu.family,
                 cpu.model, level_name(dt_cpu_level(cpu.features)));
    else
        snprintf(described, sizeof(described), "%s", name);
}

const dt_cpu_t *dt_cpu_this(void)
{
    pthread_once(&once, read_once);
    return &cpu;
}

const char *dt_cpu_describe(void)
{
    pthread_once(&once, read_once);
    return described;
}

enum dt_cpu_level dt_cpu_level(unsigned f)
{
    const unsigned v4 =
        DT_CPU_AVX512F | DT_CPU_AVX512CD | DT_CPU_AVX512BW | DT_CPU_AVX512DQ | DT_CPU_AVX512VL;
    const unsigned v3 = DT_CPU_AVX | DT_CPU_AVX2 | DT_CPU_FMA;
    if ((f & v3) == v3 && (f & v4) == v4)
        return DT_CPU_LEVEL_V4;
    if ((f & v3) == v3)
        return DT_CPU_LEVEL_V3;
    if (f & DT_CPU_AVX)
        return DT_CPU_LEVEL_AVX;
    if ((f & (DT_CPU_SSE42 | DT_CPU_SSE41 | DT_CPU_SSSE3)) ==
        (DT_CPU_SSE42 | DT_CPU_SSE41 | DT_CPU_SSSE3))
        return DT_CPU_LEVEL_V2;
    return DT_CPU_LEVEL_BASE;
}

/* OpenBLAS's x86-64 cores (its driver/others/dynamic.c names) and the
 * instructions their kernels use. */
static const struct core {
    const char *name;
    enum dt_cpu_level level;
} cores[] = {
    { "Katmai", DT_CPU_LEVEL_BASE },         { "Coppermine", DT_CPU_LEVEL_BASE },
    { "Northwood", DT_CPU_LEVEL_BASE },      { "Prescott", DT_CPU_LEVEL_BASE },
    { "Banias", DT_CPU_LEVEL_BASE },         { "Atom", DT_CPU_LEVEL_BASE },
    { "Core2", DT_CPU_LEVEL_BASE },          { "Penryn", DT_CPU_LEVEL_BASE },
    { "Dunnington", DT_CPU_LEVEL_BASE },     { "Nehalem", DT_CPU_LEVEL_V2 },
    { "Athlon", DT_CPU_LEVEL_BASE },         { "Opteron", DT_CPU_LEVEL_BASE },
    { "Opteron_SSE3", DT_CPU_LEVEL_BASE },   { "Barcelona", DT_CPU_LEVEL_BASE },
    { "Nano", DT_CPU_LEVEL_BASE },           { "Bobcat", DT_CPU_LEVEL_BASE },
    { "Sandybridge", DT_CPU_LEVEL_AVX },     { "Bulldozer", DT_CPU_LEVEL_AVX },
    { "Piledriver", DT_CPU_LEVEL_AVX },      { "Steamroller", DT_CPU_LEVEL_AVX },
    { "Haswell", DT_CPU_LEVEL_V3 },          { "Excavator", DT_CPU_LEVEL_V3 },
    { "Zen", DT_CPU_LEVEL_V3 },              { "SkylakeX", DT_CPU_LEVEL_V4 },
    { "Cooperlake", DT_CPU_LEVEL_V4 },       { "SapphireRapids", DT_CPU_LEVEL_V4 },
};

int dt_cpu_blas_core_level(const char *name)
{
    if (name == NULL)
        return -1;
    for (size_t i = 0; i < DT_ARRAY_SIZE(cores); i++)
        if (strcasecmp(name, cores[i].name) == 0)
            return (int)cores[i].level;
    return -1;
}

const char *dt_cpu_blas_core(const char *user_set, const char *running, unsigned features)
{
    if (user_set != NULL && *user_set != '\0')
        return NULL;
    int have = dt_cpu_blas_core_level(running);
    if (have < 0)
        return NULL;
    enum dt_cpu_level want = dt_cpu_level(features);
    if (want == DT_CPU_LEVEL_V4 && have < (int)DT_CPU_LEVEL_V4)
        return "SkylakeX";
    if (want == DT_CPU_LEVEL_V3 && have < (int)DT_CPU_LEVEL_V3)
        return "Haswell";
    return NULL;
}

/* Machines dt was measured on: one core's fp32 peak (the attention
 * kernels' 6-row products alone, bench/bench_attn, which run at the sgemm
 * rate of the core's best BLAS kernel) and the share of it that dtengine
 * attn and a tiny training step reach. */
static const struct measured {
    const char *vendor;
    int family, model_lo, model_hi;
    enum dt_cpu_level level; /* at least */
    double peak, eff;
    const char *where;
} measured[] = {
    /* AMD Zen 5 (EPYC 9005), 2-core VM: products 270 GFLOP/s, attention
     * ~180 per rank, the tiny training step 137 (stop 28) */
    { "AuthenticAMD", 26, 0x00, 0xff, DT_CPU_LEVEL_V4, 270e9, 0.55, "AMD Zen 5, stop 28" },
    /* AMD Zen 4 (EPYC 9004), 2-core VM, 2.6 GHz nominal: OpenBLAS sgemm
     * 2048^3 98 GFLOP/s on one core (its 512-bit FMAs issue one per cycle),
     * attention kernels 75 to 90, the tiny training step 73 (stop 29) */
    { "AuthenticAMD", 25, 0x10, 0x1f, DT_CPU_LEVEL_V4, 100e9, 0.75, "AMD Zen 4, stop 29" },
    /* Intel Xeon family 6 model 207 (Emerald Rapids) VM: OpenBLAS's SkylakeX
     * sgemm 2048^3 112 GFLOP/s on one core, MKL 113; the attention kernel
     * 63 before its B operands were packed (issue 34; not measured since) */
    { "GenuineIntel", 6, 207, 207, DT_CPU_LEVEL_V4, 120e9, 0.5, "Intel EMR, issue 34" },
};

double dt_cpu_peak(const dt_cpu_t *c, double *eff)
{
    enum dt_cpu_level l = dt_cpu_level(c->features);
    for (size_t i = 0; i < DT_ARRAY_SIZE(measured); i++) {
        const struct measured *m = &measured[i];
        if (strcmp(c->vendor, m->vendor) == 0 && c->family == m->family &&
            c->model >= m->model_lo && c->model <= m->model_hi && l >= m->level) {
            if (eff)
                *eff = m->eff;
            return m->peak;
        }
    }
    /* lanes x 2 flops x FMA pipes x clock; Zen 4 runs a 512-bit FMA as two
     * 256-bit halves on its two pipes: one per cycle */
    double lanes = l == DT_CPU_LEVEL_V4 ? 16 : l >= DT_CPU_LEVEL_AVX ? 8 : 4;
    double pipes = l >= DT_CPU_LEVEL_V3 ? 2 : 1;
    if (l == DT_CPU_LEVEL_V4 && strcmp(c->vendor, "AuthenticAMD") == 0 && c->family == 25)
        pipes = 1;
    if (l < DT_CPU_LEVEL_V3)
        lanes /= 2; /* no FMA: a multiply and an add */
    double ghz = c->ghz > 0.0 ? c->ghz : 2.5;
    if (eff)
        *eff = 0.5;
    return lanes * 2.0 * pipes * ghz * 1e9;
}
