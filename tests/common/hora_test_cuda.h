/* CK(call): a CUDA runtime call in a GPU test; on failure print where and why and exit 1.
 * hora_test_have_gpu: whether to run or skip (77) a GPU test. */
#ifndef HORA_TEST_CUDA_H
#define HORA_TEST_CUDA_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

/* 1 when a GPU is usable. 0 (print why; the caller exits 77) when there is none: no NVIDIA kernel
 * driver loaded, or it reports no devices. A loaded driver with which the CUDA runtime still
 * fails (for instance a driver older than the toolkit: cudaErrorInsufficientDriver, which is also
 * what a machine without any driver returns) is not a skip: print it and exit 1, so that a GPU
 * machine that cannot run the tests does not pass them as skipped. */
static inline int hora_test_have_gpu(const char *test) {
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e == cudaSuccess && ndev > 0) return 1;
  FILE *drv = fopen("/proc/driver/nvidia/version", "r");
  if (drv && e != cudaSuccess && e != cudaErrorNoDevice) {
    fclose(drv);
    fprintf(stderr, "%s: an NVIDIA driver is loaded but cudaGetDeviceCount failed: %s (%s)\n", test,
            cudaGetErrorString(e), cudaGetErrorName(e));
    exit(1);
  }
  if (drv) fclose(drv);
  printf("%s: no GPU (cudaGetDeviceCount: %s, %d devices): skipped\n", test,
         e == cudaSuccess ? "ok" : cudaGetErrorName(e), ndev);
  return 0;
}

#endif
