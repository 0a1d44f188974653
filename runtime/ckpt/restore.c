/* hora_ckpt_restore: rank 0 finds the newest valid checkpoint (manifest.c), checks that it holds
 * every requested tensor with the same dtype and count, and broadcasts result, step, metadata
 * and the tensors' bytes (one contiguous buffer, sent as one MPI element so that more than 2^31
 * bytes work); every rank then copies into its tensors (host memcpy or H2D). Nothing is written
 * to any tensor unless every rank will succeed. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "core/fault.h"

typedef struct {
  int rc;
  int64_t step;
  uint64_t bytes, meta_bytes, nmeta;
  char msg[CK_MSG_MAX];
} restore_hdr_t;

static int by_name(const void *a, const void *b, void *snap) {
  const ck_snap_t *s = snap;
  return strcmp(s->t[*(const size_t *)a].name, s->t[*(const size_t *)b].name);
}

/* Validate this rank's arguments and lay the tensors out back to back (off[i]). */
static hora_result_t check_args(int64_t *step, const hora_tensor_t *t, size_t n, size_t *off, size_t *total) {
  if (!step) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_restore: step is NULL");
  if (n && !t) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_restore: tensors is NULL with ntensors=%zu", n);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    size_t es = hora__dtype_size(t[i].dtype);
    if (!t[i].name || !es || (t[i].count && !t[i].data) ||
        (t[i].device != HORA_DEVICE_HOST && t[i].device != HORA_DEVICE_CUDA) || t[i].count > (SIZE_MAX - at) / es)
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                      "hora_ckpt_restore: tensors[%zu] (%s) has a NULL name or data, or an unknown dtype or device",
                      i, t[i].name ? t[i].name : "NULL");
    off[i] = at;
    at += t[i].count * es;
  }
  *total = at;
  return HORA_SUCCESS;
}

/* Rank 0: find a checkpoint and map the requested tensors onto it (src[i]: offset in its data). */
static hora_result_t find_and_match(hora_ckpt_t *ck, const hora_tensor_t *t, size_t n, size_t *src, char **path,
                                    unsigned char **buf, ck_snap_t *snap) {
  HORA_CHECK(hora__ck_find_newest(ck->local_dir, ck->persist_dir, path, buf, snap));
  size_t *idx = malloc(sizeof(size_t) * (snap->ntensors ? snap->ntensors : 1));
  if (!idx) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  for (size_t i = 0; i < snap->ntensors; i++) idx[i] = i;
  qsort_r(idx, snap->ntensors, sizeof *idx, by_name, snap);
  hora_result_t rc = HORA_SUCCESS;
  for (size_t i = 0; i < n && rc == HORA_SUCCESS; i++) {
    size_t lo = 0, hi = snap->ntensors;
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      int c = strcmp(snap->t[idx[mid]].name, t[i].name);
      if (c < 0) lo = mid + 1;
      else hi = mid;
    }
    if (lo == snap->ntensors || strcmp(snap->t[idx[lo]].name, t[i].name) != 0) {
      rc = HORA_ERR(HORA_ERR_MISMATCH, "hora_ckpt_restore: checkpoint %s has no tensor '%s'", *path, t[i].name);
      break;
    }
    const ck_tensor_t *f = &snap->t[idx[lo]];
    int shape_ok = 1;
    if (t[i].ndim > 0) {
      shape_ok = t[i].shape && f->ndim == t[i].ndim;
      for (int d = 0; shape_ok && d < f->ndim; d++) shape_ok = f->shape[d] == t[i].shape[d];
    }
    if (f->dtype != t[i].dtype || f->count != t[i].count || !shape_ok)
      rc = HORA_ERR(HORA_ERR_MISMATCH,
                    "hora_ckpt_restore: tensor '%s' is %s with %zu elements (ndim %d) in %s, the program asks for "
                    "%s with %zu elements (ndim %d)", t[i].name, hora__dtype_name(f->dtype), f->count, f->ndim,
                    *path, hora__dtype_name(t[i].dtype), t[i].count, t[i].ndim);
    src[i] = f->offset;
  }
  free(idx);
  return rc;
}

