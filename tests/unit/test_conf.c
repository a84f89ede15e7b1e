/* SPDX-License-Identifier: MIT
 *
 * Unit tests for common/conf: a key table over a small struct with one field
 * of each type, good files, every content error with the message the user
 * would read (file, line, key), all-or-nothing on error, and the value parsers
 * on their own. Files are real temporary files; nothing here needs a service.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/conf.h"
#include "common/mem.h"

struct cfg {
    char *name;      /* required */
    char *motd;      /* optional string with a heap default */
    int64_t port;    /* 1..65535 */
    int64_t offset;  /* unbounded */
    int verbose;     /* bool */
    int64_t timeout; /* ms, 10ms..1h */
    int64_t buf;     /* bytes, 4KiB..1GiB */
    int64_t limit;   /* bytes, unbounded */
};

#define KEY(n, t, f, lo, hi, req, h)                                                           \
    {                                                                                          \
        .name = (n), .type = (t), .offset = offsetof(struct cfg, f), .min = (lo), .max = (hi), \
        .required = (req), .help = (h)                                                         \
    }

static const dt_conf_key_t keys[] = {
    KEY("name", DT_CONF_STRING, name, 0, 0, 1, "cluster name"),
    KEY("motd", DT_CONF_STRING, motd, 0, 0, 0, "message of the day"),
    KEY("port", DT_CONF_INT, port, 1, 65535, 0, "tcp port"),
    KEY("offset", DT_CONF_INT, offset, 0, 0, 0, "any integer"),
    KEY("verbose", DT_CONF_BOOL, verbose, 0, 0, 0, "log more"),
    KEY("timeout", DT_CONF_DURATION, timeout, 10, 3600 * 1000, 0, "rpc timeout"),
    KEY("buf", DT_CONF_SIZE, buf, 4096, INT64_C(1) << 30, 0, "buffer size"),
    KEY("limit", DT_CONF_SIZE, limit, 0, 0, 0, "any size"),
    { .name = NULL },
};

static void cfg_init(struct cfg *c)
{
    memset(c, 0, sizeof(*c));
    c->motd = dt_xstrdup("hello");
    c->port = 8080;
    c->timeout = 30000;
    c->buf = 65536;
}

/* a and b hold the same values (and the same string pointers). */
static void cfg_assert_same(const struct cfg *a, const struct cfg *b)
{
    cr_assert_eq(a->name, b->name);
    cr_assert_eq(a->motd, b->motd);
    if (a->motd != NULL)
        cr_assert_str_eq(a->motd, "hello");
    cr_assert_eq(a->port, b->port);
    cr_assert_eq(a->offset, b->offset);
    cr_assert_eq(a->verbose, b->verbose);
    cr_assert_eq(a->timeout, b->timeout);
    cr_assert_eq(a->buf, b->buf);
    cr_assert_eq(a->limit, b->limit);
}

#define assert_has(s, sub) \
    cr_assert(strstr((s), (sub)) != NULL, "message \"%s\" lacks \"%s\"", (s), (sub))

/* text fails with DT_ECONF, the message contains want, and nothing in the
 * struct changed. */
static void expect_error(const char *text, const char *want)
{
    struct cfg c, before;
    dt_emsg_t em = { { 0 } };
    int rc;

    cfg_init(&c);
    before = c;
    rc = dt_conf_parse("t.conf", text, keys, &c, &em);
    cr_assert_eq(rc, DT_ECONF, "rc %d (%s) for:\n%s", rc, dt_err_name(rc), text);
    assert_has(em.s, want);
    cfg_assert_same(&c, &before);
    dt_conf_free(keys, &c);
}

/* A temporary file holding n bytes of data; the caller unlinks it. */
static char *write_temp(const char *data, size_t n)
{
    char *path = dt_xstrdup("/tmp/test_conf.XXXXXX");
    int fd = mkstemp(path);

    cr_assert(fd >= 0, "mkstemp failed");
    cr_assert_eq(write(fd, data, n), (ssize_t)n);
    close(fd);
    return path;
}

/*-- good files --------------------------------------------------------------*/

