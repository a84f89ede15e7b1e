/* SPDX-License-Identifier: MIT
 *
 * The SVG picture of a job's history (cli/svgplot.h): the reply read into
 * plain arrays, the ranges and ticks of each panel, then the document
 * written top to bottom into a memory stream. Coordinates are in the
 * viewBox's units (WIDTH wide); numbers are printed with "%.1f" in the C
 * locale dtctl runs in.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/svgplot.h"
#include "common/mem.h"
#include "common/text.h"

#define WIDTH 960.0
#define LEFT 84.0   /* room for the y tick labels */
#define RIGHT 36.0
#define PANEL_H 220.0 /* a plot area's height */
#define PANEL_GAP 76.0 /* its title above, its x axis below */
#define LINE_H 16.0
#define LABELS_MAX 8   /* failures labelled beside their line on the time panel */
#define LISTED_MAX 32  /* failures listed under the panels */

/* a generation's colour; red is the failures' */
static const char *const palette[] = { "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e",
                                       "#17becf", "#8c564b", "#e377c2", "#bcbd22" };
#define FAIL_COLOUR "#d62728"
#define CKPT_COLOUR "#444444"

/*-- text ------------------------------------------------------------------------*/

/* Characters that are dropped: not allowed in XML 1.0, or controls that
 * would reorder or break what is shown. */
static int dropped(uint32_t c)
{
    return dt_text_unprintable(c) || c == 0xfffe || c == 0xffff;
}

char *dtctl_svgplot_text(const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p), o = 0;
    char *out = dt_xmalloc(n * 6 + 1); /* the longest: "&quot;" for one byte */

    while (*p) {
        uint32_t c;
        size_t len = dt_text_utf8_next(p, n, &c);
        if (len == 0) { /* U+FFFD for the byte */
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            p++;
            n--;
            continue;
        }
        const char *ent = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;"
                          : c == '"' ? "&quot;" : c == '\'' ? "&#39;" : NULL;
        if (ent) {
            memcpy(out + o, ent, strlen(ent));
            o += strlen(ent);
        } else if (!dropped(c)) {
            memcpy(out + o, p, len);
            o += len;
        }
        p += len;
        n -= len;
    }
    out[o] = '\0';
    return out;
}

/* fputs of s escaped */
static void put_text(FILE *f, const char *s)
{
    char *e = dtctl_svgplot_text(s);
    fputs(e, f);
    free(e);
}

/*-- the reply, read ---------------------------------------------------------------*/

typedef struct point {
    int gen;
    double step, t, loss, rate; /* t: seconds since the first step; NaN: not reported */
} point_t;

typedef struct failure {
    int gen, next;
    const char *fault;
    double detect_s, restart_s, load_s, recomputed_s;
    double resume, reached; /* steps: where the next resumed, how far it had got */
    long long redo;
    double t, t_back; /* seconds: the fault, the next generation's first step */
} failure_t;

typedef struct ckpt {
    double step, t; /* t NaN: not committed, or before the first step */
} ckpt_t;

typedef struct hist {
    const json_t *job, *goodput;
    point_t *pts;
    size_t npts;
    failure_t *fails;
    size_t nfails;
    ckpt_t *cks;
    size_t ncks;
    int gens[LISTED_MAX]; /* the generations seen, in order (the legend's) */
    long long resumes[LISTED_MAX];
    size_t ngens, more_gens;
} hist_t;

