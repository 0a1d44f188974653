/* TensorBoard event files: TFRecord-framed `Event` protocol buffers (docs/data.md).
 *
 * Why our own encoder: the three messages needed are tiny and fixed, and a hand encoder avoids a
 * protobuf-c build dependency and generated code. The messages (tensorflow/core/util/event.proto
 * and tensorflow/core/framework/summary.proto) and the fields written:
 *
 *   Event          1 wall_time     double  wire type 1 (64-bit)   key 0x09
 *                  2 step          int64   wire type 0 (varint)   key 0x10
 *                  3 file_version  string  wire type 2 (length)   key 0x1a   (first record only)
 *                  5 summary       Summary wire type 2 (length)   key 0x2a
 *   Summary        1 value         repeated Value, wire type 2    key 0x0a
 *   Summary.Value  1 tag           string  wire type 2            key 0x0a
 *                  2 simple_value  float   wire type 5 (32-bit)   key 0x15
 *
 * A key is (field_number << 3) | wire_type as a varint; varints are little-endian base-128 with
 * the high bit as continuation; negative int64 steps take 10 bytes (two's complement);
 * doubles and floats are IEEE little-endian. Each event is one record (records.h framing),
 * written with a single write() so that readers of a live file never see half an event. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "core/safefs.h"
#include "trace/trace.h"

#define TB_MAX_TAG 1024

struct hora_tb {
  int fd;
  int failed;
  char *path;
  pthread_mutex_t lock;
  unsigned fork_gen; /* hora__fork_watch() at open: the file is the opener's (core/fork.c) */
};
#define TB_FORK_CHECK(tb, fn) \
  HORA_CHECK(hora__fork_check((tb)->fork_gen, fn, "the TensorBoard writer", "write to it in the parent"))

static size_t put_varint(unsigned char *p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (unsigned char)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (unsigned char)v;
  return n;
}

static double wall_time_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Encode Event{wall_time, step, <payload field>} into out; returns its length. */
static size_t encode_event(unsigned char *out, double wall, int64_t step, unsigned char key,
                           const unsigned char *payload, size_t payload_len) {
  size_t n = 0;
  out[n++] = 0x09;
  memcpy(out + n, &wall, 8); /* little-endian hosts */
  n += 8;
  if (step != 0) {
    out[n++] = 0x10;
    n += put_varint(out + n, (uint64_t)step);
  }
  out[n++] = key;
  n += put_varint(out + n, payload_len);
  memcpy(out + n, payload, payload_len);
  return n + payload_len;
}

static void store_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Frame `ev` as one TFRecord (the framing of runtime/data, repeated here so that trace/ depends
 * on core/ only): uint64 LE length, masked CRC32C of those 8 bytes, data, masked CRC32C of the
 * data. Written in one call. Caller holds tb->lock. */
static hora_result_t write_event(hora_tb_t *tb, const unsigned char *ev, size_t len) {
  unsigned char rec[TB_MAX_TAG + 128];
  for (int i = 0; i < 8; i++) rec[i] = (unsigned char)((uint64_t)len >> (8 * i));
  store_le32(rec + 8, hora__crc32c_mask(hora__crc32c(0, rec, 8)));
  memcpy(rec + 12, ev, len);
  store_le32(rec + 12 + len, hora__crc32c_mask(hora__crc32c(0, ev, len)));
  size_t total = len + 16, done = 0;
  while (done < total) {
    ssize_t w = write(tb->fd, rec + done, total - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      tb->failed = 1;
      return HORA_ERR(HORA_ERR_IO, "write %s: %s", tb->path, strerror(errno));
    }
    done += (size_t)w;
  }
  return HORA_SUCCESS;
}

/* mkdir -p through core/safefs.c: every directory on the way is checked (owner, mode, symlinks)
 * and new ones are private (hora__dir_mode()). */
