/* SPDX-License-Identifier: MIT
 *
 * What this CPU is, from cpuid alone: vendor, family and model, the brand
 * string, the vector instruction sets the CPU has and the OS saves the
 * registers of, and the clock the kernel reports. Two decisions are made
 * from it, here and nowhere else:
 *
 * - which OpenBLAS core dtengine asks for (dt_cpu_blas_core): a BLAS older
 *   than the CPU runs a generic core on it (Debian 12's OpenBLAS 0.3.21
 *   runs "Prescott" on an Intel Xeon of family 6 model 207, four times
 *   slower than its SkylakeX core there, and "Haswell" on AMD Zen 5);
 * - the fp32 peak of one core that the planner's `cpu` preset uses
 *   (dt_cpu_peak): a figure measured on the machines dt was run on, else
 *   one computed from the vector width, the FMA pipes and the clock.
 *
 * Both are functions of cpuid's answers only, never of a timing, so every
 * rank of a job on the same kind of machine decides the same way (the BLAS
 * core changes results in the last bits: resumes stay bit-identical).
 * Not here: which attention kernel runs (kernels/cpu/attn_cpu.c asks the
 * compiler's cpu_supports for that), or calling the BLAS (the caller passes
 * the core name it reports).
 */
#ifndef DT_CPUINFO_H
#define DT_CPUINFO_H

/* Instruction-set features, counted only when the OS saves their state
 * (XCR0): AVX needs the YMM state, AVX-512 the opmask and ZMM states. */
enum {
    DT_CPU_SSE3 = 1u << 0,
    DT_CPU_SSSE3 = 1u << 1,
    DT_CPU_SSE41 = 1u << 2,
    DT_CPU_SSE42 = 1u << 3,
    DT_CPU_AVX = 1u << 4,
    DT_CPU_FMA = 1u << 5,
    DT_CPU_AVX2 = 1u << 6,
    DT_CPU_AVX512F = 1u << 7,
    DT_CPU_AVX512DQ = 1u << 8,
    DT_CPU_AVX512CD = 1u << 9,
    DT_CPU_AVX512BW = 1u << 10,
    DT_CPU_AVX512VL = 1u << 11,
    DT_CPU_AVX512BF16 = 1u << 12,
    DT_CPU_AMX = 1u << 13, /* AMX tiles (bf16/int8 only; no fp32 use here) */
};

/* x86-64 micro-architecture levels (the psABI's): what a kernel may use. */
enum dt_cpu_level {
    DT_CPU_LEVEL_BASE = 0, /* SSE2 */
    DT_CPU_LEVEL_V2 = 1,   /* SSE4.2 */
    DT_CPU_LEVEL_AVX = 2,  /* AVX, no AVX2 */
    DT_CPU_LEVEL_V3 = 3,   /* AVX2 + FMA */
    DT_CPU_LEVEL_V4 = 4,   /* AVX-512 F, CD, BW, DQ, VL */
};

typedef struct dt_cpu {
    char vendor[13];   /* "GenuineIntel", "AuthenticAMD"; "" off x86 */
    char brand[49];    /* cpuid's brand string, spaces trimmed; "" when none */
    int family, model; /* display family and model (extended fields added) */
    unsigned features; /* DT_CPU_* */
    double ghz;        /* maximum clock the kernel reports; 0 when it reports none */
} dt_cpu_t;

/* This CPU (read once; cheap after the first call). Off x86 everything is
 * zero but the clock. Thread-safe. */
const dt_cpu_t *dt_cpu_this(void);

/* The level a feature set reaches. */
enum dt_cpu_level dt_cpu_level(unsigned features);

/* "AMD EPYC 9R14 (family 25 model 17, avx512)": the brand (or the vendor
 * when there is none), family and model, and the widest vector set, for
 * stats lines and benchmark headers. Borrowed, static, computed once. */
const char *dt_cpu_describe(void);

/* The level of OpenBLAS core `name` (as openblas_get_corename() and
 * OPENBLAS_CORETYPE spell it, case ignored: "Prescott", "Haswell",
 * "SkylakeX", ...); -1 for a name this table does not know (a core newer
 * than the table, or another BLAS). */
int dt_cpu_blas_core_level(const char *name);

/* The OpenBLAS core to ask for, or NULL for none, given what the user set
 * (OPENBLAS_CORETYPE; NULL or "" when unset), the core the BLAS runs now
 * and the CPU's features:
 *   - a value the user set is never overridden: NULL;
 *   - a core below what the CPU runs: "SkylakeX" on a CPU with AVX-512
 *     (F, CD, BW, DQ, VL), "Haswell" on one with AVX2 and FMA;
 *   - otherwise (an up-to-date core, a core this table does not know, a
 *     CPU without AVX2): NULL.
 * Pure. */
const char *dt_cpu_blas_core(const char *user_set, const char *running, unsigned features);

/* Peak fp32 FLOP/s of one core of `c`, and the share of it dtengine's
 * attention and training reach (*eff). A machine dt has been measured on
 * gets its measured figures (the table in cpuinfo.c says where each came
 * from); any other gets lanes x 2 x FMA pipes x clock (2.5 GHz when the
 * clock is unknown) and efficiency 0.5. Never 0. */
double dt_cpu_peak(const dt_cpu_t *c, double *eff);

#endif /* DT_CPUINFO_H */
