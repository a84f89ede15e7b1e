/* SPDX-License-Identifier: MIT
 *
 * An attention mask from options and .npy files (maskfile.h).
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "io/maskfile.h"
#include "io/npy.h"

bool dt_mask_args_any(const dt_mask_args_t *a)
{
    return a->doc_lengths != NULL || a->window > 0 || a->block_mask != NULL || a->block > 0;
}

static bool is_npy(const char *s)
{
    size_t n = strlen(s);
    return n > 4 && strcmp(s + n - 4, ".npy") == 0;
}

/* "L1,L2,..." into a new array */
static int parse_list(const char *s, int64_t **out, int64_t *n, dt_emsg_t *em)
{
    int64_t cap = 16, k = 0;
    int64_t *v = dt_xmallocarray((size_t)cap, sizeof(*v));
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno != 0 || (*end != ',' && *end != '\0')) {
            free(v);
            return dt_emsg_set(em, DT_EINVAL, "--doc-lengths '%s': expected lengths "
                               "separated by commas, or a .npy file of them", s);
        }
        if (k == cap)
            v = dt_xrealloc(v, (size_t)(cap *= 2) * sizeof(*v));
        v[k++] = x;
        if (*end == '\0')
            break;
        p = end + 1;
    }
    *out = v;
    *n = k;
    return 0;
}

/* a 1-D integer .npy into a new array */
static int read_ints(const char *opt, const char *path, int64_t **out, int64_t *n,
                     dt_emsg_t *em)
{
    dt_npy_info_t info;
    int rc = dt_npy_read_header(path, &info, em);
    if (rc < 0)
        return rc;
    if (info.dtype != DT_I32 && info.dtype != DT_I64)
        return dt_emsg_set(em, DT_EDTYPE, "%s %s: dtype %s; int32 or int64 expected", opt, path,
                           dt_npy_dtype_name(info.dtype));
    if (info.ndim != 1 && !(info.ndim == 2 && strcmp(opt, "--block-mask") == 0))
        return dt_emsg_set(em, DT_ESHAPE, "%s %s: %d dimensions; 1 expected", opt, path,
                           info.ndim);
    *out = dt_xmallocarray((size_t)(info.count > 0 ? info.count : 1), sizeof(**out));
    if ((rc = dt_npy_read_ints(path, &info, *out, em)) < 0) {
        free(*out);
        *out = NULL;
        return rc;
    }
    *n = info.count;
    return 0;
}

static int load_docs(dt_mask_t *m, const char *arg, dt_emsg_t *em)
{
    int64_t *len = NULL, n = 0;
    int rc = is_npy(arg) ? read_ints("--doc-lengths", arg, &len, &n, em)
                         : parse_list(arg, &len, &n, em);
    if (rc == 0 && (rc = dt_mask_set_docs(m, len, n, em)) < 0) {
        dt_emsg_t inner = *em;
        dt_emsg_set(em, rc, "--doc-lengths%s%s: %s", is_npy(arg) ? " " : "",
                    is_npy(arg) ? arg : "", inner.s);
    }
    free(len);
    return rc;
}

