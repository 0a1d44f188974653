/* File-system helpers of the checkpoint pipeline: every file reaches its final name through
 * temporary name + fsync + rename + directory fsync, so that a crash at any instant leaves either
 * the old or the new content under a final name, never a torn one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/crc32c.h"

hora_result_t hora__ck_write_all(int fd, const void *p, size_t n, const char *name) {
  const unsigned char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return HORA_ERR(HORA_ERR_IO, "write %s: %s", name, strerror(errno));
    if (w == 0) return HORA_ERR(HORA_ERR_IO, "write %s: no progress (disk full?)", name);
    c += w;
    n -= (size_t)w;
  }
  return HORA_SUCCESS;
}

hora_result_t hora__ck_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return HORA_ERR(HORA_ERR_IO, "open directory %s: %s", dir, strerror(errno));
  int r = fsync(fd);
  int e = errno;
  close(fd);
  if (r != 0 && e != EINVAL) return HORA_ERR(HORA_ERR_IO, "fsync directory %s: %s", dir, strerror(e));
  return HORA_SUCCESS;
}

hora_result_t hora__ck_mkdirs(const char *dir) {
  struct stat st;
  if (stat(dir, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return HORA_SUCCESS;
    return HORA_ERR(HORA_ERR_IO, "%s exists and is not a directory", dir);
  }
  char *p = strdup(dir);
  if (!p) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  hora_result_t rc = HORA_SUCCESS;
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s) continue;
    char c = *s;
    *s = 0;
    if (mkdir(p, 0755) == 0) {
      /* Make the new entry durable in its parent. */
      char *slash = strrchr(p, '/');
      if (slash && slash != p) {
        *slash = 0;
        hora__ck_fsync_dir(p);
        *slash = '/';
      }
    } else if (errno != EEXIST) {
      rc = HORA_ERR(HORA_ERR_IO, "mkdir %s: %s", p, strerror(errno));
      break;
    }
    *s = c;
    if (!c) break;
  }
  free(p);
  return rc;
}

hora_result_t hora__ck_write_small(const char *dir, const char *name, const void *p, size_t n) {
  char tmp[4600], fin[4600];
  snprintf(tmp, sizeof tmp, "%s/" CK_TMP_PREFIX "%s.%ld", dir, name, (long)getpid());
  snprintf(fin, sizeof fin, "%s/%s", dir, name);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return HORA_ERR(HORA_ERR_IO, "create %s: %s", tmp, strerror(errno));
  hora_result_t rc = hora__ck_write_all(fd, p, n, tmp);
  if (rc == HORA_SUCCESS && fsync(fd) != 0) rc = HORA_ERR(HORA_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
  if (close(fd) != 0 && rc == HORA_SUCCESS) rc = HORA_ERR(HORA_ERR_IO, "close %s: %s", tmp, strerror(errno));
  if (rc == HORA_SUCCESS && rename(tmp, fin) != 0)
    rc = HORA_ERR(HORA_ERR_IO, "rename %s to %s: %s", tmp, fin, strerror(errno));
  if (rc != HORA_SUCCESS) {
    unlink(tmp);
    return rc;
  }
  return hora__ck_fsync_dir(dir);
}

hora_result_t hora__ck_remove_step(const char *stepdir) {
  char p[4600];
  snprintf(p, sizeof p, "%s/%s", stepdir, CK_MANIFEST);
  if (unlink(p) != 0 && errno != ENOENT)
    return HORA_ERR(HORA_ERR_IO, "remove %s: %s", p, strerror(errno));
  DIR *d = opendir(stepdir);
  if (!d) return errno == ENOENT ? HORA_SUCCESS : HORA_ERR(HORA_ERR_IO, "opendir %s: %s", stepdir, strerror(errno));
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", stepdir, e->d_name);
    unlink(p);
  }
  closedir(d);
  if (rmdir(stepdir) != 0) return HORA_ERR(HORA_ERR_IO, "rmdir %s: %s", stepdir, strerror(errno));
  return HORA_SUCCESS;
}

hora_result_t hora__ck_read_file(const char *path, size_t max_bytes, unsigned char **buf, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return HORA_ERR(errno == ENOENT ? HORA_ERR_NOT_FOUND : HORA_ERR_IO, "open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return HORA_ERR(HORA_ERR_IO, "stat %s: %s", path, strerror(errno));
  }
  if ((uint64_t)st.st_size > max_bytes) {
    close(fd);
    return HORA_ERR(HORA_ERR_DATA, "%s has %lld bytes, more than the %zu expected", path, (long long)st.st_size, max_bytes);
  }
  size_t n = (size_t)st.st_size;
  unsigned char *b = malloc(n + 1);
  if (!b) {
    close(fd);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory reading %s (%zu bytes)", path, n);
  }
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got > ((size_t)1 << 30) ? ((size_t)1 << 30) : n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = errno;
      free(b);
      close(fd);
      return HORA_ERR(HORA_ERR_IO, "read %s: %s", path, r == 0 ? "unexpected end of file" : strerror(e));
    }
    got += (size_t)r;
  }
  close(fd);
  b[n] = 0;
  *buf = b;
  *len = n;
  return HORA_SUCCESS;
}

hora_result_t hora__ck_file_crc(const char *path, size_t chunk, uint32_t *crc, uint64_t *bytes) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return HORA_ERR(errno == ENOENT ? HORA_ERR_NOT_FOUND : HORA_ERR_IO, "open %s: %s", path, strerror(errno));
  unsigned char *b = malloc(chunk);
  if (!b) {
    close(fd);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  }
  uint32_t c = 0;
  uint64_t total = 0;
  hora_result_t rc = HORA_SUCCESS;
  for (;;) {
    ssize_t r = read(fd, b, chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = HORA_ERR(HORA_ERR_IO, "read %s: %s", path, strerror(errno));
      break;
    }
    if (r == 0) break;
    c = hora__crc32c(c, b, (size_t)r);
    total += (uint64_t)r;
  }
  free(b);
  close(fd);
  if (rc == HORA_SUCCESS) {
    *crc = c;
    *bytes = total;
  }
  return rc;
}

void hora__ck_test_delay(void) {
  double us = (double)hora__params()->ckpt_test_delay_us;
  if (us <= 0) return;
  struct timespec ts = {(time_t)(us / 1e6), (long)((us - (double)(time_t)(us / 1e6) * 1e6) * 1e3)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void hora__ck_keep_msg(char *dst) { snprintf(dst, CK_MSG_MAX, "%s", hora_last_error()); }
