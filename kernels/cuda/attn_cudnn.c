/* SPDX-License-Identifier: MIT
 *
 * cuDNN's fused attention through its graph API (contract in
 * kernels/cuda/attn_cudnn.h): the loader, the two graphs, their plans and
 * cache, and the calls.
 *
 * The graphs are the patterns cuDNN's fused ("flash") attention engines
 * recognise, written out op by op (cuDNN 9 before the unified SDPA
 * operation of 9.21; the same shapes NVIDIA's cudnn-frontend lowers its
 * SDPA nodes to). Forward:
 *     S = Q K^T; S *= scale; [causal: S = row + shift >= col ? S : -inf]
 *     M = rowmax S; E = exp(S - M); Z = rowsum E; stats = M + log Z
 *     P = E / Z (in the input type); O = P V
 * Backward (dO, O, the final stats):
 *     Dsum = rowsum(dO * O)  (fp32, in the workspace)
 *     S = Q K^T * scale - stats; [causal]; E = exp(S)   (= P)
 *     dV = E^T dO; dP = dO V^T; dS = (dP - Dsum) * E * scale
 *     dK = dS^T Q; dQ = dS K   (dQ through an fp32 accumulator in the
 *     workspace unless deterministic: cuDNN then takes its ordered path)
 * With GQA the K/V-side products are per query head and reduced over each
 * group of h / hkv heads.
 *
 * Not here: choosing cuDNN or dt's kernels and cutting the ring's blocks
 * into pieces cuDNN takes (engine/attn/attn_block.c); merging a block's
 * output into the ring's fp32 state (attn_aux.cu).
 */
#include "config.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "kernels/cuda/attn_cudnn.h"
#include "kernels/cuda/cuda_err.h"

#ifdef HAVE_CUDNN_GRAPH_H

#include <cudnn_graph.h>

/* ---- the library ------------------------------------------------------------ */

static struct {
    size_t (*GetVersion)(void);
    cudnnStatus_t (*Create)(cudnnHandle_t *);
    cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
    const char *(*GetErrorString)(cudnnStatus_t);
    void (*GetLastErrorString)(char *, size_t);
    cudnnStatus_t (*CreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*DestroyDescriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*Finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*SetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                  cudnnBackendAttributeType_t, int64_t, const void *);
    cudnnStatus_t (*GetAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                  cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*Execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} dn;

static pthread_mutex_t dn_mu = PTHREAD_MUTEX_INITIALIZER;
static int dn_state; /* 0 not tried, 1 loaded, -1 failed (dn_why) */
static char dn_why[256];
static size_t dn_ver;

static int dn_open(void)
{
    static const char *const names[] = { "libcudnn.so.9", "libcudnn.so" };
    void *h = NULL;

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && h == NULL; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(dn_why, sizeof(dn_why), "cuDNN cannot be loaded: %s", dlerror());
        return -1;
    }
    const struct {
        void **slot;
        const char *sym;
    } syms[] = {
        { (void **)&dn.GetVersion, "cudnnGetVersion" },
        { (void **)&dn.Create, "cudnnCreate" },
        { (void **)&dn.SetStream, "cudnnSetStream" },
        { (void **)&dn.GetErrorString, "cudnnGetErrorString" },
        { (void **)&dn.GetLastErrorString, "cudnnGetLastErrorString" },
        { (void **)&dn.CreateDescriptor, "cudnnBackendCreateDescriptor" },
        { (void **)&dn.DestroyDescriptor, "cudnnBackendDestroyDescriptor" },
        { (void **)&dn.Finalize, "cudnnBackendFinalize" },
        { (void **)&dn.SetAttribute, "cudnnBackendSetAttribute" },
        { (void **)&dn.GetAttribute, "cudnnBackendGetAttribute" },
        { (void **)&dn.Execute, "cudnnBackendExecute" },
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++)
        if ((*syms[i].slot = dlsym(h, syms[i].sym)) == NULL) {
            snprintf(dn_why, sizeof(dn_why), "cuDNN has no %s (a cuDNN 9 is needed)",
                     syms[i].sym);
            return -1;
        }
    dn_ver = dn.GetVersion();
    if (dn_ver < 90000 || dn_ver >= 100000) {
        snprintf(dn_why, sizeof(dn_why), "cuDNN %zu is not a cuDNN 9", dn_ver);
        return -1;
    }
    return 0;
}

size_t dt_cudnn_version(dt_emsg_t *em)
{
    pthread_mutex_lock(&dn_mu);
    if (dn_state == 0)
        dn_state = dn_open() == 0 ? 1 : -1;
    pthread_mutex_unlock(&dn_mu);
    if (dn_state < 0) {
        if (em != NULL)
            dt_emsg_set(em, DT_ENOTSUP, "%s", dn_why);
        return 0;
    }
    return dn_ver;
}