Test(conf, good_file)
{
    static const char text[] = "# dt.conf for the tests\n"
                               "\n"
                               "name = alpha\n"
                               "   port=9000   \n"
                               "offset = -12\n"
                               "verbose = yes\n"
                               "timeout = 250ms\n"
                               "\tbuf = 4M\n"
                               "limit = 2GiB\n";
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", text, keys, &c, &em), 0, "%s", em.s);
    cr_assert_str_eq(c.name, "alpha");
    cr_assert_str_eq(c.motd, "hello");
    cr_assert_eq(c.port, 9000);
    cr_assert_eq(c.offset, -12);
    cr_assert_eq(c.verbose, 1);
    cr_assert_eq(c.timeout, 250);
    cr_assert_eq(c.buf, 4 << 20);
    cr_assert_eq(c.limit, INT64_C(2) << 30);
    dt_conf_free(keys, &c);
}

Test(conf, unset_keys_keep_their_defaults)
{
    struct cfg c;

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", "name = x\n", keys, &c, NULL), 0);
    cr_assert_str_eq(c.motd, "hello");
    cr_assert_eq(c.port, 8080);
    cr_assert_eq(c.timeout, 30000);
    cr_assert_eq(c.buf, 65536);
    dt_conf_free(keys, &c);
}

Test(conf, string_replaces_old_value)
{
    struct cfg c;

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", "name = a\nmotd = bye\n", keys, &c, NULL), 0);
    cr_assert_str_eq(c.motd, "bye");
    /* a second load replaces again (the old string is freed, see valgrind) */
    cr_assert_eq(dt_conf_parse("t.conf", "name = b\nmotd = again\n", keys, &c, NULL), 0);
    cr_assert_str_eq(c.name, "b");
    cr_assert_str_eq(c.motd, "again");
    dt_conf_free(keys, &c);
    cr_assert_null(c.name);
    cr_assert_null(c.motd);
}

Test(conf, comments_and_quotes)
{
    static const char text[] = "name = plain value # a comment\n"
                               "motd = \"  spaced # not a comment  \"   # a comment\n";
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", text, keys, &c, &em), 0, "%s", em.s);
    cr_assert_str_eq(c.name, "plain value");
    cr_assert_str_eq(c.motd, "  spaced # not a comment  ");
    dt_conf_free(keys, &c);
}

Test(conf, quote_escapes)
{
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(
        dt_conf_parse("t.conf", "name = \"say \\\"hi\\\" \\\\o/\"\nmotd = \"\"\n", keys, &c, &em),
        0, "%s", em.s);
    cr_assert_str_eq(c.name, "say \"hi\" \\o/");
    cr_assert_str_eq(c.motd, "");
    dt_conf_free(keys, &c);
}

Test(conf, quoted_typed_values_and_empty_string)
{
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", "name = x\nport = \"81\"\nmotd =\n", keys, &c, &em), 0,
                 "%s", em.s);
    cr_assert_eq(c.port, 81);
    cr_assert_str_eq(c.motd, "");
    dt_conf_free(keys, &c);
}

Test(conf, crlf_and_no_final_newline)
{
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", "name = x\r\nport = 82\r\nverbose = off", keys, &c, &em),
                 0, "%s", em.s);
    cr_assert_str_eq(c.name, "x");
    cr_assert_eq(c.port, 82);
    cr_assert_eq(c.verbose, 0);
    dt_conf_free(keys, &c);
}

Test(conf, bounds_are_inclusive)
{
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(
        dt_conf_parse("t.conf", "name = x\nport = 65535\ntimeout = 1h\nbuf = 4K\n", keys, &c, &em),
        0, "%s", em.s);
    cr_assert_eq(c.port, 65535);
    cr_assert_eq(c.timeout, 3600 * 1000);
    cr_assert_eq(c.buf, 4096);
    dt_conf_free(keys, &c);
}

