/* SPDX-License-Identifier: MIT
 *
 * `dtctl nll DIR [--out FILE.npy]`: the likelihood a prefill wrote with
 * --out-dir DIR, one shard per rank (io/nll.h), put back in position
 * order: the perplexity over the window and by position bucket, and with
 * --out the per-position NLL as one float32 array. Local: no coordinator.
 */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/dtctl.h"
#include "io/nll.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dtctl nll DIR [--out FILE.npy] [--json]\n"
               "DIR: what dtengine prefill --out-dir wrote (nll.K.npy, nll_pos.K.npy per rank).\n"
               "Prints the perplexity over the window and by position bucket (powers of two);\n"
               "--out writes the negative log-likelihood of every position, in order, as\n"
               "float32 (NaN where a position has no target).\n");
}

int dtctl_nll(dtctl_t *ctl, int argc, char **argv)
{
    static const struct option lo[] = {
        { "out", required_argument, NULL, 'o' },
        { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *out = NULL;
    dt_nll_sums_t s;
    dt_emsg_t em = { "" };
    int64_t first = 0, n = 0;
    int c;

    memset(&s, 0, sizeof(s));
    opterr = 0;
    optind = 0;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'j': ctl->json = 1; break;
        case 'h': usage(stdout); return DTCTL_OK;
        default:
            fprintf(stderr, "%s nll: unknown option or missing value '%s'\n", ctl->prog,
                    argv[optind - 1]);
            usage(stderr);
            return DTCTL_USAGE;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "%s nll: one directory, please\n", ctl->prog);
        usage(stderr);
        return DTCTL_USAGE;
    }
    if (dt_nll_merge(argv[optind], out, &s, &first, &n, &em) < 0) {
        dtctl_error(ctl, "nll", NULL, em.s);
        return DTCTL_USAGE;
    }
    if (ctl->json) {
        json_t *j = dt_nll_summary(&s, n, first);
        if (out)
            json_object_set_new(j, "out", json_string(out));
        dtctl_print_json(j);
        json_decref(j);
        return DTCTL_OK;
    }
    dt_nll_print(stdout, &s, n, first);
    if (out)
        printf("wrote %s: %lld positions from %lld\n", out, (long long)n, (long long)first);
    return DTCTL_OK;
}
