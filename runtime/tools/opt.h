/* Command-line option parsing shared by hora's tools (hora-bench, hora-records, hora-info) and the
 * mnist example. Every value is checked in full: a number is all digits, does not overflow and
 * lies in the option's range; an option followed by nothing or by another option ("--iters
 * --warmup 3") is missing its value. Every error prints one line on stderr,
 *     PROG: MESSAGE (see PROG --help)
 * and the caller exits with OPT_USAGE (2). Header-only: each tool is a separate executable and the
 * example links only the public libhora.
 *
 *   for (int i = 1; i < argc; i++) {
 *     const char *a = argv[i];
 *     if (!strcmp(a, "--iters")) { if (opt_int(P, argc, argv, &i, 1, 1000000, &iters)) return 2; }
 *     else if (!strcmp(a, "--dir")) { if (!(dir = opt_value(P, argc, argv, &i))) return 2; }
 *     else return opt_unknown(P, a);
 *   }
 */
#ifndef HORA_TOOLS_OPT_H
#define HORA_TOOLS_OPT_H
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPT_USAGE 2 /* exit status of every usage error */

/* Set to 1 to parse without printing (an MPI program's ranks other than 0). */
static int opt_quiet = 0;

/* Prints "prog: message (see prog --help)" on stderr; returns OPT_USAGE. */
__attribute__((format(printf, 2, 3))) static inline int opt_error(const char *prog, const char *fmt, ...) {
  if (opt_quiet) return OPT_USAGE;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* "hora-bench ckpt" -> "hora-bench ckpt --help" */
  fprintf(stderr, "%s: %s (see %s --help)\n", prog, msg, prog);
  return OPT_USAGE;
}

static inline int opt_unknown(const char *prog, const char *arg) {
  if (arg[0] == '-') return opt_error(prog, "unknown option '%s'", arg);
  return opt_error(prog, "unexpected argument '%s'", arg);
}

/* "--x" and "-x" are options; "-", "-5" and "-.5" are values. */
static inline int opt_is_option(const char *s) {
  return s[0] == '-' && s[1] && (s[1] == '-' || isalpha((unsigned char)s[1]));
}

/* argv[*i] is an option that takes a value: returns argv[*i + 1] and advances *i, or prints
 * "OPT needs a value" and returns NULL when argv ends there or the next word is an option. */
static inline const char *opt_value(const char *prog, int argc, char **argv, int *i) {
  if (*i + 1 >= argc || opt_is_option(argv[*i + 1]) || !argv[*i + 1][0]) {
    opt_error(prog, "%s needs a value", argv[*i]);
    return NULL;
  }
  return argv[++*i];
}

/* s must be a decimal integer in [lo, hi] (no sign, no spaces, no suffix). 0 or OPT_USAGE. */
static inline int opt_parse_u64(const char *prog, const char *opt, const char *s, uint64_t lo,
                                uint64_t hi, uint64_t *out) {
  const char *p = s;
  while (*p >= '0' && *p <= '9') p++;
  if (p == s || *p)
    return opt_error(prog, "%s '%s' is not a whole number (want %llu..%llu)", opt, s,
                     (unsigned long long)lo, (unsigned long long)hi);
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno == ERANGE || v < lo || v > hi)
    return opt_error(prog, "%s %s is out of range (want %llu..%llu)", opt, s, (unsigned long long)lo,
                     (unsigned long long)hi);
  *out = v;
  return 0;
}

/* A byte size: a whole number with an optional K, M, G or T suffix (powers of 1024, "KiB" and
 * "KB" accepted), in [lo, hi] bytes. 0 or OPT_USAGE. */
