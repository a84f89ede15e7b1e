/* SPDX-License-Identifier: MIT
 *
 * npytool: the test suite's helper for .npy files. It makes generated
 * inputs (the same values as dtengine --generate), computes reference
 * attention outputs and gradients with tests/ref/ref.c, compares arrays
 * with |a - b| <= atol + rtol * |b|, and lists the tensors of safetensors
 * files with their digests, so the integration scripts need no Python.
 *
 * Not installed and not a user tool: no streaming (whole arrays are held in
 * memory, and `ref` is O(T^2)), float32 output only (float16 for `gen`).
 *
 * Exit status: 0 success, 1 a comparison failed (values out of tolerance,
 * or shapes that differ), 2 a usage error or a file that cannot be read or
 * written.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/mem.h"
#include "common/sha256.h"
#include "engine/data/loader.h"
#include "engine/data/recall.h"
#include "io/tokshard.h"
#include "engine/data/gen.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "tests/ref/ref.h"

#define EXIT_DIFF 1
#define EXIT_USAGE 2

#define MAXBRANCH 64

/* An array loaded as float32, whatever its file dtype. */
struct arr {
    const char *path;
    dt_npy_info_t info;
    float *data; /* (info.count), dt_xaligned */
};

static const char *cmdname = "npytool";

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s: ", cmdname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (try 'npytool help')\n");
    return EXIT_USAGE;
}

static int file_error(int rc, const dt_emsg_t *em)
{
    fprintf(stderr, "%s: %s\n", cmdname, em->s[0] != '\0' ? em->s : dt_strerror(rc));
    return EXIT_USAGE;
}

/* ---- parsing ---------------------------------------------------------- */

static bool parse_i64(const char *s, int64_t *out)
{
    char *end;
    long long x;

    errno = 0;
    x = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        return false;
    *out = x;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long x;

    /* strtoull would quietly wrap "-1" */
    if (*s == '-' || *s == '+')
        return false;
    errno = 0;
    x = strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0')
        return false;
    *out = x;
    return true;
}

static bool parse_float(const char *s, float *out)
{
    char *end;
    float x;

    errno = 0;
    x = strtof(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(x))
        return false;
    *out = x;
    return true;
}

/* "a,b,c" of positive integers, at most max of them. */
static bool parse_list(const char *s, int64_t *out, int max, int *n)
{
    char *copy = dt_xstrdup(s), *save = NULL, *tok;
    bool ok = true;

    *n = 0;
    /* strtok_r would skip empty items; refuse them instead */
    if (*s == '\0' || *s == ',' || s[strlen(s) - 1] == ',' || strstr(s, ",,") != NULL)
        ok = false;
    for (tok = strtok_r(copy, ",", &save); ok && tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (*n == max || !parse_i64(tok, &out[*n]) || out[*n] <= 0)
            ok = false;
        else
            (*n)++;
    }
    free(copy);
    return ok;
}

static void shape_str(const dt_npy_info_t *info, char *buf, size_t len)
{
    size_t used = 0;

    used += (size_t)snprintf(buf + used, len - used, "(");
    for (int d = 0; d < info->ndim && used < len; d++)
        used +=
            (size_t)snprintf(buf + used, len - used, "%s%" PRId64, d ? ", " : "", info->shape[d]);
    if (used < len)
        snprintf(buf + used, len - used, info->ndim == 1 ? ",)" : ")");
}

static bool same_shape(const dt_npy_info_t *a, const dt_npy_info_t *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return true;
}

/* getopt_long over argv of one subcommand (argv[0] is its name), printing
 * our own messages. Returns the option, -1 at the end, or '?' after an
 * error has been printed. */
static int next_opt(int argc, char **argv, const struct option *opts)
{
    int c;

    opterr = 0;
    c = getopt_long(argc, argv, ":", opts, NULL);
    if (c == ':') {
        usage_error("option '%s' needs a value", argv[optind - 1]);
        return '?';
    }
    if (c == '?') {
        usage_error("unknown option '%s'", argv[optind - 1]);
        return '?';
    }
    return c;
}

/* ---- arrays ----------------------------------------------------------- */

static int arr_load(struct arr *a, const char *path)
{
    dt_emsg_t em = { "" };
    int rc;

    a->path = path;
    a->data = NULL;
    rc = dt_npy_read_header(path, &a->info, &em);
    if (rc != 0)
        return file_error(rc, &em);
    if (a->info.dtype != DT_F32 && a->info.dtype != DT_F16 && a->info.dtype != DT_F64) {
        fprintf(stderr, "%s: %s: dtype %s, want float32, float16 or float64\n", cmdname, path,
                dt_npy_dtype_name(a->info.dtype));
        return EXIT_USAGE;
    }
    a->data = dt_xaligned((size_t)a->info.count, sizeof(float));
    rc = dt_npy_read_f32(path, &a->info, 0, a->info.count, a->data, &em);
    if (rc != 0) {
        free(a->data);
        a->data = NULL;
        return file_error(rc, &em);
    }
    return 0;
}

