/* SPDX-License-Identifier: MIT
 *
 * The picture of a job's history (cli/svgplot.h) from HISTORY documents
 * written here: text escaped for XML with control characters dropped, a
 * job with no steps refused, one step and a loss that was not reported
 * drawn without a NaN in the output, every failure marked on every panel
 * with its cost, checkpoints, and every document well-formed XML (checked
 * by a small parser of the subset the writer uses: elements, attributes
 * in double quotes, character data, the five entities and numeric ones).
 */
#include "config.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/svgplot.h"

/*-- a well-formedness check ---------------------------------------------------------*/

#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-:"

/* An entity at p: its length, 0 when it is none of XML's. */
static size_t entity(const char *p)
{
    static const char *const named[] = { "&amp;", "&lt;", "&gt;", "&quot;", "&apos;" };
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
        if (strncmp(p, named[i], strlen(named[i])) == 0)
            return strlen(named[i]);
    if (p[1] == '#') {
        size_t n = 2;
        while (p[n] >= '0' && p[n] <= '9')
            n++;
        return n > 2 && p[n] == ';' ? n + 1 : 0;
    }
    return 0;
}

/* NULL when doc is well-formed (one root, tags nested, attributes quoted,
 * no raw < or & in text, no control character), else what is wrong. */
static const char *xml_check(const char *doc, char *why, size_t n)
{
    char stack[64][32];
    int depth = 0, roots = 0;
    const char *p = doc;

    if (strncmp(p, "<?xml ", 6) == 0) {
        p = strstr(p, "?>");
        if (p == NULL)
            return "unterminated XML declaration";
        p += 2;
    }
    while (*p) {
        if ((unsigned char)*p < 0x20 && *p != '\n' && *p != '\t' && *p != '\r') {
            snprintf(why, n, "control character 0x%02x at byte %td", *p, p - doc);
            return why;
        }
        if (*p == '&') {
            size_t e = entity(p);
            if (e == 0) {
                snprintf(why, n, "a bare & at byte %td", p - doc);
                return why;
            }
            p += e;
            continue;
        }
        if (*p == '>') {
            snprintf(why, n, "a bare > at byte %td", p - doc);
            return why;
        }
        if (*p != '<') {
            if (depth == 0 && *p != '\n' && *p != ' ') {
                snprintf(why, n, "text outside the root at byte %td", p - doc);
                return why;
            }
            p++;
            continue;
        }
        int closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t len = strspn(name, NAME_CHARS);
        if (len == 0 || len >= sizeof(stack[0])) {
            snprintf(why, n, "a bad tag name at byte %td", p - doc);
            return why;
        }
        p = name + len;
        if (closing) {
            if (*p != '>' || depth == 0 || strncmp(stack[depth - 1], name, len) != 0 ||
                stack[depth - 1][len] != '\0') {
                snprintf(why, n, "</%.*s> does not close <%s> at byte %td", (int)len, name,
                         depth ? stack[depth - 1] : "", p - doc);
                return why;
            }
            depth--;
            p++;
            continue;
        }
        /* attributes: name="value" */
        for (;;) {
            p += strspn(p, " \n\t");
            if (*p == '>' || (p[0] == '/' && p[1] == '>'))
                break;
            size_t an = strspn(p, NAME_CHARS);
            if (an == 0 || p[an] != '=' || p[an + 1] != '"') {
                snprintf(why, n, "a bad attribute at byte %td", p - doc);
                return why;
            }
            p += an + 2;
            while (*p && *p != '"') {
                if (*p == '<' || (*p == '&' && entity(p) == 0)) {
                    snprintf(why, n, "a raw %c in an attribute at byte %td", *p, p - doc);
                    return why;
                }
                p++;
            }
            if (*p++ != '"')
                return "an unterminated attribute";
        }
        if (depth == 0 && roots++ > 0)
            return "a second root element";
        if (*p == '/') {
            p += 2;
            continue;
        }
        cr_assert_lt(depth, 64);
        memcpy(stack[depth], name, len);
        stack[depth++][len] = '\0';
        p++;
    }
    if (depth != 0) {
        snprintf(why, n, "<%s> is not closed", stack[depth - 1]);
        return why;
    }
    return roots == 1 ? NULL : "no root element";
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/*-- histories ------------------------------------------------------------------------*/

/* A job of 20 steps: gen 1 did 1..12 and failed, gen 2 resumed from the
 * checkpoint at step 10 and did 11..20. */
static json_t *history(const char *name)
{
    json_t *steps = json_array();
    int64_t t0 = 1700000000000;
    for (int k = 1; k <= 12; k++)
        json_array_append_new(steps, json_pack("{s:i, s:i, s:I, s:f, s:f, s:f}", "gen", 1, "step",
                                               k, "at_ms", (json_int_t)(t0 + 100 * k), "step_ms",
                                               100.0, "loss", 5.0 - 0.1 * k, "tokens_s", 2000.0));
    for (int k = 11; k <= 20; k++)
        json_array_append_new(steps, json_pack("{s:i, s:i, s:I, s:f, s:f, s:f}", "gen", 2, "step",
                                               k, "at_ms", (json_int_t)(t0 + 4000 + 100 * k),
                                               "step_ms", 100.0, "loss", 5.0 - 0.1 * k,
                                               "tokens_s", 1900.0));
    json_t *fail = json_pack("{s:i, s:i, s:s, s:f, s:f, s:f, s:i, s:i, s:f, s:I, s:I}", "gen", 1,
                             "next", 2, "fault", "worker", "detect_s", 0.3, "restart_s", 1.2,
                             "load_s", 2.0, "resume_step", 10, "recomputed_steps", 2,
                             "recomputed_s", 0.2, "ended_ms", (json_int_t)(t0 + 1400),
                             "fault_ms", (json_int_t)(t0 + 1250));
    return json_pack("{s:{s:i, s:s, s:s, s:i}, s:o, s:[o], s:[{s:i, s:i}, {s:i, s:i}], "
                     "s:[{s:i, s:s, s:I}], s:{s:f, s:I, s:f, s:f, s:f, s:f}}",
                     "job", "id", 7, "name", name, "state", "completed", "restarts", 1, "steps",
                     steps, "failures", fail, "generations", "gen", 1, "resume_step", 0, "gen", 2,
                     "resume_step", 10, "checkpoints", "step", 10, "state", "committed",
                     "committed_ms", (json_int_t)(t0 + 1050), "goodput", "ettr", 0.625,
                     "first_step_ms", (json_int_t)t0, "wall_s", 6.0, "productive_s", 3.75,
                     "recomputed_s", 0.2, "ckpt_stall_s", 0.0);
}

static char *render(const json_t *h)
{
    char *svg = NULL, why[160];
    size_t len = 0;
    dt_emsg_t em = { "" };

    cr_assert_eq(dtctl_svgplot(h, &svg, &len, &em), 0, "%s", em.s);
    cr_assert_not_null(svg);
    cr_assert_eq(strlen(svg), len);
    const char *bad = xml_check(svg, why, sizeof(why));
    cr_assert_null(bad, "not well-formed: %s", bad ? bad : "");
    cr_assert_null(strstr(svg, "nan"), "a NaN was printed");
    cr_assert_null(strstr(svg, "inf"), "an infinity was printed");
    return svg;
}

Test(plot, text_is_escaped_and_controls_dropped)
{
    char *e = dtctl_svgplot_text("a<b>&\"c'\x1b[31mred\x7f\n\t\xc2\x85z");
    cr_assert_str_eq(e, "a&lt;b&gt;&amp;&quot;c&#39;[31mredz");
    free(e);
    e = dtctl_svgplot_text("bad \xff byte, \xe2\x80\xae rlo, caf\xc3\xa9 \xf0\x9f\x98\x80");
    cr_assert_str_eq(e, "bad \xef\xbf\xbd byte,  rlo, caf\xc3\xa9 \xf0\x9f\x98\x80",
                     "U+FFFD for a bad byte; U+202E dropped; the rest kept");
    free(e);
    e = dtctl_svgplot_text(NULL);
    cr_assert_str_eq(e, "");
    free(e);
    /* a cut sequence and an overlong one are bytes, not characters */
    e = dtctl_svgplot_text("\xe2\x80 \xc0\xbc");
    cr_assert_str_eq(e, "\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd");
    free(e);
}

Test(plot, a_hostile_name_stays_text)
{
    json_t *h = history("<script>&\"x\"\x1b]0;title\x07</script>");
    char *svg = render(h);
    cr_assert_null(strstr(svg, "<script"));
    cr_assert_null(strchr(svg, '\x1b'));
    cr_assert_null(strchr(svg, '\x07'));
    cr_assert_not_null(strstr(svg, "job 7 &lt;script&gt;&amp;&quot;x&quot;]0;title&lt;/script&gt;"
                                   " \xe2\x80\x94 completed \xe2\x80\x94 ETTR 0.625"));
    free(svg);
    json_decref(h);
}

Test(plot, panels_series_failures_and_checkpoints)
{
    json_t *h = history("small");
    char *svg = render(h);

    cr_assert_not_null(strstr(svg, "viewBox=\"0 0 960 "));
    cr_assert_not_null(strstr(svg, " width=\"960\" height=\""));
    cr_assert_eq(count(svg, "class=\"plot-area\""), 3);
    cr_assert_not_null(strstr(svg, "id=\"area-loss\""));
    cr_assert_not_null(strstr(svg, "id=\"area-rate\""));
    cr_assert_not_null(strstr(svg, "id=\"area-progress\""));
    /* one polyline per generation on each panel, in its own colour */
    /* the earlier one wider, so that the steps done again lie inside it */
    cr_assert_eq(count(svg, "class=\"gen-1\" stroke=\"#1f77b4\" stroke-width=\"3.2\""), 3);
    cr_assert_eq(count(svg, "class=\"gen-2\" stroke=\"#2ca02c\" stroke-width=\"1.6\""), 3);
    cr_assert_not_null(strstr(svg, "gen 2 (from step 10)"), "the legend says where gen 2 began");
    /* the failure on every panel, its cost beside it on the time panel and
     * listed under the panels */
    cr_assert_eq(count(svg, "<g class=\"failure\" "), 3);
    const char *cost = "gen 1 worker: detect 0.3 s, restart 1.2 s, load 2.0 s, redo 2 steps 0.2 s";
    cr_assert_not_null(strstr(svg, cost));
    cr_assert_eq(count(svg, "class=\"failure-label\""), 1);
    cr_assert_not_null(strstr(svg, "F1</tspan> at 1.2 s, step 12: "));
    /* the checkpoint on each panel's edge */
    cr_assert_eq(count(svg, "<path class=\"checkpoint\""), 3);
    cr_assert_not_null(strstr(svg, ">22 steps recorded in 2 generations, 1 failure; productive "
                                   "3.8 s of 6.0 s, recomputed 0.2 s"));
    free(svg);
    json_decref(h);
}

Test(plot, no_steps_is_nothing_to_plot)
{
    json_t *h = json_pack("{s:{s:i, s:s}, s:[], s:[], s:[], s:[], s:n}", "job", "id", 4, "state",
                          "cancelled", "steps", "failures", "generations", "checkpoints",
                          "goodput");
    char *svg = (char *)"unset";
    size_t len = 1;
    dt_emsg_t em = { "" };

    cr_assert_eq(dtctl_svgplot(h, &svg, &len, &em), DT_ESTATE);
    cr_assert_str_eq(em.s, "job 4 has no steps recorded yet: nothing to plot");
    cr_assert_null(svg);
    cr_assert_eq(len, 0);
    json_decref(h);
    h = json_pack("{s:[]}", "steps");
    cr_assert_eq(dtctl_svgplot(h, &svg, &len, &em), DT_EPROTO, "no job: not a HISTORY reply");
    json_decref(h);
}

Test(plot, one_step_is_a_dot)
{
    json_t *h = json_pack("{s:{s:i, s:s, s:s}, s:[{s:i, s:i, s:I, s:f, s:f, s:f}], s:[], s:[], "
                          "s:[], s:{s:n, s:I}}", "job", "id", 1, "name", "one", "state",
                          "running", "steps", "gen", 1, "step", 1, "at_ms",
                          (json_int_t)1700000000500, "step_ms", 500.0, "loss", 2.5, "tokens_s",
                          100.0, "failures", "generations", "checkpoints", "goodput", "ettr",
                          "first_step_ms", (json_int_t)1700000000000);
    char *svg = render(h);

    cr_assert_eq(count(svg, "<circle class=\"gen-1\""), 3, "a dot on each panel");
    cr_assert_null(strstr(svg, "<polyline"));
    cr_assert_not_null(strstr(svg, "ETTR -"), "no ETTR: a dash");
    cr_assert_not_null(strstr(svg, "no failure"));
    free(svg);
    json_decref(h);
}

Test(plot, unreported_loss_and_rate)
{
    /* steps 1..6, loss missing at 3 (null) and 4 (absent): two runs of
     * points on the loss panel; no tokens/s at all (prefill) */
    json_t *steps = json_array();
    for (int k = 1; k <= 6; k++) {
        json_t *s = json_pack("{s:i, s:i, s:I, s:n}", "gen", 1, "step", k, "at_ms",
                              (json_int_t)(1000 + 10 * k), "tokens_s");
        if (k == 3)
            json_object_set_new(s, "loss", json_null());
        else if (k != 4)
            json_object_set_new(s, "loss", json_real(1.0 / k));
        json_array_append_new(steps, s);
    }
    json_t *h = json_pack("{s:{s:i, s:s, s:s}, s:o, s:[], s:[], s:[], s:n}", "job", "id", 2,
                          "name", "p", "state", "completed", "steps", steps, "failures",
                          "generations", "checkpoints", "goodput");
    char *svg = render(h);
    const char *loss = strstr(svg, "id=\"panel-loss\""), *rate = strstr(svg, "id=\"panel-rate\"");
    cr_assert(loss && rate);
    size_t lines = 0;
    for (const char *p = loss; (p = strstr(p, "<polyline")) != NULL && p < rate; p++)
        lines++;
    cr_assert_eq(lines, 2, "the loss line breaks where it was not reported");
    cr_assert_not_null(strstr(svg, "no tokens/s reported"));
    free(svg);
    json_decref(h);
}

Test(plot, many_failures_stay_bounded)
{
    json_t *h = history("many");
    json_t *fails = json_object_get(h, "failures"), *f0 = json_array_get(fails, 0);
    for (int i = 0; i < 40; i++) {
        json_t *f = json_deep_copy(f0);
        json_object_set_new(f, "fault", json_string(i == 3 ? "<&\">" : "agent"));
        json_array_append_new(fails, f);
    }
    char *svg = render(h);
    cr_assert_eq(count(svg, "class=\"failure-label\""), 8, "labels beside the first 8 only");
    cr_assert_eq(count(svg, "<g class=\"failure\" "), 3 * 41, "every one marked");
    cr_assert_not_null(strstr(svg, "and 9 more"));
    cr_assert_not_null(strstr(svg, "gen 1 &lt;&amp;&quot;&gt;: detect"));
    free(svg);
    json_decref(h);
}
