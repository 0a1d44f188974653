/* hora_elastic_save (a survivor's commit to its own file, without MPI) and hora_elastic_sync
 * (the new step agrees on the newest commit and broadcasts it from the lowest rank holding it).
 * The file format is described at the top of elastic.c. */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/elastic.h"
#include "core/crc32c.h"

#define EL_HDR_BYTES (8 + 4 * 8)

static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

HORA_EXPORT hora_result_t hora_elastic_save(hora_elastic_t *es) {
  if (!es) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_elastic_save: es is NULL");
  HORA_ELASTIC_FORK_CHECK(es, "hora_elastic_save");
  const el_commit_t *c = &es->cur;
  if (c->id < 0) return HORA_ERR(HORA_ERR_NOT_FOUND, "hora_elastic_save: nothing committed or synced yet");
  size_t payload = c->data_bytes + c->blob_bytes, len = EL_HDR_BYTES + payload + 4;
  unsigned char *buf = malloc(len);
  if (!buf) return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_elastic_save: out of memory for %zu bytes", len);
  memcpy(buf, EL_MAGIC, 8);
  put_u64(buf + 8, (uint64_t)c->id);
  put_u64(buf + 16, c->layout);
  put_u64(buf + 24, c->data_bytes);
  put_u64(buf + 32, c->blob_bytes);
  memcpy(buf + EL_HDR_BYTES, c->data, payload);
  uint32_t crc = hora__crc32c(0, buf, EL_HDR_BYTES + payload);
  memcpy(buf + EL_HDR_BYTES + payload, &crc, 4);
  char name[96];
  snprintf(name, sizeof name, "commit-%" PRId64 ".r%d.hora", c->id, es->rank);
  int dfd = -1;
  hora_result_t rc = hora__dir_open(es->dir, 1, &dfd);
  if (rc == HORA_SUCCESS) rc = hora__file_write_atomic(dfd, es->dir, name, buf, len);
  if (dfd >= 0) close(dfd);
  free(buf);
  if (rc == HORA_SUCCESS) HORA_INFO(CKPT, "elastic: commit %" PRId64 " saved to %s/%s", c->id, es->dir, name);
  return rc;
}

typedef struct {
  int64_t id;
  char name[96];
} el_file_t;

static int newest_first(const void *a, const void *b) {
  int64_t x = ((const el_file_t *)a)->id, y = ((const el_file_t *)b)->id;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Decode and check one file against the expected layout; 0 when it is usable. */
static int check_file(const unsigned char *buf, size_t len, uint64_t layout, size_t data_bytes, const char **why) {
  uint32_t crc;
  if (len < EL_HDR_BYTES + 4 || memcmp(buf, EL_MAGIC, 8) != 0) return *why = "not a commit file", 1;
  size_t db = get_u64(buf + 24), bb = get_u64(buf + 32);
  if (db > len || bb > len || EL_HDR_BYTES + db + bb + 4 != len) return *why = "truncated or wrong size", 1;
  memcpy(&crc, buf + len - 4, 4);
  if (crc != hora__crc32c(0, buf, len - 4)) return *why = "CRC32C mismatch", 1;
  if (get_u64(buf + 16) != layout || db != data_bytes)
    return *why = "other tensors (names, dtypes or counts) than those given", 1;
  return 0;
}

/* The newest valid commit file in es->dir for this layout (any rank's: survivors of one node
 * may all have written one). out->id stays -1 when there is none; problems are warnings. */
static void load_newest(hora_elastic_t *es, uint64_t layout, size_t data_bytes, el_commit_t *out) {
  int dfd = -1;
  if (hora__dir_open(es->dir, 0, &dfd) != HORA_SUCCESS) return;
  int dfd2 = dup(dfd);
  DIR *d = dfd2 >= 0 ? fdopendir(dfd2) : NULL;
  el_file_t *f = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    int64_t id;
    int r, end = 0;
    if (sscanf(e->d_name, "commit-%" SCNd64 ".r%d.hora%n", &id, &r, &end) != 2 || e->d_name[end] || id < 0) continue;
    if (n == cap) {
      el_file_t *g = realloc(f, sizeof *f * (cap = cap ? 2 * cap : 16));
      if (!g) break;
      f = g;
    }
    if (strlen(e->d_name) >= sizeof f->name) continue;
    f[n].id = id;
    memcpy(f[n++].name, e->d_name, strlen(e->d_name) + 1);
  }
  if (d) closedir(d);
  else if (dfd2 >= 0) close(dfd2);
  if (n) qsort(f, n, sizeof *f, newest_first);
  for (size_t i = 0; i < n && out->id < 0; i++) {
    unsigned char *buf = NULL;
    size_t len = 0;
    const char *why = NULL;
    if (hora__ck_read_file_at(dfd, es->dir, f[i].name, EL_FILE_MAX, &buf, &len) != HORA_SUCCESS)
      why = "unreadable";
    else if (!check_file(buf, len, layout, data_bytes, &why)) {
      out->id = (int64_t)get_u64(buf + 8);
      out->layout = layout;
      out->data_bytes = data_bytes;
      out->blob_bytes = get_u64(buf + 32);
      out->data = malloc(data_bytes + out->blob_bytes + 1);
      if (out->data) memcpy(out->data, buf + EL_HDR_BYTES, data_bytes + out->blob_bytes);
      else out->id = -1, why = "out of memory";
    }
    if (why) HORA_WARN(CKPT, "elastic: skipping %s/%s: %s", es->dir, f[i].name, why);
    free(buf);
  }
  free(f);
  close(dfd);
}

