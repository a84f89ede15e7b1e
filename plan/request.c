/* SPDX-License-Identifier: MIT
 *
 * The planner's request (planner.h): the cluster presets (h100-sxm, h200,
 * cpu) and dt_plan_req_from_spec, a request from a checked job spec: the
 * model and cluster presets, the spec's overrides and the key table's
 * defaults. Pure computation; the cpu preset's peak is this CPU's
 * (common/cpuinfo.h).
 *
 * Not here: what the spec's keys mean and their checks (spec/), what a
 * request costs (cost.c), the plan (planner.c). This file calls neither.
 */
#include "config.h"

#include <string.h>

#include "common/cpuinfo.h"
#include "common/macros.h"
#include "plan/planner.h"

#define GiB (1024.0 * 1024.0 * 1024.0)
#define MiB (1024.0 * 1024.0)

/*-- presets -------------------------------------------------------------------*/

/* The GPU presets' efficiencies, measured on one H200 (cuDNN 9.19, CUDA
 * 13, driver 580; tests/gpu/device.sh --quick, 2026-12-04; the H100's
 * compute is the same chip's, and its earlier runs agree within a few per
 * cent for the kernels they share). The attention blocks' (bench/gpu.sh,
 * bench_attn_cuda through cuDNN, T = 16384, causal, bf16): at D = 128 the
 * forward 542 TFLOP/s (0.55 of the 989 peak), the backward 517 (0.52),
 * deterministic 118 (0.12, cuDNN keeping the scores); at D = 64 each 0.75
 * of that (406, 392, 86). The rest, GPU_EFF: what is left of the measured
 * training step of the LLaMA-3.2-1B shape at T = 16384 (0.909 s,
 * bench/train_gpu.sh) after its attention at the rates above: its matrix
 * products (cuBLASLt reaches 0.80 of peak at 8192^3 in the same run) with
 * the elementwise kernels, the loss and AdamW, which the model does not
 * count apart, folded in. */
#define GPU_EFF 0.38
#define GPU_ATTN_EFF { 0.55, 0.52, 0.12 }
#define GPU_ATTN_D64 0.75

/* peak_fp32: the same machine at fp32 (GPUs without TF32: the non-tensor
 * FP32 peak), used when a job asks for fp32. */
static const struct cluster_preset {
    dt_cluster_t c;
    double peak_fp32;
    int this_cpu; /* peak and efficiency from this machine's CPU */
} clusters[] = {
    /* H100 SXM: 80 GiB HBM3 (76 usable after the CUDA context, allocator
     * slack and fragmentation), 989 TFLOP/s dense bf16, NVLink 4 at 900 GB/s
     * both directions together, one 400 Gb/s NDR InfiniBand port per GPU.
     * Fixed: CUDA context, cuBLAS workspace and NCCL buffers, ~1 GiB.
     * Host: a DGX H100's 2 TiB of DDR5 per node (NVIDIA's DGX H100 user
     * guide), 1.8 TiB of it for page-locked buffers (the OS, the page
     * cache and the processes keep the rest); PCIe Gen5 x16 per GPU, 64
     * GB/s raw per direction, about 50 GB/s of copies (cudaMemcpyAsync
     * from page-locked memory). */
    { { "h100-sxm", 8, 0, 76.0 * GiB, 989e12, GPU_EFF, 450e9, 50e9, 1.0 * GiB, 0, 1843.0 * GiB,
        50e9, GPU_ATTN_EFF, GPU_ATTN_D64 },
      67e12, 0 },
    /* H200: the same compute and links, 141 GB HBM3e (about 140 GiB; 133
     * usable); a DGX H200's host is a DGX H100's (2 TiB, PCIe Gen5). */
    { { "h200", 8, 0, 133.0 * GiB, 989e12, GPU_EFF, 450e9, 50e9, 1.0 * GiB, 0, 1843.0 * GiB,
        50e9, GPU_ATTN_EFF, GPU_ATTN_D64 },
      67e12, 0 },
    /* cpu: one dtengine rank per core, a "node" being one machine of two
     * ranks, 4 GiB per rank. Peak and efficiency: this machine's
     * (common/cpuinfo.h dt_cpu_peak: measured on the CPUs dt was run on,
     * else vector width x FMA pipes x clock), filled in by preset_copy;
     * the figures here are AMD Zen 5's, where the attention kernels'
     * 6-row products reach 270 GFLOP/s and dtengine attn and the tiny
     * training step 0.55 of it. Links: shared-memory copies between ranks
     * of one machine (5 GB/s), 1 GB/s between machines. Fixed: dtengine's
     * max RSS with 16 tokens per rank under mpirun (bench/memory.sh): 13.2
     * MiB at R = 1, 13.5 at 2, 16.5 at 4; 15 MiB. Per peer: Open MPI's
     * shared-memory transport maps and touches buffers for each other
     * rank, about 0.7 MiB each at 1 to 8 ranks of dtengine train
     * (bench/train_memory.sh): 720 KiB. bf16 runs no faster on the CPU
     * kernels. */
    { { "cpu", 2, 0, 4.0 * GiB, 270e9, 0.55, 5e9, 1e9, 15.0 * MiB, 720.0 * 1024, 0, 0, { 0 }, 0 },
      270e9,
      1 },
};

