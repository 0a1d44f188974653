/* Record-file writer (fsync-and-rename commit) and hora_records_count.
 * The writer owns one buffer and one temporary file; nothing appears under the final name until
 * close has flushed, fsynced and renamed it, so a crash leaves at most a hidden temporary file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safefs.h"
#include "data/records.h"

#define WRITER_BUF_BYTES (1u << 20)

struct hora_records_writer {
  int fd;
  int dirfd; /* the checked directory of path (core/safefs.h) */
  int failed;
  char *path, *tmp;   /* tmp: dir/tmpname, for messages */
  char *dir, *base, *tmpname;
  unsigned char *buf;
  size_t used;
  uint64_t records;
  unsigned fork_gen; /* hora__fork_watch() at open (core/fork.c) */
};

/* The file being written is the parent's: a fork() child (whose Python exit may drop its copy of
 * the writer, which aborts it) must neither unlink, rename nor append to it. */
#define WRITER_FORK_CHECK(w, fn) \
  HORA_CHECK(hora__fork_check((w)->fork_gen, fn, "the records writer", "write and close it in the parent"))

static hora_result_t write_all(int fd, const void *p, size_t n, const char *name) {
  const unsigned char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return HORA_ERR(HORA_ERR_IO, "write %s: %s", name, strerror(errno));
    c += w;
    n -= (size_t)w;
  }
  return HORA_SUCCESS;
}

static void writer_free(hora_records_writer_t *w) {
  if (w->fd >= 0) close(w->fd);
  if (w->dirfd >= 0) close(w->dirfd);
  free(w->path);
  free(w->tmp);
  free(w->dir);
  free(w->base);
  free(w->tmpname);
  free(w->buf);
  free(w);
}

HORA_EXPORT hora_result_t hora_records_writer_open(const char *path, hora_records_writer_t **writer) {
  if (!path || !*path || !writer)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_writer_open: %s is NULL or empty",
                    !writer ? "writer" : "path");
  hora_records_writer_t *w = calloc(1, sizeof *w);
  if (!w) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  w->fd = -1;
  w->dirfd = -1;
  w->path = strdup(path);
  w->buf = malloc(WRITER_BUF_BYTES);
  size_t n = strlen(path) + 2;
  w->dir = malloc(n);
  w->base = malloc(n);
  w->tmpname = malloc(n + 32);
  w->tmp = malloc(2 * n + 32);
  if (!w->path || !w->buf || !w->dir || !w->base || !w->tmpname || !w->tmp) {
    writer_free(w);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  }
  /* The directory is checked (owner, mode, symlinks: core/safefs.h) and the temporary file is
   * created in it with openat(O_EXCL|O_NOFOLLOW) under an unpredictable name. */
  hora_result_t rc = hora__path_split(path, w->dir, n, w->base, n);
  if (rc == HORA_SUCCESS) {
    rc = hora__dir_open(w->dir, 0, &w->dirfd);
    if (rc == HORA_ERR_NOT_FOUND) rc = HORA_ERR(HORA_ERR_IO, "hora_records_writer_open: %s: no such directory", w->dir);
  }
  if (rc == HORA_SUCCESS) rc = hora__file_create_tmp(w->dirfd, w->dir, w->base, O_WRONLY, w->tmpname, n + 32, &w->fd);
  if (rc != HORA_SUCCESS) {
    writer_free(w);
    return rc;
  }
  snprintf(w->tmp, 2 * n + 32, "%s/%s", w->dir, w->tmpname);
  w->fork_gen = hora__fork_watch();
  *writer = w;
  return HORA_SUCCESS;
}

static hora_result_t writer_flush(hora_records_writer_t *w) {
  if (!w->used) return HORA_SUCCESS;
  hora_result_t rc = write_all(w->fd, w->buf, w->used, w->tmp);
  w->used = 0;
  if (rc != HORA_SUCCESS) w->failed = 1;
  return rc;
}

