/* hora_ckpt_save and the writer thread (rank 0).
 *
 *   training thread                      writer thread                    copier thread
 *   save(step): wait until the staging
 *   buffer is free, copy tensors into it
 *   (D2H async + sync), hand it over ───► step-N/.tmp-state.safetensors.PID
 *   return                                 header + data, fsync, rename,
 *                                          fsync dir; manifest.json last
 *                                          (tmp, fsync, rename, fsync dir);
 *                                          verify; `latest`; prune old ───► copy when due
 *
 * Only one snapshot exists at a time: a save that finds the previous one still being written
 * waits for it (and logs that it did). Errors of the background write are kept and returned by
 * the next save, flush or close. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/fatal.h"
#include "core/fault.h"

/* The name of the data file for a step directory whose committed manifest names `old` (or
 * none): a name different from the committed one, so the old file stays intact until the new
 * manifest replaces the old one by rename. */
static const char *pick_file(const char *old) {
  return (old && strcmp(old, CK_DATA) == 0) ? "state.1.safetensors" : CK_DATA;
}

/* Write the data file of snapshot s into the step directory sdfd (path sd) under `file`:
 * unpredictable temporary name (O_EXCL, O_NOFOLLOW), chunked writes, fsync, renameat, fsync. */
static hora_result_t write_data(int sdfd, const char *sd, const char *file, const unsigned char *prefix,
                                size_t prefix_bytes, const ck_snap_t *s) {
  char tmp[NAME_MAX + 1], what[4800];
  int fd;
  HORA_CHECK(hora__file_create_tmp(sdfd, sd, file, O_WRONLY, tmp, sizeof tmp, &fd));
  snprintf(what, sizeof what, "%s/%s", sd, tmp);
  hora_result_t rc = hora__ck_write_all(fd, prefix, prefix_bytes, what);
  size_t chunk = (size_t)hora__params()->ckpt_chunk_bytes;
  for (size_t at = 0; rc == HORA_SUCCESS && at < s->data_bytes; at += chunk) {
    size_t n = s->data_bytes - at < chunk ? s->data_bytes - at : chunk;
    rc = hora__ck_write_all(fd, s->data + at, n, what);
    hora__ck_test_delay();
  }
  if (rc == HORA_SUCCESS && fsync(fd) != 0) rc = HORA_ERR(HORA_ERR_IO, "fsync %s: %s", what, strerror(errno));
  if (close(fd) != 0 && rc == HORA_SUCCESS) rc = HORA_ERR(HORA_ERR_IO, "close %s: %s", what, strerror(errno));
  if (rc == HORA_SUCCESS) rc = hora__file_commit(sdfd, sd, tmp, file);
  if (rc != HORA_SUCCESS) unlinkat(sdfd, tmp, 0);
  return rc;
}