static int dn_err(dt_emsg_t *em, cudnnStatus_t s, const char *what, int line)
{
    char last[512] = "";

    dn.GetLastErrorString(last, sizeof(last));
    return dt_emsg_set(em, s == CUDNN_STATUS_NOT_SUPPORTED ? DT_ENOTSUP : DT_EDEVICE,
                       "attn_cudnn.c:%d: %s: %s%s%s", line, what, dn.GetErrorString(s),
                       last[0] ? ": " : "", last);
}

/* ---- building a graph ------------------------------------------------------- */

#define MAXD 256 /* descriptors of one graph (tensors, ops, their descriptors, configs) */
#define MAXOPS 32

typedef struct gb {
    cudnnBackendDescriptor_t d[MAXD]; /* everything made, destroyed with the graph */
    int nd;
    cudnnBackendDescriptor_t ops[MAXOPS];
    int nops;
    int64_t next_uid;
    cudnnStatus_t s; /* the first failure */
    const char *what;
    int line;
} gb_t;

/* Record the first failure; later calls do nothing. */
#define GB(g, call)                                  \
    do {                                             \
        if ((g)->s == CUDNN_STATUS_SUCCESS) {        \
            cudnnStatus_t s_ = (call);               \
            if (s_ != CUDNN_STATUS_SUCCESS) {        \
                (g)->s = s_;                         \
                (g)->what = #call;                   \
                (g)->line = __LINE__;                \
            }                                        \
        }                                            \
    } while (0)

static cudnnBackendDescriptor_t mk(gb_t *g, cudnnBackendDescriptorType_t t)
{
    cudnnBackendDescriptor_t d = NULL;

    if (g->s != CUDNN_STATUS_SUCCESS)
        return NULL;
    if (g->nd == MAXD) {
        g->s = CUDNN_STATUS_INTERNAL_ERROR;
        g->what = "too many descriptors";
        g->line = __LINE__;
        return NULL;
    }
    GB(g, dn.CreateDescriptor(t, &d));
    if (g->s == CUDNN_STATUS_SUCCESS)
        g->d[g->nd++] = d;
    return d;
}

static void set(gb_t *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n,
                cudnnBackendAttributeType_t t, int64_t count, const void *v)
{
    if (d != NULL)
        GB(g, dn.SetAttribute(d, n, t, count, v));
}

static void fin(gb_t *g, cudnnBackendDescriptor_t d)
{
    if (d != NULL)
        GB(g, dn.Finalize(d));
}

static void gb_free(gb_t *g)
{
    for (int i = g->nd - 1; i >= 0; i--)
        dn.DestroyDescriptor(g->d[i]);
    g->nd = 0;
}

typedef struct { int64_t v[4]; } dims_t;

static dims_t D4(int64_t a, int64_t b, int64_t c, int64_t d)
{
    dims_t x = { { a, b, c, d } };
    return x;
}

/* A tensor: uid 0 makes a virtual one with the next free uid. */
static cudnnBackendDescriptor_t tens(gb_t *g, int64_t uid, cudnnDataType_t t, dims_t dim,
                                     dims_t str, bool byval)
{
    cudnnBackendDescriptor_t d = mk(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    bool virt = uid == 0;
    int64_t align = 16;

    if (virt)
        uid = g->next_uid++;
    set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t);
    set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim.v);
    set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str.v);
    set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (byval)
        set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
    fin(g, d);
    return d;
}

/* A scalar passed by value at execution (the variant pack points at the host value). */
static cudnnBackendDescriptor_t scalar(gb_t *g, int64_t uid, cudnnDataType_t t)
{
    return tens(g, uid, t, D4(1, 1, 1, 1), D4(1, 1, 1, 1), true);
}

static void add_op(gb_t *g, cudnnBackendDescriptor_t op)
{
    fin(g, op);
    if (g->s != CUDNN_STATUS_SUCCESS)
        return;
    if (g->nops == MAXOPS) {
        g->s = CUDNN_STATUS_INTERNAL_ERROR;
        g->what = "too many operations";
        g->line = __LINE__;
        return;
    }
    g->ops[g->nops++] = op;
}

/* y = mode(x[, b[, t]]) elementwise, computed in prec; axis >= 0 for
 * GEN_INDEX (and as the frontend sets it on index arithmetic). */
