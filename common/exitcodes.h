/* SPDX-License-Identifier: MIT
 *
 * Every exit status of dt's programs, in two named sets, here only:
 *
 * - DT_EXIT_*: dtengine's (dtengine(1) EXIT STATUS) and dtagentd's (the
 *   batch script's under Slurm, dtagentd(8)). The coordinator reads a
 *   worker's through its agent and an agent's through Slurm, and decides
 *   recovery by these names (coordinator/recovery.c, run.c);
 * - DTCTL_*: dtctl's (dtctl(1) EXIT STATUS), which mean other things than
 *   the engine's numbers of the same value.
 *
 * Comparisons use the names, never the numbers; no value is ever
 * renumbered (scripts and slurm.conf's RequeueExit know them).
 */
#ifndef DT_EXITCODES_H
#define DT_EXITCODES_H

enum dt_exit {
    DT_EXIT_OK = 0,
    DT_EXIT_FAILURE = 1,    /* a failure while running: I/O, transport; may be retried */
    DT_EXIT_INPUT = 2,      /* bad options or input: retrying cannot help */
    DT_EXIT_STOPPED = 3,    /* stopped on purpose (prefill --stop-after-layer, agent W_STOP) */
    DT_EXIT_PEER = 4,       /* another rank of the job failed (PMIx event): restart helps */
    DT_EXIT_AGENT_LOST = 5, /* the channel to dtagentd broke */
    /* the checkpoint named by --resume-from does not verify: the
     * coordinator marks it corrupt and starts again from the one before,
     * without counting a restart */
    DT_EXIT_CKPT = 6,
    /* this rank's GPU failed (a CUDA error that poisons the context, an
     * XID, an uncorrectable ECC error): the coordinator treats the node as
     * suspect and runs the next generation without it */
    DT_EXIT_DEVICE = 7,
    /* dtagentd (and so the batch script) when the coordinator wants the
     * job run again: EX_TEMPFAIL. A site may list it in slurm.conf's
     * RequeueExit. 0 is "completed", 1 "failed, do not requeue". */
    DT_EXIT_REQUEUE = 75,
};

enum dtctl_exit {
    DTCTL_OK = 0,
    DTCTL_ERROR = 1,     /* the coordinator refused or failed the request */
    DTCTL_USAGE = 2,     /* bad options or spec */
    DTCTL_NOCOORD = 3,   /* cannot reach the coordinator */
    DTCTL_NOTFOUND = 4,  /* no such job */
    DTCTL_DENIED = 5,    /* permission denied */
    DTCTL_REFUSED = 6,   /* the job cannot be planned: does not fit, bad lengths */
    DTCTL_JOBFAILED = 7, /* watch, run: the job ended failed or cancelled */
};

#endif /* DT_EXITCODES_H */