static hora_result_t write_checkpoint(hora_ckpt_t *ck, ck_snap_t *s) {
  hora_result_t rc = HORA_SUCCESS;
  char sd[4400], name[64];
  int created = 0, committed = 0, ldfd = -1, sdfd = -1;
  unsigned char *prefix = NULL;
  char *manifest = NULL;
  ck_manifest_t old;
  HORA_CHECK(hora__dir_open(ck->local_dir, 1, &ldfd));
  hora__ck_step_name(s->step, name, sizeof name);
  snprintf(sd, sizeof sd, "%s/%s", ck->local_dir, name);
  /* A step directory without a (readable) manifest is debris of an interrupted write. A symlink
   * or a foreign directory under the step's name is refused (HORA_ERR_IO), never written into. */
  if (hora__entry_exists(ldfd, name)) {
    HORA_CHECK_GOTO(hora__subdir_open(ldfd, ck->local_dir, name, 0, &sdfd), rc, fail);
    committed = hora__entry_exists(sdfd, CK_MANIFEST) && hora__ck_manifest_read_at(sdfd, sd, &old) == HORA_SUCCESS;
  }
  if (!committed && sdfd >= 0) {
    close(sdfd);
    sdfd = -1;
    HORA_CHECK_GOTO(hora__ck_remove_step_at(ldfd, ck->local_dir, name), rc, fail);
  }
  if (!committed) {
    HORA_CHECK_GOTO(hora__subdir_open(ldfd, ck->local_dir, name, 1, &sdfd), rc, fail);
    created = 1;
  } else {
    HORA_INFO(CKPT, "step %" PRId64 " is already committed in %s: writing a new version beside it", s->step,
              ck->local_dir);
  }
  const char *file = pick_file(committed ? old.file : NULL);
  uint32_t file_crc, data_crc;
  size_t prefix_bytes;
  hora__ck_snap_crcs(s);
  HORA_CHECK_GOTO(hora__ck_encode(s, &prefix, &prefix_bytes, &file_crc, &data_crc), rc, fail);
  HORA_CHECK_GOTO(write_data(sdfd, sd, file, prefix, prefix_bytes, s), rc, fail);
  uint64_t file_bytes = prefix_bytes + s->data_bytes;
  HORA_CHECK_GOTO(hora__ck_manifest_json(s, file, file_bytes, file_crc, data_crc, ck->persist_dir, &manifest), rc, fail);
  HORA_CHECK_GOTO(hora__file_write_atomic(sdfd, sd, CK_MANIFEST, manifest, strlen(manifest)), rc, fail);
  if (committed && strcmp(old.file, file) != 0) {
    unlinkat(sdfd, old.file, 0);
    (void)hora__ck_fsync_fd(sdfd, sd);
  }
  committed = 1;
  created = 0;
  /* Read the new checkpoint back before anything older may go. */
  if (hora__params()->ckpt_verify) {
    ck_manifest_t m;
    rc = hora__ck_validate_at(sdfd, sd, 0, &m, NULL, NULL);
    if (rc != HORA_SUCCESS) {
      char msg[CK_MSG_MAX];
      hora__ck_keep_msg(msg);
      created = 1; /* removed below */
      rc = HORA_ERR(HORA_ERR_IO, "checkpoint of step %" PRId64 " did not read back correctly and was removed: %s",
                    s->step, msg);
      goto fail;
    }
  }
  char latest[64];
  int ln = snprintf(latest, sizeof latest, "%s\n", name);
  HORA_CHECK_GOTO(hora__file_write_atomic(ldfd, ck->local_dir, CK_LATEST, latest, (size_t)ln), rc, fail);
  ck->last_file_bytes = file_bytes;
  close(sdfd);
  close(ldfd);
  free(prefix);
  free(manifest);
  return HORA_SUCCESS;
fail:
  if (sdfd >= 0) close(sdfd);
  /* Nothing of ours may stay behind; older steps are untouched. */
  if (created) hora__ck_remove_step_at(ldfd, ck->local_dir, name);
  if (ldfd >= 0) close(ldfd);
  free(prefix);
  free(manifest);
  return rc;
}

void *hora__ck_writer_main(void *arg) {
  hora__thread_name("hora-ckpt-write");
  hora_ckpt_t *ck = arg;
  pthread_mutex_lock(&ck->mu);
  for (;;) {
    while (!ck->job_pending && !ck->stop) pthread_cond_wait(&ck->cv, &ck->mu);
    if (!ck->job_pending) break;
    ck->job_pending = 0;
    ck->writing = 1;
    ck_snap_t *s = &ck->job;
    pthread_mutex_unlock(&ck->mu);

    double t0 = hora__now_s();
    hora_result_t rc = write_checkpoint(ck, s);
    double dt = hora__now_s() - t0;
    char msg[CK_MSG_MAX] = "";
    if (rc != HORA_SUCCESS) {
      hora__ck_keep_msg(msg);
      HORA_WARN(CKPT, "checkpoint of step %" PRId64 " failed: %s", s->step, msg);
    } else {
      HORA_INFO(CKPT, "step %" PRId64 " committed in %s (%" PRIu64 " bytes, %.3f s)", s->step, ck->local_dir,
                ck->last_file_bytes, dt);
    }

    pthread_mutex_lock(&ck->mu);
    if (rc == HORA_SUCCESS) {
      ck->commit_seq++;
      ck->committed_step = s->step;
      ck->last_write_s = dt;
      int64_t pinned = ck->copying_step;
      int64_t step = s->step;
      pthread_mutex_unlock(&ck->mu);
      int dfd;
      if (hora__dir_open(ck->local_dir, 0, &dfd) == HORA_SUCCESS) {
        hora__ck_prune(dfd, ck->local_dir, ck->keep, step, pinned);
        close(dfd);
      }
      pthread_mutex_lock(&ck->mu);
    } else if (ck->write_rc == HORA_SUCCESS) {
      ck->write_rc = rc;
      snprintf(ck->write_msg, sizeof ck->write_msg, "checkpoint of step %" PRId64 " failed: %s", s->step, msg);
    }
    hora__ck_snap_free(s);
    ck->writing = 0;
    pthread_cond_broadcast(&ck->cv);
  }
  pthread_mutex_unlock(&ck->mu);
  return NULL;
}