static int load_dense(dt_mask_t *m, const char *path, int64_t B, int H, dt_emsg_t *em)
{
    dt_npy_info_t info;
    int rc = dt_npy_read_header(path, &info, em);
    if (rc < 0)
        return rc;
    if (info.dtype != DT_BOOL && info.dtype != DT_U8)
        return dt_emsg_set(em, DT_EDTYPE, "--block-mask %s: dtype %s; bool or uint8 expected",
                           path, dt_npy_dtype_name(info.dtype));
    int64_t nb = m->T / B;
    int nhead = info.ndim == 3 ? (int)info.shape[0] : 1;
    const int64_t *sh = info.shape + (info.ndim == 3);
    if ((info.ndim != 2 && info.ndim != 3) || sh[0] != nb || sh[1] != nb ||
        (info.ndim == 3 && info.shape[0] != H && info.shape[0] != 1))
    {
        char shp[128];
        int k = snprintf(shp, sizeof(shp), "(");
        for (int d = 0; d < info.ndim && k < 100; d++)
            k += snprintf(shp + k, sizeof(shp) - (size_t)k, "%s%lld", d ? ", " : "",
                          (long long)info.shape[d]);
        snprintf(shp + k, sizeof(shp) - (size_t)k, ")");
        return dt_emsg_set(em, DT_ESHAPE, "--block-mask %s: shape %s; (%lld, %lld) or (%d, "
                           "%lld, %lld) expected (T / B = %lld / %lld blocks a side, %d heads)",
                           path, shp, (long long)nb, (long long)nb, H, (long long)nb,
                           (long long)nb, (long long)m->T, (long long)B, H);
    }
    uint8_t *d = dt_xmallocarray((size_t)(info.count > 0 ? info.count : 1), 1);
    rc = dt_npy_read_bytes(path, &info, d, em);
    if (rc == 0 && (rc = dt_mask_set_blocks_dense(m, B, nhead, d, em)) < 0) {
        dt_emsg_t inner = *em;
        dt_emsg_set(em, rc, "--block-mask %s: %s", path, inner.s);
    }
    free(d);
    return rc;
}

static int load_csr(dt_mask_t *m, const char *arg, int64_t B, int H, dt_emsg_t *em)
{
    const char *comma = strchr(arg, ',');
    char *rows = dt_xasprintf("%.*s", (int)(comma - arg), arg);
    const char *cols = comma + 1;
    int64_t *rp = NULL, *ci = NULL, nrp = 0, nci = 0, nb = m->T / B;
    dt_npy_info_t info;
    int rc = dt_npy_read_header(rows, &info, em);
    if (rc == 0 && info.ndim == 2 && info.shape[0] != H && info.shape[0] != 1)
        rc = dt_emsg_set(em, DT_ESHAPE, "--block-mask %s: %lld rows of row pointers; 1 or the "
                         "%d heads expected", rows, (long long)info.shape[0], H);
    int nhead = rc == 0 && info.ndim == 2 ? (int)info.shape[0] : 1;
    if (rc == 0)
        rc = read_ints("--block-mask", rows, &rp, &nrp, em);
    if (rc == 0 && nrp != (int64_t)nhead * (nb + 1))
        rc = dt_emsg_set(em, DT_ESHAPE, "--block-mask %s: %lld row pointers per head; T / B + "
                         "1 = %lld expected", rows, (long long)(nrp / nhead), (long long)(nb + 1));
    if (rc == 0)
        rc = read_ints("--block-mask", cols, &ci, &nci, em);
    if (rc == 0 && (rc = dt_mask_set_blocks_csr(m, B, nhead, rp, nci, ci, em)) < 0) {
        dt_emsg_t inner = *em;
        dt_emsg_set(em, rc, "--block-mask %s: %s", arg, inner.s);
    }
    free(ci);
    free(rp);
    free(rows);
    return rc;
}

int dt_mask_load(dt_mask_t *m, const dt_mask_args_t *a, int64_t T, bool causal, int H,
                 dt_emsg_t *em)
{
    int rc = 0;
    dt_mask_init(m, T, causal);
    if (a->doc_lengths && (rc = load_docs(m, a->doc_lengths, em)) < 0)
        return rc;
    if (a->window != 0 && (rc = dt_mask_set_window(m, a->window, em)) < 0) {
        dt_emsg_t inner = *em;
        return dt_emsg_set(em, rc, "--sliding-window: %s", inner.s);
    }
    if ((a->block_mask != NULL) != (a->block > 0))
        return dt_emsg_set(em, DT_EINVAL, a->block_mask ? "--block-mask needs --mask-block B "
                                                          "(the block size)"
                                                        : "--mask-block needs --block-mask");
    if (a->block_mask == NULL)
        return 0;
    if (a->block < 1 || T % a->block != 0)
        return dt_emsg_set(em, DT_EINVAL, "--mask-block %lld does not divide the sequence length "
                           "%lld", (long long)a->block, (long long)T);
    if (strchr(a->block_mask, ','))
        return load_csr(m, a->block_mask, a->block, H, em);
    return load_dense(m, a->block_mask, a->block, H, em);
}