static void arr_free(struct arr *a)
{
    free(a->data);
    a->data = NULL;
}

static int save_f32(const char *path, int ndim, const int64_t *shape, const float *data)
{
    dt_emsg_t em = { "" };
    int rc = dt_npy_save(path, DT_F32, ndim, shape, data, &em);

    return rc != 0 ? file_error(rc, &em) : 0;
}

/* Load A and B for a comparison: 0, EXIT_USAGE, or EXIT_DIFF for shapes
 * that differ (nothing is left loaded unless 0). */
/* Both files; with head > 0 only their first head elements are compared
 * (shapes may differ then), else their shapes must be equal. *n: the
 * elements to compare. */
static int load_pair(const char *pa, const char *pb, int64_t head, struct arr *a, struct arr *b,
                     int64_t *n)
{
    char sa[256], sb[256];
    int rc;

    if ((rc = arr_load(a, pa)) != 0)
        return rc;
    if ((rc = arr_load(b, pb)) != 0) {
        arr_free(a);
        return rc;
    }
    *n = head > 0 ? head : a->info.count;
    if (head > 0 && (a->info.count < head || b->info.count < head)) {
        fprintf(stderr, "%s: --head %lld: %s has %lld elements, %s %lld\n", cmdname,
                (long long)head, pa, (long long)a->info.count, pb, (long long)b->info.count);
        arr_free(b);
        arr_free(a);
        return EXIT_DIFF;
    }
    if (head == 0 && !same_shape(&a->info, &b->info)) {
        shape_str(&a->info, sa, sizeof(sa));
        shape_str(&b->info, sb, sizeof(sb));
        fprintf(stderr, "%s: %s has shape %s but %s has shape %s\n", cmdname, pa, sa, pb, sb);
        arr_free(b);
        arr_free(a);
        return EXIT_DIFF;
    }
    return 0;
}

/* ---- gen -------------------------------------------------------------- */

static int cmd_gen(int argc, char **argv)
{
    static const struct option opts[] = {
        { "shape", required_argument, NULL, 'S' },
        { "seed", required_argument, NULL, 's' },
        { "stream", required_argument, NULL, 'n' },
        { "f16", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int64_t shape[DT_NPY_MAXDIM], count = 1;
    int ndim = 0, c, rc;
    uint64_t seed = 0, stream = 0;
    bool have_shape = false, have_seed = false, have_stream = false, f16 = false;
    const char *out;
    float *data;
    dt_emsg_t em = { "" };

    while ((c = next_opt(argc, argv, opts)) != -1) {
        switch (c) {
        case 'S':
            if (!parse_list(optarg, shape, DT_NPY_MAXDIM, &ndim))
                return usage_error("--shape '%s': want 1 to %d positive sizes like 4,8,64", optarg,
                                   DT_NPY_MAXDIM);
            have_shape = true;
            break;
        case 's':
            if (!parse_u64(optarg, &seed))
                return usage_error("--seed '%s' is not an unsigned 64-bit integer", optarg);
            have_seed = true;
            break;
        case 'n':
            if (!parse_u64(optarg, &stream))
                return usage_error("--stream '%s' is not an unsigned 64-bit integer", optarg);
            have_stream = true;
            break;
        case 'h':
            f16 = true;
            break;
        default:
            return EXIT_USAGE;
        }
    }
    if (!have_shape || !have_seed || !have_stream)
        return usage_error("needs --shape, --seed and --stream");
    if (optind != argc - 1)
        return usage_error("needs exactly one output file");
    out = argv[optind];
    for (int d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(count, shape[d], &count) || count > INT64_MAX / 8)
            return usage_error("--shape: too many elements");

    data = dt_xaligned((size_t)count, sizeof(float));
    ref_fill(seed, stream, count, data);
    rc = dt_npy_save(out, f16 ? DT_F16 : DT_F32, ndim, shape, data, &em);
    free(data);
    return rc != 0 ? file_error(rc, &em) : 0;
}

/* ---- blocks ----------------------------------------------------------- */

/* A random block pattern for masks: NB x NB blocks (H patterns with
 * --heads H), each allowed with probability 2/3 (xorshift of the seed),
 * query block 1 of the first pattern wholly masked (rows with no key);
 * written as uint8 (--bool: bool), and with --csr ROWPTR.npy,COLS.npy also
 * in the compressed form dtengine takes. */
static int cmd_blocks(int argc, char **argv)
{
    static const struct option opts[] = {
        { "blocks", required_argument, NULL, 'n' }, { "heads", required_argument, NULL, 'h' },
        { "seed", required_argument, NULL, 's' },   { "csr", required_argument, NULL, 'c' },
        { "bool", no_argument, NULL, 'b' },         { NULL, 0, NULL, 0 },
    };
    int64_t nb = 0, nh = 1;
    uint64_t seed = 1;
    const char *csr = NULL;
    bool as_bool = false;
    int c, rc;
    dt_emsg_t em = { "" };

    while ((c = next_opt(argc, argv, opts)) != -1) {
        switch (c) {
        case 'n':
            if (!parse_i64(optarg, &nb) || nb < 1 || nb > 1 << 14)
                return usage_error("--blocks '%s': want 1 to 16384", optarg);
            break;
        case 'h':
            if (!parse_i64(optarg, &nh) || nh < 1 || nh > 1024)
                return usage_error("--heads '%s': want 1 to 1024", optarg);
            break;
        case 's':
            if (!parse_u64(optarg, &seed))
                return usage_error("--seed '%s' is not an unsigned 64-bit integer", optarg);
            break;
        case 'c':
            csr = optarg;
            break;
        case 'b':
            as_bool = true;
            break;
        default:
            return EXIT_USAGE;
        }
    }
    if (nb == 0 || optind != argc - 1)
        return usage_error("needs --blocks NB and one output file");
    if (csr != NULL && strchr(csr, ',') == NULL)
        return usage_error("--csr '%s': want ROWPTR.npy,COLS.npy", csr);
    int64_t n = nh * nb * nb, k = 0;
    uint8_t *d = dt_xmallocarray((size_t)n, 1);
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t e = 0; e < n; e++) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        d[e] = (uint8_t)(z % 3 != 0);
    }
    for (int64_t b = 0; b < nb && nb > 1; b++)
        d[nb + b] = 0;
    int64_t shape[3] = { nh, nb, nb };
    rc = dt_npy_save(argv[optind], as_bool ? DT_BOOL : DT_U8, nh > 1 ? 3 : 2,
                     nh > 1 ? shape : shape + 1, d, &em);
    if (rc == 0 && csr != NULL) {
        int64_t *rp = dt_xmallocarray((size_t)(nh * (nb + 1)), sizeof(*rp));
        int64_t *cols = dt_xmallocarray((size_t)(n > 0 ? n : 1), sizeof(*cols));
        for (int64_t h = 0; h < nh; h++)
            for (int64_t a = 0; a <= nb; a++) {
                rp[h * (nb + 1) + a] = k;
                for (int64_t b = 0; a < nb && b < nb; b++)
                    if (d[(h * nb + a) * nb + b])
                        cols[k++] = b;
            }
        const char *comma = strchr(csr, ',');
        char *rows = dt_xasprintf("%.*s", (int)(comma - csr), csr);
        int64_t rshape[2] = { nh, nb + 1 };
        rc = dt_npy_save(rows, DT_I64, nh > 1 ? 2 : 1, nh > 1 ? rshape : rshape + 1, rp, &em);
        if (rc == 0)
            rc = dt_npy_save(comma + 1, DT_I64, 1, &k, cols, &em);
        free(rows);
        free(cols);
        free(rp);
    }
    free(d);
    return rc != 0 ? file_error(rc, &em) : 0;
}