/* A preset as planned on this machine: the cpu preset's peak is this
 * CPU's. */
static void preset_copy(const struct cluster_preset *p, dt_cluster_t *out, double *peak_fp32)
{
    *out = p->c;
    if (peak_fp32)
        *peak_fp32 = p->peak_fp32;
    if (p->this_cpu) {
        out->peak_flops = dt_cpu_peak(dt_cpu_this(), &out->efficiency);
        if (peak_fp32)
            *peak_fp32 = out->peak_flops;
    }
}

static const struct cluster_preset *find_cluster(const char *name)
{
    for (size_t i = 0; i < DT_ARRAY_SIZE(clusters); i++)
        if (name != NULL && strcmp(name, clusters[i].c.name) == 0)
            return &clusters[i];
    return NULL;
}

int dt_cluster_preset(const char *name, dt_cluster_t *out, dt_emsg_t *em)
{
    const struct cluster_preset *p = find_cluster(name);

    if (p == NULL)
        return dt_emsg_set(em, DT_EINVAL, "unknown gpu '%s' (known: h100-sxm, h200, cpu)",
                           name ? name : "(null)");
    preset_copy(p, out, NULL);
    return 0;
}

/*-- from a spec -----------------------------------------------------------------*/

int dt_plan_req_from_spec(const dt_spec_t *s, dt_plan_req_t *out, dt_emsg_t *em)
{
    const char *gpu;
    const struct cluster_preset *cp;
    dt_attn_spec_t a = { 0 };
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = dt_spec_check(s, em)) < 0)
        return rc;
    gpu = dt_spec_gpu(s);
    out->cuda = dt_spec_device_id(s) == DT_DEVICE_CUDA;
    out->tokens = s->tokens;

    if ((rc = dt_model_from_spec(s, &out->model, em)) < 0)
        return rc;

    if ((cp = find_cluster(gpu)) == NULL)
        return dt_cluster_preset(gpu, &out->cluster, em);
    double peak_fp32;
    preset_copy(cp, &out->cluster, &peak_fp32);
    if (s->nodes)
        out->cluster.nodes = (int)s->nodes;
    if (s->gpus_per_node)
        out->cluster.gpus_per_node = (int)s->gpus_per_node;
    if (s->host_memory)
        out->cluster.host_mem_bytes = (double)s->host_memory;
    if (s->pcie_gbps)
        out->cluster.pcie_bps = 1e9 * (double)s->pcie_gbps;

    out->kind = dt_spec_kind(s);
    out->precision = dt_spec_dtype_id(s);
    if (out->precision == DT_F32)
        out->cluster.peak_flops = peak_fp32;

    out->causal = dt_spec_causal(s);
    out->nondet = !dt_spec_deterministic(s);
    out->layout = dt_spec_layout(s);
    if ((rc = dt_attn_parse_branches(&a, s->segments, s->dilations, em)) < 0)
        return rc;
    out->nbranch = a.nbranch;
    memcpy(out->seg, a.seg, sizeof(out->seg));
    memcpy(out->dil, a.dil, sizeof(out->dil));
    out->ranks = (int)s->ranks;
    out->spares = (int)dt_spec_int(s, "spares");
    /* checked by dt_spec_check; unset: AUTO */
    out->recompute = DT_RECOMPUTE_AUTO;
    if (s->recompute != NULL)
        dt_recompute_parse("recompute", s->recompute, &out->recompute, NULL);
    out->shard = DT_SHARD_AUTO;
    if (s->shard != NULL)
        dt_shard_parse("shard", s->shard, &out->shard, NULL);
    out->offload = dt_spec_offload(s);
    out->ckpt_dtype = dt_spec_ckpt_dtype(s);
    out->offload_auto = s->offload == NULL;
    out->ckpt_auto = s->ckpt_dtype == NULL;
    out->batch = dt_spec_int(s, "batch");
    out->dp = (int)dt_spec_int(s, "dp");
    dt_spec_mask_rules(s, &out->masks);
    out->layout_auto = s->layout == NULL;
    out->mem_ckpt_every = dt_spec_given(s, "mem_ckpt_every") ? s->mem_ckpt_every : -1;
    return 0;
}
