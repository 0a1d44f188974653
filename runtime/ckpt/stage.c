/* Snapshot memory. The writer's staging buffer is allocated once and reused (a fresh gigabyte
 * of malloc'd memory costs page faults on every save); in CUDA builds it is pinned
 * (cudaHostAlloc) as soon as a save contains device tensors, so that their device-to-host
 * copies run as DMA with cudaMemcpyAsync on a stream of our own, overlapping the memcpy of the
 * host tensors. Only CUDA runtime API calls are used here (no kernels). */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "core/fatal.h"
#include "hora_kernels.h"

#if HORA_HAVE_CUDA
#include <cuda_runtime_api.h>

static hora_result_t cuda_err(cudaError_t e, const char *what) {
  return HORA_ERR(e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? HORA_ERR_NOT_SUPPORTED : HORA_ERR_CUDA,
                  "checkpoint: %s: %s", what, cudaGetErrorString(e));
}
#endif

hora_result_t hora__ck_stage_reserve(ck_stage_t *st, size_t bytes, int pinned) {
#if !HORA_HAVE_CUDA
  pinned = 0;
#endif
  if (st->p && st->cap >= bytes && (st->pinned || !pinned)) return HORA_SUCCESS;
  hora__ck_stage_free(st);
  size_t cap = bytes ? bytes : 1;
#if HORA_HAVE_CUDA
  if (pinned) {
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, cap, cudaHostAllocDefault);
    if (e != cudaSuccess) return cuda_err(e, "cudaHostAlloc of the staging buffer");
    st->p = p;
    st->cap = cap;
    st->pinned = 1;
    return HORA_SUCCESS;
  }
#endif
  st->p = malloc(cap);
  if (!st->p) return HORA_ERR(HORA_ERR_NO_MEMORY, "checkpoint: cannot allocate a %zu-byte staging buffer", cap);
  st->cap = cap;
  st->pinned = 0;
  return HORA_SUCCESS;
}

void hora__ck_stage_free(ck_stage_t *st) {
  if (!st->p) return;
#if HORA_HAVE_CUDA
  if (st->pinned)
    cudaFreeHost(st->p);
  else
#endif
    free(st->p);
  st->p = NULL;
  st->cap = 0;
  st->pinned = 0;
}

/* Host copies, split over HORA_CKPT_SNAPSHOT_THREADS threads: one thread cannot reach a node's
 * memory bandwidth. The default (0) takes the CPUs of this rank's affinity mask, at most 4: launch
 * binds each rank to its own cores, so these are cores the rank owns (1 GiB on an idle 2-core VM:
 * 151 ms with one thread, 80 ms with two; more threads than free cores make it slower).
 * Worker w copies bytes [w*T/W, (w+1)*T/W) of the staging layout, crossing tensor borders. */
typedef struct {
  hora_tensor_t *t;
  size_t n;
  const size_t *off;
  unsigned char *buf;
  int dir;
  size_t lo, hi; /* byte range of the staging buffer */
} copy_job_t;

static void copy_range(copy_job_t *j) {
  for (size_t i = 0; i < j->n; i++) {
    if (j->t[i].device == HORA_DEVICE_CUDA || !j->t[i].count) continue;
    size_t a = j->off[i], b = a + j->t[i].count * hora__dtype_size(j->t[i].dtype);
    size_t lo = a > j->lo ? a : j->lo, hi = b < j->hi ? b : j->hi;
    if (lo >= hi) continue;
    unsigned char *user = (unsigned char *)j->t[i].data + (lo - a);
    /* the snapshot is read next by the writer's write(), long after it left the caches */
    if (j->dir == 0 && hi - lo >= ((size_t)1 << 20)) hora__copy_stream_host(j->buf + lo, user, hi - lo);
    else if (j->dir == 0) memcpy(j->buf + lo, user, hi - lo);
    else memcpy(user, j->buf + lo, hi - lo);
  }
}

/* A helper thread's entry (the calling thread does the first share itself, under its own name). */
static void *copy_range_thread(void *arg) {
  hora__thread_name("hora-ckpt-stage");
  copy_range(arg);
  return NULL;
}