static double real(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static double real0(const json_t *o, const char *k)
{
    double v = real(o, k);
    return isfinite(v) ? v : 0.0;
}

static const char *str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void hist_clear(hist_t *h)
{
    free(h->pts);
    free(h->fails);
    free(h->cks);
}

static void note_gen(hist_t *h, int gen, const json_t *gens)
{
    for (size_t i = 0; i < h->ngens; i++)
        if (h->gens[i] == gen)
            return;
    if (h->ngens == LISTED_MAX) {
        h->more_gens++;
        return;
    }
    size_t i;
    const json_t *g;
    h->resumes[h->ngens] = 0;
    json_array_foreach(gens, i, g)
        if (json_integer_value(json_object_get(g, "gen")) == gen)
            h->resumes[h->ngens] = (long long)json_integer_value(json_object_get(g, "resume_step"));
    h->gens[h->ngens++] = gen;
}

static int read_history(const json_t *r, hist_t *h, dt_emsg_t *em)
{
    const json_t *steps = json_object_get(r, "steps"), *fails = json_object_get(r, "failures"),
                 *cks = json_object_get(r, "checkpoints"),
                 *gens = json_object_get(r, "generations"), *v;
    size_t i;

    memset(h, 0, sizeof(*h));
    h->job = json_object_get(r, "job");
    h->goodput = json_object_get(r, "goodput");
    if (!json_is_object(h->job) || !json_is_array(steps))
        return dt_emsg_set(em, DT_EPROTO, "the coordinator's reply is not a HISTORY document "
                           "(no job or steps)");
    /* time 0: the first step's start, as goodput counts it; else the
     * first report */
    double t0 = real0(h->goodput, "first_step_ms");
    h->pts = dt_xcalloc(json_array_size(steps) + 1, sizeof(*h->pts));
    json_array_foreach(steps, i, v) {
        double step = real(v, "step"), at = real(v, "at_ms");
        if (!json_is_integer(json_object_get(v, "gen")) || !isfinite(step) || !isfinite(at))
            continue;
        if (t0 <= 0)
            t0 = at - real0(v, "step_ms");
        point_t *p = &h->pts[h->npts++];
        p->gen = (int)json_integer_value(json_object_get(v, "gen"));
        p->step = step;
        p->t = (at - t0) / 1000.0;
        p->loss = real(v, "loss");
        p->rate = real(v, "tokens_s");
        note_gen(h, p->gen, gens);
    }
    if (h->npts == 0)
        return dt_emsg_set(em, DT_ESTATE, "job %lld has no steps recorded yet: nothing to plot",
                           (long long)json_integer_value(json_object_get(h->job, "id")));
    h->fails = dt_xcalloc(json_array_size(fails) + 1, sizeof(*h->fails));
    json_array_foreach(fails, i, v) {
        failure_t *f = &h->fails[h->nfails++];
        f->gen = (int)json_integer_value(json_object_get(v, "gen"));
        f->next = (int)json_integer_value(json_object_get(v, "next"));
        f->fault = str(v, "fault");
        f->detect_s = real0(v, "detect_s");
        f->restart_s = real0(v, "restart_s");
        f->load_s = real0(v, "load_s");
        f->recomputed_s = real0(v, "recomputed_s");
        f->resume = real0(v, "resume_step");
        f->redo = (long long)real0(v, "recomputed_steps");
        f->reached = f->resume + (double)f->redo;
        double fault_ms = real0(v, "fault_ms");
        f->t = fault_ms > 0 ? (fault_ms - t0) / 1000.0 : NAN;
        f->t_back = f->t + f->detect_s + f->restart_s + f->load_s;
    }
    h->cks = dt_xcalloc(json_array_size(cks) + 1, sizeof(*h->cks));
    json_array_foreach(cks, i, v) {
        double step = real(v, "step"), at = real0(v, "committed_ms");
        if (!isfinite(step))
            continue;
        ckpt_t *c = &h->cks[h->ncks++];
        c->step = step;
        c->t = at > 0 && at >= t0 ? (at - t0) / 1000.0 : NAN;
    }
    return 0;
}

/*-- axes ---------------------------------------------------------------------------*/

typedef struct range {
    double lo, hi;
} range_t;

static void widen(range_t *r, double v)
{
    if (!isfinite(v))
        return;
    if (v < r->lo)
        r->lo = v;
    if (v > r->hi)
        r->hi = v;
}

/* A tick spacing near span / target: 1, 2 or 5 times a power of ten. */
static double tick_step(double span, int target, int integer)
{
    double raw = span / target, mag = pow(10.0, floor(log10(raw))), f = raw / mag;
    double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    return integer && step < 1 ? 1 : step;
}

/* An axis over r: widened to whole ticks, never empty (an empty range,
 * nothing in it, gets one around what there is). */
static double nice(range_t *r, int target, int integer)
{
    if (!(r->lo <= r->hi) || !isfinite(r->hi - r->lo)) /* nothing in it, or past drawing */
        *r = (range_t){ 0, 1 };
    if (r->hi - r->lo < 1e-9 * (fabs(r->lo) + 1)) {
        double pad = fabs(r->lo) > 0 ? fabs(r->lo) * 0.1 : 1.0;
        r->lo -= pad;
        r->hi += pad;
    }
    double step = tick_step(r->hi - r->lo, target, integer);
    r->lo = floor(r->lo / step + 1e-9) * step;
    r->hi = ceil(r->hi / step - 1e-9) * step;
    return step;
}

/* Decimals that show ticks `step` apart. */
static int decimals(double step)
{
    int d = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    return d > 6 ? 6 : d;
}

typedef struct panel {
    const char *id, *title, *xlabel, *ylabel;
    double x, y, w, h; /* the plot area */
    range_t xr, yr;
    double xstep, ystep;
} panel_t;

static double px(const panel_t *p, double v)
{
    return p->x + (v - p->xr.lo) / (p->xr.hi - p->xr.lo) * p->w;
}

static double py(const panel_t *p, double v)
{
    return p->y + p->h - (v - p->yr.lo) / (p->yr.hi - p->yr.lo) * p->h;
}

/* How many ticks past the first an axis has (at most 50). */
static int ticks(const range_t *r, double step)
{
    double n = floor((r->hi - r->lo) / step + 1e-6);
    return n < 0 ? 0 : n > 50 ? 50 : (int)n;
}

/* The frame, grid, ticks and labels of a panel, and the clip path its data
 * is drawn in. */
static void draw_axes(FILE *f, const panel_t *p)
{
    int xd = decimals(p->xstep), yd = decimals(p->ystep);
    int nx = ticks(&p->xr, p->xstep), ny = ticks(&p->yr, p->ystep);

    fprintf(f, "<g class=\"panel\" id=\"panel-%s\">\n", p->id);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">%s</text>\n",
            p->x, p->y - 8, p->title);
    fprintf(f, "<clipPath id=\"clip-%s\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
            "height=\"%.1f\"/></clipPath>\n", p->id, p->x, p->y, p->w, p->h);
    fprintf(f, "<rect class=\"plot-area\" id=\"area-%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
            "height=\"%.1f\" fill=\"#ffffff\" stroke=\"#888888\"/>\n", p->id, p->x, p->y, p->w,
            p->h);
    fprintf(f, "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n");
    for (int k = 0; k <= nx; k++) {
        double x = px(p, p->xr.lo + k * p->xstep);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, p->y, x,
                p->y + p->h);
    }
    for (int k = 0; k <= ny; k++) {
        double y = py(p, p->yr.lo + k * p->ystep);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", p->x, y,
                p->x + p->w, y);
    }
    fprintf(f, "</g>\n<g font-size=\"11\" fill=\"#333333\">\n");
    for (int k = 0; k <= nx; k++) {
        double v = p->xr.lo + k * p->xstep;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.*f</text>\n", px(p, v),
                p->y + p->h + 14, xd, fabs(v) < p->xstep * 1e-6 ? 0.0 : v);
    }
    for (int k = 0; k <= ny; k++) {
        double v = p->yr.lo + k * p->ystep;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.*f</text>\n", p->x - 6,
                py(p, v) + 4, yd, fabs(v) < p->ystep * 1e-6 ? 0.0 : v);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", p->x + p->w / 2,
            p->y + p->h + 32, p->xlabel);
    fprintf(f, "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">%s"
            "</text>\n</g>\n", p->x - 62, p->y + p->h / 2, p->ylabel);
}