static void pw(gb_t *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
               cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t p = mk(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);

    set(g, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(g, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0)
        set(g, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    fin(g, p);
    cudnnBackendDescriptor_t op = mk(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b != NULL)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t != NULL)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add_op(g, op);
}

/* c = a b (batched over the first two dimensions), fp32 accumulation. */
static void matmul(gb_t *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c)
{
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = mk(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);

    set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    fin(g, m);
    cudnnBackendDescriptor_t op = mk(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    add_op(g, op);
}

/* y = reduce(x) over the dimensions where y has extent 1. */
static void reduce(gb_t *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t y)
{
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = mk(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);

    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    fin(g, r);
    cudnnBackendDescriptor_t op = mk(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    add_op(g, op);
}

/* y is x seen with other dimensions and strides (a transpose). */
static void reshape(gb_t *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = mk(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);

    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add_op(g, op);
}

/* The uids of the graphs' tensors that calls bind (virtual ones start at 100). */
enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV,
    U_SCALE, U_NEGINF, U_SHIFT, U_ONE, U_DSUM, U_DQACC,
    U_FIRST_VIRTUAL = 100
};

static cudnnDataType_t io_type(dt_dtype_t t)
{
    return t == DT_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

static int64_t causal_shift(const dt_cudnn_sdpa_t *a)
{
    return a->shift >= a->tk - 1 ? DT_CUDNN_FULL : a->shift;
}

/* s (1, h, tq, tk) fp32 -> the same with keys after row + shift at -inf. */
static cudnnBackendDescriptor_t mask(gb_t *g, const dt_cudnn_sdpa_t *a,
                                     cudnnBackendDescriptor_t s)
{
    const int64_t h = a->h, tq = a->tq, tk = a->tk;
    const dims_t sd = D4(1, h, tq, tk), ss = D4(h * tq * tk, tq * tk, tk, 1);
    cudnnBackendDescriptor_t row = tens(g, 0, CUDNN_DATA_INT32, sd, ss, false);
    cudnnBackendDescriptor_t col = tens(g, 0, CUDNN_DATA_INT32, sd, ss, false);

    pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, s, NULL, NULL, row);
    pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, s, NULL, NULL, col);
    if (a->shift != 0) {
        cudnnBackendDescriptor_t r2 = tens(g, 0, CUDNN_DATA_INT32, sd, ss, false);
        pw(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, 3, row, scalar(g, U_SHIFT, CUDNN_DATA_INT32),
           NULL, r2);
        row = r2;
    }
    cudnnBackendDescriptor_t keep = tens(g, 0, CUDNN_DATA_BOOLEAN, sd, ss, false);
    pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
    cudnnBackendDescriptor_t out = tens(g, 0, CUDNN_DATA_FLOAT, sd, ss, false);
    pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s,
       scalar(g, U_NEGINF, CUDNN_DATA_FLOAT), keep, out);
    return out;
}

/* Q (1, h, tq, d), K^T (1, hkv, d, tk) and V (1, hkv, tk, d) (transposed:
 * V^T (1, hkv, d, tk)) over the caller's row-major (t, heads, d). */
static void qkv(gb_t *g, const dt_cudnn_sdpa_t *a, int vt, cudnnBackendDescriptor_t *q,
                cudnnBackendDescriptor_t *kt, cudnnBackendDescriptor_t *v)
{
    const cudnnDataType_t io = io_type(a->dtype);
    const int64_t h = a->h, hkv = a->hkv, d = a->d, tq = a->tq, tk = a->tk;

    *q = tens(g, U_Q, io, D4(1, h, tq, d), D4(tq * a->ldq, d, a->ldq, 1), false);
    *kt = tens(g, U_K, io, D4(1, hkv, d, tk), D4(tk * a->ldk, d, 1, a->ldk), false);
    if (vt)
        *v = tens(g, U_V, io, D4(1, hkv, d, tk), D4(tk * a->ldv, d, 1, a->ldv), false);
    else
        *v = tens(g, U_V, io, D4(1, hkv, tk, d), D4(tk * a->ldv, d, a->ldv, 1), false);
}

static void build_fwd(gb_t *g, const dt_cudnn_sdpa_t *a)
{
    const cudnnDataType_t io = io_type(a->dtype), f = CUDNN_DATA_FLOAT;
    const int64_t h = a->h, d = a->d, tq = a->tq, tk = a->tk;
    const dims_t sd = D4(1, h, tq, tk), ss = D4(h * tq * tk, tq * tk, tk, 1);
    const dims_t rd = D4(1, h, tq, 1), rs = D4(h * tq, tq, 1, 1);
    cudnnBackendDescriptor_t q, kt, v;

    qkv(g, a, 0, &q, &kt, &v);
    cudnnBackendDescriptor_t s = tens(g, 0, f, sd, ss, false);
    matmul(g, q, kt, s);
    cudnnBackendDescriptor_t s1 = tens(g, 0, f, sd, ss, false);
    pw(g, CUDNN_POINTWISE_MUL, f, -1, s, scalar(g, U_SCALE, f), NULL, s1);
    if (causal_shift(a) != DT_CUDNN_FULL)
        s1 = mask(g, a, s1);
    cudnnBackendDescriptor_t m = tens(g, 0, f, rd, rs, false);
    reduce(g, CUDNN_REDUCE_TENSOR_MAX, s1, m);
    cudnnBackendDescriptor_t sub = tens(g, 0, f, sd, ss, false);
    pw(g, CUDNN_POINTWISE_SUB, f, -1, s1, m, NULL, sub);
    cudnnBackendDescriptor_t e = tens(g, 0, f, sd, ss, false);
    pw(g, CUDNN_POINTWISE_EXP, f, -1, sub, NULL, NULL, e);
    cudnnBackendDescriptor_t z = tens(g, 0, f, rd, rs, false);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    cudnnBackendDescriptor_t lz = tens(g, 0, f, rd, rs, false);
    pw(g, CUDNN_POINTWISE_LOG, f, -1, z, NULL, NULL, lz);
    cudnnBackendDescriptor_t stats = tens(g, U_STATS, f, rd, rs, false);
    pw(g, CUDNN_POINTWISE_ADD, f, -1, m, lz, NULL, stats);
    cudnnBackendDescriptor_t p = tens(g, 0, io, sd, ss, false);
    pw(g, CUDNN_POINTWISE_DIV, f, -1, e, z, NULL, p);
    cudnnBackendDescriptor_t o = tens(g, U_O, io, D4(1, h, tq, d), D4(tq * a->ldo, d, a->ldo, 1),
                                      false);
    matmul(g, p, v, o);
}

