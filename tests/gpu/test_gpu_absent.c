/* Device buffers where there is no GPU (CI machines, CPU nodes, builds without CUDA): hora_init
 * succeeds, every collective on HORA_DEVICE_CUDA buffers fails with HORA_ERR_NOT_SUPPORTED on every
 * rank (no hang, no crash: the device pointers are never touched), hora_device_index says the rank
 * has no GPU, and host collectives keep working afterwards. Exits 77 when a GPU is visible (the
 * GPU tests cover that case). */
#include <stdint.h>
#include <string.h>

#include "hora_test.h"
#if HORA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

int main(int argc, char **argv) {
  int provided, rank, size;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int gpu = 0, any = 0;
#if HORA_HAVE_CUDA
  int ndev = 0;
  gpu = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
#endif
  MPI_Allreduce(&gpu, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any) {
    if (rank == 0) printf("test_gpu_absent: a GPU is visible: skipped\n");
    MPI_Finalize();
    return HORA_TEST_SKIP;
  }
  unsetenv("HORA_DEVICE");
  hora_ctx_t *ctx = NULL;
  EXPECT_OK(hora_init(&ctx));
  int dev = 12345;
  EXPECT_RC(hora_device_index(ctx, &dev), HORA_ERR_NOT_SUPPORTED);
  EXPECT(dev == 12345, "hora_device_index changed *device on error");
  /* Fake device pointers: they must never be dereferenced. */
  float *fake = (float *)(uintptr_t)0x1000, *fake2 = (float *)(uintptr_t)0x800000;
  size_t counts[64];
  for (int i = 0; i < size && i < 64; i++) counts[i] = 4;
  for (int rep = 0; rep < 2; rep++) {
    EXPECT_RC(hora_allreduce(ctx, fake, fake2, 4, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA), HORA_ERR_NOT_SUPPORTED);
    /* The message names the cause: a build without CUDA, or no usable GPU on this rank. */
    const char *why = HORA_HAVE_CUDA ? "GPU" : "built without CUDA";
    EXPECT(strstr(hora_last_error(), why) != NULL, "hora_allreduce on device buffers: \"%s\" does not say \"%s\"",
           hora_last_error(), why);
    if (rep == 0 && rank == 0) printf("device buffers refused: %s\n", hora_last_error());
    EXPECT_RC(hora_broadcast(ctx, fake, 4, HORA_FLOAT32, 0, HORA_DEVICE_CUDA), HORA_ERR_NOT_SUPPORTED);
    EXPECT_RC(hora_allgather(ctx, fake, fake2, 4, HORA_FLOAT32, HORA_DEVICE_CUDA), HORA_ERR_NOT_SUPPORTED);
    EXPECT_RC(hora_allgatherv(ctx, fake, 4, fake2, counts, HORA_FLOAT32, HORA_DEVICE_CUDA), HORA_ERR_NOT_SUPPORTED);
    EXPECT_RC(hora_reducescatter(ctx, fake, fake2, 1, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA), HORA_ERR_NOT_SUPPORTED);
    EXPECT_RC(hora_alltoall(ctx, fake, fake2, 1, HORA_FLOAT32, HORA_DEVICE_CUDA), HORA_ERR_NOT_SUPPORTED);
    EXPECT_RC(hora_alltoallv(ctx, fake, counts, fake2, counts, HORA_FLOAT32, HORA_DEVICE_CUDA), HORA_ERR_NOT_SUPPORTED);
  }
  /* Host collectives are unaffected. */
  float v[3] = {(float)rank, 1.0f, 2.0f * (float)rank};
  EXPECT_OK(hora_allreduce(ctx, v, v, 3, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST));
  float want0 = (float)size * (float)(size - 1) / 2.0f;
  EXPECT(v[0] == want0 && v[1] == (float)size && v[2] == 2.0f * want0, "host allreduce after device errors: %g %g %g",
         v[0], v[1], v[2]);
  EXPECT_OK(hora_finalize(ctx));
  int rc = hora_test_finish_mpi("test_gpu_absent");
  MPI_Finalize();
  return rc;
}
