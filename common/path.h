/* SPDX-License-Identifier: MIT
 *
 * Where the running program is, and its sibling programs beside it: dtctl
 * finds dtcoordd and dtagentd, dtagentd finds dtengine, in the build tree
 * (../engine/dtengine) as in the installed layout (../bin/dtengine).
 */
#ifndef DT_PATH_H
#define DT_PATH_H

#include <stddef.h>

/* The directory of the running program (/proc/self/exe), a new string;
 * NULL where it cannot be read. */
char *dt_path_self_dir(void);

/* dt_path_beside's flags. */
#define DT_PATH_REAL 1u /* the result resolved with realpath(3) */

/* The first of DIR/rel[0], DIR/rel[1], ... that this process may execute,
 * a new string (with DT_PATH_REAL: resolved, and a candidate that cannot
 * be resolved is passed over); NULL when there is none. */
char *dt_path_beside(const char *dir, const char *const *rel, size_t nrel, unsigned flags);

#endif /* DT_PATH_H */
