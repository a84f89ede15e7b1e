/* SPDX-License-Identifier: MIT
 *
 * The CPU transport over Open MPI. MPI is initialised only when a PMIx
 * server (mpirun, srun --mpi=pmix, dtagentd) or another MPI launcher put its
 * identity in the environment; a plain process is one rank ("solo") and
 * never touches MPI, so `dtengine` starts instantly on a laptop.
 *
 * MPI counts are ints: transfers are cut into pieces of at most 1 GiB, each
 * its own request. Errors return instead of aborting (MPI_ERRORS_RETURN).
 */
#include "config.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "engine/comm/comm.h"

#define PIECE ((size_t)1 << 30)
#define MAXREQ 64 /* 32 GiB per direction per op */

struct dt_comm {
    int mpi;     /* MPI is initialised: the operations go through mc */
    int owner;   /* MPI_Init was called for this one: dt_comm_free finalises */
    int funneled; /* MPI allows other threads beside the one calling it */
    MPI_Comm mc; /* MPI_COMM_WORLD, or a group of it (dt_comm_split) */
    int rank, size;
};

struct dt_comm_op {
    int n;
    MPI_Request req[2 * MAXREQ];
    int *arrays; /* counts and displacements a nonblocking collective reads until done */
};

static int launched_under_pmi(void)
{
    static const char *vars[] = { "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE" };
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        if (getenv(vars[i]) != NULL)
            return 1;
    return 0;
}

int dt_comm_new(int *argc, char ***argv, dt_comm_t **out, dt_emsg_t *em)
{
    dt_comm_t *c = dt_xcalloc(1, sizeof(*c));

    c->size = 1;
    if (launched_under_pmi()) {
        /* funneled: the attention's threads (dt_attn_set_threads) never
         * call MPI; the thread that initialised it makes every call */
        int provided = MPI_THREAD_SINGLE;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            free(c);
            return dt_emsg_set(em, DT_ECOMM, "MPI_Init_thread failed (error %d)", rc);
        }
        c->funneled = provided >= MPI_THREAD_FUNNELED;
        c->mpi = c->owner = 1;
        c->mc = MPI_COMM_WORLD;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    }
    *out = c;
    return 0;
}

void dt_comm_free(dt_comm_t *c)
{
    if (c == NULL)
        return;
    if (c->mpi && !c->owner)
        MPI_Comm_free(&c->mc);
    if (c->owner)
        MPI_Finalize();
    free(c);
}

void dt_comm_abort(dt_comm_t *c, int code)
{
    if (c != NULL && c->mpi)
        MPI_Abort(MPI_COMM_WORLD, code); /* the whole job, whatever group c is */
    exit(code);
}

int dt_comm_rank(const dt_comm_t *c)
{
    return c->rank;
}

int dt_comm_size(const dt_comm_t *c)
{
    return c->size;
}

const char *dt_comm_kind(const dt_comm_t *c)
{
    return c->mpi ? "mpi" : "solo";
}

int dt_comm_threads_ok(const dt_comm_t *c)
{
    return !c->mpi || c->funneled;
}

static int pieces(size_t bytes)
{
    return (int)((bytes + PIECE - 1) / PIECE);
}

int dt_comm_start(dt_comm_t *c, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                  size_t rbytes, int src, int tag, dt_comm_op_t **out)
{
    dt_comm_op_t *op;

    *out = NULL;
    if (pieces(sbytes) > MAXREQ || pieces(rbytes) > MAXREQ)
        return DT_ERANGE;
    if (!c->mpi) {
        /* one rank: a ring of one sends to itself */
        if (sbytes != rbytes || dst != 0 || src != 0)
            return DT_EINVAL;
        if (sbytes > 0 && sbuf != rbuf)
            memcpy(rbuf, sbuf, sbytes);
        return 0;
    }
    op = dt_xcalloc(1, sizeof(*op));
    for (size_t off = 0; off < rbytes; off += PIECE) {
        size_t n = rbytes - off < PIECE ? rbytes - off : PIECE;
        if (MPI_Irecv((char *)rbuf + off, (int)n, MPI_BYTE, src, tag, c->mc,
                      &op->req[op->n++]) != MPI_SUCCESS)
            goto fail;
    }
    for (size_t off = 0; off < sbytes; off += PIECE) {
        size_t n = sbytes - off < PIECE ? sbytes - off : PIECE;
        if (MPI_Isend((const char *)sbuf + off, (int)n, MPI_BYTE, dst, tag, c->mc,
                      &op->req[op->n++]) != MPI_SUCCESS)
            goto fail;
    }
    *out = op;
    return 0;
fail:
    for (int i = 0; i < op->n; i++)
        if (op->req[i] != MPI_REQUEST_NULL)
            MPI_Cancel(&op->req[i]);
    free(op);
    return DT_ECOMM;
}