/* Bytes of the backward's own fp32 buffers at the start of its workspace:
 * Dsum (h, tq), and the dQ accumulator (h, tq, d) unless deterministic. */
static size_t bwd_own(const dt_cudnn_sdpa_t *a, size_t *dqacc_off)
{
    size_t dsum = ((size_t)a->h * (size_t)a->tq * sizeof(float) + 255) & ~(size_t)255;

    *dqacc_off = dsum;
    if (a->det)
        return dsum;
    return dsum + (((size_t)a->h * (size_t)a->tq * (size_t)a->d * sizeof(float) + 255) &
                   ~(size_t)255);
}

static void build_bwd(gb_t *g, const dt_cudnn_sdpa_t *a)
{
    const cudnnDataType_t io = io_type(a->dtype), f = CUDNN_DATA_FLOAT;
    const int64_t h = a->h, hkv = a->hkv, d = a->d, tq = a->tq, tk = a->tk;
    const dims_t sd = D4(1, h, tq, tk), ss = D4(h * tq * tk, tq * tk, tk, 1);
    const dims_t td = D4(1, h, tk, tq), ts = D4(h * tq * tk, tq * tk, 1, tk); /* transposed */
    const dims_t rd = D4(1, h, tq, 1), rs = D4(h * tq, tq, 1, 1);
    const dims_t qd = D4(1, h, tq, d), os = D4(tq * a->ldo, d, a->ldo, 1);
    const dims_t kd = D4(1, hkv, tk, d), dks = D4(tk * a->lddk, d, a->lddk, 1);
    cudnnBackendDescriptor_t q, kt, vt;

    qkv(g, a, 1, &q, &kt, &vt);
    cudnnBackendDescriptor_t o = tens(g, U_O, io, qd, os, false);
    cudnnBackendDescriptor_t dout = tens(g, U_DO, io, qd, os, false);
    cudnnBackendDescriptor_t stats = tens(g, U_STATS, f, rd, rs, false);

    /* Dsum = rowsum(dO * O), kept in the workspace */
    cudnnBackendDescriptor_t t = tens(g, 0, f, qd, D4(h * tq * d, tq * d, h * d, 1), false);
    pw(g, CUDNN_POINTWISE_MUL, f, -1, dout, o, NULL, t);
    cudnnBackendDescriptor_t r = tens(g, 0, f, rd, rs, false);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, t, r);
    cudnnBackendDescriptor_t dsum = tens(g, U_DSUM, f, rd, rs, false);
    pw(g, CUDNN_POINTWISE_MUL, f, -1, r, scalar(g, U_ONE, f), NULL, dsum);

    /* P = exp(Q K^T * scale - stats), masked */
    cudnnBackendDescriptor_t s = tens(g, 0, f, sd, ss, false);
    matmul(g, q, kt, s);
    cudnnBackendDescriptor_t s1 = tens(g, 0, f, sd, ss, false);
    cudnnBackendDescriptor_t scale = scalar(g, U_SCALE, f);
    pw(g, CUDNN_POINTWISE_MUL, f, -1, s, scale, NULL, s1);
    cudnnBackendDescriptor_t s2 = tens(g, 0, f, sd, ss, false);
    pw(g, CUDNN_POINTWISE_SUB, f, -1, s1, stats, NULL, s2);
    if (causal_shift(a) != DT_CUDNN_FULL)
        s2 = mask(g, a, s2);
    cudnnBackendDescriptor_t e = tens(g, 0, f, sd, ss, false);
    pw(g, CUDNN_POINTWISE_EXP, f, -1, s2, NULL, NULL, e);

    /* dV = P^T dO (per query head, then summed over each GQA group) */
    cudnnBackendDescriptor_t pt = tens(g, 0, io, td, ts, false);
    reshape(g, e, pt);
    cudnnBackendDescriptor_t dv = tens(g, U_DV, io, kd, dks, false);
    if (h == hkv) {
        matmul(g, pt, dout, dv);
    } else {
        cudnnBackendDescriptor_t full = tens(g, 0, io, D4(1, h, tk, d),
                                             D4(h * tk * d, tk * d, d, 1), false);
        matmul(g, pt, dout, full);
        reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, dv);
    }

    /* dS = (dO V^T - Dsum) * P * scale */
    cudnnBackendDescriptor_t dp = tens(g, 0, f, sd, ss, false);
    matmul(g, dout, vt, dp);
    cudnnBackendDescriptor_t dp2 = tens(g, 0, f, sd, ss, false);
    pw(g, CUDNN_POINTWISE_SUB, f, -1, dp, dsum, NULL, dp2);
    cudnnBackendDescriptor_t ds = tens(g, 0, f, sd, ss, false);
    pw(g, CUDNN_POINTWISE_MUL, f, -1, dp2, e, NULL, ds);
    cudnnBackendDescriptor_t ds2 = tens(g, 0, f, sd, ss, false);
    pw(g, CUDNN_POINTWISE_MUL, f, -1, ds, scale, NULL, ds2);

    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = tens(g, 0, io, td, ts, false);
    reshape(g, ds2, dst);
    cudnnBackendDescriptor_t dk = tens(g, U_DK, io, kd, dks, false);
    if (h == hkv) {
        matmul(g, dst, q, dk);
    } else {
        cudnnBackendDescriptor_t full = tens(g, 0, io, D4(1, h, tk, d),
                                             D4(h * tk * d, tk * d, d, 1), false);
        matmul(g, dst, q, full);
        reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, dk);
    }

    /* dQ = dS K */
    cudnnBackendDescriptor_t k = tens(g, 0, io, kd, D4(tk * a->ldk, d, a->ldk, 1), false);
    reshape(g, kt, k);
    cudnnBackendDescriptor_t dq = tens(g, U_DQ, io, qd, os, false);
    if (a->det) {
        matmul(g, ds2, k, dq);
    } else {
        cudnnBackendDescriptor_t acc = tens(g, U_DQACC, f, qd, D4(h * tq * d, tq * d, d, 1),
                                            false);
        matmul(g, ds2, k, acc);
        pw(g, CUDNN_POINTWISE_IDENTITY, f, -1, acc, NULL, NULL, dq);
    }
}