Test(conf, empty_text_with_no_required_keys)
{
    static const dt_conf_key_t opt[] = {
        { .name = "port", .type = DT_CONF_INT, .offset = offsetof(struct cfg, port) },
        { .name = NULL },
    };
    struct cfg c;

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", "", opt, &c, NULL), 0);
    cr_assert_eq(dt_conf_parse("t.conf", "\n  \n# only comments\n", opt, &c, NULL), 0);
    cr_assert_eq(c.port, 8080);
    dt_conf_free(keys, &c);
}

Test(conf, utf8_bom_is_skipped)
{
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", "\xef\xbb\xbfname = x\n", keys, &c, &em), 0, "%s", em.s);
    cr_assert_str_eq(c.name, "x");
    dt_conf_free(keys, &c);
}

/*-- errors: syntax ----------------------------------------------------------*/

Test(conf, unknown_key)
{
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", "name = x\n\nfoo = 1\n", keys, &c, &em), DT_ECONF);
    cr_assert_str_eq(em.s, "t.conf:3: unknown key 'foo'");
    dt_conf_free(keys, &c);
}

Test(conf, duplicate_key)
{
    expect_error("name = x\nport = 1\n# again\nport = 2\n",
                 "t.conf:4: duplicate key 'port' (first set on line 2)");
}

Test(conf, missing_equals)
{
    expect_error("name = x\nport 80\n", "t.conf:2: missing '=' after 'port 80'");
    expect_error("port # = 80\n", "t.conf:1: missing '=' after 'port'");
}

Test(conf, empty_key)
{
    expect_error("name = x\n  = 80\n", "t.conf:2: empty key before '='");
}

Test(conf, invalid_key_name)
{
    expect_error("Port = 80\n", "t.conf:1: invalid key name 'Port'");
    expect_error("name = x\nmy key = 1\n", "t.conf:2: invalid key name 'my key'");
}

Test(conf, unterminated_quote)
{
    expect_error("name = x\nmotd = \"open\n", "t.conf:2: key 'motd': unterminated quote");
    /* an escaped quote does not close it, nor does a trailing backslash */
    expect_error("motd = \"open\\\"\n", "t.conf:1: key 'motd': unterminated quote");
    expect_error("motd = \"open\\\n", "t.conf:1: key 'motd': unterminated quote");
}

Test(conf, unknown_escape)
{
    expect_error("motd = \"a\\nb\"\n", "t.conf:1: key 'motd': unknown escape '\\n'");
}

Test(conf, text_after_closing_quote)
{
    expect_error("motd = \"a\" b\n",
                 "t.conf:1: key 'motd': unexpected text after closing quote: 'b'");
}

Test(conf, stray_quote_in_bare_value)
{
    expect_error("motd = say \"hi\"\n", "t.conf:1: key 'motd': stray '\"' in unquoted value");
}

Test(conf, first_error_wins)
{
    expect_error("name = x\nfoo = 1\nbar = 2\n", "t.conf:2: unknown key 'foo'");
}

/*-- errors: values ----------------------------------------------------------*/

Test(conf, bad_values)
{
    expect_error("port = eighty\n",
                 "t.conf:1: key 'port': bad value 'eighty' (expected an integer)");
    expect_error("port = 80 90\n", "t.conf:1: key 'port': bad value '80 90'");
    expect_error("verbose = maybe\n",
                 "t.conf:1: key 'verbose': bad value 'maybe' (expected yes/no");
    expect_error("name = x\ntimeout = 10x\n",
                 "t.conf:2: key 'timeout': bad value '10x' (expected a duration");
    expect_error("buf = 4Q\n", "t.conf:1: key 'buf': bad value '4Q' (expected a size");
    expect_error("timeout = 1.5s\n", "t.conf:1: key 'timeout': bad value '1.5s'");
}

Test(conf, empty_value)
{
    expect_error("port =\n", "t.conf:1: key 'port': empty value (expected an integer)");
    expect_error("verbose = \"\"\n", "t.conf:1: key 'verbose': empty value");
}

