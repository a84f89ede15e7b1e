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
    int mpi; /* MPI_Init was called by us */
    int rank, size;
};

struct dt_comm_op {
    int n;
    MPI_Request req[2 * MAXREQ];
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
        int rc = MPI_Init(argc, argv);
        if (rc != MPI_SUCCESS) {
            free(c);
            return dt_emsg_set(em, DT_ECOMM, "MPI_Init failed (error %d)", rc);
        }
        c->mpi = 1;
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
    if (c->mpi)
        MPI_Finalize();
    free(c);
}

void dt_comm_abort(dt_comm_t *c, int code)
{
    if (c != NULL && c->mpi && c->size > 1)
        MPI_Abort(MPI_COMM_WORLD, code);
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
        if (MPI_Irecv((char *)rbuf + off, (int)n, MPI_BYTE, src, tag, MPI_COMM_WORLD,
                      &op->req[op->n++]) != MPI_SUCCESS)
            goto fail;
    }
    for (size_t off = 0; off < sbytes; off += PIECE) {
        size_t n = sbytes - off < PIECE ? sbytes - off : PIECE;
        if (MPI_Isend((const char *)sbuf + off, (int)n, MPI_BYTE, dst, tag, MPI_COMM_WORLD,
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
    MPI_Testall(op->n, op->req, &done, MPI_STATUSES_IGNORE);
    return done;
}

int dt_comm_wait(dt_comm_op_t *op)
{
    int rc;

    if (op == NULL)
        return 0;
    rc = MPI_Waitall(op->n, op->req, MPI_STATUSES_IGNORE);
    free(op);
    return rc == MPI_SUCCESS ? 0 : DT_ECOMM;
}

int dt_comm_send(dt_comm_t *c, const void *buf, size_t bytes, int dst, int tag)
{
    if (!c->mpi)
        return DT_EINVAL;
    for (size_t off = 0; off < bytes; off += PIECE) {
        size_t n = bytes - off < PIECE ? bytes - off : PIECE;
        if (MPI_Send((const char *)buf + off, (int)n, MPI_BYTE, dst, tag, MPI_COMM_WORLD) !=
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
        if (MPI_Recv((char *)buf + off, (int)n, MPI_BYTE, src, tag, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return DT_ECOMM;
    }
    return 0;
}

int dt_comm_barrier(dt_comm_t *c)
{
    if (!c->mpi)
        return 0;
    return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : DT_ECOMM;
}

static int allreduce(dt_comm_t *c, void *buf, size_t n, MPI_Datatype t, MPI_Op op, size_t esz)
{
    if (!c->mpi)
        return 0;
    size_t step = PIECE / esz;
    for (size_t off = 0; off < n; off += step) {
        size_t k = n - off < step ? n - off : step;
        if (MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * esz, (int)k, t, op,
                          MPI_COMM_WORLD) != MPI_SUCCESS)
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

int dt_comm_allgather_slices_f32(dt_comm_t *c, float *buf, int64_t n)
{
    /* one broadcast per owner, in chunks whose count fits MPI's int:
     * simple, and safe for slices of any size */
    const int64_t chunk = INT64_C(1) << 28;

    if (!c->mpi || c->size == 1)
        return 0;
    for (int r = 0; r < c->size; r++) {
        int64_t off = n * r / c->size, len = n * (r + 1) / c->size - off;
        for (int64_t i = 0; i < len; i += chunk) {
            int k = (int)(len - i < chunk ? len - i : chunk);
            if (MPI_Bcast(buf + off + i, k, MPI_FLOAT, r, MPI_COMM_WORLD) != MPI_SUCCESS)
                return DT_ECOMM;
        }
    }
    return 0;
}

int dt_comm_bcast_int(dt_comm_t *c, int *code)
{
    if (!c->mpi)
        return 0;
    return MPI_Bcast(code, 1, MPI_INT, 0, MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : DT_ECOMM;
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
    if (MPI_Allreduce(&in, &out, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD) != MPI_SUCCESS)
        return DT_ECOMM;
    *who = out.rank;
    return (out.key - (out.key & 1)) / 2;
}