/* ---- ref -------------------------------------------------------------- */

enum ref_file { RQ, RK, RV, RDOUT, NIN };

static const char *const ref_role[NIN] = { "--q", "--k", "--v", "--dout" };

/* "<role> <path>: shape (..), <why>", for a refused input; EXIT_USAGE. */
static int shape_refused(const struct arr *a, int f, const char *why)
{
    char s[256];

    shape_str(&a[f].info, s, sizeof(s));
    fprintf(stderr, "%s: %s %s: shape %s, %s\n", cmdname, ref_role[f], a[f].path, s, why);
    return EXIT_USAGE;
}

/* q (T, H, D), k and v (T, Hkv, D) with Hkv dividing H, dout like q. The
 * loaded entries of a are those with a non-NULL data. */
static int check_ref_shapes(const struct arr *a)
{
    const int64_t *qs = a[RQ].info.shape, *ks = a[RK].info.shape;
    char want[512], sq[256], sk[256];

    for (int f = 0; f < NIN; f++) {
        if (a[f].data == NULL)
            continue;
        if (a[f].info.ndim != 3)
            return shape_refused(a, f, "want 3 dimensions (T, heads, D)");
        if (a[f].info.count == 0)
            return shape_refused(a, f, "which is empty");
    }
    if (qs[1] > INT32_MAX || qs[2] > INT32_MAX)
        return shape_refused(a, RQ, "too many heads or too large a head dimension");
    shape_str(&a[RQ].info, sq, sizeof(sq));
    shape_str(&a[RK].info, sk, sizeof(sk));
    if (ks[0] != qs[0] || ks[2] != qs[2]) {
        snprintf(want, sizeof(want), "want (%" PRId64 ", Hkv, %" PRId64 ") to match --q %s %s",
                 qs[0], qs[2], a[RQ].path, sq);
        return shape_refused(a, RK, want);
    }
    if (qs[1] % ks[1] != 0) {
        snprintf(want, sizeof(want),
                 "its %" PRId64 " heads do not divide the %" PRId64 " heads of --q %s", ks[1],
                 qs[1], a[RQ].path);
        return shape_refused(a, RK, want);
    }
    if (!same_shape(&a[RV].info, &a[RK].info)) {
        snprintf(want, sizeof(want), "want %s like --k %s", sk, a[RK].path);
        return shape_refused(a, RV, want);
    }
    if (a[RDOUT].data != NULL && !same_shape(&a[RDOUT].info, &a[RQ].info)) {
        snprintf(want, sizeof(want), "want %s like --q %s", sq, a[RQ].path);
        return shape_refused(a, RDOUT, want);
    }
    return 0;
}