Test(conf, bad_value_is_shown_safely)
{
    char text[400];

    /* control characters become '?' */
    expect_error("port = 1\x01\n", "t.conf:1: key 'port': bad value '1?'");
    /* a long value is cut short, and the message still ends properly */
    snprintf(text, sizeof(text), "port = %0300d\x02\n", 7);
    expect_error(text, "t.conf:1: key 'port': bad value '000000");
    expect_error(text, "...' (expected an integer)");
}

Test(conf, out_of_range)
{
    expect_error("port = 0\n", "t.conf:1: key 'port': value '0' out of range (1..65535)");
    expect_error("name = x\nport = 70000\n",
                 "t.conf:2: key 'port': value '70000' out of range (1..65535)");
    expect_error("timeout = 2h\n", "t.conf:1: key 'timeout': value '2h' out of range (10ms..1h)");
    expect_error("timeout = 5ms\n", "t.conf:1: key 'timeout': value '5ms' out of range");
    expect_error("buf = 2G\n", "t.conf:1: key 'buf': value '2G' out of range (4KiB..1GiB)");
}

Test(conf, overflow)
{
    expect_error("offset = 9223372036854775808\n",
                 "t.conf:1: key 'offset': value '9223372036854775808' out of range");
    expect_error("offset = 99999999999999999999999\n", "t.conf:1: key 'offset': value '9999");
    expect_error("limit = 8388608T\n", "t.conf:1: key 'limit': value '8388608T' out of range");
}

Test(conf, negative_duration_and_size)
{
    expect_error("timeout = -5s\n", "t.conf:1: key 'timeout': negative value '-5s'");
    expect_error("limit = -1K\n", "t.conf:1: key 'limit': negative value '-1K'");
}

Test(conf, missing_required_key)
{
    expect_error("port = 80\n", "t.conf: missing required key 'name' (cluster name)");
}

Test(conf, required_key_present)
{
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", "name = \"\"\n", keys, &c, &em), 0, "%s", em.s);
    cr_assert_str_eq(c.name, "");
    dt_conf_free(keys, &c);
}

/*-- errors: limits ----------------------------------------------------------*/

Test(conf, line_too_long)
{
    static const char head[] = "name = x\nmotd = ";
    size_t n = 5000, h = sizeof(head) - 1;
    char *text = dt_xmalloc(h + n + 2);

    memcpy(text, head, h);
    memset(text + h, 'a', n);
    strcpy(text + h + n, "\n");
    expect_error(text, "t.conf:2: line longer than 4096 bytes");
    free(text);
}

Test(conf, text_too_large)
{
    size_t n = 1024 * 1024 + 1;
    char *text = dt_xmalloc(n + 1);

    memset(text, '\n', n);
    text[n] = '\0';
    expect_error(text, "t.conf: larger than the limit of 1048576 bytes");
    free(text);
}

Test(conf, long_key_is_cut_in_message)
{
    char text[2000];
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    memset(text, 'k', 1500);
    strcpy(text + 1500, " = 1\n");
    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", text, keys, &c, &em), DT_ECONF);
    assert_has(em.s, "t.conf:1: unknown key 'kkkk");
    assert_has(em.s, "...'");
    cr_assert_lt(strlen(em.s), 100);
    dt_conf_free(keys, &c);
}

/*-- all-or-nothing ----------------------------------------------------------*/

Test(conf, error_leaves_dst_unchanged)
{
    static const char text[] = "name = new\n"
                               "motd = changed\n"
                               "port = 1\n"
                               "verbose = on\n"
                               "timeout = 1s\n"
                               "buf = 1M\n"
                               "offset = nope\n";
    struct cfg c, before;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    c.name = dt_xstrdup("old");
    before = c;
    cr_assert_eq(dt_conf_parse("t.conf", text, keys, &c, &em), DT_ECONF);
    assert_has(em.s, "t.conf:7: key 'offset': bad value 'nope'");
    cfg_assert_same(&c, &before);
    cr_assert_str_eq(c.name, "old");
    dt_conf_free(keys, &c);
}

Test(conf, missing_required_leaves_dst_unchanged)
{
    struct cfg c, before;

    cfg_init(&c);
    before = c;
    cr_assert_eq(dt_conf_parse("t.conf", "motd = x\nport = 2\n", keys, &c, NULL), DT_ECONF);
    cfg_assert_same(&c, &before);
    dt_conf_free(keys, &c);
}