/* ---- plans -------------------------------------------------------------------- */

/* A graph's plan for one shape: cached for the process's life. */
typedef struct plan {
    struct plan *next;
    dt_cudnn_sdpa_t key;
    int bwd, dev;
    cudnnBackendDescriptor_t plan;
    size_t ws;     /* cuDNN's workspace (after the backward's own buffers) */
    size_t own;    /* the backward's own buffers (bwd_own) */
    size_t dqacc;  /* offset of the dQ accumulator in the workspace */
    float scale, neginf, one;
} plan_t;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static plan_t *cache;
static cudnnHandle_t handles[64];

/* a with the fields that do not change the graph cleared, scale and shift normalised */
static dt_cudnn_sdpa_t norm_key(const dt_cudnn_sdpa_t *a, int bwd)
{
    dt_cudnn_sdpa_t k = *a;

    /* the graph knows full, the diagonal, or a shifted diagonal; the shift
     * itself is a scalar given at execution (one plan for every chunk) */
    k.shift = causal_shift(a);
    if (k.shift != DT_CUDNN_FULL && k.shift != 0)
        k.shift = 1;
    if (k.scale == 0)
        k.scale = 1.0f / sqrtf((float)a->d);
    if (!bwd) {
        k.det = 0;
        k.lddk = 0;
    }
    return k;
}

static int same_key(const dt_cudnn_sdpa_t *x, const dt_cudnn_sdpa_t *y)
{
    return x->tq == y->tq && x->tk == y->tk && x->h == y->h && x->hkv == y->hkv &&
           x->d == y->d && x->dtype == y->dtype && x->ldq == y->ldq && x->ldk == y->ldk &&
           x->ldv == y->ldv && x->ldo == y->ldo && x->lddk == y->lddk && x->shift == y->shift &&
           x->scale == y->scale && x->det == y->det;
}

/* Whether an engine is marked non-deterministic. */
static int nondeterministic(gb_t *g, cudnnBackendDescriptor_t cfg, int64_t *index)
{
    cudnnBackendDescriptor_t eng = mk(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t n = 0, one = 0;

    if (eng == NULL)
        return 1;
    GB(g, dn.GetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                          &one, &eng));
    GB(g, dn.GetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &one,
                          index));
    GB(g, dn.GetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                          CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes));
    if (g->s != CUDNN_STATUS_SUCCESS)
        return 1;
    for (int64_t i = 0; i < n; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)
            return 1;
    return 0;
}

#define MAXCFG 16

/* Build the graph of a and the first plan its heuristics give that
 * finalises (deterministic when a->det): *out owns the plan descriptor.
 * On a device the graph and the plan take the handle h (the path every
 * cuDNN 9 takes); offline (h NULL) they take props, a DEVICEPROP
 * descriptor made from a device's JSON. A DEVICEPROP made from a live
 * handle is refused by cuDNN 9.19 on an H200 ("fromSerialization ||
 * initialized", seen 2026-12-04), so the live path does not use one. */