static int cmd_ref(int argc, char **argv)
{
    static const struct option opts[] = {
        { "q", required_argument, NULL, 'q' },         { "k", required_argument, NULL, 'k' },
        { "v", required_argument, NULL, 'v' },         { "out", required_argument, NULL, 'o' },
        { "lse", required_argument, NULL, 'l' },       { "causal", no_argument, NULL, 'c' },
        { "scale", required_argument, NULL, 'x' },     { "segments", required_argument, NULL, 'w' },
        { "dilations", required_argument, NULL, 'r' }, { "dout", required_argument, NULL, 'D' },
        { "dq", required_argument, NULL, 'Q' },        { "dk", required_argument, NULL, 'K' },
        { "dv", required_argument, NULL, 'V' },        { "doc-lengths", required_argument, NULL, 'L' },
        { "sliding-window", required_argument, NULL, 'W' },
        { "block-mask", required_argument, NULL, 'M' },
        { "mask-block", required_argument, NULL, 'B' }, { NULL, 0, NULL, 0 },
    };
    const char *in[NIN] = { NULL }, *out = NULL, *lse_path = NULL, *docs = NULL, *blocks = NULL;
    ref_mask_t mask = { 0 };
    int64_t *doc_len = NULL;
    uint8_t *bmask = NULL;
    const char *dq_path = NULL, *dk_path = NULL, *dv_path = NULL;
    const char *segs = NULL, *dils = NULL;
    int64_t seg[MAXBRANCH], dil[MAXBRANCH];
    int nseg = 0, ndil = 0, causal = 0, c, rc = 0, ngrad;
    float scale = 0.0f;
    struct arr a[NIN] = { { 0 } };
    float *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    int64_t T, Hl, Hkvl, D;

    while ((c = next_opt(argc, argv, opts)) != -1) {
        switch (c) {
        case 'q':
            in[RQ] = optarg;
            break;
        case 'k':
            in[RK] = optarg;
            break;
        case 'v':
            in[RV] = optarg;
            break;
        case 'D':
            in[RDOUT] = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'l':
            lse_path = optarg;
            break;
        case 'Q':
            dq_path = optarg;
            break;
        case 'K':
            dk_path = optarg;
            break;
        case 'V':
            dv_path = optarg;
            break;
        case 'c':
            causal = 1;
            break;
        case 'w':
            segs = optarg;
            break;
        case 'r':
            dils = optarg;
            break;
        case 'x':
            if (!parse_float(optarg, &scale) || !(scale > 0.0f))
                return usage_error("--scale '%s' is not a positive number", optarg);
            break;
        case 'L':
            docs = optarg;
            break;
        case 'W':
            if (!parse_i64(optarg, &mask.window) || mask.window < 1)
                return usage_error("--sliding-window '%s' is not a positive integer", optarg);
            break;
        case 'M':
            blocks = optarg;
            break;
        case 'B':
            if (!parse_i64(optarg, &mask.block) || mask.block < 1)
                return usage_error("--mask-block '%s' is not a positive integer", optarg);
            break;
        default:
            return EXIT_USAGE;
        }
    }
    if ((blocks == NULL) != (mask.block == 0))
        return usage_error("--block-mask and --mask-block go together");
    if (optind != argc)
        return usage_error("takes no positional argument ('%s')", argv[optind]);
    if (in[RQ] == NULL || in[RK] == NULL || in[RV] == NULL || out == NULL)
        return usage_error("needs --q, --k, --v and --out");
    ngrad = (in[RDOUT] != NULL) + (dq_path != NULL) + (dk_path != NULL) + (dv_path != NULL);
    if (ngrad != 0 && ngrad != 4)
        return usage_error("the backward needs all of --dout, --dq, --dk and --dv");
    if ((segs == NULL) != (dils == NULL))
        return usage_error("--segments and --dilations go together");
    if (segs != NULL) {
        if (!parse_list(segs, seg, MAXBRANCH, &nseg))
            return usage_error("--segments '%s': want up to %d positive lengths like 2048,4096",
                               segs, MAXBRANCH);
        if (!parse_list(dils, dil, MAXBRANCH, &ndil))
            return usage_error("--dilations '%s': want up to %d positive rates like 1,2", dils,
                               MAXBRANCH);
        if (nseg != ndil)
            return usage_error("%d segment lengths but %d dilation rates", nseg, ndil);
    }

    for (int f = 0; f < NIN; f++)
        if (in[f] != NULL && (rc = arr_load(&a[f], in[f])) != 0)
            goto out;

    if ((rc = check_ref_shapes(a)) != 0)
        goto out;
    rc = EXIT_USAGE;
    T = a[RQ].info.shape[0];
    Hl = a[RQ].info.shape[1];
    D = a[RQ].info.shape[2];
    Hkvl = a[RK].info.shape[1];

    if (docs != NULL) {
        int n = 0;
        int64_t sum = 0;
        doc_len = dt_xmallocarray((size_t)T, sizeof(*doc_len));
        if (!parse_list(docs, doc_len, (int)T, &n)) {
            rc = usage_error("--doc-lengths '%s': want positive lengths like 100,28", docs);
            goto out;
        }
        for (int d = 0; d < n; d++)
            sum += doc_len[d];
        if (sum != T) {
            rc = usage_error("--doc-lengths '%s' sum to %lld, not T = %lld", docs,
                             (long long)sum, (long long)T);
            goto out;
        }
        mask.ndoc = n;
        mask.doc_len = doc_len;
    }
    if (blocks != NULL) {
        dt_npy_info_t bi;
        dt_emsg_t em = { "" };
        int64_t nb = T / mask.block;
        if (T % mask.block != 0) {
            rc = usage_error("--mask-block %lld does not divide T = %lld", (long long)mask.block,
                             (long long)T);
            goto out;
        }
        if ((rc = dt_npy_read_header(blocks, &bi, &em)) != 0) {
            rc = file_error(rc, &em);
            goto out;
        }
        mask.nhead = bi.ndim == 3 ? (int)bi.shape[0] : 1;
        if ((bi.ndim != 2 && bi.ndim != 3) || bi.shape[bi.ndim - 1] != nb ||
            bi.shape[bi.ndim - 2] != nb || (mask.nhead != 1 && mask.nhead != Hl)) {
            rc = usage_error("--block-mask %s: want (T/B, T/B) or (H, T/B, T/B)", blocks);
            goto out;
        }
        bmask = dt_xmallocarray((size_t)bi.count, 1);
        if ((rc = dt_npy_read_bytes(blocks, &bi, bmask, &em)) != 0) {
            rc = file_error(rc, &em);
            goto out;
        }
        mask.blocks = bmask;
    }
    o = dt_xaligned((size_t)a[RQ].info.count, sizeof(float));
    lse = dt_xaligned((size_t)(T * Hl), sizeof(float));
    ref_attn_fwd_masked(T, (int)Hl, (int)Hkvl, (int)D, a[RQ].data, a[RK].data, a[RV].data,
                        causal, scale, nseg, seg, dil, &mask, o, lse);
    if ((rc = save_f32(out, 3, a[RQ].info.shape, o)) != 0)
        goto out;
    if (lse_path != NULL) {
        int64_t lshape[2] = { Hl, T };
        if ((rc = save_f32(lse_path, 2, lshape, lse)) != 0)
            goto out;
    }
    if (ngrad == 4) {
        dq = dt_xaligned((size_t)a[RQ].info.count, sizeof(float));
        dk = dt_xaligned((size_t)a[RK].info.count, sizeof(float));
        dv = dt_xaligned((size_t)a[RV].info.count, sizeof(float));
        ref_attn_bwd_masked(T, (int)Hl, (int)Hkvl, (int)D, a[RQ].data, a[RK].data, a[RV].data,
                            causal, scale, nseg, seg, dil, &mask, a[RDOUT].data, dq, dk, dv);
        if ((rc = save_f32(dq_path, 3, a[RQ].info.shape, dq)) != 0 ||
            (rc = save_f32(dk_path, 3, a[RK].info.shape, dk)) != 0 ||
            (rc = save_f32(dv_path, 3, a[RV].info.shape, dv)) != 0)
            goto out;
    }
    rc = 0;
out:
    free(bmask);
    free(doc_len);
    free(dv);
    free(dk);
    free(dq);
    free(lse);
    free(o);
    for (int f = NIN - 1; f >= 0; f--)
        arr_free(&a[f]);
    return rc;
}

