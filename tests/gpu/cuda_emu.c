/* An emulated CUDA runtime for running runtime/comm's logic on machines without a GPU (CI).
 *
 * Linked into a test executable, these definitions take the place of libcudart's (the executable's
 * own symbols win at link time) and of the CUDA kernels in kernels/cuda (the archive members that
 * define them are then not linked): "device" memory is host memory, every copy, memset and kernel
 * runs at once on the calling thread through the host reference kernels, and streams and events
 * report "not ready" at random a third of the time so that the staged ring's polling paths run.
 *
 * What this checks: the staged ring's block/chunk/step bookkeeping, the naive path, scaling,
 * averaging and compression around the transports, path selection and the whole-buffer staging of
 * the other collectives. What it cannot check: real asynchrony (the copies are complete when
 * enqueued, so a missing stream dependency goes unnoticed), the CUDA kernels, NCCL. Those need
 * the GPU tests on a GPU. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hora_kernels.h"

static __thread int current_device;
static __thread uint64_t rng = 0x9e3779b97f4a7c15ull;
static int not_ready(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng % 3 == 0;
}

cudaError_t cudaGetDeviceCount(int *count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
  (void)device;
  if (len > 0) snprintf(pciBusId, (size_t)len, "0000:00:00.0");
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  (void)attr;
  (void)device;
  *value = 80;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  (void)device;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "emulated GPU");
  /* Every rank the same GPU (ranks share it), or with HORA_EMU_DISTINCT_GPUS set one GPU per rank. */
  memset(prop->uuid.bytes, 0x42, sizeof prop->uuid.bytes);
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  if (getenv("HORA_EMU_DISTINCT_GPUS") && r) prop->uuid.bytes[0] = (char)atoi(r);
  prop->major = 9;
  prop->multiProcessorCount = 80;
  return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t error) { return error == cudaSuccess ? "no error" : "emulated CUDA error"; }
const char *cudaGetErrorName(cudaError_t error) { return error == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }

static void *xalloc(size_t n) {
  void *p = NULL;
  return posix_memalign(&p, 256, n ? n : 1) == 0 ? p : NULL;
}

/* "Device" allocations, so that cudaPointerGetAttributes can tell them from host memory. */
#define MAX_DEV_ALLOCS 4096
static struct { char *p; size_t n; } dev_allocs[MAX_DEV_ALLOCS];
static void dev_track(void *p, size_t n) {
  for (int i = 0; i < MAX_DEV_ALLOCS; i++)
    if (!dev_allocs[i].p) {
      dev_allocs[i].p = p;
      dev_allocs[i].n = n;
      return;
    }
}
static void dev_untrack(void *p) {
  for (int i = 0; i < MAX_DEV_ALLOCS; i++)
    if (dev_allocs[i].p == p) dev_allocs[i].p = NULL;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  memset(a, 0, sizeof *a);
  a->type = cudaMemoryTypeHost;
  a->device = -1;
  for (int i = 0; i < MAX_DEV_ALLOCS; i++)
    if (dev_allocs[i].p && (const char *)p >= dev_allocs[i].p && (const char *)p < dev_allocs[i].p + dev_allocs[i].n) {
      a->type = cudaMemoryTypeDevice;
      a->device = 0;
    }
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) {
  if (!(*p = xalloc(n))) return cudaErrorMemoryAllocation;
  dev_track(*p, n ? n : 1);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return (*p = xalloc(n)) ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  (void)s;
  return cudaMalloc(p, n);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  dev_untrack(p);
  free(p);
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
  dev_untrack(p);
  free(p);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  (void)kind;
  if (n) memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
  (void)s;
  return cudaMemcpy(dst, src, n, kind);
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaMemset(void *p, int v, size_t n) {
  memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  (void)s;
  return cudaMemset(p, v, n);
}

/* Streams and events are tokens; work is done when enqueued. */
static int token;
cudaError_t cudaStreamCreate(cudaStream_t *s) {
  *s = (cudaStream_t)&token;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  (void)flags;
  return cudaStreamCreate(s);
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
  (void)s;
  fn(arg);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  (void)s;
  return not_ready() ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  (void)s;
  (void)e;
  (void)flags;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  (void)flags;
  *e = (cudaEvent_t)&token;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  (void)a;
  (void)b;
  *ms = 1.0f; /* the emulation has no clock of its own: benchmark figures from it mean nothing */
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
  *v = 0;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)e;
  (void)s;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  (void)e;
  return not_ready() ? cudaErrorNotReady : cudaSuccess;
}

/* The CUDA kernels, run by their host references. */
hora_result_t hora__reduce_cuda(void *dst, const void *a, const void *b, size_t count, hora_dtype_t dtype,
                                hora_op_t op, void *stream) {
  return hora__reduce_host(dst, a, b, count, dtype, op, stream);
}
hora_result_t hora__reduce_n_cuda(void *dst, const void *const *srcs, int nsrc, size_t count, hora_dtype_t dtype,
                                  hora_op_t op, void *stream) {
  return hora__reduce_n_host(dst, srcs, nsrc, count, dtype, op, stream);
}
hora_result_t hora__scale_cuda(void *dst, const void *src, size_t count, hora_dtype_t dtype, double factor,
                               void *stream) {
  return hora__scale_host(dst, src, count, dtype, factor, stream);
}
hora_result_t hora__cast_f32_to_f16_cuda(void *dst, const float *src, size_t count, void *stream) {
  return hora__cast_f32_to_f16_host(dst, src, count, stream);
}
hora_result_t hora__cast_f16_to_f32_cuda(float *dst, const void *src, size_t count, void *stream) {
  return hora__cast_f16_to_f32_host(dst, src, count, stream);
}
hora_result_t hora__cast_f32_to_bf16_cuda(void *dst, const float *src, size_t count, void *stream) {
  return hora__cast_f32_to_bf16_host(dst, src, count, stream);
}
hora_result_t hora__cast_bf16_to_f32_cuda(float *dst, const void *src, size_t count, void *stream) {
  return hora__cast_bf16_to_f32_host(dst, src, count, stream);
}
hora_result_t hora__batched_copy_cuda(const hora_copy_desc_t *descs, size_t n, void *stream) {
  return hora__batched_copy_host(descs, n, stream);
}
