/* The copier thread (rank 0, only with a persist_dir): copies the newest committed local step to
 * persist_dir when it is due (copy_interval_s after the previous copy, after every save with
 * interval 0, and at once when a flush waits):
 *
 *   local step-N/<file> ──read, CRC32C──► persist step-N/.tmp-<file>.PID ──fsync──► re-read,
 *   CRC32C == manifest? ──► rename to <file>, fsync dir ──► manifest.json (tmp, fsync, rename,
 *   fsync dir) ──► `latest` (tmp, rename) ──► prune persist_dir to `keep` versions
 *
 * persist_dir itself is never created by the copier (only by hora_ckpt_open): if it disappears
 * (an unmounted file system), copying into an empty mount point would be wrong; the copier logs
 * the failure once, retries every HORA_CKPT_RETRY_S, and resumes when it is back. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/crc32c.h"
#include "core/fatal.h"
#include "core/fault.h"

/* Read-back verification, pipelined with the copy: a helper thread reads dst back chunk by
 * chunk (from the page cache, right after each chunk was copied) and extends the CRC32C, while
 * the copier thread moves the next chunk. On two or more cores the verification is then almost
 * free; on one core it costs one CRC pass (about 4 GB/s). */
typedef struct {
  int fd;
  const char *path;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t avail; /* bytes of dst copied so far */
  int done;       /* the copy is over (or failed) */
  uint32_t crc;
  uint64_t verified;
  int err; /* errno of a failed read, or -1 for a short file */
} verify_t;

/* Read-back size: small enough that the bytes are still in the L2 cache when the CRC reads them
 * (a chunk-sized buffer would go out to memory and back). */
#define VERIFY_READ_BYTES (256u << 10)

static void *verify_main(void *arg) {
  hora__thread_name("hora-ckpt-check");
  verify_t *v = arg;
  unsigned char *b = malloc(VERIFY_READ_BYTES);
  if (!b) {
    v->err = ENOMEM;
    return NULL;
  }
  for (;;) {
    pthread_mutex_lock(&v->mu);
    while (v->verified >= v->avail && !v->done) pthread_cond_wait(&v->cv, &v->mu);
    uint64_t lim = v->avail;
    int done = v->done;
    pthread_mutex_unlock(&v->mu);
    if (v->verified >= lim && done) break;
    while (v->verified < lim) {
      size_t n = lim - v->verified < VERIFY_READ_BYTES ? (size_t)(lim - v->verified) : VERIFY_READ_BYTES;
      ssize_t x = pread(v->fd, b, n, (off_t)v->verified);
      if (x < 0 && errno == EINTR) continue;
      if (x <= 0) {
        v->err = x < 0 ? errno : -1;
        free(b);
        return NULL;
      }
      v->crc = hora__crc32c(v->crc, b, (size_t)x);
      v->verified += (uint64_t)x;
    }
  }
  free(b);
  return NULL;
}

/* Copy src to dst (created) and return the CRC32C and size of what dst holds afterwards.
 * The bytes move inside the kernel (copy_file_range, as cp does; read/write where the two file
 * systems cannot do that); each chunk's writeback is started at once (sync_file_range), so the
 * final fsync overlaps with the copy instead of following it; each chunk is read back from dst
 * and CRC'd by the verifier thread while it is still in the page cache. */