static int make_plan(const dt_cudnn_sdpa_t *a, int bwd, cudnnHandle_t h,
                     cudnnBackendDescriptor_t props, int offline, cudnnBackendDescriptor_t *out,
                     size_t *ws, int64_t *engine, dt_emsg_t *em)
{
    gb_t g = { .next_uid = U_FIRST_VIRTUAL };
    cudnnBackendDescriptor_t cfg[MAXCFG] = { 0 }, plan = NULL;
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    int64_t n = 0, wsz = 0;
    int rc = 0, nondet = 0, tried = 0;
    char why[256] = "";

    if (bwd)
        build_bwd(&g, a);
    else
        build_fwd(&g, a);
    cudnnBackendDescriptor_t graph = mk(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (h != NULL)
        set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops);
    fin(&g, graph);
    cudnnBackendDescriptor_t heur = mk(&g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set(&g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    set(&g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (props != NULL)
        set(&g, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &props);
    fin(&g, heur);
    for (int i = 0; i < MAXCFG; i++)
        cfg[i] = mk(&g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    GB(&g, dn.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                           MAXCFG, &n, cfg));
    if (g.s != CUDNN_STATUS_SUCCESS) {
        rc = dn_err(em, g.s, g.what, g.line);
        goto out;
    }
    for (int64_t i = 0; i < n && plan == NULL; i++) {
        int64_t idx = -1;
        if (a->det && bwd && nondeterministic(&g, cfg[i], &idx)) {
            if (g.s != CUDNN_STATUS_SUCCESS)
                break;
            nondet++;
            continue;
        }
        if (a->det && bwd)
            ; /* idx set by nondeterministic() */
        else {
            (void)nondeterministic(&g, cfg[i], &idx);
            if (g.s != CUDNN_STATUS_SUCCESS)
                break;
        }
        cudnnBackendDescriptor_t p = NULL;
        cudnnStatus_t s = dn.CreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dn.SetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        if (s == CUDNN_STATUS_SUCCESS && h != NULL)
            s = dn.SetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        if (s == CUDNN_STATUS_SUCCESS && props != NULL)
            s = dn.SetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &props);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dn.Finalize(p);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dn.GetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                &n, &wsz);
        tried++;
        if (s == CUDNN_STATUS_SUCCESS) {
            plan = p;
            if (engine != NULL)
                *engine = idx;
        } else if (offline && s == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER) {
            /* compiled; loading the module needs a device: as far as a
             * machine without one gets (the engine config's workspace) */
            dn.DestroyDescriptor(p);
            s = dn.GetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                &n, &wsz);
            if (s != CUDNN_STATUS_SUCCESS)
                wsz = -1;
            if (engine != NULL)
                *engine = idx;
            *out = NULL;
            *ws = (size_t)(wsz < 0 ? 0 : wsz);
            goto out;
        } else {
            dn.GetLastErrorString(why, sizeof(why));
            if (p != NULL)
                dn.DestroyDescriptor(p);
        }
    }
    if (g.s != CUDNN_STATUS_SUCCESS) {
        rc = dn_err(em, g.s, g.what, g.line);
    } else if (plan == NULL) {
        rc = dt_emsg_set(em, DT_ENOTSUP,
                         "cuDNN %zu has no engine for the attention %s (tq %lld, tk %lld, h %d, "
                         "hkv %d, d %d, %s): %lld configurations, %d non-deterministic%s, %d "
                         "failed%s%s",
                         dn_ver, bwd ? "backward" : "forward", (long long)a->tq,
                         (long long)a->tk, a->h, a->hkv, a->d,
                         causal_shift(a) == DT_CUDNN_FULL ? "full" : "causal", (long long)n,
                         nondet, a->det && bwd ? " (skipped)" : "", tried, why[0] ? ": " : "",
                         why);
    } else {
        *out = plan;
        *ws = (size_t)wsz;
    }
out:
    gb_free(&g);
    return rc;
}

/* The cuDNN handle of device dev, made on first use. */
static int device_handle(int dev, cudnnHandle_t *hp, dt_emsg_t *em)
{
    cudnnStatus_t s;

    if (dev < 0 || dev >= (int)(sizeof(handles) / sizeof(handles[0])))
        return dt_emsg_set(em, DT_EINVAL, "attn_cudnn: device %d out of range", dev);
    if (handles[dev] == NULL && (s = dn.Create(&handles[dev])) != CUDNN_STATUS_SUCCESS)
        return dn_err(em, s, "cudnnCreate", __LINE__);
    *hp = handles[dev];
    return 0;
}

static int check_shape(const dt_cudnn_sdpa_t *a, dt_emsg_t *em)
{
    if (a->tq < 1 || a->tk < 1 || a->h < 1 || a->hkv < 1 || a->h % a->hkv != 0)
        return dt_emsg_set(em, DT_EINVAL, "attn_cudnn: bad block tq %lld tk %lld h %d hkv %d",
                           (long long)a->tq, (long long)a->tk, a->h, a->hkv);
    if (a->dtype != DT_BF16 && a->dtype != DT_F16)
        return dt_emsg_set(em, DT_EINVAL, "attn_cudnn: dtype must be bf16 or f16");
    if (a->ldq < (int64_t)a->h * a->d || a->ldk < (int64_t)a->hkv * a->d ||
        a->ldv < (int64_t)a->hkv * a->d || a->ldo < (int64_t)a->h * a->d)
        return dt_emsg_set(em, DT_EINVAL, "attn_cudnn: row strides below the rows");
    return 0;
}

