/* A buffer of more than 2^31 elements (u8: 2^31 + 5 bytes per rank) through hora_allreduce with
 * the ring and the shared-memory algorithms, in place: counts above INT_MAX must neither be
 * truncated nor split wrongly. Skips (77) when the memory is not there. Label `slow`. */
#include <stdint.h>
#include <sys/sysinfo.h>

#include "hora_test.h"
#include "core/internal.h"

/* Position-dependent bytes (cheap enough for 2 GiB): a misplaced segment changes them. */
static inline unsigned pat(size_t i) { return (unsigned)((i ^ (i >> 7) ^ (i >> 19)) & 63); }

int main(int argc, char **argv) {
  int provided, rank, size;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  setenv("HORA_LOG", "WARN", 1);
  const size_t n = ((size_t)1 << 31) + 5;
  struct sysinfo si;
  int enough = sysinfo(&si) == 0 && (double)si.freeram * si.mem_unit > 1.5 * (double)n * size;
  unsigned char *buf = enough ? malloc(n) : NULL;
  int ok = buf != NULL, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (rank == 0) printf("test_coll_big: skipped (needs %.1f GB free)\n", 1.5 * (double)n * size / 1e9);
    free(buf);
    MPI_Finalize();
    return HORA_TEST_SKIP;
  }
  hora_ctx_t *ctx;
  EXPECT_OK(hora_init(&ctx));
  const char *algos[] = {"ring", "shm"};
  for (int a = 0; a < 2; a++) {
    setenv("HORA_ALLREDUCE_ALGO", algos[a], 1);
    EXPECT_OK(hora__params_reload());
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(pat(i) + (size_t)rank);
    double t0 = MPI_Wtime();
    EXPECT_OK(hora_allreduce(ctx, buf, buf, n, HORA_UINT8, HORA_SUM, 1, 1, HORA_DEVICE_HOST));
    double t = MPI_Wtime() - t0;
    size_t bad = 0, first = SIZE_MAX;
    unsigned base = (unsigned)(size * (size - 1) / 2);
    for (size_t i = 0; i < n; i++)
      if (buf[i] != (unsigned char)(pat(i) * (size_t)size + base)) {
        if (!bad) first = i;
        bad++;
      }
    EXPECT(bad == 0, "%s: %zu wrong bytes, first at %zu", algos[a], bad, first);
    if (rank == 0) printf("%s: 2^31+5 bytes in %.2f s\n", algos[a], t);
  }
  EXPECT_OK(hora_finalize(ctx));
  free(buf);
  int rc = hora_test_finish_mpi("test_coll_big");
  MPI_Finalize();
  return rc;
}