static hora_result_t copy_file(int in, const char *src, int out, const char *dst, uint32_t *crc, uint64_t *bytes) {
  size_t chunk = (size_t)hora__params()->ckpt_chunk_bytes;
  struct stat st;
  if (fstat(in, &st) != 0) return HORA_ERR(HORA_ERR_IO, "stat %s: %s", src, strerror(errno));
  posix_fadvise(in, 0, 0, POSIX_FADV_SEQUENTIAL);
  verify_t v = {.fd = out, .path = dst};
  pthread_mutex_init(&v.mu, NULL);
  pthread_cond_init(&v.cv, NULL);
  pthread_t vt;
  int vt_started = pthread_create(&vt, NULL, verify_main, &v) == 0;
  unsigned char *b = malloc(chunk);
  hora_result_t rc = (b && vt_started) ? HORA_SUCCESS : HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory (copier)");
  uint64_t total = (uint64_t)st.st_size, off = 0;
  int kernel_copy = 1;
  while (rc == HORA_SUCCESS && off < total) {
    size_t n = total - off < chunk ? (size_t)(total - off) : chunk;
    ssize_t r;
    if (kernel_copy) {
      loff_t io = (loff_t)off, oo = (loff_t)off;
      r = copy_file_range(in, &io, out, &oo, n, 0);
      if (r < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
        kernel_copy = 0;
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        rc = HORA_ERR(HORA_ERR_IO, "copy %s to %s: %s", src, dst, strerror(errno));
        break;
      }
    } else {
      r = pread(in, b, n, (off_t)off);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        rc = HORA_ERR(HORA_ERR_IO, "read %s: %s", src, strerror(errno));
        break;
      }
      size_t w = 0;
      while (r > 0 && w < (size_t)r && rc == HORA_SUCCESS) {
        ssize_t x = pwrite(out, b + w, (size_t)r - w, (off_t)(off + w));
        if (x < 0 && errno == EINTR) continue;
        if (x <= 0) rc = HORA_ERR(HORA_ERR_IO, "write %s: %s", dst, x < 0 ? strerror(errno) : "no progress");
        else w += (size_t)x;
      }
    }
    if (rc != HORA_SUCCESS) break;
    if (r == 0) {
      rc = HORA_ERR(HORA_ERR_IO, "%s ended at byte %" PRIu64 " of %" PRIu64 " (changed while copied)", src, off, total);
      break;
    }
    sync_file_range(out, (off64_t)off, (off64_t)r, SYNC_FILE_RANGE_WRITE);
    off += (uint64_t)r;
    pthread_mutex_lock(&v.mu);
    v.avail = off;
    pthread_cond_signal(&v.cv);
    pthread_mutex_unlock(&v.mu);
    hora__ck_test_delay();
  }
  pthread_mutex_lock(&v.mu);
  v.done = 1;
  pthread_cond_signal(&v.cv);
  pthread_mutex_unlock(&v.mu);
  if (vt_started) pthread_join(vt, NULL);
  if (rc == HORA_SUCCESS && v.err)
    rc = HORA_ERR(HORA_ERR_IO, "read back %s: %s", dst, v.err > 0 ? strerror(v.err) : "short file");
  if (rc == HORA_SUCCESS && fsync(out) != 0) rc = HORA_ERR(HORA_ERR_IO, "fsync %s: %s", dst, strerror(errno));
  free(b);
  pthread_mutex_destroy(&v.mu);
  pthread_cond_destroy(&v.cv);
  *crc = v.crc;
  *bytes = v.verified;
  return rc;
}

/* The local manifest (of the step directory sdfd, path sd) with "file" set to `file` (the
 * persistent copy may carry another name). */
static hora_result_t manifest_for(int sdfd, const char *sd, const char *file, char **out) {
  unsigned char *buf = NULL;
  size_t len = 0;
  HORA_CHECK(hora__ck_read_file_at(sdfd, sd, CK_MANIFEST, (size_t)256 << 20, &buf, &len));
  json_error_t e;
  json_t *root = json_loadb((const char *)buf, len, 0, &e);
  free(buf);
  if (!root) return HORA_ERR(HORA_ERR_DATA, "%s/%s: %s", sd, CK_MANIFEST, e.text);
  json_object_set_new(root, "file", json_string(file));
  *out = json_dumps(root, JSON_INDENT(1));
  json_decref(root);
  return *out ? HORA_SUCCESS : HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
}

/* Copy the file of manifest m from src_sdfd to dst_sdfd under `file` (temporary name first),
 * check size and CRC32C against the manifest, then rename. */
static hora_result_t copy_data(int src_sdfd, const char *src_sd, int dst_sdfd, const char *dst_sd,
                               const ck_manifest_t *m, const char *file) {
  char src[4800], tmp[NAME_MAX + 1], what[4800];
  int in, out;
  snprintf(src, sizeof src, "%s/%s", src_sd, m->file);
  HORA_CHECK(hora__file_open_read(src_sdfd, src_sd, m->file, &in));
  hora_result_t rc = hora__file_create_tmp(dst_sdfd, dst_sd, file, O_RDWR, tmp, sizeof tmp, &out);
  if (rc != HORA_SUCCESS) {
    close(in);
    return rc;
  }
  snprintf(what, sizeof what, "%s/%s", dst_sd, tmp);
  uint32_t crc = 0;
  uint64_t bytes = 0;
  rc = copy_file(in, src, out, what, &crc, &bytes);
  if (close(out) != 0 && rc == HORA_SUCCESS) rc = HORA_ERR(HORA_ERR_IO, "close %s: %s", what, strerror(errno));
  close(in);
  /* What persist_dir holds must match the manifest: a mismatch means the local file was
   * damaged after its commit (it cannot be fixed by retrying) or the copy went wrong. */
  if (rc == HORA_SUCCESS && (bytes != m->file_bytes || crc != m->file_crc)) {
    uint32_t lc = 0;
    uint64_t lb = 0;
    int local_bad = hora__ck_file_crc_at(src_sdfd, src_sd, m->file, (size_t)hora__params()->ckpt_chunk_bytes, &lc,
                                         &lb) != HORA_SUCCESS || lc != m->file_crc || lb != m->file_bytes;
    rc = HORA_ERR(local_bad ? HORA_ERR_DATA : HORA_ERR_IO,
                  "%s reads back as %" PRIu64 " bytes with CRC32C %08" PRIx32 ", the manifest says %" PRIu64
                  ", %08" PRIx32 "%s: not committed", what, bytes, crc, m->file_bytes, m->file_crc,
                  local_bad ? " (the local file itself no longer matches)" : "");
  }
  if (rc == HORA_SUCCESS) rc = hora__file_commit(dst_sdfd, dst_sd, tmp, file);
  if (rc != HORA_SUCCESS) unlinkat(dst_sdfd, tmp, 0);
  return rc;
}

