/* SPDX-License-Identifier: MIT
 *
 * dt_ring_nccl_pmix_new: an NCCL ring whose rank, size and unique id come
 * from the PMIx server the engine runs under (Open MPI's mpirun,
 * `srun --mpi=pmix`, dtagentd). The ring's member 0 (the job's rank 0, or
 * a group's leader) makes the id and publishes it (PMIx_Put with global
 * scope, PMIx_Commit); a fence over the whole namespace with data
 * collection makes it visible; every other member reads it from the
 * leader (PMIx_Get). The device is the local rank modulo the visible
 * devices. PMIx status is translated here into DT_ECOMM.
 *
 * PMIx_Init is reference counted: the engine may hold its own reference
 * (engine/wlink.c); this file takes one for the duration of the call.
 *
 * Not here: the ring itself (comm_nccl.c). Built only into programs that
 * link libpmix (dtengine), never into the GPU tests.
 */
#include "config.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <pmix.h>

#include "engine/comm/comm.h"
#include "kernels/cuda/cuda_err.h"

/* Rings made through PMIx in this process: every rank makes them in the
 * same order, so the count names a fresh key for each call
 * ("dt.nccl.id.<n>.<color>") and a second ring never reads the first
 * one's id. */
static atomic_uint ring_seq;

/* An integer attribute of proc, whatever integer type the server uses. */
static int get_uint(const pmix_proc_t *proc, const char *key, uint64_t *out, dt_emsg_t *em)
{
    pmix_value_t *val = NULL;
    pmix_status_t st = PMIx_Get(proc, key, NULL, 0, &val);
    int rc = 0;

    if (st != PMIX_SUCCESS || val == NULL)
        return dt_emsg_set(em, DT_ECOMM, "PMIx_Get(%s) for rank %u of namespace %s: %s", key,
                           proc->rank, proc->nspace, PMIx_Error_string(st));
    switch (val->type) {
    case PMIX_UINT8:
        *out = val->data.uint8;
        break;
    case PMIX_UINT16:
        *out = val->data.uint16;
        break;
    case PMIX_UINT32:
        *out = val->data.uint32;
        break;
    case PMIX_UINT64:
        *out = val->data.uint64;
        break;
    case PMIX_PROC_RANK:
        *out = val->data.rank;
        break;
    case PMIX_SIZE:
        *out = val->data.size;
        break;
    case PMIX_INT:
        if (val->data.integer < 0)
            rc = dt_emsg_set(em, DT_ECOMM, "PMIx_Get(%s): negative value %d", key,
                             val->data.integer);
        else
            *out = (uint64_t)val->data.integer;
        break;
    default:
        rc = dt_emsg_set(em, DT_ECOMM, "PMIx_Get(%s): a %s, not an integer", key,
                         PMIx_Data_type_string(val->type));
        break;
    }
    PMIX_VALUE_RELEASE(val);
    return rc;
}

/* Rank 0: make the id and publish it under key. */
static int publish_id(const char *key, unsigned char *id, dt_emsg_t *em)
{
    pmix_byte_object_t bo = { .bytes = (char *)id, .size = DT_RING_ID_BYTES };
    pmix_value_t val;
    pmix_status_t st;
    int rc;

    if ((rc = dt_ring_nccl_id(id, em)) < 0)
        return rc;
    PMIX_VALUE_CONSTRUCT(&val);
    st = PMIx_Value_load(&val, &bo, PMIX_BYTE_OBJECT); /* copies the bytes */
    if (st == PMIX_SUCCESS)
        st = PMIx_Put(PMIX_GLOBAL, key, &val);
    PMIX_VALUE_DESTRUCT(&val);
    if (st != PMIX_SUCCESS)
        return dt_emsg_set(em, DT_ECOMM, "PMIx_Put(%s) of the NCCL unique id: %s", key,
                           PMIx_Error_string(st));
    if ((st = PMIx_Commit()) != PMIX_SUCCESS)
        return dt_emsg_set(em, DT_ECOMM, "PMIx_Commit of the NCCL unique id: %s",
                           PMIx_Error_string(st));
    return 0;
}

/* Other members: read the id the leader (the job's rank `leader`)
 * published. */
