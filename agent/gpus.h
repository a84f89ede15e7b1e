/* SPDX-License-Identifier: MIT
 *
 * The node's GPUs for dtagentd (gpus.c): what `dtengine devices --json`
 * reports, read once at start and registered with the coordinator; a
 * cuda job's workers are bound one to a GPU by its UUID
 * (CUDA_VISIBLE_DEVICES) and, where the node says, to the CPUs near it.
 *
 * Not here: CUDA itself (the agent never links it), the workers (task.c).
 */
#ifndef DT_AGENT_GPUS_H
#define DT_AGENT_GPUS_H

#include <stdint.h>

#include "common/err.h"

typedef struct dt_gpus {
    int n;
    char **uuid;      /* [n] "GPU-..." */
    char **cpus;      /* [n] the kernel's list of CPUs near it ("0-31"), or NULL */
    int64_t mem_min;  /* bytes: the smallest GPU's memory */
    char why[256];    /* n == 0: why none (no driver, no device, no answer) */
} dt_gpus_t;

/* Ask `ENGINE devices --json`, waiting at most timeout_ms. Never fails:
 * a node whose engine cannot answer has no GPU, and why says so. */
void dt_gpus_probe(const char *engine, int timeout_ms, dt_gpus_t *g);
/* Parse the engine's answer: 0, or DT_EFORMAT naming what is wrong (then
 * *g is empty). */
int dt_gpus_parse(const char *text, dt_gpus_t *g, dt_emsg_t *em);
void dt_gpus_free(dt_gpus_t *g);

#endif /* DT_AGENT_GPUS_H */