/* Fds of one copy: local_dir, its step directory, persist_dir, the destination step directory. */
typedef struct {
  int ld, src, pd, dst;
} copy_fds_t;

static void close_fds(copy_fds_t *f) {
  int *all[4] = {&f->ld, &f->src, &f->pd, &f->dst};
  for (int i = 0; i < 4; i++)
    if (*all[i] >= 0) {
      close(*all[i]);
      *all[i] = -1;
    }
}

static hora_result_t copy_step(hora_ckpt_t *ck, int64_t step) {
  char name[64], src_sd[4400], dst_sd[4400];
  ck_manifest_t m, old;
  copy_fds_t f = {-1, -1, -1, -1};
  HORA_CHECK(hora__fault_hit("copy", ck->rank));
  hora__ck_step_name(step, name, sizeof name);
  snprintf(src_sd, sizeof src_sd, "%s/%s", ck->local_dir, name);
  snprintf(dst_sd, sizeof dst_sd, "%s/%s", ck->persist_dir, name);
  hora_result_t rc;
  char *manifest = NULL;
  int created = 0;
  HORA_CHECK_GOTO(hora__dir_open(ck->local_dir, 0, &f.ld), rc, fail);
  HORA_CHECK_GOTO(hora__subdir_open(f.ld, ck->local_dir, name, 0, &f.src), rc, fail);
  HORA_CHECK_GOTO(hora__ck_manifest_read_at(f.src, src_sd, &m), rc, fail);
  /* persist_dir is never created here (an unmounted file system leaves an empty mount point). */
  rc = hora__dir_open(ck->persist_dir, 0, &f.pd);
  if (rc == HORA_ERR_NOT_FOUND) {
    char msg[CK_MSG_MAX];
    hora__ck_keep_msg(msg);
    rc = HORA_ERR(HORA_ERR_IO, "persist_dir %s is not reachable: %s", ck->persist_dir, msg);
    goto fail;
  }
  if (rc != HORA_SUCCESS) goto fail;
  if (hora__entry_exists(f.pd, name)) HORA_CHECK_GOTO(hora__subdir_open(f.pd, ck->persist_dir, name, 0, &f.dst), rc, fail);
  int committed = f.dst >= 0 && hora__entry_exists(f.dst, CK_MANIFEST) &&
                  hora__ck_manifest_read_at(f.dst, dst_sd, &old) == HORA_SUCCESS;
  if (committed && old.file_crc == m.file_crc && old.file_bytes == m.file_bytes &&
      hora__ck_validate_at(f.dst, dst_sd, 0, &old, NULL, NULL) == HORA_SUCCESS) {
    HORA_INFO(CKPT, "step %" PRId64 " is already in %s", step, ck->persist_dir);
    goto latest;
  }
  if (!committed) {
    if (f.dst >= 0) {
      close(f.dst);
      f.dst = -1;
      HORA_CHECK_GOTO(hora__ck_remove_step_at(f.pd, ck->persist_dir, name), rc, fail);
    }
    HORA_CHECK_GOTO(hora__subdir_open(f.pd, ck->persist_dir, name, 1, &f.dst), rc, fail);
    created = 1;
  }
  const char *file = (committed && strcmp(old.file, m.file) == 0)
                         ? (strcmp(m.file, CK_DATA) == 0 ? "state.1.safetensors" : CK_DATA)
                         : m.file;
  double t0 = hora__now_s();
  HORA_CHECK_GOTO(copy_data(f.src, src_sd, f.dst, dst_sd, &m, file), rc, fail);
  HORA_CHECK_GOTO(manifest_for(f.src, src_sd, file, &manifest), rc, fail);
  HORA_CHECK_GOTO(hora__file_write_atomic(f.dst, dst_sd, CK_MANIFEST, manifest, strlen(manifest)), rc, fail);
  free(manifest);
  manifest = NULL;
  created = 0;
  if (committed && strcmp(old.file, file) != 0) {
    unlinkat(f.dst, old.file, 0);
    (void)hora__ck_fsync_fd(f.dst, dst_sd);
  }
  ck->last_copy_dur_s = hora__now_s() - t0;
  HORA_INFO(CKPT, "step %" PRId64 " copied to %s (%" PRIu64 " bytes, %.3f s)", step, ck->persist_dir, m.file_bytes,
            ck->last_copy_dur_s);
latest:;
  char latest[64];
  int ln = snprintf(latest, sizeof latest, "%s\n", name);
  HORA_CHECK_GOTO(hora__file_write_atomic(f.pd, ck->persist_dir, CK_LATEST, latest, (size_t)ln), rc, fail);
  hora__ck_prune(f.pd, ck->persist_dir, ck->keep, step, INT64_MIN);
  close_fds(&f);
  return HORA_SUCCESS;
fail:
  free(manifest);
  if (created) {
    if (f.dst >= 0) close(f.dst);
    f.dst = -1;
    hora__ck_remove_step_at(f.pd, ck->persist_dir, name);
  }
  close_fds(&f);
  return rc;
}