/* Remove commit files older than `id` (best effort; other ranks may remove the same ones). */
static void prune_files(hora_elastic_t *es, int64_t id) {
  int dfd = -1;
  if (hora__dir_open(es->dir, 0, &dfd) != HORA_SUCCESS) return;
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  for (struct dirent *e; (e = readdir(d));) {
    int64_t fid;
    int r, end = 0;
    if (sscanf(e->d_name, "commit-%" SCNd64 ".r%d.hora%n", &fid, &r, &end) == 2 && !e->d_name[end] && fid < id)
      unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

/* No commit anywhere: the checkpoint pipeline's newest checkpoint, read straight into the
 * caller's tensors (and the blob tensor), then kept as the commit. HORA_ERR_NOT_FOUND: none. */
static hora_result_t from_ckpt(hora_elastic_t *es, hora_tensor_t *t, size_t n, el_commit_t *c) {
  hora_tensor_t *all = malloc(sizeof *all * (n + 1));
  if (!all) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  if (n) memcpy(all, t, sizeof *all * n);
  all[n] = (hora_tensor_t){EL_BLOB_TENSOR, es->ckblob, HORA_ELASTIC_BLOB_MAX, HORA_UINT8, HORA_DEVICE_HOST, 0, NULL};
  int64_t step = -1;
  hora_result_t rc = hora_ckpt_restore(es->ck, &step, all, n + 1);
  free(all);
  if (rc != HORA_SUCCESS) return rc;
  const char *bb = NULL;
  unsigned long long blob = 0;
  if (hora_ckpt_meta_get(es->ck, "elastic.blob_bytes", &bb) == HORA_SUCCESS) blob = strtoull(bb, NULL, 10);
  if (blob > HORA_ELASTIC_BLOB_MAX)
    return HORA_ERR(HORA_ERR_DATA, "hora_elastic_sync: checkpoint step %" PRId64 " has elastic.blob_bytes %llu", step,
                    blob);
  size_t *off = malloc(sizeof(size_t) * (n ? n : 1));
  if (!off) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  rc = hora__el_layout("hora_elastic_sync", t, n, &c->layout, &c->data_bytes, off);
  if (rc == HORA_SUCCESS && !(c->data = malloc(c->data_bytes + blob + 1))) rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  if (rc == HORA_SUCCESS) rc = hora__ck_gather(t, n, off, c->data, es->ctx->device);
  free(off);
  if (rc != HORA_SUCCESS) return rc;
  memcpy(c->data + c->data_bytes, es->ckblob, blob);
  c->blob_bytes = blob;
  c->id = step;
  return HORA_SUCCESS;
}

/* The collectives of sync and of the host check are nonblocking MPI calls waited on while
 * watching the heartbeat's verdict, so that a peer dying during them ends the call on every
 * survivor with HORA_ERR_REMOTE (within HORA_PEER_TIMEOUT_S) instead of a hang: the survivor can
 * still save its commit. MPI may still write the buffers of an abandoned call, so after a verdict
 * callers leak them (heap buffers only; the program is ending). `bytes`: the data the call moves
 * (hora__ctx_wait yields, without sleeping, for bytes / 50 MB/s). */
static hora_result_t el_allreduce(hora_elastic_t *es, const void *in, void *out, int n, MPI_Datatype t, MPI_Op op) {
  MPI_Request req = MPI_REQUEST_NULL;
  return hora__ctx_wait(es->ctx, MPI_Iallreduce(in, out, n, t, op, es->comm, &req), &req, "elastic allreduce",
                        0); /* a few counters */
}

static hora_result_t el_bcast(hora_elastic_t *es, void *p, int n, MPI_Datatype t, int root, size_t bytes) {
  MPI_Request req = MPI_REQUEST_NULL;
  return hora__ctx_wait(es->ctx, MPI_Ibcast(p, n, t, root, es->comm, &req), &req, "elastic broadcast", bytes);
}

/* Broadcast `bytes` bytes at p (heap) from root as one MPI element (also beyond 2 GiB). */
static hora_result_t bcast_bytes(hora_elastic_t *es, void *p, size_t bytes, int root) {
  if (!bytes) return HORA_SUCCESS;
  MPI_Datatype type;
  int owned = 0;
  HORA_CHECK(hora__mpi_bytes_type(bytes, &type, &owned));
  hora_result_t rc = el_bcast(es, p, 1, type, root, bytes);
  if (owned) MPI_Type_free(&type);
  return rc;
}

/* Free a buffer an abandoned MPI call may still write: only while there is no verdict. */
static void el_free(hora_elastic_t *es, void *p) {
  if (!hora__ctx_failed(es->ctx)) free(p);
}

/* Every rank's verdict on its arguments and layout, and the newest commit id anyone holds. */
static hora_result_t agree(hora_elastic_t *es, hora_result_t rc, uint64_t layout, int64_t id, int64_t *top) {
  uint64_t *b = malloc(8 * sizeof *b); /* in[3] out[3] id_in id_out */
  if (!b) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  b[0] = rc != HORA_SUCCESS, b[1] = layout, b[2] = ~layout, b[6] = (uint64_t)id;
  hora_result_t mrc = el_allreduce(es, b, b + 3, 3, MPI_UINT64_T, MPI_MAX);
  if (mrc == HORA_SUCCESS) mrc = el_allreduce(es, b + 6, b + 7, 1, MPI_INT64_T, MPI_MAX);
  uint64_t m[3] = {b[3], b[4], b[5]};
  *top = (int64_t)b[7];
  el_free(es, b);
  if (mrc != HORA_SUCCESS) return mrc;
  if (rc != HORA_SUCCESS) return rc;
  if (m[0]) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_elastic_sync: another rank's arguments are invalid (see its log)");
  if (m[1] != layout || ~m[2] != layout)
    return HORA_ERR(HORA_ERR_MISMATCH, "hora_elastic_sync: the ranks pass different tensors (names, dtypes or counts)");
  return HORA_SUCCESS;
}

/* The lowest rank holding commit `top` (*from) and the length of its blob (*blob). */
static hora_result_t find_root(hora_elastic_t *es, const el_commit_t *cand, int64_t top, int *from, uint64_t *blob) {
  int64_t *b = malloc(3 * sizeof *b); /* mine, lowest, blob */
  if (!b) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  b[0] = cand->id == top ? es->rank : es->size;
  hora_result_t rc = el_allreduce(es, b, b + 1, 1, MPI_INT64_T, MPI_MIN);
  *from = (int)b[1];
  b[2] = (int64_t)cand->blob_bytes;
  if (rc == HORA_SUCCESS) rc = el_bcast(es, b + 2, 1, MPI_INT64_T, *from, 0);
  *blob = (uint64_t)b[2];
  el_free(es, b);
  return rc;
}

/* Fill c with the commit every rank will hold: the newest one (broadcast from the lowest rank
 * holding it), else the checkpoint's, else rank 0's current tensors (a fresh start, id 0). */
static hora_result_t choose(hora_elastic_t *es, hora_tensor_t *t, size_t n, el_commit_t *cand, int64_t top,
                            uint64_t layout, size_t bytes, el_commit_t *c, const char **source, int *from) {
  *from = 0;
  if (top >= 0) {
    uint64_t blob = 0;
    HORA_CHECK(find_root(es, cand, top, from, &blob));
    /* layout and bytes are this rank's own (agree() made them equal everywhere): a rank without
     * a candidate (a node that joins, node-local dirs) has none in cand. */
    *c = (el_commit_t){top, layout, bytes, blob, NULL};
    if (es->rank == *from) {
      c->data = cand->data; /* handed over */
      cand->data = NULL;
    } else if (!(c->data = malloc(c->data_bytes + blob + 1))) {
      return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_elastic_sync: out of memory");
    }
    *source = "a surviving rank";
    return bcast_bytes(es, c->data, c->data_bytes + blob, *from);
  }
  if (es->ck) {
    hora_result_t rc = from_ckpt(es, t, n, c);
    *source = "the checkpoint";
    if (rc != HORA_ERR_NOT_FOUND) return rc;
  }
  size_t *off = malloc(sizeof(size_t) * (n ? n : 1));
  if (!off) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  c->id = 0;
  c->blob_bytes = 0;
  hora_result_t rc = hora__el_layout("hora_elastic_sync", t, n, &c->layout, &c->data_bytes, off);
  if (rc == HORA_SUCCESS && !(c->data = malloc(c->data_bytes + 1))) rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  if (rc == HORA_SUCCESS && es->rank == 0) rc = hora__ck_gather(t, n, off, c->data, es->ctx->device);
  free(off);
  *source = "rank 0's initial state";
  if (rc == HORA_SUCCESS) rc = bcast_bytes(es, c->data, c->data_bytes, 0);
  return rc;
}

/* For the driver's log (launch --elastic): rank 0 writes "<HORA_ELASTIC_HOSTS_FILE>.commit" with
 * the commit it resumed from (best effort: the driver only prints it). */
static void report_resumed(const hora_elastic_t *es, const char *source) {
  const char *hf = hora__params()->elastic_hosts_file;
  if (!hf || !*hf) return;
  char path[4200], tmp[4300];
  snprintf(path, sizeof path, "%s.commit", hf);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  int ok = fprintf(f, "commit %" PRId64 " from %s, world size %d\n", es->cur.id, source, es->size) > 0;
  if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) unlink(tmp);
}

/* A driver that started this step before the previous one ended (launch --elastic, at a lost rank)
 * keeps "<HORA_ELASTIC_HOSTS_FILE>.prev" while the previous step's survivors may still be saving
 * their commit. Rank 0 waits until the file is gone (at most the peer timeout + 60 s: the driver
 * removes it when that step's srun ends, and a hung step gets SIGKILL at the peer timeout + 30 s),
 * then joins the others in an allreduce, so that no rank looks for commit files before they are
 * written. The other ranks wait in it, watching the heartbeat. */
static hora_result_t wait_prev_step(hora_elastic_t *es) {
  const char *hf = hora__params()->elastic_hosts_file;
  int *waited = malloc(sizeof(int));
  if (!waited) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  *waited = 0;
  if (es->rank == 0 && hf && *hf) {
    char path[4200];
    snprintf(path, sizeof path, "%s.prev", hf);
    const double bound = hora__params()->peer_timeout_s + 60;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
      if (access(path, F_OK) != 0) break;
      clock_gettime(CLOCK_MONOTONIC, &t);
      double s = (double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9;
      if (s > bound) {
        HORA_WARN(CKPT, "elastic: %s still there after %.0f s: syncing without waiting for the previous step", path, s);
        break;
      }
      *waited = 1;
      usleep(20000);
    }
    if (*waited) HORA_INFO(CKPT, "elastic: waited for the previous step's survivors to save their commit");
  }
  int *out = malloc(sizeof(int));
  if (!out) {
    free(waited);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  }
  /* an allreduce, like the sync's next call (a rank in another collective must not match it) */
  hora_result_t rc = el_allreduce(es, waited, out, 1, MPI_INT, MPI_MAX);
  el_free(es, waited);
  el_free(es, out);
  return rc;
}

HORA_EXPORT hora_result_t hora_elastic_sync(hora_elastic_t *es, hora_tensor_t *tensors, size_t ntensors, void *blob,
                                            size_t blob_cap, size_t *blob_bytes, int64_t *commit) {
  if (!es) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_elastic_sync: es is NULL");
  HORA_ELASTIC_FORK_CHECK(es, "hora_elastic_sync");
  uint64_t layout = 0;
  size_t bytes = 0;
  hora_result_t rc = commit ? hora__el_layout("hora_elastic_sync", tensors, ntensors, &layout, &bytes, NULL)
                            : HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_elastic_sync: commit is NULL");
  el_commit_t cand = {.id = -1}, c = {.id = -1};
  int from_mem = 0;
  /* every rank, whatever its arguments: a collective */
  hora_result_t wrc = wait_prev_step(es);
  if (wrc != HORA_SUCCESS) return wrc;
  if (rc == HORA_SUCCESS && es->cur.id >= 0 && es->cur.layout == layout && es->cur.data_bytes == bytes) {
    from_mem = 1;
    cand = es->cur; /* this rank's memory: the step it belonged to went on in this process */
    es->cur = (el_commit_t){.id = -1};
  } else if (rc == HORA_SUCCESS) {
    load_newest(es, layout, bytes, &cand);
  }
  int64_t top = -1;
  int from = 0;
  const char *source = "";
  HORA_CHECK_GOTO(agree(es, rc, layout, cand.id, &top), rc, done);
  HORA_CHECK_GOTO(choose(es, tensors, ntensors, &cand, top, layout, bytes, &c, &source, &from), rc, done);
  HORA_CHECK_GOTO(hora__el_apply("hora_elastic_sync", &c, tensors, ntensors, blob, blob_cap, blob_bytes,
                                 es->ctx->device), rc, done);
  hora__el_commit_free(&es->cur);
  es->cur = c;
  c.data = NULL;
  *commit = es->cur.id;
  if (top > 0) prune_files(es, top);
  if (es->rank == 0) {
    HORA_INFO(CKPT, "elastic: world size %d holds commit %" PRId64 " from %s (rank %d)", es->size, es->cur.id, source,
              from);
    report_resumed(es, source);
  }
done:
  if (rc != HORA_SUCCESS && from_mem && es->cur.id < 0) {
    /* An error leaves this rank's commit as it was (choose() may have handed its data to c). */
    if (!cand.data && c.data && c.id == cand.id) cand.data = c.data, c.data = NULL;
    if (cand.data) {
      es->cur = cand;
      cand.data = NULL;
    }
  }
  hora__el_commit_free(&cand);
  el_free(es, c.data);
  return rc;
}

HORA_EXPORT hora_result_t hora_elastic_hosts_changed(hora_elastic_t *es, int *changed) {
  if (!es || !changed) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_elastic_hosts_changed: NULL argument");
  HORA_ELASTIC_FORK_CHECK(es, "hora_elastic_hosts_changed");
  int v[2] = {0, 0}; /* changed, nodes available */
  const char *path = hora__params()->elastic_hosts_file;
  if (es->rank == 0 && path && *path) {
    FILE *f = fopen(path, "r");
    if (f) {
      if (fscanf(f, "%d", &v[1]) == 1 && v[1] > 0 && v[1] != es->ctx->cross_size) v[0] = 1;
      fclose(f);
    }
  }
  int *b = malloc(sizeof v);
  if (!b) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  memcpy(b, v, sizeof v);
  hora_result_t rc = el_bcast(es, b, 2, MPI_INT, 0, 0);
  memcpy(v, b, sizeof v);
  el_free(es, b);
  if (rc != HORA_SUCCESS) return rc;
  if (v[0] && es->rank == 0)
    HORA_INFO(CKPT, "elastic: %d nodes available, this step runs on %d: re-forming", v[1], es->ctx->cross_size);
  *changed = v[0];
  return HORA_SUCCESS;
}
