/* Device tensors: save from CUDA memory (async D2H into pinned staging) next to a host tensor,
 * restore into zeroed device memory, compare on the host. Exits 77 without a GPU or without a
 * CUDA build. */
#include <inttypes.h>

#include "ckpt_test.h"
#include "hora_test.h"
#if HORA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

int main(void) {
#if !HORA_HAVE_CUDA
  printf("test_ckpt_device: skipped (hora built without CUDA)\n");
  return HORA_TEST_SKIP;
#else
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("test_ckpt_device: skipped (no GPU)\n");
    return HORA_TEST_SKIP;
  }
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) return 1;
  char *root = ck_mktemp("ckpt-device");
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = root;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  const size_t counts[3] = {(1 << 20) + 3, 4097, 100};
  const hora_dtype_t dt[3] = {HORA_FLOAT32, HORA_BFLOAT16, HORA_INT64};
  const hora_device_t dev[3] = {HORA_DEVICE_CUDA, HORA_DEVICE_CUDA, HORA_DEVICE_HOST};
  void *p[3], *host[3];
  size_t bytes[3];
  hora_tensor_t t[3];
  for (int k = 0; k < 3; k++) {
    size_t es = 0;
    hora_dtype_size(dt[k], &es);
    bytes[k] = counts[k] * es;
    host[k] = malloc(bytes[k]);
    ck_fill(host[k], bytes[k], 7, k);
    if (dev[k] == HORA_DEVICE_CUDA) {
      EXPECT(cudaMalloc(&p[k], bytes[k]) == cudaSuccess, "cudaMalloc");
      cudaMemcpy(p[k], host[k], bytes[k], cudaMemcpyHostToDevice);
    } else {
      p[k] = malloc(bytes[k]);
      memcpy(p[k], host[k], bytes[k]);
    }
    t[k] = (hora_tensor_t){k == 0 ? "w" : k == 1 ? "e" : "c", p[k], counts[k], dt[k], dev[k], 0, NULL};
  }
  EXPECT_OK(hora_ckpt_save(ck, 7, t, 3, NULL, 0));
  /* The snapshot is complete when save returns: overwrite the device buffers at once. */
  for (int k = 0; k < 3; k++)
    if (dev[k] == HORA_DEVICE_CUDA) cudaMemset(p[k], 0, bytes[k]);
    else memset(p[k], 0, bytes[k]);
  EXPECT_OK(hora_ckpt_flush(ck));
  int64_t step = -1;
  EXPECT_OK(hora_ckpt_restore(ck, &step, t, 3));
  EXPECT(step == 7, "step %" PRId64, step);
  for (int k = 0; k < 3; k++) {
    void *back = malloc(bytes[k]);
    if (dev[k] == HORA_DEVICE_CUDA) cudaMemcpy(back, p[k], bytes[k], cudaMemcpyDeviceToHost);
    else memcpy(back, p[k], bytes[k]);
    EXPECT(ck_check(back, bytes[k], 7, k) < 0, "tensor %d differs after the round trip", k);
    free(back);
    if (dev[k] == HORA_DEVICE_CUDA) cudaFree(p[k]);
    else free(p[k]);
    free(host[k]);
  }
  EXPECT_OK(hora_ckpt_close(ck));
  hora_finalize(ctx);
  ck_rmrf(root);
  free(root);
  return hora_test_finish("test_ckpt_device");
#endif
}