/* ---- cmp and maxerr --------------------------------------------------- */

/* --head's count: a whole number >= 1, or 0 when it is not one. */
static int64_t parse_head(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    return end != s && *end == '\0' && v >= 1 ? (int64_t)v : 0;
}

/* --nan-same: the elements that are NaN in both arrays dropped from both
 * (a likelihood's positions without a target); *n the count left. */
static void drop_common_nan(struct arr *a, struct arr *b, int64_t *n)
{
    int64_t k = 0;
    for (int64_t x = 0; x < *n; x++) {
        if (isnan(a->data[x]) && isnan(b->data[x]))
            continue;
        a->data[k] = a->data[x];
        b->data[k++] = b->data[x];
    }
    *n = k;
}

static int cmd_cmp(int argc, char **argv)
{
    static const struct option opts[] = {
        { "atol", required_argument, NULL, 'a' },
        { "rtol", required_argument, NULL, 'r' },
        { "head", required_argument, NULL, 'H' },
        { "nan-same", no_argument, NULL, 'N' },
        { NULL, 0, NULL, 0 },
    };
    float atol = 1e-5f, rtol = 0.0f;
    struct arr a, b;
    int64_t nbad = 0, n, head = 0;
    double abs_err, rel_err;
    int c, rc, nan_same = 0;

    while ((c = next_opt(argc, argv, opts)) != -1) {
        switch (c) {
        case 'a':
            if (!parse_float(optarg, &atol) || atol < 0.0f)
                return usage_error("--atol '%s' is not a number >= 0", optarg);
            break;
        case 'r':
            if (!parse_float(optarg, &rtol) || rtol < 0.0f)
                return usage_error("--rtol '%s' is not a number >= 0", optarg);
            break;
        case 'H':
            if ((head = parse_head(optarg)) < 1)
                return usage_error("--head '%s' is not a count >= 1", optarg);
            break;
        case 'N':
            nan_same = 1;
            break;
        default:
            return EXIT_USAGE;
        }
    }
    if (optind != argc - 2)
        return usage_error("needs two files, A.npy B.npy");
    if ((rc = load_pair(argv[optind], argv[optind + 1], head, &a, &b, &n)) != 0)
        return rc;
    if (nan_same)
        drop_common_nan(&a, &b, &n);
    abs_err = ref_max_abs_err(a.data, b.data, n, atol, rtol, &nbad, NULL);
    rel_err = ref_max_rel_err(a.data, b.data, n);
    printf("max_abs_err=%.3e max_rel_err=%.3e bad=%" PRId64 " of %" PRId64 "\n", abs_err, rel_err,
           nbad, n);
    fflush(stdout);
    if (nbad > 0)
        ref_print_mismatches(a.path, a.data, b.data, n, atol, rtol);
    arr_free(&b);
    arr_free(&a);
    return nbad > 0 ? EXIT_DIFF : 0;
}

