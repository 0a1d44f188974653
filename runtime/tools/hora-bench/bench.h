/* Shared helpers of hora-bench's subcommands. */
#ifndef HORA_BENCH_H
#define HORA_BENCH_H
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "core/internal.h"
#include "../opt.h"

/* Largest buffer a benchmark option may ask for: 64 GiB. */
#define BENCH_MAX_BYTES (64ull << 30)

static inline double bench_now_s(void) { return hora__now_s(); }

/* "4", "64K", "256M", "1G" -> bytes (powers of 1024); -1 on a malformed value. */
static inline int64_t bench_parse_size(const char *s) {
  uint64_t v;
  return hora__parse_bytes(s, &v) == HORA_SUCCESS ? (int64_t)v : -1;
}

/* Human size: "4 B", "64 KiB", "256 MiB". */
static inline const char *bench_fmt_size(uint64_t b, char *buf, size_t n) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) snprintf(buf, n, "%llu GiB", (unsigned long long)(b >> 30));
  else if (b >= (1ull << 20) && b % (1ull << 20) == 0) snprintf(buf, n, "%llu MiB", (unsigned long long)(b >> 20));
  else if (b >= 1024 && b % 1024 == 0) snprintf(buf, n, "%llu KiB", (unsigned long long)(b >> 10));
  else snprintf(buf, n, "%llu B", (unsigned long long)b);
  return buf;
}
#endif
