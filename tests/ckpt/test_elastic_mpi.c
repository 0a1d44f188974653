/* The elastic committed state on 1..4 ranks, each re-formed "step" simulated in one process by a
 * new hora_elastic_t (empty memory), and the shrunk world by a process set without the last rank:
 *   fresh   sync with nothing anywhere: rank 0's initial tensors reach every rank (commit 0)
 *   commit  commits 1..K (the last rank one more, K+1); garbage, then restore: bit for bit
 *   corrupt every rank saves; the newest file (K+1) is corrupted: a new state's sync skips it
 *           and every rank gets commit K from the files
 *   shrink  the last rank saves commit K+1, then a set without it syncs: the file of the rank
 *           outside the set is the newest and every member gets its values and blob
 *   local   node-local dirs: only rank 0's dir holds commit K+1, the others' are empty: every
 *           rank gets it from rank 0
 *   ckpt    no files, a checkpointer with ckpt_every 2: the sync after commits 1..5 restores
 *           checkpoint step 4 (its tensors and blob)
 *   hosts   hora_elastic_hosts_changed against the node count in HORA_ELASTIC_HOSTS_FILE
 *   errors  restore before any commit, a too-large blob, ranks passing different tensors.
 * Float tensors get arbitrary bit patterns (NaN payloads included): comparisons are bytewise. */
#include <inttypes.h>

#include "ckpt_test.h"
#include "hora_test.h"

#define NT 2
#define W 1000
static float w[W];
static int64_t ctr[3];
static char blob[256];
static hora_tensor_t t[NT] = {{"w", w, W, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL},
                              {"counters", ctr, 3, HORA_INT64, HORA_DEVICE_HOST, 0, NULL}};

/* The state of commit `id`. */
static size_t fill(int64_t id) {
  ck_fill(w, sizeof w, id, 0);
  ck_fill(ctr, sizeof ctr, id, 1);
  return (size_t)snprintf(blob, sizeof blob, "epoch=%" PRId64 " batch=%" PRId64, id / 3, id % 3) + 1;
}

static void garbage(void) {
  memset(w, 0xA5, sizeof w);
  memset(ctr, 0x5A, sizeof ctr);
  memset(blob, 0, sizeof blob);
}

static float got_w[W];
static int64_t got_c[3];
static char got_b[256];
/* Tensors and blob must be those of commit `id`, bit for bit (what the API wrote is copied
 * first, then fill() recomputes the expected state). */
static void check(const char *what, int rank, int64_t id, size_t blob_bytes) {
  memcpy(got_w, w, sizeof w);
  memcpy(got_c, ctr, sizeof ctr);
  memcpy(got_b, blob, sizeof blob);
  size_t n = fill(id);
  long at = ck_check(got_w, sizeof got_w, id, 0);
  EXPECT(at < 0, "%s: rank %d: w differs from commit %" PRId64 " at byte %ld", what, rank, id, at);
  at = ck_check(got_c, sizeof got_c, id, 1);
  EXPECT(at < 0, "%s: rank %d: counters differ from commit %" PRId64 " at byte %ld", what, rank, id, at);
  EXPECT(blob_bytes == n && memcmp(got_b, blob, n) == 0, "%s: rank %d: blob '%s' (%zu bytes), want '%s' (%zu)", what,
         rank, got_b, blob_bytes, blob, n);
}