Test(conf, null_emsg)
{
    struct cfg c;

    cfg_init(&c);
    cr_assert_eq(dt_conf_parse("t.conf", "foo = 1\n", keys, &c, NULL), DT_ECONF);
    cr_assert_eq(dt_conf_load("/nonexistent/dt.conf", keys, &c, NULL), DT_ENOENT);
    dt_conf_free(keys, &c);
}

/*-- a key's own check --------------------------------------------------------*/

struct hp {
    char *addr;
};

/* "host:port" with a port of digits, or empty (the key's "off") */
static int check_hostport(const char *v, dt_emsg_t *em)
{
    const char *colon = strrchr(v, ':');

    if (*v == '\0')
        return 0;
    if (colon == NULL || colon[1] == '\0' || strspn(colon + 1, "0123456789") != strlen(colon + 1))
        return dt_emsg_set(em, DT_EINVAL, "'%s': expected HOST:PORT", v);
    return 0;
}

static const dt_conf_key_t hp_keys[] = {
    { .name = "addr", .type = DT_CONF_STRING, .offset = offsetof(struct hp, addr),
      .check = check_hostport },
    { .name = NULL },
};

Test(conf, a_key_check_names_file_line_and_value)
{
    struct hp h = { dt_xstrdup("keep") };
    dt_emsg_t em = { { 0 } };

    cr_assert_eq(dt_conf_parse("m.conf", "# x\naddr = 1.2.3.4:x9\n", hp_keys, &h, &em), DT_ECONF);
    cr_assert_str_eq(em.s, "m.conf:2: key 'addr': '1.2.3.4:x9': expected HOST:PORT");
    cr_assert_str_eq(h.addr, "keep", "a refused value changes nothing");
    /* a control character the check quotes back is not echoed raw */
    cr_assert_eq(dt_conf_parse("m.conf", "addr = \"a\x1b[2J\"\n", hp_keys, &h, &em), DT_ECONF);
    cr_assert_str_eq(em.s, "m.conf:1: key 'addr': 'a?[2J': expected HOST:PORT");
    cr_assert_eq(dt_conf_parse("m.conf", "addr = 127.0.0.1:9\n", hp_keys, &h, &em), 0, "%s", em.s);
    cr_assert_str_eq(h.addr, "127.0.0.1:9");
    cr_assert_eq(dt_conf_parse("m.conf", "addr =\n", hp_keys, &h, &em), 0, "%s", em.s);
    cr_assert_str_eq(h.addr, "");
    dt_conf_free(hp_keys, &h);
}

/*-- files -------------------------------------------------------------------*/

Test(conf, load_file)
{
    static const char text[] = "name = \"from file\"\nport = 7000\nlimit = 1T\n";
    char *path = write_temp(text, sizeof(text) - 1);
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_load(path, keys, &c, &em), 0, "%s", em.s);
    cr_assert_str_eq(c.name, "from file");
    cr_assert_eq(c.port, 7000);
    cr_assert_eq(c.limit, INT64_C(1) << 40);
    dt_conf_free(keys, &c);
    unlink(path);
    free(path);
}

Test(conf, load_error_names_path_and_line)
{
    static const char text[] = "name = x\nbogus = 1\n";
    char *path = write_temp(text, sizeof(text) - 1);
    char want[128];
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_load(path, keys, &c, &em), DT_ECONF);
    snprintf(want, sizeof(want), "%s:2: unknown key 'bogus'", path);
    cr_assert_str_eq(em.s, want);
    cr_assert_null(c.name);
    dt_conf_free(keys, &c);
    unlink(path);
    free(path);
}

Test(conf, load_missing_file)
{
    struct cfg c, before;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    before = c;
    cr_assert_eq(dt_conf_load("/nonexistent/dt.conf", keys, &c, &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "/nonexistent/dt.conf: cannot open: no such file or directory");
    cfg_assert_same(&c, &before);
    dt_conf_free(keys, &c);
}

Test(conf, load_directory)
{
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_load("/tmp", keys, &c, &em), DT_EIO);
    assert_has(em.s, "/tmp: cannot read: ");
    dt_conf_free(keys, &c);
}

