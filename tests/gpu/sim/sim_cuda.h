/* SPDX-License-Identifier: MIT
 *
 * The controls of the host CUDA/NCCL simulator (sim_cuda.c), for
 * tests/gpu/test_ring_sched.c. The simulator itself is reached through the
 * CUDA runtime, NCCL and kernels/cuda/attn_cuda.h APIs it defines.
 */
#ifndef DT_TESTS_GPU_SIM_CUDA_H
#define DT_TESTS_GPU_SIM_CUDA_H

/* Restart the scheduler's random choices from seed, with policy 0 (a random
 * runnable stream), 1 (compute streams first) or 2 (communication streams
 * first); re-reads the SIM_* environment knobs. Call with no stream work
 * pending on any thread. */
void sim_seed(unsigned seed, int policy);

/* Operations run since the start, and the longest stream queue seen. */
void sim_stats(long *ops, long *max_queue);

/* Queue fn(arg) on stream s as a kernel: it runs when the scheduler
 * reaches it, in stream order; arg is a single malloc'd block, freed
 * after it ran. For the stand-ins of sim_layers.c. */
#include <cuda_runtime_api.h>
void sim_enqueue(cudaStream_t s, void (*fn)(void *), void *arg, const char *what);

#endif