static int fetch_id(const pmix_proc_t *me, int leader, const char *key, const pmix_info_t *tmo,
                    unsigned char *id, dt_emsg_t *em)
{
    pmix_proc_t root;
    pmix_value_t *val = NULL;
    pmix_status_t st;
    int rc = 0;

    PMIX_PROC_LOAD(&root, me->nspace, (pmix_rank_t)leader);
    st = PMIx_Get(&root, key, tmo, 1, &val);
    if (st != PMIX_SUCCESS || val == NULL)
        return dt_emsg_set(em, DT_ECOMM, "PMIx_Get(%s) from rank %d of namespace %s: %s", key,
                           leader, me->nspace, PMIx_Error_string(st));
    if (val->type != PMIX_BYTE_OBJECT || val->data.bo.size != DT_RING_ID_BYTES)
        rc = dt_emsg_set(em, DT_ECOMM,
                         "PMIx_Get(%s) from rank %d: a %s of %zu bytes, not a %d-byte NCCL id",
                         key, leader, PMIx_Data_type_string(val->type),
                         val->type == PMIX_BYTE_OBJECT ? val->data.bo.size : (size_t)0,
                         DT_RING_ID_BYTES);
    else
        memcpy(id, val->data.bo.bytes, DT_RING_ID_BYTES);
    PMIX_VALUE_RELEASE(val);
    return rc;
}

int dt_ring_nccl_pmix_new(double timeout_s, const dt_ring_group_t *grp, dt_ring_t **out,
                          dt_emsg_t *em)
{
    pmix_proc_t me, all;
    pmix_info_t info[2];
    pmix_status_t st;
    unsigned char id[DT_RING_ID_BYTES];
    uint64_t size = 0, lrank = 0;
    bool collect = true;
    int tmo, ndev, rc;
    char key[64];

    *out = NULL;
    if (timeout_s < 0)
        return dt_emsg_set(em, DT_EINVAL, "nccl ring: timeout %g s is negative", timeout_s);
    tmo = (int)ceil(timeout_s > 0 ? timeout_s : 300.0);
    if ((st = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS)
        return dt_emsg_set(em, DT_ECOMM, "PMIx_Init (for the NCCL ring): %s",
                           PMIx_Error_string(st));
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    PMIx_Info_load(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIx_Info_load(&info[1], PMIX_TIMEOUT, &tmo, PMIX_INT);
    PMIX_PROC_LOAD(&all, me.nspace, PMIX_RANK_WILDCARD);
    snprintf(key, sizeof(key), "dt.nccl.id.%u.%d", atomic_fetch_add(&ring_seq, 1u),
             grp ? grp->color : 0);

    if ((rc = get_uint(&all, PMIX_JOB_SIZE, &size, em)) < 0 ||
        (rc = get_uint(&me, PMIX_LOCAL_RANK, &lrank, em)) < 0)
        goto out;
    if (size < 1 || size > INT_MAX || me.rank >= size) {
        rc = dt_emsg_set(em, DT_ECOMM, "PMIx: rank %u in a job of %llu ranks", me.rank,
                         (unsigned long long)size);
        goto out;
    }
    /* the ring: the whole job, or the group */
    int rank = (int)me.rank, R = (int)size, leader = 0;
    if (grp != NULL) {
        if (grp->size < 1 || grp->rank < 0 || grp->rank >= grp->size || grp->size > R ||
            grp->leader < 0 || grp->leader >= R || (grp->rank == 0) != (grp->leader == rank)) {
            rc = dt_emsg_set(em, DT_EINVAL, "nccl ring: member %d of %d led by rank %d, in a "
                             "job of %d ranks (this one %d)", grp->rank, grp->size, grp->leader,
                             R, rank);
            goto out;
        }
        leader = grp->leader;
        R = grp->size;
        rank = grp->rank;
    }
    if (rank == 0 && (rc = publish_id(key, id, em)) < 0)
        goto out;
    /* a leader that could not publish leaves before the fence; the
     * others' fence then fails after tmo seconds instead of hanging */
    if ((st = PMIx_Fence(&all, 1, info, 2)) != PMIX_SUCCESS) {
        rc = dt_emsg_set(em, DT_ECOMM, "PMIx_Fence over namespace %s (%llu ranks): %s",
                         me.nspace, (unsigned long long)size, PMIx_Error_string(st));
        goto out;
    }
    if (rank != 0 && (rc = fetch_id(&me, leader, key, &info[1], id, em)) < 0)
        goto out;
    if ((ndev = dt_cuda_devices(em)) == 0) {
        rc = DT_EDEVICE; /* em says why */
        goto out;
    }
    rc = dt_ring_nccl_new(rank, R, id, (int)(lrank % (uint64_t)ndev), timeout_s, out, em);
out:
    PMIX_INFO_DESTRUCT(&info[1]);
    PMIX_INFO_DESTRUCT(&info[0]);
    (void)PMIx_Finalize(NULL, 0); /* our reference only */
    return rc;
}
