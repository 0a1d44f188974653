/* Helpers shared by the checkpoint tests: temporary directories, deterministic tensor contents
 * of every dtype, byte flips. */
#ifndef HORA_CKPT_TEST_H
#define HORA_CKPT_TEST_H
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hora.h"

/* A fresh directory under $TMPDIR (or /tmp); removed by ck_rmrf. */
static inline char *ck_mktemp(const char *tag) {
  const char *t = getenv("TMPDIR");
  char buf[4096];
  snprintf(buf, sizeof buf, "%s/hora-test-%s-XXXXXX", t && *t ? t : "/tmp", tag);
  char *d = mkdtemp(buf);
  return d ? strdup(d) : NULL;
}

static inline void ck_rmrf(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "rm -rf %s failed\n", dir);
}

/* Byte i of tensor `k` at `step`: a value that differs between steps, tensors and positions. */
static inline unsigned char ck_byte(int64_t step, int k, size_t i) {
  uint64_t x = (uint64_t)step * 0x9E3779B97F4A7C15ull + (uint64_t)k * 0xBF58476D1CE4E5B9ull + i * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return (unsigned char)(x ^ (x >> 17));
}

static inline void ck_fill(void *p, size_t bytes, int64_t step, int k) {
  unsigned char *c = p;
  for (size_t i = 0; i < bytes; i++) c[i] = ck_byte(step, k, i);
}

/* Index of the first differing byte, or -1. */
static inline long ck_check(const void *p, size_t bytes, int64_t step, int k) {
  const unsigned char *c = p;
  for (size_t i = 0; i < bytes; i++)
    if (c[i] != ck_byte(step, k, i)) return (long)i;
  return -1;
}

/* Flip one byte of a file at `offset` (negative: from the end). Returns 0 on success. */
static inline int ck_flip(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  long at = offset < 0 ? n + offset : offset;
  if (at < 0 || at >= n) {
    fclose(f);
    return -1;
  }
  fseek(f, at, SEEK_SET);
  int c = fgetc(f);
  fseek(f, at, SEEK_SET);
  fputc(c ^ 0x5a, f);
  fclose(f);
  return 0;
}

static inline int ck_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Number of entries in dir (and its step-* subdirectories) whose name starts with ".tmp-". */
static inline int ck_count_tmp(const char *dir) {
  int n = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strncmp(e->d_name, ".tmp-", 5)) n++;
    if (!strncmp(e->d_name, "step-", 5)) {
      char sub[4400];
      snprintf(sub, sizeof sub, "%.4000s/%.255s", dir, e->d_name);
      n += ck_count_tmp(sub);
    }
  }
  closedir(d);
  return n;
}
#endif