int main(int argc, char **argv) {
  int rank, size;
  char hosts[] = "/tmp/hora-test-elastic-hosts-XXXXXX"; /* read by rank 0 only (its params) */
  int hfd = mkstemp(hosts);
  if (hfd >= 0) close(hfd);
  setenv("HORA_ELASTIC_HOSTS_FILE", hosts, 1);
  hora_ctx_t *ctx = hora_test_init_mpi(&argc, &argv, &rank, &size);
  if (!ctx) return 1;
  char root[512] = "";
  if (rank == 0) {
    char *d = ck_mktemp("elastic");
    snprintf(root, sizeof root, "%s", d ? d : "");
    free(d);
  }
  MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  char dir[700], dir2[700], L[700];
  snprintf(dir, sizeof dir, "%s/commits", root);
  snprintf(dir2, sizeof dir2, "%s/commits2", root);
  snprintf(L, sizeof L, "%s/ckpt", root);
  const int K = 4, last = size - 1;
  size_t bb = 0;
  int64_t id = -7;

  /* fresh */
  hora_elastic_t *es = NULL, *es2 = NULL, *es3 = NULL;
  EXPECT_OK(hora_elastic_open(ctx, dir, NULL, 0, &es));
  EXPECT_RC(hora_elastic_restore(es, t, NT, blob, sizeof blob, &bb), HORA_ERR_NOT_FOUND);
  fill(1000 + rank);
  EXPECT_OK(hora_elastic_sync(es, t, NT, blob, sizeof blob, &bb, &id));
  EXPECT(id == 0 && bb == 0, "fresh sync: commit %" PRId64 ", blob %zu bytes", id, bb);
  memcpy(got_w, w, sizeof w);
  EXPECT(ck_check(got_w, sizeof got_w, 1000, 0) < 0, "fresh sync: rank %d does not hold rank 0's w", rank);

  /* commit / restore */
  for (int64_t c = 1; c <= K + (rank == last && size > 1); c++) {
    size_t n = fill(c);
    EXPECT_OK(hora_elastic_commit(es, t, NT, blob, n));
  }
  int64_t mine = K + (rank == last && size > 1);
  EXPECT_OK(hora_elastic_commit_id(es, &id));
  EXPECT(id == mine, "rank %d: commit id %" PRId64 ", want %" PRId64, rank, id, mine);
  garbage();
  EXPECT_OK(hora_elastic_restore(es, t, NT, blob, sizeof blob, &bb));
  check("restore", rank, mine, bb);
  EXPECT_ERR(hora_elastic_restore(es, t, NT, blob, 4, &bb), HORA_ERR_INVALID_ARGUMENT, "blob_cap");
  hora_tensor_t shorter[NT] = {t[0], t[1]};
  shorter[0].count = W - 1;
  EXPECT_ERR(hora_elastic_restore(es, shorter, NT, blob, sizeof blob, &bb), HORA_ERR_MISMATCH, "differ");
  EXPECT_ERR(hora_elastic_commit(es, t, NT, blob, HORA_ELASTIC_BLOB_MAX + 1), HORA_ERR_INVALID_ARGUMENT, "too large");

  /* corrupt: the newest file is skipped */
  EXPECT_OK(hora_elastic_save(es));
  EXPECT_OK(hora_elastic_close(es));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && size > 1) {
    char f[800];
    snprintf(f, sizeof f, "%s/commit-%d.r%d.hora", dir, K + 1, last);
    EXPECT(ck_flip(f, 100) == 0, "cannot corrupt %s", f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_OK(hora_elastic_open(ctx, dir, NULL, 0, &es2));
  garbage();
  EXPECT_OK(hora_elastic_sync(es2, t, NT, blob, sizeof blob, &bb, &id));
  EXPECT(id == K, "sync after corruption: commit %" PRId64 ", want %d", id, K);
  check("sync from files", rank, K, bb);

  /* shrink: the newest commit lives only in the file of a rank outside the new world */
  if (rank == last) {
    size_t n = fill(K + 1);
    EXPECT_OK(hora_elastic_commit(es2, t, NT, blob, n));
    EXPECT_OK(hora_elastic_save(es2));
  }
  EXPECT_OK(hora_elastic_close(es2));
  MPI_Barrier(MPI_COMM_WORLD);
  if (size > 1) {
    int ranks[3] = {0, 1, 2};
    hora_ctx_t *set = NULL;
    EXPECT_OK(hora_process_set_create(ctx, ranks, (size_t)size - 1, &set));
    if (rank != last) {
      EXPECT_OK(hora_elastic_open(set, dir, NULL, 0, &es3));
      garbage();
      EXPECT_OK(hora_elastic_sync(es3, t, NT, blob, sizeof blob, &bb, &id));
      EXPECT(id == K + 1, "shrunk sync: commit %" PRId64 ", want %d", id, K + 1);
      check("shrunk sync", rank, K + 1, bb);
      EXPECT_OK(hora_elastic_close(es3));
    }
    EXPECT_OK(hora_process_set_destroy(set));
  }

  /* node-local dirs: only rank 0 sees the newest file (K+1); the others' dirs are empty */
  if (size > 1) {
    char own[800];
    snprintf(own, sizeof own, "%s/local-%d", root, rank);
    EXPECT_OK(hora_elastic_open(ctx, rank == 0 ? dir : own, NULL, 0, &es3));
    garbage();
    EXPECT_OK(hora_elastic_sync(es3, t, NT, blob, sizeof blob, &bb, &id));
    EXPECT(id == K + 1, "sync with node-local dirs: commit %" PRId64 ", want %d", id, K + 1);
    check("sync with node-local dirs", rank, K + 1, bb);
    EXPECT_OK(hora_elastic_close(es3));
  }

  /* ckpt fallback */
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = L;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  EXPECT_OK(hora_elastic_open(ctx, dir2, ck, 2, &es));
  for (int64_t c = 1; c <= 5; c++) {
    size_t n = fill(c);
    EXPECT_OK(hora_elastic_commit(es, t, NT, blob, n));
  }
  EXPECT_OK(hora_elastic_close(es));
  EXPECT_OK(hora_elastic_open(ctx, dir2, ck, 2, &es));
  garbage();
  EXPECT_OK(hora_elastic_sync(es, t, NT, blob, sizeof blob, &bb, &id));
  EXPECT(id == 4, "sync from the checkpoint: commit %" PRId64 ", want 4", id);
  check("sync from the checkpoint", rank, 4, bb);

  /* hosts: this run is one node; the driver's file says 1 (or nothing), then 2 */
  int changed = -1, nodes = 0;
  hora_cross_size(ctx, &nodes);
  EXPECT_OK(hora_elastic_hosts_changed(es, &changed));
  EXPECT(changed == 0, "hosts_changed with an empty file: %d", changed);
  for (int k = 0; k < 2; k++) {
    if (rank == 0) {
      FILE *f = fopen(hosts, "w");
      if (f) fprintf(f, "%d\n", nodes + k), fclose(f);
    }
    changed = -1;
    EXPECT_OK(hora_elastic_hosts_changed(es, &changed));
    EXPECT(changed == k, "hosts_changed with %d nodes on %d: %d", nodes + k, nodes, changed);
  }

  /* ranks passing different tensors: every rank gets HORA_ERR_MISMATCH */
  if (size > 1) {
    EXPECT_RC(hora_elastic_sync(es, rank == 1 ? shorter : t, NT, blob, sizeof blob, &bb, &id), HORA_ERR_MISMATCH);
    garbage();
    EXPECT_OK(hora_elastic_restore(es, t, NT, blob, sizeof blob, &bb));
    check("restore after a failed sync", rank, 4, bb);
  }
  EXPECT_OK(hora_elastic_close(es));
  EXPECT_OK(hora_ckpt_close(ck));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) ck_rmrf(root);
  unlink(hosts);
  char hc[64];
  snprintf(hc, sizeof hc, "%s.commit", hosts); /* rank 0's report of each sync for the driver */
  if (rank == 0) {
    struct stat st;
    EXPECT(stat(hc, &st) == 0 && st.st_size > 0, "rank 0 wrote no %s after its syncs", hc);
  }
  unlink(hc);
  int ret = hora_test_finish_mpi("test_elastic_mpi");
  hora_finalize(ctx);
  MPI_Finalize();
  return ret;
}