/* The cached plan of a on the current device, built on first use. */
static int get_plan(const dt_cudnn_sdpa_t *a, int bwd, plan_t **pp, cudnnHandle_t *hp,
                    dt_emsg_t *em)
{
    dt_cudnn_sdpa_t k = norm_key(a, bwd);
    int dev = 0, rc;

    if (dt_cudnn_version(em) == 0)
        return DT_ENOTSUP;
    if ((rc = check_shape(a, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaGetDevice(&dev));
    pthread_mutex_lock(&cache_mu);
    for (plan_t *p = cache; p != NULL; p = p->next)
        if (p->bwd == bwd && p->dev == dev && same_key(&p->key, &k)) {
            *pp = p;
            *hp = handles[dev];
            pthread_mutex_unlock(&cache_mu);
            return 0;
        }
    plan_t *p = dt_xcalloc(1, sizeof(*p));
    p->key = k;
    p->bwd = bwd;
    p->dev = dev;
    p->scale = k.scale;
    p->neginf = -INFINITY;
    p->one = 1.0f;
    if ((rc = device_handle(dev, hp, em)) == 0)
        rc = make_plan(&k, bwd, *hp, NULL, 0, &p->plan, &p->ws, NULL, em);
    if (rc == 0) {
        if (bwd)
            p->own = bwd_own(&k, &p->dqacc);
        p->next = cache;
        cache = p;
        *pp = p;
    } else {
        free(p);
    }
    pthread_mutex_unlock(&cache_mu);
    return rc;
}

/* ---- the contract ------------------------------------------------------------ */

int dt_cudnn_supports(const dt_cudnn_sdpa_t *a, int bwd, dt_emsg_t *em)
{
    size_t v = dt_cudnn_version(em);

    return v == 0 ? DT_ENOTSUP : dt_cudnn_rules(a, bwd, v, em);
}

int dt_cudnn_ws(const dt_cudnn_sdpa_t *a, int bwd, size_t *bytes, dt_emsg_t *em)
{
    plan_t *p;
    cudnnHandle_t h;
    int rc = get_plan(a, bwd, &p, &h, em);

    if (rc == 0)
        *bytes = p->own + p->ws;
    return rc;
}

static int run(plan_t *p, cudnnHandle_t h, int n, const int64_t *uids, void *const *ptrs,
               void *ws, cudaStream_t st, dt_emsg_t *em)
{
    cudnnBackendDescriptor_t vp = NULL;
    void *cws = (char *)ws + p->own;
    cudnnStatus_t s = dn.SetStream(h, st);
    int rc = 0;

    if (s == CUDNN_STATUS_SUCCESS)
        s = dn.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (s == CUDNN_STATUS_SUCCESS)
        s = dn.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (s == CUDNN_STATUS_SUCCESS)
        s = dn.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
                            ptrs);
    if (s == CUDNN_STATUS_SUCCESS)
        s = dn.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &cws);
    if (s == CUDNN_STATUS_SUCCESS)
        s = dn.Finalize(vp);
    if (s == CUDNN_STATUS_SUCCESS)
        s = dn.Execute(h, p->plan, vp);
    if (s != CUDNN_STATUS_SUCCESS)
        rc = dn_err(em, s, "cudnnBackendExecute (attention)", __LINE__);
    if (vp != NULL)
        dn.DestroyDescriptor(vp);
    return rc;
}

int dt_cudnn_fwd(const dt_cudnn_sdpa_t *a, const void *q, const void *k, const void *v, void *o,
                 float *stats, void *ws, cudaStream_t st, dt_emsg_t *em)
{
    plan_t *p;
    cudnnHandle_t h;
    int rc = get_plan(a, 0, &p, &h, em);

    if (rc < 0)
        return rc;
    int32_t shift = (int32_t)(p->key.shift == DT_CUDNN_FULL ? 0 : causal_shift(a));
    int64_t uids[8] = { U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF, U_SHIFT };
    void *ptrs[8] = { (void *)q, (void *)k, (void *)v, o, stats, &p->scale, &p->neginf, &shift };
    int n = p->key.shift == DT_CUDNN_FULL ? 6 : p->key.shift == 0 ? 7 : 8;
    return run(p, h, n, uids, ptrs, ws, st, em);
}

