/* SPDX-License-Identifier: MIT
 *
 * A picture of a job's history (dtctl plot): a pure function from the
 * coordinator's HISTORY reply (coordinator/jobs.h, dt_jobs_history) to the
 * text of one SVG 1.1 document, written by hand with no library. Three
 * panels: loss against step, tokens/s against wall time (seconds since the
 * first step) and step against wall time; one polyline per generation in
 * its own colour, so steps done again after a resume overlap the ones
 * before; every failure a vertical line on each panel (at its step, at its
 * time) labelled with its cost, the outage (detect, restart, load) and the
 * recomputed steps shaded; checkpoint commits as small triangles; a title
 * (job, name, state, ETTR) and a legend. Each plot area is a <rect
 * class="plot-area" id="area-NAME"> (loss, rate, progress) with the data
 * clipped to it.
 *
 * Every text that comes from the reply is escaped for XML, with control
 * characters dropped (a job name may hold < & " or a terminal's escape
 * sequence). Not here: asking the coordinator, writing the file
 * (cli/cmd_plot.c).
 */
#ifndef DT_CLI_SVGPLOT_H
#define DT_CLI_SVGPLOT_H

#include <jansson.h>
#include <stddef.h>

#include "common/err.h"

/* The picture of history, a HISTORY reply (borrowed): *svg (the caller
 * frees it) holds *len bytes of UTF-8, NUL-terminated. DT_ESTATE when the
 * reply has no step to plot ("job N has no steps recorded yet: nothing to
 * plot"), DT_EPROTO when it is not a HISTORY reply; *svg NULL then. */
int dtctl_svgplot(const json_t *history, char **svg, size_t *len, dt_emsg_t *em);

/* s as XML character data or an attribute value (the caller frees it):
 * & < > " ' as entities; C0 controls (newline and tab too), DEL, C1
 * controls, the bidirectional and line-breaking format characters that
 * common/text.h refuses, and U+FFFE/U+FFFF dropped; an invalid UTF-8 byte
 * becomes U+FFFD. NULL gives "". */
char *dtctl_svgplot_text(const char *s);

#endif /* DT_CLI_SVGPLOT_H */
