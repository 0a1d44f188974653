/* launch's messages (log.c): one line each on stderr, "launch: LEVEL: [rank R: ]text".
 * The bottom of launch's dependency order: it includes and calls nothing else of launch. */
#ifndef LAUNCH_LOG_H
#define LAUNCH_LOG_H

/* After this, messages name the rank ("launch: error: rank 3: ..."); -1: they do not. */
void launch_log_set_rank(int rank);
void launch_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void launch_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Printed only when `verbose` is set (-v). */
void launch_info(int verbose, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