static const char *colour(int gen)
{
    return palette[(unsigned)(gen > 0 ? gen - 1 : 0) % (sizeof(palette) / sizeof(palette[0]))];
}

/* What a point puts on a panel. */
typedef enum which { LOSS_STEP, RATE_TIME, STEP_TIME } which_t;

static int coords(const panel_t *p, which_t w, const point_t *pt, double *x, double *y)
{
    double xv = w == LOSS_STEP ? pt->step : pt->t;
    double yv = w == LOSS_STEP ? pt->loss : w == RATE_TIME ? pt->rate : pt->step;
    if (!isfinite(xv) || !isfinite(yv))
        return 0;
    *x = px(p, xv);
    *y = py(p, yv);
    return 1;
}

/* A generation's line width: wider the more generations come after it,
 * so that the steps a later one did again lie inside its line. */
static double width_of(const hist_t *h, int gen)
{
    for (size_t i = 0; i < h->ngens; i++)
        if (h->gens[i] == gen) {
            double later = (double)(h->ngens - 1 - i);
            return 1.6 + (later < 2 ? later : 2) * 1.6;
        }
    return 1.6;
}

/* One polyline per generation's run of points with a value (a point
 * without one ends the run); a run of one point is a dot. */
static void draw_series(FILE *f, const panel_t *p, const hist_t *h, which_t w)
{
    size_t i = 0;

    fprintf(f, "<g class=\"series\" clip-path=\"url(#clip-%s)\" fill=\"none\" "
            "stroke-linejoin=\"round\" stroke-linecap=\"round\">\n", p->id);
    while (i < h->npts) {
        double x, y;
        if (!coords(p, w, &h->pts[i], &x, &y)) {
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < h->npts && h->pts[j].gen == h->pts[i].gen && coords(p, w, &h->pts[j], &x, &y))
            j++;
        const char *c = colour(h->pts[i].gen);
        if (j - i == 1) {
            coords(p, w, &h->pts[i], &x, &y);
            fprintf(f, "<circle class=\"gen-%d\" cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\" "
                    "stroke=\"none\"/>\n", h->pts[i].gen, x, y, c);
        } else {
            fprintf(f, "<polyline class=\"gen-%d\" stroke=\"%s\" stroke-width=\"%.1f\" points=\"",
                    h->pts[i].gen, c, width_of(h, h->pts[i].gen));
            for (size_t k = i; k < j; k++) {
                coords(p, w, &h->pts[k], &x, &y);
                fprintf(f, "%s%.1f,%.1f", k > i ? " " : "", x, y);
            }
            fprintf(f, "\"/>\n");
        }
        i = j;
    }
    fprintf(f, "</g>\n");
}

