/* SPDX-License-Identifier: MIT
 *
 * The spec a command line gives, for the commands that take one (plan and
 * submit): `dtctl CMD [SPECFILE] [--KEY VALUE ...]`. Every spec key of
 * dt-spec(5) is a flag, '-' for '_' (spec/spec.h dt_spec_flag: --key VALUE,
 * --key=VALUE, --bool / --no-bool); the file is read first and the flags
 * override it, so a file may leave required keys to the flags. The key
 * table is the only list of flags: a key added there is a flag of both
 * commands.
 *
 * Not here: what the spec means (spec/), the commands' own output.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/dtctl.h"
#include "spec/spec.h"

const char *dtctl_spec_key(const char *key, const char *value)
{
    return strcmp(key, "model") == 0 && strchr(value, '/') != NULL ? "init_from" : key;
}

/* arg is one of the command's own flags: its bit set in *seen */
static int own_flag(const char *arg, const char *const *own, unsigned *seen)
{
    for (int j = 0; own != NULL && own[j] != NULL; j++)
        if (strcmp(arg, own[j]) == 0) {
            *seen |= 1u << j;
            return 1;
        }
    return 0;
}

int dtctl_spec_args(dtctl_t *ctl, const char *cmd, int argc, char **argv,
                    const char *const *own, unsigned *seen, int *help, dt_spec_t *spec)
{
    dt_emsg_t em = { "" };
    const char *file = NULL;
    int i;

    *seen = 0;
    *help = 0;
    /* the spec file first (if any), then the flags on top */
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            *help = 1;
            return DTCTL_OK;
        }
        if (strncmp(argv[i], "--", 2) != 0) {
            if (file != NULL) {
                fprintf(stderr, "%s %s: more than one spec file ('%s', '%s')\n", ctl->prog, cmd,
                        file, argv[i]);
                return DTCTL_USAGE;
            }
            file = argv[i];
            continue;
        }
        if (own_flag(argv[i], own, seen))
            continue;
        char *key;
        const char *val;
        int used = dt_spec_flag(argc, argv, i, &key, &val, &em);
        if (used < 0) {
            dtctl_error(ctl, cmd, NULL, em.s);
            return DTCTL_USAGE;
        }
        free(key);
        i += used - 1;
    }
    if (file != NULL && dt_spec_load_partial(file, spec, &em) < 0) {
        dtctl_error(ctl, cmd, NULL, em.s);
        return DTCTL_USAGE;
    }
    for (i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0 || own_flag(argv[i], own, seen))
            continue;
        char *key = NULL;
        const char *val;
        int used = dt_spec_flag(argc, argv, i, &key, &val, &em);
        if (dt_spec_set(spec, dtctl_spec_key(key, val), val, &em) < 0) {
            dtctl_error(ctl, cmd, NULL, em.s);
            free(key);
            return DTCTL_USAGE;
        }
        free(key);
        i += used - 1;
    }
    return DTCTL_OK;
}
