/* launch's messages (log.h): every other file of launch/ reports through these functions, and
 * this file calls nothing of launch's own. */
#include <stdarg.h>
#include <stdio.h>

#include "log.h"

static int g_rank = -1;

void launch_log_set_rank(int rank) { g_rank = rank; }

static void vmsg(const char *level, const char *fmt, va_list ap) {
  char buf[2048];
  vsnprintf(buf, sizeof buf, fmt, ap);
  if (g_rank >= 0)
    fprintf(stderr, "launch: %s: rank %d: %s\n", level, g_rank, buf);
  else
    fprintf(stderr, "launch: %s: %s\n", level, buf);
}

void launch_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vmsg("error", fmt, ap);
  va_end(ap);
}

void launch_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vmsg("warning", fmt, ap);
  va_end(ap);
}

void launch_info(int verbose, const char *fmt, ...) {
  if (!verbose) return;
  va_list ap;
  va_start(ap, fmt);
  vmsg("info", fmt, ap);
  va_end(ap);
}
