/* Elastic training's committed state (docs/elastic.md): named tensors plus a small user blob,
 * copied into this rank's memory by every commit, written by a survivor of a failed step to a
 * file of its own (no MPI: the world is broken then), and synchronized at the start of the next
 * step from the lowest rank that holds the newest commit.
 *
 *   step k (world n)                         step k+1 (world m <= n, a new srun step)
 *   commit: tensors -> es->cur (memcpy)      sync: candidate = memory, else the newest valid
 *   every N-th: hora_ckpt_save (rank 0)            dir/commit-<id>.r<rank>.hora, else ckpt
 *   peer dies -> HORA_ERR_REMOTE                   max id over ranks; the lowest rank holding it
 *   hora_elastic_save: es->cur -> dir file         broadcasts; every rank scatters + keeps it
 *   exit(HORA_EXIT_ELASTIC)
 *
 * File (integers little-endian; the machines of one job share their byte order):
 *   "HORAEL01" | u64 id | u64 layout hash | u64 data_bytes | u64 blob_bytes | data (tensors,
 *   then blob) | u32 CRC32C of everything before it
 * written through a temporary name, fsync and rename (core/safefs.c). */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/elastic.h"

void hora__el_commit_free(el_commit_t *c) {
  free(c->data);
  c->data = NULL;
  c->id = -1;
}

/* FNV-1a over the tensor list; also returns the tensors' total bytes. */
hora_result_t hora__el_layout(const char *fn, const hora_tensor_t *t, size_t n, uint64_t *hash, size_t *bytes,
                               size_t *off) {
  if (n && !t) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: tensors is NULL with ntensors=%zu", fn, n);
  uint64_t h = 1469598103934665603ull;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    size_t es = hora__dtype_size(t[i].dtype);
    if (!t[i].name || !*t[i].name || !es || (t[i].count && !t[i].data) ||
        (t[i].device != HORA_DEVICE_HOST && t[i].device != HORA_DEVICE_CUDA) || t[i].count > (SIZE_MAX / 2 - at) / es)
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                      "%s: tensors[%zu] (%s) has a NULL or empty name, NULL data, or an unknown dtype or device", fn, i,
                      t[i].name ? t[i].name : "NULL");
    if (strcmp(t[i].name, EL_BLOB_TENSOR) == 0)
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: tensors[%zu] uses the reserved name %s", fn, i, EL_BLOB_TENSOR);
    uint64_t f[2] = {(uint64_t)t[i].dtype, (uint64_t)t[i].count};
    for (const char *c = t[i].name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    for (size_t k = 0; k < sizeof f; k++) h = (h ^ ((unsigned char *)f)[k]) * 1099511628211ull;
    if (off) off[i] = at;
    at += t[i].count * es;
  }
  *hash = h;
  *bytes = at;
  return HORA_SUCCESS;
}

/* dir NULL: HORA_ELASTIC_DIR, else $SLURM_TMPDIR/hora-elastic, else /tmp/hora-elastic-<job id>,
 * else /tmp/hora-elastic-<uid> (node-local places that the ranks of one node share). */
static char *default_dir(void) {
  char buf[4096];
  const char *p = hora__params()->elastic_dir, *t = getenv("SLURM_TMPDIR"), *j = getenv("SLURM_JOB_ID");
  if (p && *p) snprintf(buf, sizeof buf, "%s", p);
  else if (t && *t) snprintf(buf, sizeof buf, "%s/hora-elastic", t);
  else if (j && *j) snprintf(buf, sizeof buf, "/tmp/hora-elastic-%s", j);
  else snprintf(buf, sizeof buf, "/tmp/hora-elastic-%ld", (long)getuid());
  return strdup(buf);
}