/* What one failure cost, as its label says it. */
static void cost_text(const failure_t *fl, char *buf, size_t n)
{
    char word[40];
    snprintf(word, sizeof(word), "%.32s", fl->fault[0] ? fl->fault : "failure");
    char *fault = dtctl_svgplot_text(word); /* at most 6 bytes for each of 32 */
    snprintf(buf, n, "gen %d %s: detect %.1f s, restart %.1f s, load %.1f s, redo %lld step%s "
             "%.1f s", fl->gen, fault, fl->detect_s, fl->restart_s, fl->load_s, fl->redo,
             fl->redo == 1 ? "" : "s", fl->recomputed_s);
    free(fault);
}

/* The failures on a panel: on the step panel a line where the failed
 * generation had got to and the steps done again shaded; on a time panel
 * a line at the fault and the outage shaded, labelled with its cost on
 * the first time panel. */
static void draw_failures(FILE *f, const panel_t *p, const hist_t *h, which_t w, int labels)
{
    fprintf(f, "<g class=\"failures\" clip-path=\"url(#clip-%s)\">\n", p->id);
    for (size_t i = 0; i < h->nfails; i++) {
        const failure_t *fl = &h->fails[i];
        double at = w == LOSS_STEP ? fl->reached : fl->t;
        double from = w == LOSS_STEP ? fl->resume : fl->t, to = w == LOSS_STEP ? fl->reached
                                                                              : fl->t_back;
        char cost[512];
        if (!isfinite(at))
            continue;
        cost_text(fl, cost, sizeof(cost));
        double x = px(p, at), x0 = px(p, from), x1 = px(p, to);
        fprintf(f, "<g class=\"failure\" id=\"failure-%s-%zu\"><title>F%zu %s</title>\n", p->id,
                i + 1, i + 1, cost);
        if (isfinite(x0) && isfinite(x1) && x1 > x0)
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                    "fill-opacity=\"0.08\"/>\n", x0, p->y, x1 - x0, p->h, FAIL_COLOUR);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"1.5\" stroke-dasharray=\"5 3\"/>\n", x, p->y, x, p->y + p->h,
                FAIL_COLOUR);
        double ty = p->y + 12 + 13.0 * (double)(i % 6);
        if (labels && i < LABELS_MAX) {
            /* beside the line, on the side with room for it */
            int left = x + 8 + 6.2 * (double)strlen(cost) > p->x + p->w;
            fprintf(f, "<text class=\"failure-label\" x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
                    "fill=\"%s\" text-anchor=\"%s\">F%zu %s</text>\n", left ? x - 4 : x + 4, ty,
                    FAIL_COLOUR, left ? "end" : "start", i + 1, cost);
        } else {
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"%s\">F%zu</text>\n",
                    x + 3, ty, FAIL_COLOUR, i + 1);
        }
        fprintf(f, "</g>\n");
    }
    fprintf(f, "</g>\n");
}

