/* The shared-memory window where its directory is short of room. tests/mpi/shm_room.sh runs this
 * with Open MPI's window directory (osc_sm_backing_directory) on a small tmpfs, in a mount
 * namespace of its own:
 *   test_shm_room fit   the window of the requested chunk does not fit: it shrinks until it does,
 *                       and allreduces of every piece count are exact (sum of r + i % 101);
 *   test_shm_room none  not even the smallest window fits: every rank gets HORA_ERR_NO_MEMORY
 *                       naming the directory, at once and again at the next call (no rank enters
 *                       MPI_Win_allocate_shared, whose peers would wait inside it for ever).
 * Before the check, a window that did not fit failed on one rank and left the others inside
 * MPI_Win_allocate_shared: the job hung. */
#include <stdint.h>
#include <string.h>

#include "hora_test.h"

static int rank, size;

static void allreduce_exact(hora_ctx_t *ctx, size_t n) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = (float)(rank + (int)(i % 101));
  EXPECT_OK(hora_allreduce(ctx, x, x, n, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST));
  for (size_t i = 0; i < n; i++) {
    float want = (float)(size * (size - 1) / 2 + size * (int)(i % 101));
    if (x[i] != want) {
      EXPECT(0, "%zu elements: element %zu is %g, want %g", n, i, x[i], want);
      break;
    }
  }
  free(x);
}

int main(int argc, char **argv) {
  hora_ctx_t *ctx = hora_test_init_mpi(&argc, &argv, &rank, &size);
  if (!ctx) return 1;
  const char *mode = argc > 1 ? argv[1] : "fit";
  const char *dir = getenv("OMPI_MCA_osc_sm_backing_directory");
  if (!strcmp(mode, "fit")) {
    /* 4 MiB: many pieces of the shrunk chunk; 1000 elements: the flat form. */
    allreduce_exact(ctx, (size_t)1 << 20);
    allreduce_exact(ctx, 1000);
  } else {
    float x[64] = {0};
    for (int k = 0; k < 2; k++)
      EXPECT_ERR(hora_allreduce(ctx, x, x, 64, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST),
                 HORA_ERR_NO_MEMORY, dir ? dir : "/dev/shm");
  }
  EXPECT_OK(hora_finalize(ctx));
  int rc = hora_test_finish_mpi("test_shm_room");
  MPI_Finalize();
  return rc;
}
