/* Record reader sharded through a hora context: rank 0 writes 3 files, every rank reads its
 * shard (by file for up to 3 ranks, by record for 4), and the shards must be disjoint and cover
 * every record, also with shuffling; a rank's shuffled order must repeat for the same seed. */
#include <unistd.h>

#include "hora_test.h"

#define NREC 1000
#define NFILES 3

static long read_all(hora_ctx_t *ctx, const char *pat, size_t shuffle, uint32_t *ids) {
  hora_records_reader_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.patterns = &pat;
  o.pattern_count = 1;
  o.ctx = ctx;
  o.shuffle_buffer = shuffle;
  o.seed = 7;
  o.prefetch = 32;
  hora_records_reader_t *r = NULL;
  EXPECT_OK(hora_records_reader_open(&o, &r));
  if (!r) return -1;
  long n = 0;
  for (;;) {
    const void *d;
    size_t len;
    int eof;
    if (hora_records_next(r, &d, &len, &eof) != HORA_SUCCESS) {
      EXPECT(0, "next: %s", hora_last_error());
      n = -1;
      break;
    }
    if (eof) break;
    EXPECT(len == 100, "record length %zu", len);
    uint32_t id;
    memcpy(&id, d, 4);
    EXPECT(((const unsigned char *)d)[99] == (unsigned char)(id * 3), "record %u content", id);
    if (n < NREC) ids[n] = id;
    n++;
  }
  hora_records_reader_close(r);
  return n;
}

int main(int argc, char **argv) {
  hora_ctx_t *ctx = NULL;
  hora_result_t rc = hora_init(&ctx);
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  int rank = 0, size = 1;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  char dir[256] = "";
  if (rank == 0) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/hora-test-records-mpi-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    unsigned char rec[100];
    for (int f = 0; f < NFILES; f++) {
      char p[300];
      snprintf(p, sizeof p, "%s/shard-%d.rec", dir, f);
      hora_records_writer_t *w = NULL;
      EXPECT_OK(hora_records_writer_open(p, &w));
      for (uint32_t i = (uint32_t)(f * NREC / NFILES); i < (uint32_t)((f + 1) * NREC / NFILES); i++) {
        memset(rec, 0, sizeof rec);
        memcpy(rec, &i, 4);
        rec[99] = (unsigned char)(i * 3);
        EXPECT_OK(hora_records_writer_write(w, rec, sizeof rec));
      }
      EXPECT_OK(hora_records_writer_close(w));
    }
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  char pat[300];
  snprintf(pat, sizeof pat, "%s/shard-*.rec", dir);
  static uint32_t ids[NREC], ids2[NREC];
  for (size_t shuffle = 0; shuffle <= 64; shuffle += 64) {
    long n = read_all(ctx, pat, shuffle, ids);
    int seen[NREC] = {0}, total[NREC];
    for (long i = 0; i < n && i < NREC; i++)
      if (ids[i] < NREC) seen[ids[i]]++;
    MPI_Allreduce(seen, total, NREC, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < NREC; i++) EXPECT(total[i] == 1, "shuffle %zu: id %d read %d times over %d ranks", shuffle, i, total[i], size);
    if (size > NFILES && !shuffle) /* by record, file order: this rank holds ids j with j % size == rank */
      for (long i = 0; i < n && i < NREC; i++) EXPECT(ids[i] % (uint32_t)size == (uint32_t)rank, "id %u on rank %d", ids[i], rank);
    if (shuffle) {
      long n2 = read_all(ctx, pat, shuffle, ids2);
      EXPECT(n2 == n && memcmp(ids, ids2, (size_t)(n < NREC ? n : NREC) * 4) == 0, "shuffled order not repeatable");
    }
  }
  hora_barrier(ctx);
  if (rank == 0) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  int code = hora_test_finish_mpi("test_records_mpi");
  hora_finalize(ctx);
  return code;
}