static void copy_host(hora_tensor_t *t, size_t n, const size_t *off, unsigned char *buf, int dir) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    size_t end = off[i] + t[i].count * hora__dtype_size(t[i].dtype);
    if (end > total) total = end;
  }
  enum { MAX_THREADS = 16 };
  size_t want = (size_t)hora__params()->ckpt_snapshot_threads;
  if (want == 0) {
    cpu_set_t cs;
    want = sched_getaffinity(0, sizeof cs, &cs) == 0 ? (size_t)CPU_COUNT(&cs) : 1;
    if (want > 4) want = 4;
    if (want < 1) want = 1;
  }
  size_t w = total < ((size_t)64 << 20) ? 1 : want < MAX_THREADS ? want : MAX_THREADS;
  copy_job_t jobs[MAX_THREADS];
  pthread_t th[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  for (size_t k = 0; k < w; k++) {
    jobs[k] = (copy_job_t){t, n, off, buf, dir, total / w * k, k + 1 == w ? total : total / w * (k + 1)};
    if (k > 0) started[k] = pthread_create(&th[k], NULL, copy_range_thread, &jobs[k]) == 0;
  }
  copy_range(&jobs[0]);
  for (size_t k = 1; k < w; k++) {
    if (started[k]) pthread_join(th[k], NULL);
    else copy_range(&jobs[k]); /* no thread: do its share here */
  }
}

/* Copies between user tensors and a staging buffer; dir 0: tensors -> buf, 1: buf -> tensors. */
static hora_result_t copy_tensors(hora_tensor_t *t, size_t n, const size_t *off, unsigned char *buf, int dir,
                                  int device) {
  int any_dev = 0;
  for (size_t i = 0; i < n; i++) any_dev |= t[i].device == HORA_DEVICE_CUDA && t[i].count;
#if HORA_HAVE_CUDA
  cudaStream_t s = NULL;
  cudaError_t e;
  if (any_dev) {
    if (device >= 0 && (e = cudaSetDevice(device)) != cudaSuccess) return cuda_err(e, "cudaSetDevice");
    /* A blocking stream: it orders after the caller's work on the legacy default stream (as the
     * collectives' streams do, runtime/comm), so the snapshot sees the optimizer step that the
     * caller just enqueued there; a non-blocking stream could copy the weights before it. */
    if ((e = cudaStreamCreateWithFlags(&s, cudaStreamDefault)) != cudaSuccess)
      return cuda_err(e, "cudaStreamCreate");
    for (size_t i = 0; i < n; i++) {
      if (t[i].device != HORA_DEVICE_CUDA || !t[i].count) continue;
      size_t bytes = t[i].count * hora__dtype_size(t[i].dtype);
      e = dir == 0 ? cudaMemcpyAsync(buf + off[i], t[i].data, bytes, cudaMemcpyDefault, s)
                   : cudaMemcpyAsync(t[i].data, buf + off[i], bytes, cudaMemcpyDefault, s);
      if (e != cudaSuccess) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
        return HORA_ERR(HORA_ERR_CUDA, "checkpoint: copying tensor '%s' %s the device: %s", t[i].name,
                        dir == 0 ? "from" : "to", cudaGetErrorString(e));
      }
    }
  }
#else
  (void)device;
  if (any_dev)
    return HORA_ERR(HORA_ERR_NOT_SUPPORTED, "checkpoint: device tensors need a CUDA build of hora (this one has none)");
#endif
  /* Host tensors while the device copies run. */
  copy_host(t, n, off, buf, dir);
#if HORA_HAVE_CUDA
  if (any_dev) {
    e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    if (e != cudaSuccess) return cuda_err(e, "cudaStreamSynchronize after the tensor copies");
  }
#endif
  return HORA_SUCCESS;
}

hora_result_t hora__ck_gather(const hora_tensor_t *t, size_t n, const size_t *offsets, unsigned char *dst,
                              int device) {
  return copy_tensors((hora_tensor_t *)t, n, offsets, dst, 0, device);
}

hora_result_t hora__ck_scatter(hora_tensor_t *t, size_t n, const size_t *offsets, const unsigned char *src,
                               int device) {
  return copy_tensors(t, n, offsets, (unsigned char *)src, 1, device);
}
