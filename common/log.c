/* SPDX-License-Identifier: MIT
 *
 * The log sink: formats one line and writes it with a single write(2), so
 * lines from several threads or processes sharing a file do not interleave.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "log.h"

static struct {
    char prog[32];
    char tag[64];
    enum dt_log_level level;
    int fd;
    int stamps;
} logger = { "dt", "", DT_LOG_INFO, 2, 0 };

static const char *level_names[] = { "error", "warn", "info", "debug" };

void dt_log_init(const char *progname, enum dt_log_level level)
{
    snprintf(logger.prog, sizeof(logger.prog), "%s", progname ? progname : "dt");
    logger.level = level;
}

void dt_log_set_tag(const char *tag)
{
    snprintf(logger.tag, sizeof(logger.tag), "%s", tag ? tag : "");
}

void dt_log_set_level(enum dt_log_level level)
{
    logger.level = level;
}

enum dt_log_level dt_log_get_level(void)
{
    return logger.level;
}

void dt_log_set_fd(int fd)
{
    logger.fd = fd;
}

void dt_log_set_timestamps(int on)
{
    logger.stamps = on;
}

int dt_log_parse_level(const char *s, enum dt_log_level *out)
{
    for (int i = 0; i <= DT_LOG_DEBUG; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (enum dt_log_level)i;
            return 0;
        }
    }
    return DT_EINVAL;
}

void dt_log(enum dt_log_level level, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    int n;

    if (level > logger.level)
        return;
    char stamp[40] = "";
    if (logger.stamps) {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        localtime_r(&ts.tv_sec, &tm);
        size_t k = strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(stamp + k, sizeof(stamp) - k, ".%03ld ", ts.tv_nsec / 1000000);
    }
    n = snprintf(line, sizeof(line), "%s%s: %s%s%s: ", stamp, logger.prog, logger.tag,
                 logger.tag[0] ? " " : "", level_names[level]);
    if (n < 0 || (size_t)n >= sizeof(line))
        return;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    n += m;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t w = write(logger.fd, line, (size_t)n);
    (void)w;
}