/* Keep the restored checkpoint's metadata (nmeta key/value pairs, then the source directory, as
 * NUL-terminated strings in `blob`) for hora_ckpt_meta_get / restore_source. */
static void keep_meta(hora_ckpt_t *ck, size_t nmeta, const char *blob) {
  hora__ck_meta_free(ck);
  ck->keys = calloc(nmeta ? nmeta : 1, sizeof *ck->keys);
  ck->vals = calloc(nmeta ? nmeta : 1, sizeof *ck->vals);
  ck->restored_from = NULL;
  const char *p = blob;
  for (size_t i = 0; ck->keys && ck->vals && i < nmeta; i++) {
    ck->keys[i] = strdup(p);
    p += strlen(p) + 1;
    ck->vals[i] = strdup(p);
    p += strlen(p) + 1;
    ck->nmeta++;
  }
  ck->restored_from = strdup(p);
}

/* The restore's collectives are non-blocking and waited on while watching the context's verdict
 * (hora__ctx_wait): a rank that dies during a restore must end it on the others with
 * HORA_ERR_REMOTE, not hang them in MPI_Bcast. After a verdict MPI may still write the buffers:
 * the header and the check flags are per-thread statics (never freed), the metadata and data
 * buffers are leaked. */

HORA_EXPORT hora_result_t hora_ckpt_restore(hora_ckpt_t *ck, int64_t *step, hora_tensor_t *tensors,
                                            size_t ntensors) {
  if (!ck) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_restore: ck is NULL");
  HORA_CKPT_FORK_CHECK(ck, "hora_ckpt_restore");
  restore_hdr_t h;
  memset(&h, 0, sizeof h);
  size_t n = ntensors, total = 0;
  size_t *off = calloc(n ? n : 1, sizeof *off), *src = calloc(n ? n : 1, sizeof *src);
  unsigned char *buf = NULL, *packed = NULL;
  char *path = NULL, *blob = NULL;
  ck_snap_t snap = {0};
  hora_result_t rc = (!off || !src) ? HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory") : HORA_SUCCESS;
  if (rc == HORA_SUCCESS) rc = check_args(step, tensors, n, off, &total);
  if (rc == HORA_SUCCESS) rc = hora__fault_hit("restore", ck->rank);
  if (ck->rank == 0) {
    /* A save still being written is part of what restore should see. */
    pthread_mutex_lock(&ck->mu);
    while (ck->job_pending || ck->writing) pthread_cond_wait(&ck->cv, &ck->mu);
    pthread_mutex_unlock(&ck->mu);
    if (rc == HORA_SUCCESS) rc = find_and_match(ck, tensors, n, src, &path, &buf, &snap);
    if (rc == HORA_SUCCESS) {
      h.step = snap.step;
      h.bytes = total;
      h.nmeta = snap.nmeta;
      size_t mb = strlen(path) + 1;
      for (size_t i = 0; i < snap.nmeta; i++) mb += strlen(snap.keys[i]) + strlen(snap.vals[i]) + 2;
      blob = malloc(mb);
      if (!blob) rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
      else {
        char *p = blob;
        for (size_t i = 0; i < snap.nmeta; i++) {
          p = stpcpy(p, snap.keys[i]) + 1;
          p = stpcpy(p, snap.vals[i]) + 1;
        }
        strcpy(p, path);
        h.meta_bytes = mb;
      }
    }
    h.rc = rc;
    if (rc != HORA_SUCCESS) hora__ck_keep_msg(h.msg);
  }
  static _Thread_local restore_hdr_t hx;
  static _Thread_local int okv[2];
  hx = h;
  MPI_Request req = MPI_REQUEST_NULL;
  int mrc = MPI_Ibcast(&hx, (int)sizeof hx, MPI_BYTE, 0, ck->comm, &req);
  hora_result_t wrc = hora__ctx_wait(ck->ctx, mrc, &req, "hora_ckpt_restore: MPI_Ibcast (restore header)", 0);
  if (wrc != HORA_SUCCESS) {
    rc = wrc;
    goto done;
  }
  h = hx;
  if (h.rc != HORA_SUCCESS) {
    if (ck->rank != 0) rc = HORA_ERR((hora_result_t)h.rc, "hora_ckpt_restore on rank 0: %s", h.msg);
    goto done;
  }
  /* Every rank checks its own arguments against rank 0's layout before anything is written. */
  int ok = rc == HORA_SUCCESS && total == h.bytes, all_ok = ok;
  if (ck->size > 1) {
    okv[0] = ok;
    mrc = MPI_Iallreduce(&okv[0], &okv[1], 1, MPI_INT, MPI_MIN, ck->comm, &req);
    wrc = hora__ctx_wait(ck->ctx, mrc, &req, "hora_ckpt_restore: MPI_Iallreduce (restore check)", 0);
    if (wrc != HORA_SUCCESS) {
      rc = wrc;
      goto done;
    }
    all_ok = okv[1];
  }
  if (!all_ok) {
    if (rc == HORA_SUCCESS)
      rc = ok ? HORA_ERR(HORA_ERR_MISMATCH, "hora_ckpt_restore: another rank's tensors differ from rank 0's")
              : HORA_ERR(HORA_ERR_MISMATCH, "hora_ckpt_restore: this rank's tensors hold %zu bytes, rank 0's %" PRIu64,
                         total, h.bytes);
    goto done;
  }
  if (ck->size > 1) {
    if (ck->rank != 0) blob = malloc(h.meta_bytes ? h.meta_bytes : 1);
    packed = malloc(total ? total : 1);
    if (!blob || !packed) {
      rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory (%zu bytes) receiving the checkpoint", total);
      /* Keep the collective sequence: the broadcasts below still run. */
    }
    if (ck->rank == 0 && packed)
      for (size_t i = 0; i < n; i++) memcpy(packed + off[i], snap.data + src[i], tensors[i].count * hora__dtype_size(tensors[i].dtype));
    int lost = 0; /* a verdict: the broadcasts were abandoned, their buffers are leaked */
    hora_result_t brc = hora__ck_bcast_watched(ck, blob, h.meta_bytes, "hora_ckpt_restore: MPI_Ibcast (restore metadata)", &lost);
    if (!lost) {
      hora_result_t drc = hora__ck_bcast_watched(ck, packed, total, "hora_ckpt_restore: MPI_Ibcast (restore data)", &lost);
      if (brc == HORA_SUCCESS) brc = drc;
    }
    if (lost) {
      blob = NULL, packed = NULL;
      rc = brc;
      goto done;
    }
    if (brc != HORA_SUCCESS && rc == HORA_SUCCESS) rc = brc;
    if (rc != HORA_SUCCESS) goto done;
    HORA_CHECK_GOTO(hora__ck_scatter(tensors, n, off, packed, ck->ctx->device), rc, done);
  } else {
    HORA_CHECK_GOTO(hora__ck_scatter(tensors, n, src, snap.data, ck->ctx->device), rc, done);
  }
  keep_meta(ck, h.nmeta, blob);
  *step = h.step;
done:
  free(off);
  free(src);
  free(buf);
  free(packed);
  free(path);
  free(blob);
  hora__ck_snap_free(&snap);
  return rc;
}

HORA_EXPORT hora_result_t hora_ckpt_meta_get(hora_ckpt_t *ck, const char *key, const char **value) {
  if (!ck || !key || !value)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_meta_get: %s is NULL", !ck ? "ck" : !key ? "key" : "value");
  for (size_t i = 0; i < ck->nmeta; i++)
    if (ck->keys[i] && strcmp(ck->keys[i], key) == 0) {
      *value = ck->vals[i];
      return HORA_SUCCESS;
    }
  return HORA_ERR(HORA_ERR_NOT_FOUND, "hora_ckpt_meta_get: the last restore%s has no metadata key '%s'",
                  ck->restored_from ? "" : " (there was none)", key);
}

HORA_EXPORT hora_result_t hora_ckpt_restore_source(hora_ckpt_t *ck, const char **dir) {
  if (!ck || !dir) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_restore_source: %s is NULL", !ck ? "ck" : "dir");
  if (!ck->restored_from)
    return HORA_ERR(HORA_ERR_NOT_FOUND, "hora_ckpt_restore_source: no successful hora_ckpt_restore yet");
  *dir = ck->restored_from;
  return HORA_SUCCESS;
}
