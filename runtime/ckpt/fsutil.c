/* File-system helpers of the checkpoint pipeline: every file reaches its final name through
 * temporary name + fsync + rename + directory fsync, so that a crash at any instant leaves either
 * the old or the new content under a final name, never a torn one. Everything works on fds of
 * directories checked by core/safefs.c (owner, mode, no foreign symlinks): no file is opened,
 * created or removed through a path another user could redirect. */
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
#include "core/safefs.h"

hora_result_t hora__ck_write_all(int fd, const void *p, size_t n, const char *name) {
  return hora__write_all(fd, p, n, name);
}

hora_result_t hora__ck_fsync_fd(int dfd, const char *dir) {
  if (fsync(dfd) != 0 && errno != EINVAL) return HORA_ERR(HORA_ERR_IO, "fsync directory %s: %s", dir, strerror(errno));
  return HORA_SUCCESS;
}

hora_result_t hora__ck_mkdirs(const char *dir) {
  int fd;
  HORA_CHECK(hora__dir_open(dir, 1, &fd));
  close(fd);
  return HORA_SUCCESS;
}

hora_result_t hora__ck_remove_step_at(int dfd, const char *dir, const char *name) {
  int sfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sfd < 0) {
    if (errno == ENOENT) return HORA_SUCCESS;
    if (errno != ELOOP && errno != ENOTDIR) return HORA_ERR(HORA_ERR_IO, "open %s/%s: %s", dir, name, strerror(errno));
    /* A symlink (or a file) under a step name is not ours to follow: remove the entry itself. */
    if (unlinkat(dfd, name, 0) != 0) return HORA_ERR(HORA_ERR_IO, "remove %s/%s: %s", dir, name, strerror(errno));
    return HORA_SUCCESS;
  }
  if (unlinkat(sfd, CK_MANIFEST, 0) != 0 && errno != ENOENT) {
    int e = errno;
    close(sfd);
    return HORA_ERR(HORA_ERR_IO, "remove %s/%s/%s: %s", dir, name, CK_MANIFEST, strerror(e));
  }
  int lfd = dup(sfd);
  DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
  if (!d) {
    int e = errno;
    if (lfd >= 0) close(lfd);
    close(sfd);
    return HORA_ERR(HORA_ERR_IO, "opendir %s/%s: %s", dir, name, strerror(e));
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    unlinkat(sfd, e->d_name, 0);
  }
  closedir(d);
  close(sfd);
  if (unlinkat(dfd, name, AT_REMOVEDIR) != 0)
    return HORA_ERR(HORA_ERR_IO, "rmdir %s/%s: %s", dir, name, strerror(errno));
  return HORA_SUCCESS;
}

hora_result_t hora__ck_read_file_at(int dfd, const char *dir, const char *name, size_t max_bytes, unsigned char **buf,
                                    size_t *len) {
  int fd;
  HORA_CHECK(hora__file_open_read(dfd, dir, name, &fd));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return HORA_ERR(HORA_ERR_IO, "stat %s/%s: %s", dir, name, strerror(errno));
  }
  if ((uint64_t)st.st_size > max_bytes) {
    close(fd);
    return HORA_ERR(HORA_ERR_DATA, "%s/%s has %lld bytes, more than the %zu expected", dir, name, (long long)st.st_size,
                    max_bytes);
  }
  size_t n = (size_t)st.st_size;
  unsigned char *b = malloc(n + 1);
  if (!b) {
    close(fd);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory reading %s/%s (%zu bytes)", dir, name, n);
  }
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got > ((size_t)1 << 30) ? ((size_t)1 << 30) : n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = errno;
      free(b);
      close(fd);
      return HORA_ERR(HORA_ERR_IO, "read %s/%s: %s", dir, name, r == 0 ? "unexpected end of file" : strerror(e));
    }
    got += (size_t)r;
  }
  close(fd);
  b[n] = 0;
  *buf = b;
  *len = n;
  return HORA_SUCCESS;
}

hora_result_t hora__ck_file_crc_at(int dfd, const char *dir, const char *name, size_t chunk, uint32_t *crc,
                                   uint64_t *bytes) {
  int fd;
  HORA_CHECK(hora__file_open_read(dfd, dir, name, &fd));
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
      rc = HORA_ERR(HORA_ERR_IO, "read %s/%s: %s", dir, name, strerror(errno));
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