Test(conf, load_nul_byte)
{
    static const char text[] = "name = x\nmotd = a\0b\n";
    char *path = write_temp(text, sizeof(text) - 1);
    char want[128];
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    cfg_init(&c);
    cr_assert_eq(dt_conf_load(path, keys, &c, &em), DT_ECONF);
    snprintf(want, sizeof(want), "%s:2: NUL byte in line", path);
    cr_assert_str_eq(em.s, want);
    dt_conf_free(keys, &c);
    unlink(path);
    free(path);
}

Test(conf, load_file_too_large)
{
    size_t n = 1024 * 1024 + 10;
    char *text = dt_xmalloc(n);
    char *path;
    struct cfg c;
    dt_emsg_t em = { { 0 } };

    memset(text, '#', n);
    path = write_temp(text, n);
    cfg_init(&c);
    cr_assert_eq(dt_conf_load(path, keys, &c, &em), DT_ECONF);
    assert_has(em.s, path);
    assert_has(em.s, ": larger than the limit of 1048576 bytes (1 MiB)");
    dt_conf_free(keys, &c);
    unlink(path);
    free(path);
    free(text);
}

/*-- value parsers -----------------------------------------------------------*/

Test(conf, parse_duration)
{
    static const struct {
        const char *s;
        int rc;
        int64_t ms;
    } cases[] = {
        { "250ms", 0, 250 },
        { "10s", 0, 10000 },
        { "5m", 0, 300000 },
        { "1h", 0, 3600000 },
        { "7", 0, 7000 },
        { "0", 0, 0 },
        { "0ms", 0, 0 },
        { "9223372036854775807ms", 0, INT64_MAX },
        { "9223372036854775s", 0, INT64_C(9223372036854775000) },
        { "9223372036854776s", DT_ERANGE, 0 },
        { "99999999999999999999", DT_ERANGE, 0 },
        { "", DT_EINVAL, 0 },
        { "s", DT_EINVAL, 0 },
        { "-1s", DT_EINVAL, 0 },
        { "+1s", DT_EINVAL, 0 },
        { " 1s", DT_EINVAL, 0 },
        { "1s ", DT_EINVAL, 0 },
        { "1 s", DT_EINVAL, 0 },
        { "1.5s", DT_EINVAL, 0 },
        { "10x", DT_EINVAL, 0 },
        { "10S", DT_EINVAL, 0 },
        { "1d", DT_EINVAL, 0 },
        { "99999999999999999999x", DT_EINVAL, 0 },
    };
    size_t i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t ms = -42;
        int rc = dt_conf_parse_duration(cases[i].s, &ms);

        cr_assert_eq(rc, cases[i].rc, "'%s': rc %d, want %d", cases[i].s, rc, cases[i].rc);
        cr_assert_eq(ms, cases[i].rc ? -42 : cases[i].ms, "'%s': %lld", cases[i].s, (long long)ms);
    }
    cr_assert_eq(dt_conf_parse_duration(NULL, &(int64_t){ 0 }), DT_EINVAL);
}