static int free_bytes(const char *dir, uint64_t *avail) {
  struct statvfs vf;
  if (statvfs(dir, &vf) != 0) return 0;
  *avail = (uint64_t)vf.f_bavail * vf.f_frsize;
  return 1;
}

/* Disk space for a new file of `need` bytes in local_dir (called with ck->mu held and the writer
 * idle). When it does not fit beside the versions kept, older versions are pruned first, down to
 * the newest complete one at or below `step` and the one the copier is reading: a full disk
 * costs the older safety copy, never the only complete checkpoint and never the next save.
 * HORA_ERR_IO (nothing changed but the pruning) when it still does not fit, or when local_dir
 * fails the ownership and mode check (core/safefs.h). */
static hora_result_t make_room(hora_ckpt_t *ck, int64_t step, uint64_t need) {
  /* The directory is checked here too, so that a save into a directory that fails the check
   * (replaced since open) is refused at once rather than failing in the background. */
  int dfd, pruned = 0;
  HORA_CHECK(hora__dir_open(ck->local_dir, 1, &dfd));
  uint64_t avail = 0;
  if (!free_bytes(ck->local_dir, &avail) || avail >= need) {
    close(dfd);
    return HORA_SUCCESS;
  }
  pruned = hora__ck_prune(dfd, ck->local_dir, 1, step, ck->copying_step);
  close(dfd);
  if (pruned)
    HORA_WARN(CKPT, "local_dir %s had %" PRIu64 " bytes free, step %" PRId64 " needs %" PRIu64 ": pruned %d older "
              "version%s early", ck->local_dir, avail, step, need, pruned, pruned == 1 ? "" : "s");
  if (!free_bytes(ck->local_dir, &avail) || avail >= need) return HORA_SUCCESS;
  return HORA_ERR(HORA_ERR_IO, "hora_ckpt_save: local_dir %s has %" PRIu64 " bytes free, the checkpoint of step %" PRId64
                  " needs %" PRIu64 " (disk full, even after pruning %d older version%s; the newest complete "
                  "checkpoint%s kept)", ck->local_dir, avail, step, need, pruned, pruned == 1 ? "" : "s",
                  ck->copying_step != INT64_MIN ? " and the one being copied are" : " is");
}

/* hora_ckpt_save's metadata rules: keys non-empty, unique and outside "hora."; values set. */
static hora_result_t check_meta(const hora_kv_t *meta, size_t nmeta) {
  for (size_t i = 0; i < nmeta; i++) {
    if (!meta[i].key || !meta[i].value || !*meta[i].key) {
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: meta[%zu] has a NULL or empty key or a NULL value", i);
    }
    if (strncmp(meta[i].key, "hora.", 5) == 0) {
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: meta key '%s': the prefix \"hora.\" is reserved", meta[i].key);
    }
    for (size_t j = 0; j < i; j++)
      if (strcmp(meta[i].key, meta[j].key) == 0) {
        return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: meta key '%s' appears twice", meta[i].key);
      }
  }
  return HORA_SUCCESS;
}

/* Wait until the writer is idle (the staging buffer is then the caller's), return a deferred
 * error of an earlier write once, else make room for `need` bytes (make_room). */
static hora_result_t claim_writer(hora_ckpt_t *ck, int64_t step, uint64_t need) {
  hora_result_t rc;
  /* Wait for the write in progress first: the space it takes counts, and a save that cannot fit
   * must fail now, not be accepted and fail later in the background. */
  pthread_mutex_lock(&ck->mu);
  if (ck->write_rc == HORA_SUCCESS && (ck->job_pending || ck->writing)) {
    double t0 = hora__now_s();
    while (ck->job_pending || ck->writing) pthread_cond_wait(&ck->cv, &ck->mu);
    HORA_WARN(CKPT, "save of step %" PRId64 " waited %.3f s for the previous checkpoint's write to finish "
              "(saves come faster than local_dir takes them)", step, hora__now_s() - t0);
  }
  if (ck->write_rc != HORA_SUCCESS) {
    rc = HORA_ERR(ck->write_rc, "%s", ck->write_msg);
    ck->write_rc = HORA_SUCCESS;
  } else {
    /* Under mu, so that the copier cannot start on another step while room is made. */
    rc = make_room(ck, step, need);
  }
  pthread_mutex_unlock(&ck->mu);
  return rc;
}

