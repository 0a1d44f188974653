/* Stall inspector: the last rank withholds two tensors (one new, one already in the response
 * cache), and the others submit an unnamed one ("allreduce.noname.7") whose number the last
 * rank has not reached (both messages must say how unnamed requests are numbered). Run with HORA_STALL_WARNING_S=0.5 HORA_STALL_SHUTDOWN_S=2: rank 0 must log a warning
 * naming both tensors and the missing rank, and the other ranks' handles must fail with
 * HORA_ERR_TIMEOUT (message naming the tensor and the rank) in a few seconds. Rank 0 captures its
 * own stderr in a temporary file to check the warning text. */
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include "hora_test.h"

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int wrank, wsize;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  if (wsize < 2) {
    MPI_Finalize();
    return HORA_TEST_SKIP;
  }
  char path[] = "/tmp/hora-stall-XXXXXX";
  int saved = -1, logfd = -1;
  if (wrank == 0) {
    /* The file is unlinked at once and read back through its descriptor: nothing is left in
     * /tmp even when the rank dies (a sanitizer's halt). */
    logfd = mkstemp(path);
    if (logfd < 0) {
      perror("test_engine_stall: mkstemp");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    unlink(path);
    fflush(stderr);
    saved = dup(2);
    dup2(logfd, 2);
  }
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) return 1;
  int rank, size;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  int L = size - 1;
  float x[4] = {1, 2, 3, 4}, y[4], z[4];
  hora_handle_t *h;
  /* Round 1: everyone, so that "stall/cached" is in the cache. */
  EXPECT_OK(hora_allreduce_async(ctx, "stall/cached", x, y, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
  EXPECT_OK(hora_wait(h));
  hora_handle_free(h);
  if (rank != L) {
    hora_handle_t *a, *b;
    double t0 = MPI_Wtime();
    EXPECT_OK(hora_allreduce_async(ctx, "stall/withheld", x, y, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &a));
    EXPECT_OK(hora_allreduce_async(ctx, "stall/cached", x, z, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &b));
    hora_handle_t *u;
    float w[4];
    EXPECT_OK(hora_allreduce_async(ctx, "allreduce.noname.7", x, w, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &u));
    char want[32];
    snprintf(want, sizeof want, "rank(s) %d", L);
    EXPECT_RC(hora_wait(a), HORA_ERR_TIMEOUT);
    EXPECT(strstr(hora_last_error(), "stall/withheld") && strstr(hora_last_error(), want), "message: %s", hora_last_error());
    EXPECT_RC(hora_wait(b), HORA_ERR_TIMEOUT);
    EXPECT(strstr(hora_last_error(), "stall/cached") && strstr(hora_last_error(), want), "message: %s", hora_last_error());
    EXPECT(!strstr(hora_last_error(), "unnamed requests are numbered"), "named tensor, hint: %s", hora_last_error());
    EXPECT_RC(hora_wait(u), HORA_ERR_TIMEOUT);
    EXPECT(strstr(hora_last_error(), "allreduce.noname.7") && strstr(hora_last_error(), "unnamed requests are numbered"),
           "message: %s", hora_last_error());
    hora_handle_free(u);
    double dt = MPI_Wtime() - t0;
    EXPECT(dt >= 1.9 && dt < 8.0, "timeout after %.2f s, want about 2 s (HORA_STALL_SHUTDOWN_S)", dt);
    hora_handle_free(a);
    hora_handle_free(b);
  }
  EXPECT_OK(hora_barrier(ctx));
  /* The engine still works afterwards. */
  EXPECT_OK(hora_allreduce_async(ctx, "stall/after", x, y, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
  EXPECT_OK(hora_wait(h));
  hora_handle_free(h);
  EXPECT(y[3] == 4.0f * (float)size, "after: %g", y[3]);
  EXPECT_OK(hora_finalize(ctx));
  if (rank == 0) {
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    static char log[1 << 16];
    ssize_t got = pread(logfd, log, sizeof log - 1, 0);
    log[got > 0 ? got : 0] = 0;
    close(logfd);
    fputs(log, stderr);
    char want1[96], want2[96];
    snprintf(want1, sizeof want1, "'stall/withheld' missing on rank %d", L);
    snprintf(want2, sizeof want2, "'stall/cached' missing on rank %d", L);
    EXPECT(strstr(log, "stall:") && strstr(log, "HORA_STALL_WARNING_S"), "no stall warning in rank 0's log");
    EXPECT(strstr(log, want1), "warning does not say %s", want1);
    EXPECT(strstr(log, want2), "warning does not say %s", want2);
    EXPECT(strstr(log, "'allreduce.noname.7' missing") && strstr(log, "unnamed requests are numbered"),
           "warning does not explain the unnamed request");
  }
  int rc = hora_test_finish_mpi("test_engine_stall");
  MPI_Finalize();
  return rc;
}