hora_result_t hora__mkdir_p(const char *dir) {
  int fd;
  HORA_CHECK(hora__dir_open(dir, 1, &fd));
  close(fd);
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_tb_open(const char *dir, hora_tb_t **out) {
  if (!dir || !*dir || !out)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_tb_open: %s is NULL or empty", !out ? "tb" : "dir");
  int dfd;
  HORA_CHECK(hora__dir_open(dir, 1, &dfd));
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
  host[sizeof host - 1] = 0;
  hora_tb_t *tb = calloc(1, sizeof *tb);
  size_t n = strlen(dir) + strlen(host) + 96;
  char *path = malloc(n);
  if (!tb || !path) {
    close(dfd);
    free(tb);
    free(path);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  }
  int off = snprintf(path, n, "%s/", dir);
  snprintf(path + off, n - (size_t)off, "events.out.tfevents.%lld.%s.%ld", (long long)time(NULL), host, (long)getpid());
  /* openat on the checked directory, O_EXCL|O_NOFOLLOW, mode HORA_FILE_MODE (0600). */
  int fd;
  hora_result_t rc = hora__file_create_excl(dfd, dir, path + off, O_WRONLY | O_APPEND, &fd);
  close(dfd);
  if (rc != HORA_SUCCESS) {
    free(tb);
    free(path);
    return rc;
  }
  tb->fd = fd;
  tb->path = path;
  pthread_mutex_init(&tb->lock, NULL);
  static const char version[] = "brain.Event:2";
  unsigned char ev[64];
  size_t len = encode_event(ev, wall_time_s(), 0, 0x1a, (const unsigned char *)version, sizeof version - 1);
  rc = write_event(tb, ev, len);
  if (rc != HORA_SUCCESS) {
    close(fd);
    unlink(path);
    pthread_mutex_destroy(&tb->lock);
    free(path);
    free(tb);
    return rc;
  }
  HORA_INFO(TRACE, "TensorBoard events: %s", path);
  tb->fork_gen = hora__fork_watch();
  *out = tb;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_tb_scalar(hora_tb_t *tb, const char *tag, int64_t step, double value) {
  if (!tb || !tag) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_tb_scalar: %s is NULL", !tb ? "tb" : "tag");
  TB_FORK_CHECK(tb, "hora_tb_scalar");
  size_t tl = strlen(tag);
  if (tl == 0 || tl > TB_MAX_TAG)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_tb_scalar: tag length %zu is outside 1..%d", tl, TB_MAX_TAG);
  /* Summary.Value{tag, simple_value} */
  unsigned char val[TB_MAX_TAG + 16], sum[TB_MAX_TAG + 32], ev[TB_MAX_TAG + 64];
  size_t vn = 0;
  val[vn++] = 0x0a;
  vn += put_varint(val + vn, tl);
  memcpy(val + vn, tag, tl);
  vn += tl;
  val[vn++] = 0x15;
  float f = (float)value;
  memcpy(val + vn, &f, 4);
  vn += 4;
  /* Summary{value: val} */
  size_t sn = 0;
  sum[sn++] = 0x0a;
  sn += put_varint(sum + sn, vn);
  memcpy(sum + sn, val, vn);
  sn += vn;
  size_t en = encode_event(ev, wall_time_s(), step, 0x2a, sum, sn);
  pthread_mutex_lock(&tb->lock);
  hora_result_t rc = tb->failed ? HORA_ERR(HORA_ERR_IO, "hora_tb_scalar: an earlier write to %s failed", tb->path)
                                : write_event(tb, ev, en);
  pthread_mutex_unlock(&tb->lock);
  return rc;
}

HORA_EXPORT hora_result_t hora_tb_flush(hora_tb_t *tb) {
  if (!tb) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_tb_flush: tb is NULL");
  TB_FORK_CHECK(tb, "hora_tb_flush");
  pthread_mutex_lock(&tb->lock);
  hora_result_t rc = HORA_SUCCESS;
  if (fsync(tb->fd) != 0) rc = HORA_ERR(HORA_ERR_IO, "fsync %s: %s", tb->path, strerror(errno));
  pthread_mutex_unlock(&tb->lock);
  return rc;
}

HORA_EXPORT hora_result_t hora_tb_close(hora_tb_t *tb) {
  if (!tb) return HORA_SUCCESS;
  TB_FORK_CHECK(tb, "hora_tb_close");
  hora_result_t rc = HORA_SUCCESS;
  if (fsync(tb->fd) != 0) rc = HORA_ERR(HORA_ERR_IO, "fsync %s: %s", tb->path, strerror(errno));
  if (close(tb->fd) != 0 && rc == HORA_SUCCESS) rc = HORA_ERR(HORA_ERR_IO, "close %s: %s", tb->path, strerror(errno));
  pthread_mutex_destroy(&tb->lock);
  free(tb->path);
  free(tb);
  return rc;
}