/* cat OUT.npy A.npy B.npy ...: the inputs' elements one after another,
 * as a 1-D float32 array (each read as cmp reads it, whatever its shape). */
static int cmd_cat(int argc, char **argv)
{
    dt_emsg_t em = { "" };
    int64_t n = 0;
    float *all = NULL;
    int rc = 0;

    if (argc < 3)
        return usage_error("cat: OUT.npy A.npy [B.npy ...]");
    for (int i = 2; i < argc && rc == 0; i++) {
        struct arr a;
        if ((rc = arr_load(&a, argv[i])) != 0)
            break;
        all = dt_xrealloc(all, (size_t)(n + a.info.count + 1) * sizeof(float));
        memcpy(all + n, a.data, (size_t)a.info.count * sizeof(float));
        n += a.info.count;
        arr_free(&a);
    }
    if (rc == 0 && dt_npy_save(argv[1], DT_F32, 1, &n, all, &em) < 0) {
        fprintf(stderr, "%s: %s\n", cmdname, em.s);
        rc = EXIT_USAGE;
    }
    free(all);
    return rc;
}

static int cmd_maxerr(int argc, char **argv)
{
    static const struct option opts[] = {
        { "head", required_argument, NULL, 'H' },
        { "nan-same", no_argument, NULL, 'N' },
        { NULL, 0, NULL, 0 },
    };
    struct arr a, b;
    int64_t head = 0, n;
    int c, rc, nan_same = 0;

    while ((c = next_opt(argc, argv, opts)) != -1) {
        if (c == 'N') {
            nan_same = 1;
            continue;
        }
        if (c != 'H')
            return EXIT_USAGE;
        if ((head = parse_head(optarg)) < 1)
            return usage_error("--head '%s' is not a count >= 1", optarg);
    }
    if (optind != argc - 2)
        return usage_error("needs two files, A.npy B.npy");
    if ((rc = load_pair(argv[optind], argv[optind + 1], head, &a, &b, &n)) != 0)
        return rc;
    if (nan_same)
        drop_common_nan(&a, &b, &n);
    printf("%.3e\n", ref_max_abs_err(a.data, b.data, n, 0.0f, 0.0f, NULL, NULL));
    arr_free(&b);
    arr_free(&a);
    return 0;
}

/* tokbin OUT --n N --vocab V --seed S [--format F]: N tokens in [0, V),
 * each a function of (seed, index) (engine/data/gen.h), as an llm.c uint16
 * shard (u16, the default) or a 1-D .npy array of int32 or int64 ids
 * (npy-i32, npy-i64): the same seed gives the same tokens in every format.
 * With --docs L1,L2,... --eot E instead of --n: packed documents as llm.c
 * writes them, each of Li tokens starting with E (the others never E),
 * and one E after the last (the next document's start: the last target);
 * with --doc K only document K, its Li tokens and that E after it, the
 * same tokens as in the packed file. */
