/* SPDX-License-Identifier: MIT
 *
 * The running program's directory and the programs beside it (see path.h).
 */
#include "config.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"
#include "common/path.h"

char *dt_path_self_dir(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    char *slash;

    if (n <= 0)
        return NULL;
    self[n] = '\0';
    if ((slash = strrchr(self, '/')) == NULL)
        return NULL;
    *slash = '\0';
    return dt_xstrdup(self);
}

char *dt_path_beside(const char *dir, const char *const *rel, size_t nrel, unsigned flags)
{
    char real[PATH_MAX];

    for (size_t i = 0; dir && i < nrel; i++) {
        char *p = dt_xasprintf("%s/%s", dir, rel[i]);

        if (access(p, X_OK) == 0) {
            if (!(flags & DT_PATH_REAL))
                return p;
            if (realpath(p, real)) {
                free(p);
                return dt_xstrdup(real);
            }
        }
        free(p);
    }
    return NULL;
}