void *hora__ck_copier_main(void *arg) {
  hora__thread_name("hora-ckpt-copy");
  hora_ckpt_t *ck = arg;
  pthread_mutex_lock(&ck->mu);
  for (;;) {
    double now = hora__now_s();
    int need = ck->commit_seq > ck->copied_seq;
    /* Stopping (close, after its flush): leave when nothing is left or the last try failed. */
    if (ck->stop && (!need || ck->copy_rc != HORA_SUCCESS)) break;
    int urgent = ck->flush_waiters > 0 || ck->stop;
    double due = ck->copy_interval_s == 0 || urgent ? now : ck->last_copy_s + ck->copy_interval_s;
    if (ck->copy_rc != HORA_SUCCESS && ck->copy_retry_at > due) due = ck->copy_retry_at;
    if (!need || now < due) {
      double wait = need ? due - now : 3600.0;
      if (wait > 1.0) wait = 1.0; /* re-check the clock; flush and save signal the cv anyway */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      long ns = ts.tv_nsec + (long)(wait * 1e9);
      ts.tv_sec += ns / 1000000000L;
      ts.tv_nsec = ns % 1000000000L;
      pthread_cond_timedwait(&ck->cv, &ck->mu, &ts);
      continue;
    }
    uint64_t seq = ck->commit_seq;
    int64_t step = ck->committed_step;
    ck->copying_step = step;
    pthread_mutex_unlock(&ck->mu);

    hora_result_t rc;
    char msg[CK_MSG_MAX] = "";
    struct stat st;
    errno = 0;
    if (ck->copy_failed_logged && (stat(ck->persist_dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
      /* Still unreachable: the failure was logged already; keep the log quiet while retrying. */
      rc = HORA_ERR_IO;
      snprintf(msg, sizeof msg, "persist_dir %s is not reachable: %s", ck->persist_dir,
               errno ? strerror(errno) : "not a directory");
    } else {
      rc = copy_step(ck, step);
      if (rc != HORA_SUCCESS) hora__ck_keep_msg(msg);
    }

    pthread_mutex_lock(&ck->mu);
    ck->copying_step = INT64_MIN;
    ck->copy_rc = rc;
    if (rc == HORA_SUCCESS) {
      ck->copied_seq = seq;
      ck->last_copy_s = hora__now_s();
      if (ck->copy_failed_logged) HORA_WARN(CKPT, "copies to %s work again (step %" PRId64 ")", ck->persist_dir, step);
      ck->copy_failed_logged = 0;
      ck->copy_msg[0] = 0;
    } else {
      snprintf(ck->copy_msg, sizeof ck->copy_msg, "copy of step %" PRId64 " to %s failed: %s", step,
               ck->persist_dir, msg);
      if (!ck->copy_failed_logged)
        HORA_WARN(CKPT, "%s (retrying every %.1f s)", ck->copy_msg, (double)hora__params()->ckpt_retry_s);
      ck->copy_failed_logged = 1;
      ck->copy_retry_at = hora__now_s() + hora__params()->ckpt_retry_s;
      /* A local file that does not match its manifest cannot be fixed by retrying: that step
       * is given up (the next save brings a new one). */
      if (rc == HORA_ERR_DATA) ck->copied_seq = seq;
    }
    pthread_cond_broadcast(&ck->cv);
  }
  pthread_mutex_unlock(&ck->mu);
  return NULL;
}