static hora_result_t el_finalizer(hora_ctx_t *ctx, void *arg) {
  (void)ctx;
  hora_elastic_t *es = arg;
  if (es->comm != MPI_COMM_NULL) MPI_Comm_free(&es->comm);
  es->comm = MPI_COMM_NULL;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_elastic_open(hora_ctx_t *ctx, const char *dir, hora_ckpt_t *ck, int ckpt_every,
                                            hora_elastic_t **out) {
  HORA_CHECK(hora__ctx_check(ctx, "hora_elastic_open"));
  if (!out || (dir && !*dir) || ckpt_every < 0 || (ck && ck->ctx != ctx))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "hora_elastic_open: %s", !out ? "es is NULL" : dir && !*dir ? "dir is empty"
                    : ckpt_every < 0 ? "ckpt_every is negative" : "ck belongs to another context");
  hora_elastic_t *es = calloc(1, sizeof *es);
  if (!es || !(es->dir = dir ? strdup(dir) : default_dir()) || !(es->ckblob = calloc(1, HORA_ELASTIC_BLOB_MAX))) {
    if (es) free(es->dir);
    free(es);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  }
  es->ctx = ctx;
  es->ck = ck;
  es->ckpt_every = ckpt_every;
  es->cur.id = -1;
  hora_result_t rc = hora__ctx_dup(ctx, ctx->world, &es->comm, "hora_elastic_open (duplicating the communicator)");
  if (rc != HORA_SUCCESS) {
    es->comm = MPI_COMM_NULL;
  } else {
    MPI_Comm_set_errhandler(es->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(es->comm, &es->rank);
    MPI_Comm_size(es->comm, &es->size);
    rc = hora__ck_mkdirs(es->dir);
    /* Watched (hora__ctx_wait), so a rank that dies here ends the others' open with its verdict;
     * the flags are a per-thread static that an abandoned request may still write. */
    static _Thread_local int bv[2];
    bv[0] = rc != HORA_SUCCESS, bv[1] = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    int any = 0;
    hora_result_t wrc = hora__ctx_wait(ctx, MPI_Iallreduce(&bv[0], &bv[1], 1, MPI_INT, MPI_MAX, es->comm, &req), &req,
                                       "hora_elastic_open", 0);
    if (wrc != HORA_SUCCESS) {
      if (rc == HORA_SUCCESS) rc = wrc;
      any = 1;
    } else {
      any = bv[1];
    }
    if (any && rc == HORA_SUCCESS)
      rc = HORA_ERR(HORA_ERR_IO, "hora_elastic_open: another rank cannot use dir %s (see its log)", es->dir);
    if (rc == HORA_SUCCESS) rc = hora__ctx_add_finalizer(ctx, el_finalizer, es);
  }
  if (rc != HORA_SUCCESS) {
    el_finalizer(ctx, es);
    free(es->dir);
    free(es->ckblob);
    free(es);
    return rc;
  }
  *out = es;
  return HORA_SUCCESS;
}

/* Every ckpt_every-th commit goes to the checkpoint pipeline (collective: every rank commits at
 * the same point). Step = commit id; the blob travels as a fixed-size byte tensor. */
static hora_result_t commit_to_ckpt(hora_elastic_t *es, const hora_tensor_t *t, size_t n) {
  hora_tensor_t *all = malloc(sizeof *all * (n + 1));
  if (!all) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  if (n) memcpy(all, t, sizeof *all * n);
  memset(es->ckblob, 0, HORA_ELASTIC_BLOB_MAX);
  if (es->cur.blob_bytes) memcpy(es->ckblob, es->cur.data + es->cur.data_bytes, es->cur.blob_bytes);
  all[n] = (hora_tensor_t){EL_BLOB_TENSOR, es->ckblob, HORA_ELASTIC_BLOB_MAX, HORA_UINT8, HORA_DEVICE_HOST, 0, NULL};
  char bb[32];
  snprintf(bb, sizeof bb, "%zu", es->cur.blob_bytes);
  hora_kv_t meta[1] = {{"elastic.blob_bytes", bb}};
  hora_result_t rc = hora_ckpt_save(es->ck, es->cur.id, all, n + 1, meta, 1);
  free(all);
  return rc;
}

HORA_EXPORT hora_result_t hora_elastic_commit(hora_elastic_t *es, const hora_tensor_t *tensors, size_t ntensors,
                                              const void *blob, size_t blob_bytes) {
  if (!es) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_elastic_commit: es is NULL");
  HORA_ELASTIC_FORK_CHECK(es, "hora_elastic_commit");
  if (blob_bytes > HORA_ELASTIC_BLOB_MAX || (blob_bytes && !blob))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_elastic_commit: blob %s (%zu bytes; at most %d)",
                    blob_bytes && !blob ? "is NULL" : "is too large", blob_bytes, HORA_ELASTIC_BLOB_MAX);
  size_t *off = malloc(sizeof(size_t) * (ntensors ? ntensors : 1));
  if (!off) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  el_commit_t c = {.id = (es->cur.id > 0 ? es->cur.id : 0) + 1, .blob_bytes = blob_bytes};
  hora_result_t rc = hora__el_layout("hora_elastic_commit", tensors, ntensors, &c.layout, &c.data_bytes, off);
  if (rc == HORA_SUCCESS && !(c.data = malloc(c.data_bytes + blob_bytes + 1)))
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_elastic_commit: out of memory for %zu bytes", c.data_bytes + blob_bytes);
  if (rc == HORA_SUCCESS) rc = hora__ck_gather(tensors, ntensors, off, c.data, es->ctx->device);
  free(off);
  if (rc != HORA_SUCCESS) {
    free(c.data);
    return rc;
  }
  if (blob_bytes) memcpy(c.data + c.data_bytes, blob, blob_bytes);
  hora__el_commit_free(&es->cur);
  es->cur = c;
  if (es->ck && es->ckpt_every && c.id % es->ckpt_every == 0) HORA_CHECK(commit_to_ckpt(es, tensors, ntensors));
  return HORA_SUCCESS;
}

