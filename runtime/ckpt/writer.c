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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ckpt/ckpt.h"

/* The name of the data file for a step directory whose committed manifest names `old` (or
 * none): a name different from the committed one, so the old file stays intact until the new
 * manifest replaces the old one by rename. */
static const char *pick_file(const char *old) {
  return (old && strcmp(old, CK_DATA) == 0) ? "state.1.safetensors" : CK_DATA;
}

static hora_result_t write_checkpoint(hora_ckpt_t *ck, ck_snap_t *s) {
  hora_result_t rc = HORA_SUCCESS;
  char sd[4096], tmp[4600], fin[4600];
  int created = 0, fd = -1, committed = 0;
  unsigned char *prefix = NULL;
  char *manifest = NULL;
  ck_manifest_t old;
  HORA_CHECK(hora__ck_mkdirs(ck->local_dir));
  hora__ck_step_dir(ck->local_dir, s->step, sd, sizeof sd);
  tmp[0] = 0;
  /* A step directory without a (readable) manifest is debris of an interrupted write. */
  committed = hora__ck_has_manifest(sd) && hora__ck_manifest_read(sd, &old) == HORA_SUCCESS;
  if (!committed && access(sd, F_OK) == 0) HORA_CHECK(hora__ck_remove_step(sd));
  if (!committed) {
    if (mkdir(sd, 0755) != 0) return HORA_ERR(HORA_ERR_IO, "mkdir %s: %s", sd, strerror(errno));
    created = 1;
    HORA_CHECK_GOTO(hora__ck_fsync_dir(ck->local_dir), rc, fail);
  } else {
    HORA_INFO(CKPT, "step %" PRId64 " is already committed in %s: writing a new version beside it", s->step,
              ck->local_dir);
  }
  const char *file = pick_file(committed ? old.file : NULL);
  uint32_t file_crc, data_crc;
  size_t prefix_bytes;
  hora__ck_snap_crcs(s);
  HORA_CHECK_GOTO(hora__ck_encode(s, &prefix, &prefix_bytes, &file_crc, &data_crc), rc, fail);
  snprintf(tmp, sizeof tmp, "%s/" CK_TMP_PREFIX "%s.%ld", sd, file, (long)getpid());
  snprintf(fin, sizeof fin, "%s/%s", sd, file);
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = HORA_ERR(HORA_ERR_IO, "create %s: %s", tmp, strerror(errno));
    goto fail;
  }
  HORA_CHECK_GOTO(hora__ck_write_all(fd, prefix, prefix_bytes, tmp), rc, fail);
  size_t chunk = (size_t)hora__params()->ckpt_chunk_bytes;
  for (size_t at = 0; at < s->data_bytes; at += chunk) {
    size_t n = s->data_bytes - at < chunk ? s->data_bytes - at : chunk;
    HORA_CHECK_GOTO(hora__ck_write_all(fd, s->data + at, n, tmp), rc, fail);
    hora__ck_test_delay();
  }
  if (fsync(fd) != 0) {
    rc = HORA_ERR(HORA_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    goto fail;
  }
  int cfd = fd;
  fd = -1;
  if (close(cfd) != 0) {
    rc = HORA_ERR(HORA_ERR_IO, "close %s: %s", tmp, strerror(errno));
    goto fail;
  }
  if (rename(tmp, fin) != 0) {
    rc = HORA_ERR(HORA_ERR_IO, "rename %s to %s: %s", tmp, fin, strerror(errno));
    goto fail;
  }
  tmp[0] = 0;
  HORA_CHECK_GOTO(hora__ck_fsync_dir(sd), rc, fail);
  uint64_t file_bytes = prefix_bytes + s->data_bytes;
  HORA_CHECK_GOTO(hora__ck_manifest_json(s, file, file_bytes, file_crc, data_crc, ck->persist_dir, &manifest), rc, fail);
  HORA_CHECK_GOTO(hora__ck_write_small(sd, CK_MANIFEST, manifest, strlen(manifest)), rc, fail);
  if (committed && strcmp(old.file, file) != 0) {
    char p[4600];
    snprintf(p, sizeof p, "%s/%s", sd, old.file);
    unlink(p);
    (void)hora__ck_fsync_dir(sd);
  }
  committed = 1;
  created = 0;
  /* Read the new checkpoint back before anything older may go. */
  if (hora__params()->ckpt_verify) {
    ck_manifest_t m;
    rc = hora__ck_validate(sd, 0, &m, NULL, NULL);
    if (rc != HORA_SUCCESS) {
      char msg[CK_MSG_MAX];
      hora__ck_keep_msg(msg);
      hora__ck_remove_step(sd);
      rc = HORA_ERR(HORA_ERR_IO, "checkpoint of step %" PRId64 " did not read back correctly and was removed: %s",
                    s->step, msg);
      goto fail;
    }
  }
  char latest[64];
  int ln = snprintf(latest, sizeof latest, "step-%" PRId64 "\n", s->step);
  HORA_CHECK_GOTO(hora__ck_write_small(ck->local_dir, CK_LATEST, latest, (size_t)ln), rc, fail);
  ck->last_file_bytes = file_bytes;
  free(prefix);
  free(manifest);
  return HORA_SUCCESS;
fail:
  if (fd >= 0) close(fd);
  if (tmp[0]) unlink(tmp);
  if (created) hora__ck_remove_step(sd); /* nothing of ours may stay behind; older steps untouched */
  free(prefix);
  free(manifest);
  return rc;
}