static int cmd_tokbin(int argc, char **argv)
{
    static const struct option opts[] = {
        { "n", required_argument, NULL, 'n' },
        { "vocab", required_argument, NULL, 'v' },
        { "seed", required_argument, NULL, 's' },
        { "format", required_argument, NULL, 'f' },
        { "docs", required_argument, NULL, 'd' },
        { "eot", required_argument, NULL, 'e' },
        { "doc", required_argument, NULL, 'k' },
        { NULL, 0, NULL, 0 },
    };
    long long n = 0, vocab = 0, seed = 0, eot = -1, doc = -1, len[256];
    int ndoc = 0;
    enum dt_tok_format fmt = DT_TOK_U16;
    dt_emsg_t em = { "" };
    int c;

    while ((c = next_opt(argc, argv, opts)) != -1) {
        char *end;
        long long v;

        if (c == 'f') {
            if (strcmp(optarg, "u16") == 0)
                fmt = DT_TOK_U16;
            else if (strcmp(optarg, "npy-i32") == 0)
                fmt = DT_TOK_NPY_I32;
            else if (strcmp(optarg, "npy-i64") == 0)
                fmt = DT_TOK_NPY_I64;
            else
                return usage_error("tokbin: --format is u16, npy-i32 or npy-i64, not '%s'",
                                   optarg);
            continue;
        }
        if (c == 'd') {
            for (char *p = optarg; ndoc < 256; p = end + 1) {
                len[ndoc] = strtoll(p, &end, 10);
                if (end == p || len[ndoc] < 1)
                    return usage_error("tokbin: --docs takes lengths >= 1, L1,L2,...");
                n += len[ndoc++];
                if (*end != ',')
                    break;
            }
            if (*end != '\0')
                return usage_error("tokbin: --docs takes at most 256 lengths, L1,L2,...");
            continue;
        }
        v = c == '?' ? -1 : strtoll(optarg, &end, 10);
        if (c == '?' || *end != '\0' || v < 0)
            return usage_error("tokbin: --n, --vocab, --seed, --eot and --doc take "
                               "non-negative integers");
        if (c == 'n')
            n = v;
        else if (c == 'v')
            vocab = v;
        else if (c == 'e')
            eot = v;
        else if (c == 'k')
            doc = v;
        else
            seed = v;
    }
    if (ndoc > 0 && (eot < 0 || eot >= vocab || vocab < 2 || doc >= ndoc))
        return usage_error("tokbin: --docs needs --eot E in [0, V) (and --doc K below the "
                           "number of documents)");
    if (optind != argc - 1 || n <= 0 || vocab <= 0 || vocab > INT32_MAX ||
        (fmt == DT_TOK_U16 && vocab > 65536))
        return usage_error("tokbin: OUT --n N | --docs L1,.. --eot E [--doc K], --vocab V "
                           "(V <= 65536 for u16) [--seed S] [--format u16|npy-i32|npy-i64]");
    int32_t *tok = malloc((size_t)n * sizeof(*tok));
    if (tok == NULL)
        return EXIT_USAGE;
    for (long long i = 0; i < n; i++)
        tok[i] = (int32_t)(dt_gen_uniform((uint64_t)seed, 9, (uint64_t)i) * (double)vocab);
    long long from = 0;
    if (ndoc > 0) {
        /* documents: an E at each start and after the last; the rest
         * drawn from the V - 1 other tokens */
        int32_t *grown = realloc(tok, (size_t)(n + 1) * sizeof(*tok));
        if (grown == NULL) {
            free(tok);
            return EXIT_USAGE;
        }
        tok = grown;
        for (long long i = 0; i < n; i++) {
            int32_t t = (int32_t)(dt_gen_uniform((uint64_t)seed, 9, (uint64_t)i) *
                                  (double)(vocab - 1));
            tok[i] = t >= eot ? t + 1 : t;
        }
        long long at = 0;
        for (int d = 0; d <= ndoc; at += d < ndoc ? len[d] : 0, d++) {
            tok[at] = (int32_t)eot;
            if (d == doc)
                from = at;
        }
        if (doc >= 0)
            n = len[doc];
        n++;
    }
    int rc = dt_tok_save(argv[optind], fmt, tok + from, n, &em);
    free(tok);
    if (rc < 0) {
        fprintf(stderr, "npytool tokbin: %s\n", em.s);
        return EXIT_USAGE;
    }
    return 0;
}

/* ---- sttensors --------------------------------------------------------- */

