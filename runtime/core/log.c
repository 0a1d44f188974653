/* Logging and the thread-local last error.
 * Format: "host:pid:tid [rank] LEVEL SUBSYS file:line message" on stderr, one write per line so
 * lines from threads do not interleave. Library code never prints anything else. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

static const char *const subsys_names[] = {
#define X(s) #s,
    HORA_SUBSYS_LIST(X)
#undef X
};

static int log_level = HORA_LOG_WARN;
static unsigned log_mask = ~0u;
static int log_rank = -1;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static _Thread_local char last_error[1024];

static hora_result_t parse_level(const char *s, int *out) {
  static const char *const names[] = {"NONE", "WARN", "INFO", "TRACE"};
  for (int i = 0; i < 4; i++)
    if (strcasecmp(s, names[i]) == 0) {
      *out = i;
      return HORA_SUCCESS;
    }
  return HORA_ERR_INVALID_ARGUMENT;
}

static hora_result_t parse_subsys(const char *s, unsigned *out) {
  int negate = (s[0] == '^');
  if (negate) s++;
  unsigned mask = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (strcasecmp(tok, "ALL") == 0) {
      mask = ~0u;
      continue;
    }
    int found = 0;
    for (int i = 0; i < HORA_SUBSYS_COUNT; i++)
      if (strcasecmp(tok, subsys_names[i]) == 0) {
        mask |= 1u << i;
        found = 1;
      }
    if (!found) return HORA_ERR_INVALID_ARGUMENT;
  }
  *out = negate ? ~mask : mask;
  return HORA_SUCCESS;
}

hora_result_t hora__log_configure(void) {
  const char *lv = getenv("HORA_LOG");
  const char *ss = getenv("HORA_LOG_SUBSYS");
  int level = HORA_LOG_WARN;
  unsigned mask = ~0u;
  if (lv && *lv && parse_level(lv, &level) != HORA_SUCCESS) {
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "HORA_LOG=%s is not one of NONE, WARN, INFO, TRACE", lv);
  }
  if (ss && *ss && parse_subsys(ss, &mask) != HORA_SUCCESS) {
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "HORA_LOG_SUBSYS=%s names an unknown subsystem (known: INIT,COMM,RING,SHM,"
                    "ENGINE,CKPT,DATA,TRACE,CUDA,NCCL,BENCH,ALL)", ss);
  }
  __atomic_store_n(&log_level, level, __ATOMIC_RELAXED);
  __atomic_store_n(&log_mask, mask, __ATOMIC_RELAXED);
  return HORA_SUCCESS;
}

static void log_init_once(void) {
  /* Malformed values are reported by hora_init; until then keep the defaults. */
  const char *lv = getenv("HORA_LOG");
  const char *ss = getenv("HORA_LOG_SUBSYS");
  int level;
  unsigned mask;
  if (lv && *lv && parse_level(lv, &level) == HORA_SUCCESS) log_level = level;
  if (ss && *ss && parse_subsys(ss, &mask) == HORA_SUCCESS) log_mask = mask;
}

void hora__log_set_rank(int rank) { __atomic_store_n(&log_rank, rank, __ATOMIC_RELAXED); }

int hora__log_enabled(hora_log_level_t level, hora_subsys_t subsys) {
  pthread_once(&log_once, log_init_once);
  return (int)level <= __atomic_load_n(&log_level, __ATOMIC_RELAXED) &&
         (__atomic_load_n(&log_mask, __ATOMIC_RELAXED) >> subsys & 1u);
}

static void vlog(hora_log_level_t level, hora_subsys_t subsys, const char *file, int line,
                 const char *fmt, va_list ap) {
  static const char *const lnames[] = {"NONE", "WARN", "INFO", "TRACE"};
  char host[64] = "?";
  gethostname(host, sizeof host);
  host[sizeof host - 1] = 0;
  char *dot = strchr(host, '.');
  if (dot) *dot = 0;
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  char buf[2048];
  int n = snprintf(buf, sizeof buf, "%s:%d:%ld [%d] hora %s %s %s:%d ", host, (int)getpid(),
                   (long)syscall(SYS_gettid), __atomic_load_n(&log_rank, __ATOMIC_RELAXED),
                   lnames[level], subsys_names[subsys], base, line);
  if (n < 0) return;
  if ((size_t)n < sizeof buf) vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  size_t len = strnlen(buf, sizeof buf - 2);
  buf[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, len);
  (void)w;
}

void hora__log(hora_log_level_t level, hora_subsys_t subsys, const char *file, int line,
               const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, subsys, file, line, fmt, ap);
  va_end(ap);
}

hora_result_t hora__error(hora_result_t rc, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  if (hora__log_enabled(HORA_LOG_WARN, HORA_SUBSYS_INIT))
    hora__log(HORA_LOG_WARN, HORA_SUBSYS_INIT, file, line, "%s: %s", hora_result_name(rc),
              last_error);
  return rc;
}

void hora__error_clear(void) { last_error[0] = 0; }

void hora__error_restore(const char *msg) { snprintf(last_error, sizeof last_error, "%s", msg); }

HORA_EXPORT const char *hora_last_error(void) { return last_error; }

double hora__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