static hora_result_t writer_put(hora_records_writer_t *w, const void *p, size_t n) {
  if (w->used + n > WRITER_BUF_BYTES) {
    HORA_CHECK(writer_flush(w));
    if (n >= WRITER_BUF_BYTES) {
      hora_result_t rc = write_all(w->fd, p, n, w->tmp);
      if (rc != HORA_SUCCESS) w->failed = 1;
      return rc;
    }
  }
  memcpy(w->buf + w->used, p, n);
  w->used += n;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_records_writer_write(hora_records_writer_t *w, const void *data,
                                                    size_t len_bytes) {
  if (!w) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_writer_write: writer is NULL");
  WRITER_FORK_CHECK(w, "hora_records_writer_write");
  if (!data && len_bytes)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_writer_write: data is NULL with len_bytes=%zu", len_bytes);
  if (w->failed)
    return HORA_ERR(HORA_ERR_IO, "hora_records_writer_write: an earlier write to %s failed", w->tmp);
  unsigned char hdr[HORA_RECORD_HEADER_BYTES], ftr[HORA_RECORD_FOOTER_BYTES];
  hora__record_header(hdr, len_bytes);
  hora__store_le32(ftr, hora__masked_crc(data ? data : "", len_bytes));
  HORA_CHECK(writer_put(w, hdr, sizeof hdr));
  if (len_bytes) HORA_CHECK(writer_put(w, data, len_bytes));
  HORA_CHECK(writer_put(w, ftr, sizeof ftr));
  w->records++;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_records_writer_abort(hora_records_writer_t *w) {
  if (!w) return HORA_SUCCESS;
  WRITER_FORK_CHECK(w, "hora_records_writer_abort");
  close(w->fd);
  w->fd = -1;
  unlinkat(w->dirfd, w->tmpname, 0);
  writer_free(w);
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_records_writer_close(hora_records_writer_t *w) {
  if (!w) return HORA_SUCCESS;
  WRITER_FORK_CHECK(w, "hora_records_writer_close");
  hora_result_t rc = HORA_SUCCESS;
  if (w->failed) {
    rc = HORA_ERR(HORA_ERR_IO, "hora_records_writer_close: an earlier write to %s failed; %s not written",
                  w->tmp, w->path);
    goto fail;
  }
  HORA_CHECK_GOTO(writer_flush(w), rc, fail);
  if (fsync(w->fd) != 0) {
    rc = HORA_ERR(HORA_ERR_IO, "fsync %s: %s", w->tmp, strerror(errno));
    goto fail;
  }
  int fd = w->fd;
  w->fd = -1;
  if (close(fd) != 0) {
    rc = HORA_ERR(HORA_ERR_IO, "close %s: %s", w->tmp, strerror(errno));
    goto fail;
  }
  /* renameat inside the checked directory, then fsync it. */
  HORA_CHECK_GOTO(hora__file_commit(w->dirfd, w->dir, w->tmpname, w->base), rc, fail);
  writer_free(w);
  return rc;
fail:
  hora_records_writer_abort(w);
  return rc;
}

HORA_EXPORT hora_result_t hora_records_count(const char *path, uint64_t *count) {
  if (!path || !count)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_count: %s is NULL", !path ? "path" : "count");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return HORA_ERR(HORA_ERR_IO, "open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return HORA_ERR(HORA_ERR_IO, "stat %s: %s", path, strerror(errno));
  }
  /* Read headers only: pread each 12-byte header, then jump over data and footer. Buffered in a
   * 64 KiB window so that small records cost no extra system call. */
  enum { WIN = 1 << 16 };
  unsigned char *win = malloc(WIN);
  if (!win) {
    close(fd);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  }
  uint64_t off = 0, n = 0, size = (uint64_t)st.st_size, win_off = 0, win_len = 0;
  hora_result_t rc = HORA_SUCCESS;
  while (off < size) {
    if (off < win_off || off + HORA_RECORD_HEADER_BYTES > win_off + win_len) {
      ssize_t r;
      do r = pread(fd, win, WIN, (off_t)off);
      while (r < 0 && errno == EINTR);
      if (r < 0) {
        rc = HORA_ERR(HORA_ERR_IO, "read %s: %s", path, strerror(errno));
        break;
      }
      win_off = off;
      win_len = (uint64_t)r;
      if (win_len < HORA_RECORD_HEADER_BYTES) {
        rc = HORA_ERR(HORA_ERR_DATA, "%s: truncated record header at byte offset %llu", path,
                      (unsigned long long)off);
        break;
      }
    }
    uint64_t len;
    if (!hora__record_header_ok(win + (off - win_off), &len)) {
      rc = HORA_ERR(HORA_ERR_DATA, "%s: bad length checksum of the record at byte offset %llu", path,
                    (unsigned long long)off);
      break;
    }
    if (len > size - off || size - off - len < HORA_RECORD_OVERHEAD_BYTES) {
      rc = HORA_ERR(HORA_ERR_DATA, "%s: truncated record at byte offset %llu (length %llu, file has %llu bytes)",
                    path, (unsigned long long)off, (unsigned long long)len, (unsigned long long)size);
      break;
    }
    off += HORA_RECORD_OVERHEAD_BYTES + len;
    n++;
  }
  free(win);
  close(fd);
  if (rc == HORA_SUCCESS) *count = n;
  return rc;
}