static int strcmp_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One tensor of a save, alone: name, dtype, device, data, shape against count. */
static hora_result_t check_tensor(const hora_tensor_t *t, size_t i) {
  size_t es = hora__dtype_size(t->dtype);
  if (!t->name || !*t->name || strlen(t->name) > CK_NAME_MAX || strcmp(t->name, "__metadata__") == 0)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: tensors[%zu].name is %s", i,
                    !t->name ? "NULL" : !*t->name ? "empty" : strcmp(t->name, "__metadata__") == 0
                    ? "\"__metadata__\" (reserved by safetensors)" : "longer than 1024 bytes");
  if (!es)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: tensor '%s' has unknown dtype %d", t->name, (int)t->dtype);
  if (t->device != HORA_DEVICE_HOST && t->device != HORA_DEVICE_CUDA)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: tensor '%s' has unknown device %d", t->name, (int)t->device);
  if (t->count && !t->data)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: tensor '%s' has data NULL and count %zu", t->name, t->count);
  if (t->ndim < 0 || t->ndim > 64 || (t->ndim > 0 && !t->shape))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: tensor '%s' has ndim %d%s", t->name, t->ndim,
                    t->ndim > 0 ? " but shape is NULL" : " (must be 0..64)");
  size_t prod = 1;
  int bad = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] < 0 || (t->shape[d] && prod > SIZE_MAX / (size_t)t->shape[d])) bad = 1;
    else prod *= (size_t)t->shape[d];
  }
  if (t->ndim > 0 && (bad || prod != t->count))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: tensor '%s': the product of its shape is not its count %zu",
                    t->name, t->count);
  return HORA_SUCCESS;
}

/* Rank 0's part of a save. */
static hora_result_t save_root(hora_ckpt_t *ck, int64_t step, const hora_tensor_t *tensors, size_t n,
                               const hora_kv_t *meta, size_t nmeta) {
  if (n && !tensors) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: tensors is NULL with ntensors=%zu", n);
  if (nmeta && !meta) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: meta is NULL with nmeta=%zu", nmeta);
  size_t *off = calloc(n ? n : 1, sizeof *off);
  const char **names = calloc(n ? n : 1, sizeof *names);
  ck_snap_t s = {0};
  hora_result_t rc = HORA_SUCCESS;
  if (!off || !names) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
    goto done;
  }
  size_t total = 0;
  int any_dev = 0;
  for (size_t i = 0; i < n; i++) {
    const hora_tensor_t *t = &tensors[i];
    size_t es = hora__dtype_size(t->dtype);
    HORA_CHECK_GOTO(check_tensor(t, i), rc, done);
    if (t->count > (SIZE_MAX - total) / es) {
      rc = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: tensor '%s': count * element size overflows", t->name);
      goto done;
    }
    off[i] = total;
    total += t->count * es;
    names[i] = t->name;
    any_dev |= t->device == HORA_DEVICE_CUDA;
  }
  qsort(names, n, sizeof *names, strcmp_ptr);
  for (size_t i = 1; i < n; i++)
    if (strcmp(names[i - 1], names[i]) == 0) {
      rc = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: tensor name '%s' appears twice", names[i]);
      goto done;
    }
  HORA_CHECK_GOTO(check_meta(meta, nmeta), rc, done);
  HORA_CHECK_GOTO(claim_writer(ck, step, total + 4096 + (uint64_t)n * 256), rc, done);

  /* The writer is idle: the staging buffer is ours. */
  double t0 = hora__now_s();
  HORA_CHECK_GOTO(hora__ck_stage_reserve(&ck->stage, total, any_dev), rc, done);
  HORA_CHECK_GOTO(hora__ck_gather(tensors, n, off, ck->stage.p, ck->ctx->device), rc, done);
  s.step = step;
  s.world_size = ck->size;
  s.data = ck->stage.p;
  s.data_bytes = total;
  s.t = calloc(n ? n : 1, sizeof *s.t);
  s.keys = calloc(nmeta ? nmeta : 1, sizeof *s.keys);
  s.vals = calloc(nmeta ? nmeta : 1, sizeof *s.vals);
  if (!s.t || !s.keys || !s.vals) goto oom;
  for (size_t i = 0; i < n; i++) {
    ck_tensor_t *t = &s.t[i];
    const hora_tensor_t *u = &tensors[i];
    t->name = strdup(u->name);
    t->dtype = u->dtype;
    t->ndim = u->ndim > 0 ? u->ndim : 1;
    t->shape = malloc(sizeof(int64_t) * (size_t)t->ndim);
    s.ntensors++;
    if (!t->name || !t->shape) goto oom;
    if (u->ndim > 0)
      memcpy(t->shape, u->shape, sizeof(int64_t) * (size_t)u->ndim);
    else
      t->shape[0] = (int64_t)u->count;
    t->count = u->count;
    t->bytes = u->count * hora__dtype_size(u->dtype);
    t->offset = off[i];
  }
  for (size_t i = 0; i < nmeta; i++) {
    s.keys[i] = strdup(meta[i].key);
    s.vals[i] = strdup(meta[i].value);
    s.nmeta++;
    if (!s.keys[i] || !s.vals[i]) goto oom;
  }
  ck->last_snapshot_s = hora__now_s() - t0;
  pthread_mutex_lock(&ck->mu);
  ck->job = s;
  ck->job_pending = 1;
  pthread_cond_broadcast(&ck->cv);
  pthread_mutex_unlock(&ck->mu);
  memset(&s, 0, sizeof s);
  HORA_INFO(CKPT, "snapshot of step %" PRId64 ": %zu tensors, %zu bytes in %.3f s", step, n, total,
            ck->last_snapshot_s);
  goto done;