void *hora__ck_writer_main(void *arg) {
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
      hora__ck_prune(ck->local_dir, ck->keep, step, pinned);
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

/* The user metadata of a save: keys present, not empty, not "hora.*", not repeated. */
static hora_result_t check_meta(const hora_kv_t *meta, size_t nmeta) {
  for (size_t i = 0; i < nmeta; i++) {
    if (!meta[i].key || !meta[i].value || !*meta[i].key)
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: meta[%zu] has a NULL or empty key or a NULL value", i);
    if (strncmp(meta[i].key, "hora.", 5) == 0)
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: meta key '%s': the prefix \"hora.\" is reserved", meta[i].key);
    for (size_t j = 0; j < i; j++)
      if (strcmp(meta[i].key, meta[j].key) == 0)
        return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: meta key '%s' appears twice", meta[i].key);
  }
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
  /* Disk space: the new file must fit beside the versions kept (they go only after it). */
  struct statvfs vf;
  uint64_t need = total + 4096 + (uint64_t)n * 256;
  if (statvfs(ck->local_dir, &vf) == 0 && (uint64_t)vf.f_bavail * vf.f_frsize < need) {
    rc = HORA_ERR(HORA_ERR_IO, "hora_ckpt_save: local_dir %s has %" PRIu64 " bytes free, the checkpoint of step %" PRId64
                  " needs %" PRIu64 " (disk full); the previous checkpoints are kept", ck->local_dir,
                  (uint64_t)vf.f_bavail * vf.f_frsize, step, need);
    goto done;
  }

  pthread_mutex_lock(&ck->mu);
  if (ck->write_rc != HORA_SUCCESS) {
    rc = HORA_ERR(ck->write_rc, "%s", ck->write_msg);
    ck->write_rc = HORA_SUCCESS;
    pthread_mutex_unlock(&ck->mu);
    goto done;
  }
  if (ck->job_pending || ck->writing) {
    double t0 = hora__now_s();
    while (ck->job_pending || ck->writing) pthread_cond_wait(&ck->cv, &ck->mu);
    HORA_WARN(CKPT, "save of step %" PRId64 " waited %.3f s for the previous checkpoint's write to finish "
              "(saves come faster than local_dir takes them)", step, hora__now_s() - t0);
    if (ck->write_rc != HORA_SUCCESS) {
      rc = HORA_ERR(ck->write_rc, "%s", ck->write_msg);
      ck->write_rc = HORA_SUCCESS;
      pthread_mutex_unlock(&ck->mu);
      goto done;
    }
  }
  pthread_mutex_unlock(&ck->mu);

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

/* Every rank learns rank 0's result (and its message). */
hora_result_t hora__ck_bcast_result(hora_ckpt_t *ck, hora_result_t rc, const char *fn) {
  struct {
    int rc;
    char msg[CK_MSG_MAX];
  } r = {(int)rc, ""};
  if (ck->rank == 0 && rc != HORA_SUCCESS) hora__ck_keep_msg(r.msg);
  int mrc = MPI_Bcast(&r, (int)sizeof r, MPI_BYTE, 0, ck->comm);
  if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Bcast (checkpoint result)", __FILE__, __LINE__);
  if (ck->rank == 0 || r.rc == HORA_SUCCESS) return (hora_result_t)r.rc;
  return HORA_ERR((hora_result_t)r.rc, "%s failed on rank 0: %s", fn, r.msg);
}

HORA_EXPORT hora_result_t hora_ckpt_save(hora_ckpt_t *ck, int64_t step, const hora_tensor_t *tensors,
                                         size_t ntensors, const hora_kv_t *meta, size_t nmeta) {
  if (!ck) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_save: ck is NULL");
  hora_result_t rc = HORA_SUCCESS;
  if (ck->rank == 0) rc = save_root(ck, step, tensors, ntensors, meta, nmeta);
  return hora__ck_bcast_result(ck, rc, "hora_ckpt_save");
}