int dt_comm_test(dt_comm_op_t *op)
{
    int done = 1;

    if (op == NULL)
        return 1;
    /* a failed request is done too: dt_comm_wait reports it */
    if (MPI_Testall(op->n, op->req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        return 1;
    return done;
}

int dt_comm_wait(dt_comm_op_t *op)
{
    int rc;

    if (op == NULL)
        return 0;
    rc = MPI_Waitall(op->n, op->req, MPI_STATUSES_IGNORE);
    free(op->arrays);
    free(op);
    return rc == MPI_SUCCESS ? 0 : DT_ECOMM;
}

int dt_comm_send(dt_comm_t *c, const void *buf, size_t bytes, int dst, int tag)
{
    if (!c->mpi)
        return DT_EINVAL;
    for (size_t off = 0; off < bytes; off += PIECE) {
        size_t n = bytes - off < PIECE ? bytes - off : PIECE;
        if (MPI_Send((const char *)buf + off, (int)n, MPI_BYTE, dst, tag, c->mc) !=
            MPI_SUCCESS)
            return DT_ECOMM;
    }
    return 0;
}

int dt_comm_recv(dt_comm_t *c, void *buf, size_t bytes, int src, int tag)
{
    if (!c->mpi)
        return DT_EINVAL;
    for (size_t off = 0; off < bytes; off += PIECE) {
        size_t n = bytes - off < PIECE ? bytes - off : PIECE;
        if (MPI_Recv((char *)buf + off, (int)n, MPI_BYTE, src, tag, c->mc,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return DT_ECOMM;
    }
    return 0;
}

int dt_comm_barrier(dt_comm_t *c)
{
    if (!c->mpi)
        return 0;
    return MPI_Barrier(c->mc) == MPI_SUCCESS ? 0 : DT_ECOMM;
}

static int allreduce(dt_comm_t *c, void *buf, size_t n, MPI_Datatype t, MPI_Op op, size_t esz)
{
    if (!c->mpi)
        return 0;
    size_t step = PIECE / esz;
    for (size_t off = 0; off < n; off += step) {
        size_t k = n - off < step ? n - off : step;
        if (MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * esz, (int)k, t, op,
                          c->mc) != MPI_SUCCESS)
            return DT_ECOMM;
    }
    return 0;
}

int dt_comm_allreduce_sum_f32(dt_comm_t *c, float *buf, size_t n)
{
    return allreduce(c, buf, n, MPI_FLOAT, MPI_SUM, sizeof(float));
}

int dt_comm_allreduce_max_f64(dt_comm_t *c, double *buf, size_t n)
{
    return allreduce(c, buf, n, MPI_DOUBLE, MPI_MAX, sizeof(double));
}

int dt_comm_allreduce_sum_f64(dt_comm_t *c, double *buf, size_t n)
{
    return allreduce(c, buf, n, MPI_DOUBLE, MPI_SUM, sizeof(double));
}

int dt_comm_allgather_slices_f32(dt_comm_t *c, const dt_comm_slicing_t *sl, float *buf)
{
    /* one broadcast per member, in chunks whose count fits MPI's int:
     * simple, and safe for slices of any size */
    const int64_t chunk = INT64_C(1) << 28, n = sl->n;

    if (!c->mpi || c->size == 1)
        return 0;
    for (int j = 0; j < c->size; j++) {
        int64_t k = sl->s0 + j, off = n * k / sl->S, len = n * (k + 1) / sl->S - off;
        for (int64_t i = 0; i < len; i += chunk) {
            int m = (int)(len - i < chunk ? len - i : chunk);
            if (MPI_Bcast(buf + off + i, m, MPI_FLOAT, j, c->mc) != MPI_SUCCESS)
                return DT_ECOMM;
        }
    }
    return 0;
}

int dt_comm_bcast_int(dt_comm_t *c, int *code)
{
    if (!c->mpi)
        return 0;
    return MPI_Bcast(code, 1, MPI_INT, 0, c->mc) == MPI_SUCCESS ? 0 : DT_ECOMM;
}

int dt_comm_agree(dt_comm_t *c, int rc, int relayed, int *who)
{
    /* key orders by rc, then originals before relays: 2 rc + relayed */
    struct {
        int key, rank;
    } in = { 2 * rc + (rc < 0 && relayed ? 1 : 0), c->rank }, out;

    *who = c->rank;
    if (!c->mpi)
        return rc;
    if (MPI_Allreduce(&in, &out, 1, MPI_2INT, MPI_MINLOC, c->mc) != MPI_SUCCESS)
        return DT_ECOMM;
    *who = out.rank;
    return (out.key - (out.key & 1)) / 2;
}

int dt_comm_split(dt_comm_t *c, int color, int key, dt_comm_t **out, dt_emsg_t *em)
{
    dt_comm_t *g = dt_xcalloc(1, sizeof(*g));

    g->size = 1;
    if (c->mpi) {
        if (MPI_Comm_split(c->mc, color, key, &g->mc) != MPI_SUCCESS) {
            free(g);
            return dt_emsg_set(em, DT_ECOMM, "splitting the job's ranks into groups failed");
        }
        g->mpi = 1;
        g->funneled = c->funneled;
        MPI_Comm_set_errhandler(g->mc, MPI_ERRORS_RETURN);
        MPI_Comm_rank(g->mc, &g->rank);
        MPI_Comm_size(g->mc, &g->size);
    }
    *out = g;
    return 0;
}

/* The part of [a, b) in slice k of n split S ways. */
static void part(int64_t n, int S, int k, int64_t a, int64_t b, int64_t *lo, int64_t *len)
{
    int64_t s0 = n * k / S, s1 = n * (k + 1) / S;
    *lo = a > s0 ? a : s0;
    int64_t hi = b < s1 ? b : s1;
    *len = hi > *lo ? hi - *lo : 0;
}

/* [a, b) is cut into pieces whose counts fit MPI's int; for each piece
 * every member's part, as counts and displacements from the piece's start. */
#define RANGE_PIECE (INT64_C(1) << 28)

static void piece_counts(const dt_comm_t *c, const dt_comm_slicing_t *sl, int64_t a, int64_t b,
                         int *cnt, int *dsp)
{
    for (int j = 0; j < c->size; j++) {
        int64_t lo, len;
        part(sl->n, sl->S, sl->s0 + j, a, b, &lo, &len);
        cnt[j] = (int)len;
        dsp[j] = (int)(len > 0 ? lo - a : 0);
    }
}

/* gather (reduce = 0) or reduce-scatter (1) of [a, b), piece by piece */
static int range_op(dt_comm_t *c, const dt_comm_slicing_t *sl, int64_t a, int64_t b,
                    const float *in, float *out, int reduce)
{
    int64_t lo0, len0;
    int rc = 0;

    part(sl->n, sl->S, sl->s0 + c->rank, a, b, &lo0, &len0);
    if (!c->mpi || c->size == 1) {
        memcpy(out, in, (size_t)(reduce ? b - a : len0) * sizeof(float));
        return 0;
    }
    int *cnt = dt_xcalloc((size_t)c->size, sizeof(int));
    int *dsp = dt_xcalloc((size_t)c->size, sizeof(int));
    for (int64_t p = a; p < b && rc == 0; p += RANGE_PIECE) {
        int64_t q = b - p < RANGE_PIECE ? b : p + RANGE_PIECE, lo, len;
        float dummy = 0;
        piece_counts(c, sl, p, q, cnt, dsp);
        part(sl->n, sl->S, sl->s0 + c->rank, p, q, &lo, &len);
        if (reduce)
            rc = MPI_Reduce_scatter(in + (p - a), len > 0 ? out + (lo - lo0) : &dummy, cnt,
                                    MPI_FLOAT, MPI_SUM, c->mc);
        else
            rc = MPI_Allgatherv(len > 0 ? in + (lo - lo0) : &dummy, (int)len, MPI_FLOAT,
                                out + (p - a), cnt, dsp, MPI_FLOAT, c->mc);
        rc = rc == MPI_SUCCESS ? 0 : DT_ECOMM;
    }
    free(dsp);
    free(cnt);
    return rc;
}

int dt_comm_gather_range_f32(dt_comm_t *c, const dt_comm_slicing_t *sl, int64_t a, int64_t b,
                             const float *mine, float *out)
{
    return range_op(c, sl, a, b, mine, out, 0);
}

int dt_comm_reduce_scatter_range_f32(dt_comm_t *c, const dt_comm_slicing_t *sl, int64_t a,
                                     int64_t b, const float *in, float *mine)
{
    return range_op(c, sl, a, b, in, mine, 1);
}

int dt_comm_gather_range_start(dt_comm_t *c, const dt_comm_slicing_t *sl, int64_t a, int64_t b,
                               const float *mine, float *out, dt_comm_op_t **opp)
{
    int64_t np = (b - a + RANGE_PIECE - 1) / RANGE_PIECE, lo0, len0;
    dt_comm_op_t *op;
    int rc = 0;

    *opp = NULL;
    if (!c->mpi || c->size == 1 || np > 2 * MAXREQ)
        /* nothing to overlap, or more pieces than an op holds: at once */
        return range_op(c, sl, a, b, mine, out, 0);
    part(sl->n, sl->S, sl->s0 + c->rank, a, b, &lo0, &len0);
    op = dt_xcalloc(1, sizeof(*op));
    op->arrays = dt_xcalloc((size_t)(2 * c->size * np), sizeof(int));
    for (int64_t p = a, k = 0; p < b; p += RANGE_PIECE, k++) {
        int64_t q = b - p < RANGE_PIECE ? b : p + RANGE_PIECE, lo, len;
        int *cnt = op->arrays + 2 * c->size * k, *dsp = cnt + c->size;
        piece_counts(c, sl, p, q, cnt, dsp);
        part(sl->n, sl->S, sl->s0 + c->rank, p, q, &lo, &len);
        /* an empty part sends nothing: any valid address will do */
        if (MPI_Iallgatherv(len > 0 ? mine + (lo - lo0) : out, (int)len, MPI_FLOAT, out + (p - a),
                            cnt, dsp, MPI_FLOAT, c->mc, &op->req[op->n]) != MPI_SUCCESS) {
            rc = DT_ECOMM;
            break;
        }
        op->n++;
    }
    if (rc < 0) {
        int rw = dt_comm_wait(op); /* what was started, finished */
        (void)rw;
        return rc;
    }
    *opp = op;
    return 0;
}
