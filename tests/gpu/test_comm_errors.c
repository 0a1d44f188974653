/* Error paths of runtime/comm on the emulated CUDA runtime (cuda_emu.c: one GPU shared by every
 * rank), run with 2 ranks:
 *   - HORA_DEVICE beyond the visible GPUs on one rank: hora_init fails on every rank
 *     (HORA_ERR_INVALID_ARGUMENT), nothing hangs;
 *   - HORA_GPU_PATH=nccl while the ranks share a GPU: every device collective returns
 *     HORA_ERR_NOT_SUPPORTED on every rank, and host collectives still work;
 *   - a peer that never joins a staged allreduce: the waiting rank gets HORA_ERR_TIMEOUT after
 *     HORA_PEER_TIMEOUT_S instead of hanging;
 *   - a staged ring that stops half way fails the context: the next call returns that error
 *     instead of taking the peer's late messages of the abandoned call for its own. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <unistd.h>

#include "hora_test.h"

int main(int argc, char **argv) {
  int provided, rank, size;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) printf("test_comm_errors: needs 2 ranks\n");
    MPI_Finalize();
    return 1;
  }
  if (!getenv("HORA_LOG")) setenv("HORA_LOG", "NONE", 1);
  hora_ctx_t *ctx = NULL;

  /* 1. A bad HORA_DEVICE on rank 1 fails hora_init on both ranks. */
  setenv("HORA_DEVICE", rank == 1 ? "5" : "0", 1);
  hora_result_t rc = hora_init(&ctx);
  EXPECT(rc == HORA_ERR_INVALID_ARGUMENT, "hora_init with HORA_DEVICE=5 on rank 1: %s (%s)", hora_result_name(rc),
         hora_last_error());
  if (rank == 1) EXPECT(strstr(hora_last_error(), "HORA_DEVICE") != NULL, "message does not name HORA_DEVICE: %s", hora_last_error());
  unsetenv("HORA_DEVICE");

  /* 2. NCCL forced on a shared GPU. */
  setenv("HORA_GPU_PATH", "nccl", 1);
  EXPECT_OK(hora_init(&ctx));
  float *d = NULL;
  cudaMalloc((void **)&d, 4096 * sizeof *d);
  for (int rep = 0; rep < 2; rep++) {
    rc = hora_allreduce(ctx, d, d, 16, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA);
    EXPECT(rc == HORA_ERR_NOT_SUPPORTED, "allreduce with HORA_GPU_PATH=nccl on a shared GPU: %s", hora_result_name(rc));
    EXPECT_RC(hora_broadcast(ctx, d, 16, HORA_FLOAT32, 0, HORA_DEVICE_CUDA), HORA_ERR_NOT_SUPPORTED);
  }
  EXPECT(strstr(hora_last_error(), "share a GPU") != NULL, "the message does not say why: %s", hora_last_error());
  int v = rank + 1;
  EXPECT_OK(hora_allreduce(ctx, &v, &v, 1, HORA_INT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST));
  EXPECT(v == 3, "host allreduce after device errors: %d", v);
  EXPECT_OK(hora_finalize(ctx));

  /* 3. Rank 1 (alive) never joins: rank 0's allreduce ends with HORA_ERR_TIMEOUT instead of
   * hanging. With the call check on (the default) rank 0 waits in the check, whose stall
   * inspection ends it after HORA_STALL_SHUTDOWN_S naming rank 1; with it off, in the staged
   * ring, whose no-progress limit is HORA_PEER_TIMEOUT_S. The check run here. */
  setenv("HORA_GPU_PATH", "staged", 1);
  setenv("HORA_PEER_TIMEOUT_S", "1", 1);
  setenv("HORA_STALL_SHUTDOWN_S", "1", 1);
  EXPECT_OK(hora_init(&ctx));
  /* Create the GPU state on both ranks (collective) with a first allreduce that both join. */
  EXPECT_OK(hora_allreduce(ctx, d, d, 16, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA));
  if (rank == 0) {
    double t0 = MPI_Wtime();
    rc = hora_allreduce(ctx, d, d, 4096, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA);
    double dt = MPI_Wtime() - t0;
    EXPECT(rc == HORA_ERR_TIMEOUT, "staged allreduce without its peer: %s (%s)", hora_result_name(rc), hora_last_error());
    EXPECT(strstr(hora_last_error(), "rank(s) 1 did not call it"), "the message does not name rank 1: %s",
           hora_last_error());
    EXPECT(dt >= 0.9 && dt < 30, "timed out after %.2f s, want about 1 s", dt);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_OK(hora_finalize(ctx));

  /* 4. A staged ring that stops half way. The call check is off (HORA_CHECK=0), so both ranks go
   * straight into the ring, and rank 1 comes 2.5 s late: rank 0 sends its first chunks, hears
   * nothing for HORA_PEER_TIMEOUT_S = 1 s and returns HORA_ERR_TIMEOUT. Its next call must return
   * that failure at once: run on, it would pair with rank 1's messages of the abandoned call
   * (MPI_ERR_TRUNCATE, or a wrong sum without an error). Rank 1's late call ends with an error
   * too (rank 0 stopped its part, and its heartbeats), and so does its next one. */
  setenv("HORA_CHECK", "0", 1);
  setenv("HORA_STAGED_CHUNK_BYTES", "4096", 1);
  unsetenv("HORA_STALL_SHUTDOWN_S");
  EXPECT_OK(hora_init(&ctx));
  EXPECT_OK(hora_allreduce(ctx, d, d, 16, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA));
  float host[4096];
  for (int i = 0; i < 4096; i++) host[i] = (float)(rank + 1);
  cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice);
  if (rank == 1) usleep(2500 * 1000);
  rc = hora_allreduce(ctx, d, d, 4096, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA);
  if (rank == 0)
    EXPECT(rc == HORA_ERR_TIMEOUT, "staged ring whose peer comes late: %s (%s)", hora_result_name(rc), hora_last_error());
  else
    EXPECT(rc != HORA_SUCCESS, "rank 1's late call into an abandoned ring succeeded");
  hora_result_t rc2 = hora_allreduce(ctx, d, d, 16, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA);
  EXPECT(rc2 != HORA_SUCCESS, "the call after a ring that stopped half way succeeded (it can pair with stale messages)");
  if (rank == 0) {
    EXPECT(rc2 == HORA_ERR_TIMEOUT && strstr(hora_last_error(), "stopped half way"),
           "the next call does not return the failure: %s (%s)", hora_result_name(rc2), hora_last_error());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  hora_finalize(ctx); /* returns the failure; it must return */
  cudaFree(d);
  int code = hora_test_finish_mpi("test_comm_errors");
  MPI_Finalize();
  return code;
}
