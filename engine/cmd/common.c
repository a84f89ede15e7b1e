/* SPDX-License-Identifier: MIT
 *
 * What the engine's three commands share besides agreeing on outcomes
 * (engine/cmd/agree.h): option numbers, the model options of train and
 * prefill, and the exit code of a dt error (engine/cmd/cmd.h). Here rather
 * than in main.c, which dispatches to the commands: the commands call
 * down into this file, never up into main.
 */
#include "config.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/proto.h"
#include "io/hfspec.h"
#include "engine/cmd/cmd.h"
#include "spec/dtype.h"
#include "spec/spec.h"

int dt_cmd_model_resolve(dt_spec_t *s, dt_model_cfg_t *m, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_spec_check_model(s, em)) < 0)
        return rc;
    if (s->init_from != NULL && (rc = dt_hf_spec_fill(s, em)) < 0)
        return rc;
    if ((rc = dt_model_from_spec(s, m, em)) < 0)
        return rc;
    return dt_model_cfg_check(m, em);
}

void dt_cmd_plan_pos_offset(json_t *plan, int64_t pos_offset)
{
    if (pos_offset != 0)
        json_object_set_new(plan, "pos_offset", json_integer((json_int_t)pos_offset));
}

int dt_cmd_check_pos_offset(const char *dir, const json_t *plan, int64_t pos_offset,
                            dt_emsg_t *em)
{
    json_t *v = json_object_get(plan, "pos_offset");
    json_int_t have = json_is_integer(v) ? json_integer_value(v) : 0;

    if (v != NULL && !json_is_integer(v))
        return dt_emsg_set(em, DT_EFORMAT, "%s: the manifest's pos_offset is not an integer",
                           dir);
    if (have != pos_offset)
        return dt_emsg_set(em, DT_EINVAL, "%s: written for the window at position %lld "
                           "(pos_offset), this run's starts at %lld: a resume continues the "
                           "same positions", dir, (long long)have, (long long)pos_offset);
    return 0;
}

int dt_cmd_number(const char *name, const char *s, double lo, double hi, double *out,
                  dt_emsg_t *em)
{
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !(v >= lo && v <= hi))
        return dt_emsg_set(em, DT_EUSAGE, "--%s '%s': a number from %g to %g", name, s, lo, hi);
    *out = v;
    return 0;
}

int dt_cmd_spec_load(const char *path, const char *kind, struct dt_spec *s, dt_emsg_t *em)
{
    int rc;

    dt_spec_free(s);
    if ((rc = dt_spec_load(path, s, em)) < 0)
        return rc;
    if (strcmp(s->kind ? s->kind : "train", kind) != 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: kind = %s; dtengine %s runs kind = %s", path,
                           s->kind ? s->kind : "train", kind, kind);
    return 0;
}

int dt_cmd_device_check(const dt_spec_t *s, dt_emsg_t *em)
{
    const char *dt = s->dtype ? s->dtype : s->precision;
    bool cuda = dt_spec_device_id(s) == DT_DEVICE_CUDA;

    if (dt != NULL && !cuda && strcmp(dt, "fp32") != 0)
        return dt_emsg_set(em, DT_EUSAGE, "--dtype %s is for --device cuda (the CPU path is "
                           "fp32)", dt);
    if (dt != NULL && cuda && strcmp(dt, "fp32") == 0)
        return dt_emsg_set(em, DT_EUSAGE, "--dtype fp32 with --device cuda: the GPU path "
                           "computes in bf16 or fp16");
#ifndef HAVE_CUDA
    if (cuda)
        return dt_emsg_set(em, DT_EUSAGE, "device cuda: this dtengine was built without CUDA "
                           "(configure --with-cuda)");
#endif
    return 0;
}

int dt_cmd_commit_option(const char *value, int *external, dt_emsg_t *em)
{
    if (strcmp(value, "self") != 0 && strcmp(value, "external") != 0)
        return dt_emsg_set(em, DT_EUSAGE, "--ckpt-commit '%s': self or external", value);
    *external = strcmp(value, "external") == 0;
    return 0;
}

int dt_exit_code(int rc)
{
    switch (rc) {
    case DT_OK:
        return DT_EXIT_OK;
    case DT_EINVAL:
    case DT_EUSAGE:
    case DT_ECONF:
    case DT_ENOENT:
    case DT_EACCES:
    case DT_EFORMAT:
    case DT_ESHAPE:
    case DT_EDTYPE:
    case DT_ELAYOUT:
    case DT_ERANGE:
    case DT_ENOTSUP:
        return DT_EXIT_INPUT;
    case DT_ECKPT:
        return DT_EXIT_CKPT;
    case DT_EDEVICE:
        return DT_EXIT_DEVICE;
    default:
        return DT_EXIT_FAILURE;
    }
}