int dt_cudnn_bwd(const dt_cudnn_sdpa_t *a, const void *q, const void *k, const void *v,
                 const void *o, const void *dout, const float *lse, void *dq, void *dk, void *dv,
                 void *ws, cudaStream_t st, dt_emsg_t *em)
{
    plan_t *p;
    cudnnHandle_t h;
    int rc = get_plan(a, 1, &p, &h, em);

    if (rc < 0)
        return rc;
    char *w = ws;
    int32_t shift = (int32_t)(p->key.shift == DT_CUDNN_FULL ? 0 : causal_shift(a));
    int64_t uids[16] = { U_Q, U_K, U_V, U_O, U_DO, U_STATS, U_DQ, U_DK, U_DV, U_SCALE, U_ONE,
                         U_DSUM };
    void *ptrs[16] = { (void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, (void *)lse,
                       dq, dk, dv, &p->scale, &p->one, w };
    int n = 12;
    if (!p->key.det) {
        size_t bytes = (size_t)a->h * (size_t)a->tq * (size_t)a->d * sizeof(float);
        DT_CUDA_TRY(em, cudaMemsetAsync(w + p->dqacc, 0, bytes, st));
        uids[n] = U_DQACC;
        ptrs[n++] = w + p->dqacc;
    }
    if (p->key.shift != DT_CUDNN_FULL) {
        uids[n] = U_NEGINF;
        ptrs[n++] = &p->neginf;
        if (p->key.shift != 0) {
            uids[n] = U_SHIFT;
            ptrs[n++] = &shift;
        }
    }
    return run(p, h, n, uids, ptrs, ws, st, em);
}

int dt_cudnn_plan_offline(const dt_cudnn_sdpa_t *a, int bwd, const char *props_json,
                          size_t *bytes, int64_t *engine, dt_emsg_t *em)
{
    dt_cudnn_sdpa_t k = norm_key(a, bwd);
    cudnnBackendDescriptor_t props = NULL, plan = NULL;
    cudnnStatus_t s;
    size_t ws = 0, dq;
    int rc;

    if (dt_cudnn_version(em) == 0)
        return DT_ENOTSUP;
    if ((rc = check_shape(a, em)) < 0)
        return rc;
    if ((s = dn.CreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &props)) !=
        CUDNN_STATUS_SUCCESS)
        return dn_err(em, s, "cudnnBackendCreateDescriptor(DEVICEPROP)", __LINE__);
    if ((s = dn.SetAttribute(props, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                             (int64_t)strlen(props_json), props_json)) != CUDNN_STATUS_SUCCESS ||
        (s = dn.Finalize(props)) != CUDNN_STATUS_SUCCESS) {
        rc = dn_err(em, s, "DEVICEPROP from JSON", __LINE__);
    } else if ((rc = make_plan(&k, bwd, NULL, props, 1, &plan, &ws, engine, em)) == 0) {
        *bytes = (bwd ? bwd_own(&k, &dq) : 0) + ws;
        if (plan != NULL)
            dn.DestroyDescriptor(plan);
    }
    dn.DestroyDescriptor(props);
    return rc;
}

#else /* !HAVE_CUDNN_GRAPH_H: built without cuDNN's header, dt's kernels only */

#define NO_CUDNN "cuDNN cannot be loaded: this dtengine was built without cudnn_graph.h"

size_t dt_cudnn_version(dt_emsg_t *em)
{
    if (em != NULL)
        dt_emsg_set(em, DT_ENOTSUP, NO_CUDNN);
    return 0;
}

int dt_cudnn_supports(const dt_cudnn_sdpa_t *a, int bwd, dt_emsg_t *em)
{
    (void)a;
    (void)bwd;
    return dt_emsg_set(em, DT_ENOTSUP, NO_CUDNN);
}

int dt_cudnn_ws(const dt_cudnn_sdpa_t *a, int bwd, size_t *bytes, dt_emsg_t *em)
{
    (void)a;
    (void)bwd;
    *bytes = 0;
    return dt_emsg_set(em, DT_ENOTSUP, NO_CUDNN);
}

int dt_cudnn_fwd(const dt_cudnn_sdpa_t *a, const void *q, const void *k, const void *v, void *o,
                 float *stats, void *ws, cudaStream_t st, dt_emsg_t *em)
{
    (void)a, (void)q, (void)k, (void)v, (void)o, (void)stats, (void)ws, (void)st;
    return dt_emsg_set(em, DT_ENOTSUP, NO_CUDNN);
}

int dt_cudnn_bwd(const dt_cudnn_sdpa_t *a, const void *q, const void *k, const void *v,
                 const void *o, const void *dout, const float *lse, void *dq, void *dk, void *dv,
                 void *ws, cudaStream_t st, dt_emsg_t *em)
{
    (void)a, (void)q, (void)k, (void)v, (void)o, (void)dout, (void)lse, (void)dq, (void)dk;
    (void)dv, (void)ws, (void)st;
    return dt_emsg_set(em, DT_ENOTSUP, NO_CUDNN);
}

int dt_cudnn_plan_offline(const dt_cudnn_sdpa_t *a, int bwd, const char *props_json,
                          size_t *bytes, int64_t *engine, dt_emsg_t *em)
{
    (void)a, (void)bwd, (void)props_json, (void)bytes, (void)engine;
    return dt_emsg_set(em, DT_ENOTSUP, NO_CUDNN);
}

#endif /* HAVE_CUDNN_GRAPH_H */
