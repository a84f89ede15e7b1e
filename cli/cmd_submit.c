/* SPDX-License-Identifier: MIT
 *
 * dtctl submit: a job from a spec file (dt-spec(5)), from flags, or a file
 * with flags overriding it. Every spec key is also a flag: `--kv-heads 8`
 * sets kv_heads. The spec is checked here first, so a typo never reaches
 * the coordinator; the coordinator plans it and refuses what cannot run.
 * With --dry-run the coordinator plans it and prints the batch script it
 * would submit to Slurm, storing nothing.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/dtctl.h"
#include "io/hfspec.h"
#include "common/mem.h"
#include "common/proto.h"
#include "common/wire.h"
#include "spec/spec.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dtctl submit [SPECFILE] [--KEY VALUE ...] [--dry-run] [--json]\n"
               "  every key of dt-spec(5) is a flag, '-' for '_': --kind train --model tiny\n"
               "  --tokens 64K --ranks 4 --segments 2048,8192 --dilations 1,4 --name demo\n"
               "  --key=value works too; boolean keys take --causal / --no-causal\n"
               "  --dry-run: print the Slurm batch script, submit nothing\n");
}

int dtctl_submit(dtctl_t *ctl, int argc, char **argv)
{
    static const char *const own[] = { "--json", "--dry-run", NULL };
    dt_spec_t spec = { 0 };
    dt_emsg_t em = { "" };
    json_t *res = NULL;
    unsigned seen;
    int rc, help, dry;

    if ((rc = dtctl_spec_args(ctl, "submit", argc, argv, own, &seen, &help, &spec)) != DTCTL_OK ||
        help) {
        if (help)
            usage(stdout);
        dt_spec_free(&spec);
        return rc;
    }
    if (seen & 1u)
        ctl->json = 1;
    dry = (seen & 2u) != 0;
    if ((rc = dt_spec_check(&spec, &em)) < 0 || (rc = dt_hf_spec_fill(&spec, &em)) < 0) {
        dtctl_error(ctl, "submit", NULL, em.s);
        dt_spec_free(&spec);
        return DTCTL_USAGE;
    }
    char *text = dt_spec_format(&spec);
    dt_spec_free(&spec);
    dt_wire_submit_t req = { .spec = text, .dry_run = dry };
    rc = dtctl_request(ctl, DT_MSG_SUBMIT, dt_wire_submit_encode(&req), &res, &em);
    free(text);
    if (rc < 0)
        return dtctl_fail(ctl, "submit", rc, &em);
    dtctl_sanitize(ctl, res);
    dt_wire_submit_ok_t ok;
    if ((rc = dtctl_result(ctl, "submit", DT_MSG_SUBMIT, res, &ok)) != 0) {
        json_decref(res);
        return rc;
    }
    if (dry) {
        if (ctl->json)
            dtctl_print_json(res);
        else
            fputs(ok.script ? ok.script : "", stdout);
        json_decref(res);
        return DTCTL_OK;
    }
    if (ctl->json) {
        dt_wire_submit_ok_t brief = { .id = ok.id, .state = ok.state };
        json_t *out = dt_wire_submit_ok_encode(&brief);
        dtctl_print_json(out);
        json_decref(out);
    } else {
        printf("%lld\n", (long long)ok.id);
    }
    json_decref(res);
    return DTCTL_OK;
}