Test(conf, parse_size)
{
    static const struct {
        const char *s;
        int rc;
        int64_t bytes;
    } cases[] = {
        { "512", 0, 512 },
        { "512B", 0, 512 },
        { "0", 0, 0 },
        { "64K", 0, 65536 },
        { "64k", 0, 65536 },
        { "64KB", 0, 65536 },
        { "64KiB", 0, 65536 },
        { "4M", 0, 4 << 20 },
        { "4MiB", 0, 4 << 20 },
        { "2G", 0, INT64_C(2) << 30 },
        { "1T", 0, INT64_C(1) << 40 },
        { "8388607T", 0, INT64_C(8388607) << 40 },
        { "8388608T", DT_ERANGE, 0 },
        { "9223372036854775807", 0, INT64_MAX },
        { "9223372036854775808", DT_ERANGE, 0 },
        { "", DT_EINVAL, 0 },
        { "K", DT_EINVAL, 0 },
        { "-1", DT_EINVAL, 0 },
        { "1iB", DT_EINVAL, 0 },
        { "1Ki", DT_EINVAL, 0 },
        { "1KBB", DT_EINVAL, 0 },
        { "1P", DT_EINVAL, 0 },
        { "1 K", DT_EINVAL, 0 },
        { "1.5G", DT_EINVAL, 0 },
    };
    size_t i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t b = -42;
        int rc = dt_conf_parse_size(cases[i].s, &b);

        cr_assert_eq(rc, cases[i].rc, "'%s': rc %d, want %d", cases[i].s, rc, cases[i].rc);
        cr_assert_eq(b, cases[i].rc ? -42 : cases[i].bytes, "'%s': %lld", cases[i].s, (long long)b);
    }
}

Test(conf, parse_bool)
{
    static const char *const yes[] = { "yes", "true", "on", "1", "YES", "True", "On" };
    static const char *const no[] = { "no", "false", "off", "0", "NO", "False", "OFF" };
    static const char *const bad[] = { "", "2", "y", "n", "yes ", " no", "enable", "-1" };
    size_t i;
    int b;

    for (i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        b = -1;
        cr_assert_eq(dt_conf_parse_bool(yes[i], &b), 0, "'%s'", yes[i]);
        cr_assert_eq(b, 1, "'%s'", yes[i]);
    }
    for (i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        b = -1;
        cr_assert_eq(dt_conf_parse_bool(no[i], &b), 0, "'%s'", no[i]);
        cr_assert_eq(b, 0, "'%s'", no[i]);
    }
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        b = -1;
        cr_assert_eq(dt_conf_parse_bool(bad[i], &b), DT_EINVAL, "'%s'", bad[i]);
        cr_assert_eq(b, -1, "'%s' wrote the output", bad[i]);
    }
}

Test(conf, parse_int)
{
    static const struct {
        const char *s;
        int64_t min, max;
        int rc;
        int64_t v;
    } cases[] = {
        { "42", 0, 0, 0, 42 },
        { "-42", 0, 0, 0, -42 },
        { "+7", 0, 0, 0, 7 },
        { "-0", 0, 0, 0, 0 },
        { "007", 0, 0, 0, 7 },
        { "9223372036854775807", 0, 0, 0, INT64_MAX },
        { "-9223372036854775808", 0, 0, 0, INT64_MIN },
        { "9223372036854775808", 0, 0, DT_ERANGE, 0 },
        { "-9223372036854775809", 0, 0, DT_ERANGE, 0 },
        { "18446744073709551616", 0, 0, DT_ERANGE, 0 },
        { "1", 1, 10, 0, 1 },
        { "10", 1, 10, 0, 10 },
        { "0", 1, 10, DT_ERANGE, 0 },
        { "11", 1, 10, DT_ERANGE, 0 },
        { "-5", -5, 0, 0, -5 }, /* only both 0 means unbounded */
        { "1", -5, 0, DT_ERANGE, 0 },
        { "", 0, 0, DT_EINVAL, 0 },
        { "-", 0, 0, DT_EINVAL, 0 },
        { " 1", 0, 0, DT_EINVAL, 0 },
        { "1 ", 0, 0, DT_EINVAL, 0 },
        { "1a", 0, 0, DT_EINVAL, 0 },
        { "0x10", 0, 0, DT_EINVAL, 0 },
        { "--1", 0, 0, DT_EINVAL, 0 },
        { "1e3", 0, 0, DT_EINVAL, 0 },
    };
    size_t i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t v = -42;
        int rc = dt_conf_parse_int(cases[i].s, cases[i].min, cases[i].max, &v);

        cr_assert_eq(rc, cases[i].rc, "'%s': rc %d, want %d", cases[i].s, rc, cases[i].rc);
        cr_assert_eq(v, cases[i].rc ? -42 : cases[i].v, "'%s': %lld", cases[i].s, (long long)v);
    }
}