/* Checkpoint commits: a small triangle on the panel's bottom edge. */
static void draw_ckpts(FILE *f, const panel_t *p, const hist_t *h, which_t w)
{
    fprintf(f, "<g class=\"checkpoints\" fill=\"%s\">\n", CKPT_COLOUR);
    for (size_t i = 0; i < h->ncks; i++) {
        double v = w == LOSS_STEP ? h->cks[i].step : h->cks[i].t;
        if (!isfinite(v) || v < p->xr.lo || v > p->xr.hi)
            continue;
        double x = px(p, v), y = p->y + p->h;
        fprintf(f, "<path class=\"checkpoint\" d=\"M%.1f %.1fl-4 7h8z\"><title>checkpoint at "
                "step %.0f committed</title></path>\n", x, y - 7, h->cks[i].step);
    }
    fprintf(f, "</g>\n");
}

static void legend(FILE *f, const hist_t *h, double y)
{
    double x = LEFT;

    fprintf(f, "<g class=\"legend\" font-size=\"11\" fill=\"#333333\">\n");
    for (size_t i = 0; i < h->ngens; i++) {
        char what[64];
        if (h->resumes[i] > 0)
            snprintf(what, sizeof(what), "gen %d (from step %lld)", h->gens[i], h->resumes[i]);
        else
            snprintf(what, sizeof(what), "gen %d", h->gens[i]);
        double wtext = 6.2 * (double)strlen(what) + 34;
        if (x + wtext > WIDTH - RIGHT) {
            x = LEFT;
            y += LINE_H;
        }
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x, y - 4, x + 20,
                y - 4, colour(h->gens[i]), x + 24, y, what);
        x += wtext;
    }
    if (h->more_gens)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">and %zu more</text>\n", x, y, h->more_gens);
    y += LINE_H;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"1.5\" stroke-dasharray=\"5 3\"/><text x=\"%.1f\" y=\"%.1f\">failure "
            "(at its step, at its time)</text>\n", LEFT, y - 4, LEFT + 20, y - 4, FAIL_COLOUR,
            LEFT + 24, y);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"20\" height=\"10\" fill=\"%s\" "
            "fill-opacity=\"0.08\"/><text x=\"%.1f\" y=\"%.1f\">steps done again; outage "
            "(detect, restart, load)</text>\n", LEFT + 230, y - 9, FAIL_COLOUR, LEFT + 254, y);
    fprintf(f, "<path d=\"M%.1f %.1fl-4 7h8z\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">"
            "checkpoint committed</text>\n</g>\n", LEFT + 540, y - 9, CKPT_COLOUR, LEFT + 550, y);
}

/*-- the document -----------------------------------------------------------------*/

