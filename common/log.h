/* SPDX-License-Identifier: MIT
 *
 * One logging API for every dt program: dt_log_info("job=%s gen=%u started",
 * ...). Messages are lowercase, without a trailing period, ids as key=value.
 * Lines go to stderr (or a file, or syslog for daemons) prefixed with the
 * program name and, when set, a tag such as "rank=3". Thread-safe: one
 * write(2) per line.
 */
#ifndef DT_LOG_H
#define DT_LOG_H

enum dt_log_level {
    DT_LOG_ERROR = 0,
    DT_LOG_WARN,
    DT_LOG_INFO,
    DT_LOG_DEBUG,
};

/* Program name and the lowest level shown (default: "dt", DT_LOG_INFO). */
void dt_log_init(const char *progname, enum dt_log_level level);
/* A tag added to every line, e.g. "rank=3"; NULL clears it. Copied. */
void dt_log_set_tag(const char *tag);
void dt_log_set_level(enum dt_log_level level);
enum dt_log_level dt_log_get_level(void);
/* Parse "error", "warn", "info" or "debug"; returns 0 or DT_EINVAL. */
int dt_log_parse_level(const char *s, enum dt_log_level *out);
/* Send lines to this file descriptor instead of stderr (not closed by log). */
void dt_log_set_fd(int fd);
/* Prefix lines with the local time, ISO 8601 with milliseconds (for log
 * files; a terminal or journald adds its own). */
void dt_log_set_timestamps(int on);

void dt_log(enum dt_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define dt_log_error(...) dt_log(DT_LOG_ERROR, __VA_ARGS__)
#define dt_log_warn(...) dt_log(DT_LOG_WARN, __VA_ARGS__)
#define dt_log_info(...) dt_log(DT_LOG_INFO, __VA_ARGS__)
#define dt_log_debug(...) dt_log(DT_LOG_DEBUG, __VA_ARGS__)

#endif /* DT_LOG_H */
