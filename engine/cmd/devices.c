/* SPDX-License-Identifier: MIT
 *
 * `dtengine devices [--json]`: the GPUs this process can see (after
 * CUDA_VISIBLE_DEVICES, so under Slurm the job's own), with their UUID,
 * memory, PCI address and the CPUs the node puts near each. dtagentd asks
 * this at start (the daemons never link CUDA: STYLE.md) and registers what
 * it says. A local query: it joins no job.
 *
 * The JSON, one object:
 *   {"cuda": BUILT, "driver": VERSION|null, "cudnn": VERSION|null,
 *    "cudnn_error": TEXT?, "devices": [{"index", "name", "uuid",
 *    "memory_bytes", "pci_bus_id", "cpus"}...], "error": TEXT?}
 * "cudnn" is the version libcudnn.so.9 reports (91900 for 9.19.0), null
 * with "cudnn_error" saying why where it cannot be loaded.
 * "error" says why no device is listed when the query failed (no driver,
 * a driver too old for the runtime, no device); the exit status is still 0,
 * as the answer is complete: this node has none. Exit 2 for bad usage.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/text.h"
#include "engine/cmd/cmd.h"

#ifdef HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/attn_cudnn.h"
#endif

/* The kernel's list of the CPUs near a PCI device ("0-31,64-95"), NULL
 * when it does not say (no NUMA, no sysfs). */
static char *local_cpus(const char *bdf)
{
    char path[128], buf[1024];
    FILE *f;

    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/local_cpulist", bdf);
    if ((f = fopen(path, "r")) == NULL)
        return NULL;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return buf[0] ? strdup(buf) : NULL;
}

#ifdef HAVE_CUDA
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it
 * and CUDA_VISIBLE_DEVICES takes it. */
static void uuid_text(const unsigned char b[16], char out[48])
{
    int o = snprintf(out, 48, "GPU-");
    for (int i = 0; i < 16; i++) {
        o += snprintf(out + o, (size_t)(48 - o), "%02x", b[i]);
        if (i == 3 || i == 5 || i == 7 || i == 9)
            out[o++] = '-';
    }
    out[o] = '\0';
}

static void query(json_t *o)
{
    json_t *devs = json_object_get(o, "devices");
    int n = 0, drv = 0;
    cudaError_t e;

    if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0)
        json_object_set_new(o, "driver", json_integer(drv));
    /* cuDNN, which the GPU ring's blocks run through where it loads */
    dt_emsg_t em = { 0 };
    size_t cv = dt_cudnn_version(&em);
    json_object_set_new(o, "cudnn", cv ? json_integer((json_int_t)cv) : json_null());
    if (!cv)
        json_object_set_new(o, "cudnn_error", json_string(em.s));
    if ((e = cudaGetDeviceCount(&n)) != cudaSuccess) {
        /* with no driver at all the runtime says its version is too new */
        json_object_set_new(o, "error",
                            json_sprintf("%scudaGetDeviceCount: %s",
                                         e == cudaErrorInsufficientDriver && drv == 0
                                             ? "no NVIDIA driver is loaded: "
                                             : "",
                                         cudaGetErrorString(e)));
        (void)cudaGetLastError();
        return;
    }
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        char uuid[48], bdf[32];

        if ((e = cudaGetDeviceProperties(&p, i)) != cudaSuccess) {
            json_object_set_new(o, "error", json_sprintf("cudaGetDeviceProperties(%d): %s", i,
                                                         cudaGetErrorString(e)));
            return;
        }
        uuid_text((const unsigned char *)p.uuid.bytes, uuid);
        snprintf(bdf, sizeof(bdf), "%04x:%02x:%02x.0", (unsigned)p.pciDomainID,
                 (unsigned)p.pciBusID, (unsigned)p.pciDeviceID);
        char *cpus = local_cpus(bdf);
        char *name = dt_text_escape(p.name, 0);
        json_array_append_new(devs, json_pack("{s:i, s:s, s:s, s:I, s:s, s:s?}", "index", i,
                                              "name", name, "uuid", uuid, "memory_bytes",
                                              (json_int_t)p.totalGlobalMem, "pci_bus_id", bdf,
                                              "cpus", cpus));
        free(name);
        free(cpus);
    }
}
#else
static void query(json_t *o)
{
    (void)local_cpus;
    json_object_set_new(o, "error", json_string("this dtengine was built without CUDA "
                                                "(./configure --with-cuda)"));
}
#endif

static void usage(FILE *f)
{
    fprintf(f, "usage: dtengine devices [--json]\n"
               "  the GPUs this process can see (after CUDA_VISIBLE_DEVICES); see dtengine(1)\n");
}

int dt_cmd_devices(int argc, char **argv)
{
    int json = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return DT_EXIT_OK;
        } else {
            fprintf(stderr, "dtengine devices: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return DT_EXIT_INPUT;
        }
    }
#ifdef HAVE_CUDA
    json_t *o = json_pack("{s:b, s:n, s:[]}", "cuda", 1, "driver", "devices");
#else
    json_t *o = json_pack("{s:b, s:n, s:[]}", "cuda", 0, "driver", "devices");
#endif
    query(o);
    if (json) {
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
    } else {
        json_t *devs = json_object_get(o, "devices"), *d;
        size_t i;
        const char *err = json_string_value(json_object_get(o, "error"));
        json_t *cv = json_object_get(o, "cudnn");
        if (json_array_size(devs) == 0)
            printf("no GPU%s%s\n", err ? ": " : "", err ? err : "");
        if (json_is_integer(cv))
            printf("cudnn %lld.%lld.%lld\n", (long long)json_integer_value(cv) / 10000,
                   (long long)json_integer_value(cv) / 100 % 100,
                   (long long)json_integer_value(cv) % 100);
        else if (json_is_string(json_object_get(o, "cudnn_error")))
            printf("cudnn none: %s\n",
                   json_string_value(json_object_get(o, "cudnn_error")));
        json_array_foreach(devs, i, d)
            printf("%lld  %s  %s  %.1f GiB  %s  cpus %s\n",
                   (long long)json_integer_value(json_object_get(d, "index")),
                   json_string_value(json_object_get(d, "uuid")),
                   json_string_value(json_object_get(d, "name")),
                   (double)json_integer_value(json_object_get(d, "memory_bytes")) /
                       (1024.0 * 1024.0 * 1024.0),
                   json_string_value(json_object_get(d, "pci_bus_id")),
                   json_is_string(json_object_get(d, "cpus"))
                       ? json_string_value(json_object_get(d, "cpus"))
                       : "-");
    }
    json_decref(o);
    return DT_EXIT_OK;
}