int dtctl_svgplot(const json_t *history, char **svg, size_t *len, dt_emsg_t *em)
{
    hist_t h;
    int rc;

    *svg = NULL;
    *len = 0;
    if ((rc = read_history(history, &h, em)) < 0) {
        hist_clear(&h);
        return rc;
    }
    /* the panels' ranges: the data, the failures and the commits */
    range_t steps = { INFINITY, -INFINITY }, secs = steps, loss = steps, rate = steps;
    widen(&steps, 0);
    widen(&secs, 0);
    widen(&rate, 0);
    for (size_t i = 0; i < h.npts; i++) {
        widen(&steps, h.pts[i].step);
        widen(&secs, h.pts[i].t);
        widen(&loss, h.pts[i].loss);
        widen(&rate, h.pts[i].rate);
    }
    for (size_t i = 0; i < h.nfails; i++) {
        widen(&steps, h.fails[i].reached);
        widen(&secs, h.fails[i].t);
        widen(&secs, h.fails[i].t_back);
    }
    for (size_t i = 0; i < h.ncks; i++) {
        widen(&steps, h.cks[i].step);
        widen(&secs, h.cks[i].t);
    }
    int have_loss = loss.lo <= loss.hi, have_rate = rate.hi > 0;

    size_t listed = h.nfails < LISTED_MAX ? h.nfails : LISTED_MAX;
    double legend_y = 84, legend_h = LINE_H * (2 + (double)(h.ngens / 6));
    double top = legend_y + legend_h + 24;
    double height = top + 3 * (PANEL_H + PANEL_GAP) + LINE_H * (double)(listed + 1) + 16;
    panel_t ps[3] = {
        { .id = "loss", .title = "loss against step", .xlabel = "step", .ylabel = "loss",
          .xr = steps, .yr = loss },
        { .id = "rate", .title = "tokens/s against wall time", .xlabel = "seconds since the "
          "first step", .ylabel = "tokens/s", .xr = secs, .yr = rate },
        { .id = "progress", .title = "step against wall time", .xlabel = "seconds since the "
          "first step", .ylabel = "step", .xr = secs, .yr = steps },
    };
    for (int i = 0; i < 3; i++) {
        ps[i].x = LEFT;
        ps[i].w = WIDTH - LEFT - RIGHT;
        ps[i].y = top + i * (PANEL_H + PANEL_GAP);
        ps[i].h = PANEL_H;
        ps[i].xstep = nice(&ps[i].xr, 8, i != 1 && i != 2);
        ps[i].ystep = nice(&ps[i].yr, 5, i == 2);
    }

    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL) {
        hist_clear(&h);
        return dt_emsg_set(em, DT_ENOMEM, "cannot write the picture: out of memory");
    }
    const json_t *j = h.job, *gp = h.goodput;
    long long id = (long long)json_integer_value(json_object_get(j, "id"));
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" "
            "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, "
            "Arial, sans-serif\" font-size=\"12\">\n", WIDTH, height, WIDTH, height);
    fprintf(f, "<title>dt job %lld ", id);
    put_text(f, str(j, "name"));
    fprintf(f, "</title>\n<rect width=\"%.0f\" height=\"%.0f\" fill=\"#fbfbfb\"/>\n", WIDTH,
            height);
    /* the title: job, name, state, ETTR */
    fprintf(f, "<text class=\"title\" x=\"%.1f\" y=\"30\" font-size=\"18\" font-weight=\"bold\">"
            "job %lld ", LEFT, id);
    put_text(f, str(j, "name"));
    fprintf(f, " \xe2\x80\x94 ");
    put_text(f, str(j, "state"));
    double ettr = real(gp, "ettr");
    if (isfinite(ettr))
        fprintf(f, " \xe2\x80\x94 ETTR %.3f", ettr);
    else
        fprintf(f, " \xe2\x80\x94 ETTR -");
    fprintf(f, "</text>\n");
    fprintf(f, "<text class=\"subtitle\" x=\"%.1f\" y=\"52\" fill=\"#333333\">%zu step%s "
            "recorded in %zu generation%s, %zu failure%s; productive %.1f s of %.1f s, "
            "recomputed %.1f s, checkpoint stall %.1f s, restarts %lld</text>\n", LEFT, h.npts,
            h.npts == 1 ? "" : "s", h.ngens + h.more_gens, h.ngens + h.more_gens == 1 ? "" : "s",
            h.nfails, h.nfails == 1 ? "" : "s", real0(gp, "productive_s"), real0(gp, "wall_s"),
            real0(gp, "recomputed_s"), real0(gp, "ckpt_stall_s"),
            (long long)json_integer_value(json_object_get(j, "restarts")));
    legend(f, &h, legend_y);

    static const which_t what[3] = { LOSS_STEP, RATE_TIME, STEP_TIME };
    for (int i = 0; i < 3; i++) {
        const panel_t *p = &ps[i];
        draw_axes(f, p);
        if ((i == 0 && !have_loss) || (i == 1 && !have_rate))
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888888\">"
                    "no %s reported</text>\n", p->x + p->w / 2, p->y + p->h / 2,
                    i == 0 ? "loss" : "tokens/s");
        draw_failures(f, p, &h, what[i], i == 1);
        draw_series(f, p, &h, what[i]);
        draw_ckpts(f, p, &h, what[i]);
        fprintf(f, "</g>\n");
    }

    /* every failure, in words */
    double y = top + 3 * (PANEL_H + PANEL_GAP) - 20;
    fprintf(f, "<g class=\"failure-list\" font-size=\"11\" fill=\"#333333\">\n");
    if (h.nfails == 0)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">no failure</text>\n", LEFT, y);
    for (size_t i = 0; i < listed; i++) {
        const failure_t *fl = &h.fails[i];
        char cost[512];
        cost_text(fl, cost, sizeof(cost));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\"><tspan fill=\"%s\">F%zu</tspan> at %.1f s, "
                "step %.0f: %s; gen %d resumed from step %.0f</text>\n", LEFT, y, FAIL_COLOUR,
                i + 1, isfinite(fl->t) ? fl->t : 0.0, fl->reached, cost, fl->next, fl->resume);
        y += LINE_H;
    }
    if (h.nfails > listed)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">and %zu more (dtctl --json plot)</text>\n", LEFT,
                y, h.nfails - listed);
    fprintf(f, "</g>\n</svg>\n");
    hist_clear(&h);
    if (fclose(f) != 0) {
        free(buf);
        return dt_emsg_set(em, DT_ENOMEM, "cannot write the picture: out of memory");
    }
    *svg = buf;
    *len = n;
    return 0;
}