/* Copy commit c into the caller's tensors and blob, after checking that it fits them. */
hora_result_t hora__el_apply(const char *fn, const el_commit_t *c, hora_tensor_t *t, size_t n, void *blob,
                           size_t blob_cap, size_t *blob_bytes, int device) {
  uint64_t h;
  size_t bytes;
  size_t *off = malloc(sizeof(size_t) * (n ? n : 1));
  if (!off) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  hora_result_t rc = hora__el_layout(fn, t, n, &h, &bytes, off);
  if (rc == HORA_SUCCESS && (h != c->layout || bytes != c->data_bytes))
    rc = HORA_ERR(HORA_ERR_MISMATCH, "%s: the tensors (names, dtypes, counts: %zu bytes) differ from those of commit %" PRId64
                  " (%zu bytes)", fn, bytes, c->id, c->data_bytes);
  if (rc == HORA_SUCCESS && c->blob_bytes && (!blob || blob_cap < c->blob_bytes))
    rc = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: commit %" PRId64 " has a %zu-byte blob; blob_cap is %zu", fn, c->id,
                  c->blob_bytes, blob ? blob_cap : 0);
  if (rc == HORA_SUCCESS) rc = hora__ck_scatter(t, n, off, c->data, device);
  free(off);
  if (rc != HORA_SUCCESS) return rc;
  if (c->blob_bytes) memcpy(blob, c->data + c->data_bytes, c->blob_bytes);
  if (blob_bytes) *blob_bytes = c->blob_bytes;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_elastic_restore(hora_elastic_t *es, hora_tensor_t *tensors, size_t ntensors, void *blob,
                                               size_t blob_cap, size_t *blob_bytes) {
  if (!es) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_elastic_restore: es is NULL");
  if (es->cur.id < 0) return HORA_ERR(HORA_ERR_NOT_FOUND, "hora_elastic_restore: nothing committed or synced yet");
  return hora__el_apply("hora_elastic_restore", &es->cur, tensors, ntensors, blob, blob_cap, blob_bytes, es->ctx->device);
}

HORA_EXPORT hora_result_t hora_elastic_commit_id(hora_elastic_t *es, int64_t *commit) {
  if (!es || !commit) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_elastic_commit_id: NULL argument");
  *commit = es->cur.id;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_elastic_close(hora_elastic_t *es) {
  if (!es) return HORA_SUCCESS;
  HORA_ELASTIC_FORK_CHECK(es, "hora_elastic_close");
  hora__ctx_remove_finalizer(es->ctx, el_finalizer, es);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) el_finalizer(es->ctx, es);
  hora__el_commit_free(&es->cur);
  free(es->dir);
  free(es->ckblob);
  free(es);
  return HORA_SUCCESS;
}