oom:
  rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory describing the snapshot");
done:
  hora__ck_snap_free(&s);
  free(off);
  free(names);
  return rc;
}

/* Non-blocking and death-aware (hora__ctx_wait): a rank that died (or that is stuck elsewhere
 * after a failure) must not keep the others in a broadcast forever; the wait ends with the
 * verdict that names it. */
hora_result_t hora__ck_bcast_watched(hora_ckpt_t *ck, void *p, size_t bytes, const char *what, int *lost) {
  *lost = 0;
  if (!bytes) return HORA_SUCCESS;
  MPI_Datatype ty;
  int owned = 0;
  HORA_CHECK(hora__mpi_bytes_type(bytes, &ty, &owned));
  MPI_Request req = MPI_REQUEST_NULL;
  hora_result_t rc = hora__ctx_wait(ck->ctx, MPI_Ibcast(p, 1, ty, 0, ck->comm, &req), &req, what, bytes);
  if (owned) MPI_Type_free(&ty); /* MPI keeps a type alive while a request uses it */
  *lost = rc != HORA_SUCCESS && hora__ctx_failed(ck->ctx);
  return rc;
}

/* Every rank learns rank 0's result (and its message). */
hora_result_t hora__ck_bcast_result(hora_ckpt_t *ck, hora_result_t rc, const char *fn) {
  struct ck_result {
    int rc;
    char msg[CK_MSG_MAX];
  } *r = calloc(1, sizeof *r);
  if (!r) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
  r->rc = (int)rc;
  if (ck->rank == 0 && rc != HORA_SUCCESS) hora__ck_keep_msg(r->msg);
  char own[CK_MSG_MAX] = "";
  if (rc != HORA_SUCCESS) hora__ck_keep_msg(own);
  char what[96];
  snprintf(what, sizeof what, "%s (waiting for the result from rank 0)", fn);
  int lost = 0;
  hora_result_t wrc = hora__ck_bcast_watched(ck, r, sizeof *r, what, &lost);
  if (wrc != HORA_SUCCESS) {
    if (!lost) free(r); /* else the abandoned broadcast may still write it */
    /* This rank's own failure, if it had one, is the error to report (the verdict is in the log). */
    if (rc == HORA_SUCCESS) return wrc;
    hora__error_restore(own);
    return rc;
  }
  hora_result_t out = (hora_result_t)r->rc;
  if (ck->rank != 0 && out != HORA_SUCCESS) out = HORA_ERR(out, "%s failed on rank 0: %s", fn, r->msg);
  free(r);
  return out;
}

HORA_EXPORT hora_result_t hora_ckpt_save(hora_ckpt_t *ck, int64_t step, const hora_tensor_t *tensors,
                                         size_t ntensors, const hora_kv_t *meta, size_t nmeta) {
  if (!ck) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: ck is NULL");
  HORA_CKPT_FORK_CHECK(ck, "hora_ckpt_save");
  hora_result_t frc = hora__fault_hit("save", ck->rank), rc = frc;
  if (ck->rank == 0 && rc == HORA_SUCCESS) rc = save_root(ck, step, tensors, ntensors, meta, nmeta);
  rc = hora__ck_bcast_result(ck, rc, "hora_ckpt_save");
  return ck->rank != 0 && frc != HORA_SUCCESS ? frc : rc;
}