static inline int opt_parse_bytes(const char *prog, const char *opt, const char *s, uint64_t lo,
                                  uint64_t hi, uint64_t *out) {
  const char *p = s;
  while (*p >= '0' && *p <= '9') p++;
  unsigned shift = 0;
  const char *suf = p;
  if (*p) {
    switch (toupper((unsigned char)*p)) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      case 'B': shift = 0; p--; break;
      default: shift = 99;
    }
    p++;
    if (shift != 99 && (*p == 'i' || *p == 'I')) p++;
    if (shift != 99 && (*p == 'B' || *p == 'b')) p++;
  }
  if (suf == s || shift == 99 || *p)
    return opt_error(prog, "%s '%s' is not a byte size (a whole number with an optional K, M or G "
                     "suffix)", opt, s);
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno == ERANGE || v > (UINT64_MAX >> shift) || (v << shift) < lo || (v << shift) > hi)
    return opt_error(prog, "%s %s is out of range (want %llu..%llu bytes)", opt, s,
                     (unsigned long long)lo, (unsigned long long)hi);
  *out = (uint64_t)v << shift;
  return 0;
}

/* s must be a finite decimal number in [lo, hi]. 0 or OPT_USAGE. */
static inline int opt_parse_double(const char *prog, const char *opt, const char *s, double lo,
                                   double hi, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || isspace((unsigned char)*s))
    return opt_error(prog, "%s '%s' is not a number (want %g..%g)", opt, s, lo, hi);
  if (errno == ERANGE || !(v >= lo && v <= hi))
    return opt_error(prog, "%s %s is out of range (want %g..%g)", opt, s, lo, hi);
  *out = v;
  return 0;
}

/* opt_value + the parser above, for the option at argv[*i]. 0 or OPT_USAGE. */
static inline int opt_u64(const char *prog, int argc, char **argv, int *i, uint64_t lo, uint64_t hi,
                          uint64_t *out) {
  const char *opt = argv[*i], *v = opt_value(prog, argc, argv, i);
  return v ? opt_parse_u64(prog, opt, v, lo, hi, out) : OPT_USAGE;
}

static inline int opt_int(const char *prog, int argc, char **argv, int *i, int lo, int hi, int *out) {
  uint64_t v = 0;
  int rc = opt_u64(prog, argc, argv, i, lo < 0 ? 0 : (uint64_t)lo, hi < 0 ? 0 : (uint64_t)hi, &v);
  if (rc == 0) *out = (int)v;
  return rc;
}

static inline int opt_long(const char *prog, int argc, char **argv, int *i, long lo, long hi, long *out) {
  uint64_t v = 0;
  int rc = opt_u64(prog, argc, argv, i, lo < 0 ? 0 : (uint64_t)lo, hi < 0 ? 0 : (uint64_t)hi, &v);
  if (rc == 0) *out = (long)v;
  return rc;
}

static inline int opt_bytes(const char *prog, int argc, char **argv, int *i, uint64_t lo, uint64_t hi,
                            uint64_t *out) {
  const char *opt = argv[*i], *v = opt_value(prog, argc, argv, i);
  return v ? opt_parse_bytes(prog, opt, v, lo, hi, out) : OPT_USAGE;
}

static inline int opt_double(const char *prog, int argc, char **argv, int *i, double lo, double hi,
                             double *out) {
  const char *opt = argv[*i], *v = opt_value(prog, argc, argv, i);
  return v ? opt_parse_double(prog, opt, v, lo, hi, out) : OPT_USAGE;
}

/* The value must be one of the '|'-separated words in choices ("host|cuda"). 0 or OPT_USAGE. */
static inline int opt_choice(const char *prog, int argc, char **argv, int *i, const char *choices,
                             const char **out) {
  const char *opt = argv[*i], *v = opt_value(prog, argc, argv, i);
  if (!v) return OPT_USAGE;
  size_t n = strlen(v);
  for (const char *c = choices; *c;) {
    const char *bar = strchr(c, '|');
    size_t len = bar ? (size_t)(bar - c) : strlen(c);
    if (len == n && !strncmp(c, v, n)) {
      *out = v;
      return 0;
    }
    c += len + (bar != NULL);
  }
  return opt_error(prog, "%s '%s' is not one of %s", opt, v, choices);
}

/* "--help" or "-h" among argv[1..argc-1]. */
static inline int opt_wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
  return 0;
}
#endif