static int by_line(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* sttensors FILE.safetensors...: one line per tensor of all the files,
 * "NAME DTYPE [SHAPE] SHA256-OF-ITS-BYTES", sorted by name, so that two
 * models (one file or shards, any tensor order, any metadata) compare
 * with cmp: the same tensors, bit for bit. */
static int cmd_sttensors(int argc, char **argv)
{
    char **lines = NULL;
    size_t n = 0;
    int rc = 0;

    if (argc < 2)
        return usage_error("sttensors: FILE.safetensors...");
    for (int f = 1; f < argc && rc == 0; f++) {
        dt_st_reader_t *r = NULL;
        dt_emsg_t em = { "" };

        if ((rc = dt_st_open(argv[f], &r, &em)) < 0) {
            rc = file_error(rc, &em);
            break;
        }
        for (size_t i = 0; i < dt_st_count(r) && rc == 0; i++) {
            const dt_st_tensor_t *t = dt_st_tensor(r, i);
            size_t nb = (size_t)(t->end - t->begin), k;
            void *buf = dt_xmalloc(nb > 0 ? nb : 1);
            char hex[DT_SHA256_HEX], shape[160];

            if ((rc = dt_st_read(r, t->name, buf, nb, &em)) < 0) {
                rc = file_error(rc, &em);
            } else {
                dt_sha256_hex(buf, nb, hex);
                k = (size_t)snprintf(shape, sizeof(shape), "[");
                for (int d = 0; d < t->ndim && k < sizeof(shape); d++)
                    k += (size_t)snprintf(shape + k, sizeof(shape) - k, "%s%" PRId64,
                                          d ? "," : "", t->shape[d]);
                if (k < sizeof(shape))
                    snprintf(shape + k, sizeof(shape) - k, "]");
                lines = dt_xrealloc(lines, (n + 1) * sizeof(*lines));
                lines[n++] = dt_xasprintf("%s %s %s %s", t->name, dt_st_dtype_name(t->dtype),
                                          shape, hex);
            }
            free(buf);
        }
        dt_st_close(r);
    }
    if (n > 1)
        qsort(lines, n, sizeof(*lines), by_line);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0)
            printf("%s\n", lines[i]);
        free(lines[i]);
    }
    free(lines);
    return rc;
}

/* ---- main ------------------------------------------------------------- */

static const struct cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *args;
    const char *help;
} cmds[] = {
    { "gen", cmd_gen, "--shape A,B,.. --seed S --stream N [--f16] OUT.npy",
      "write dt_gen_normal values (flat index from 0) as float32, or float16" },
    { "blocks", cmd_blocks, "--blocks NB [--heads H] [--seed S] [--bool] [--csr ROWPTR.npy,COLS.npy] OUT.npy",
      "a random block mask for dtengine attn --block-mask: (NB, NB) or (H, NB, NB) uint8" },
    { "ref", cmd_ref,
      "--q Q.npy --k K.npy --v V.npy --out O.npy [--lse L.npy] [--causal]\n"
      "        [--scale X] [--segments w1,.. --dilations r1,..]\n"
      "        [--doc-lengths L1,.. ] [--sliding-window W] [--block-mask M.npy --mask-block B]\n"
      "        [--dout dO.npy --dq dQ.npy --dk dK.npy --dv dV.npy]",
      "reference attention: o (T, H, D), lse (H, T) and gradients, float32;\n"
      "        q (T, H, D), k and v (T, Hkv, D); scale defaults to 1/sqrt(D)" },
    { "cmp", cmd_cmp, "A.npy B.npy [--atol X] [--rtol Y] [--head N] [--nan-same]",
      "check |A - B| <= atol + rtol |B| (defaults 1e-5, 0) over the whole arrays, or\n"
      "        their first N elements (--nan-same: but where both are NaN); float32,\n"
      "        float16 or float64; exit 1 if not" },
    { "cat", cmd_cat, "OUT.npy A.npy [B.npy ...]",
      "the elements of A, B, ... one after another, as a 1-D float32 array" },
    { "maxerr", cmd_maxerr, "A.npy B.npy [--head N] [--nan-same]",
      "print max |A - B| as %.3e (of the first N elements)" },
    { "tokbin", cmd_tokbin,
      "OUT --n N|--docs L1,.. --eot E [--doc K] --vocab V [--seed S] [--format u16|npy-i32|npy-i64]",
      "write N generated tokens in [0, V) as an llm.c uint16 token shard (u16),\n"
      "        or as a 1-D .npy array of int32 or int64 token ids; --docs: packed\n"
      "        documents, each starting with E, and one E after the last (--doc K: only K)" },
    { "sttensors", cmd_sttensors, "FILE.safetensors...",
      "each tensor of the files as NAME DTYPE [SHAPE] SHA256, sorted by name" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage:\n");
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        fprintf(f, "  npytool %s %s\n        %s\n", cmds[i].name, cmds[i].args, cmds[i].help);
    fprintf(f, "exit: 0 ok, 1 comparison failed (values or shapes differ), 2 usage or file "
               "error\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        if (strcmp(argv[1], cmds[i].name) == 0) {
            static char name[32];
            snprintf(name, sizeof(name), "npytool %s", cmds[i].name);
            cmdname = name;
            optind = 1;
            return cmds[i].fn(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "npytool: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
