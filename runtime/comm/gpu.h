/* runtime/comm: device-buffer collectives (CUDA, NCCL, MPI staged through pinned host memory).
 *
 * Who calls what:
 *   algo/coll.c routes HORA_DEVICE_CUDA buffers through hora__gpu_hooks (algo/coll.h), which
 *     gpu.c defines: linking any collective links this module.
 *   hora_init (init/init.c) -> hora__gpu_on_init: picks this rank's GPU.
 *   first device collective -> gpu_state(): collective creation of the per-context state (ctx->gpu):
 *     a dup of the world for staged traffic, two CUDA streams, events, the path (nccl | staged |
 *     naive) agreed by every rank. The NCCL communicator is made on first NCCL use.
 *   hora_finalize -> the state's finalizer: waits for the streams, destroys the communicator,
 *     frees device, pinned and host memory.
 *
 * Ordering with the caller's GPU work: hora's streams are created as blocking streams, so work
 * enqueued on them starts after everything the caller enqueued earlier on the legacy default
 * stream. Work on the caller's own non-blocking or per-thread streams must be complete (for
 * example cudaStreamSynchronize) before a device buffer is handed to hora. Blocking collectives
 * return once the result is in recvbuf (the host has waited for hora's streams). */
#ifndef HORA_COMM_GPU_H
#define HORA_COMM_GPU_H

#include "hora/config.h"
#include "core/ctx.h"
#include "hora_kernels.h"

/* Called by hora_init after the layout is known and before optional services start: choose the
 * GPU (HORA_DEVICE, else local rank modulo the visible GPU count), make it current on the calling
 * thread, record it in ctx->device and log it. Collective (agrees on errors over the world). A rank
 * without a visible GPU keeps ctx->device as core set it. Errors: HORA_ERR_INVALID_ARGUMENT when
 * HORA_DEVICE names a GPU that is not visible; HORA_ERR_CUDA when cudaSetDevice fails. Builds
 * without CUDA: no-op. */
hora_result_t hora__gpu_on_init(hora_ctx_t *ctx);

#if HORA_HAVE_CUDA
#include <cuda_runtime.h>
#if HORA_HAVE_NCCL
#include <nccl.h>
#endif

typedef enum { HORA_GPU_PATH_NCCL = 0, HORA_GPU_PATH_STAGED = 1, HORA_GPU_PATH_NAIVE = 2 } hora_gpu_path_t;

#define HORA_STAGED_SLOTS 4 /* chunks in flight in the staged ring */

typedef struct hora_gpu {
  int device;             /* CUDA ordinal */
  hora_gpu_path_t path;   /* agreed by every rank at creation */
  int shared_gpu;         /* 1 if two ranks of some node use the same GPU */
  size_t naive_below;     /* auto with a shared GPU: messages below this many bytes take the naive path */
  MPI_Comm comm;          /* dup of ctx->world for staged and naive traffic */
  cudaStream_t stream;    /* NCCL, scale and cast kernels; the staged path's H2D + reduce */
  cudaStream_t d2h;       /* the staged path's device->host copies */
  cudaEvent_t ev_d2h[HORA_STAGED_SLOTS], ev_h2d[HORA_STAGED_SLOTS];
  /* Staged ring buffers: HORA_STAGED_SLOTS chunks each (grown on demand). */
  void *h_send, *h_recv; /* pinned host */
  void *d_tmp;           /* device */
  size_t slot_bytes;
  /* Whole-buffer staging (naive path, other collectives): pinned host, grown on demand. */
  void *h_whole;
  size_t h_whole_bytes;
  /* Device scratch for compression and out-of-place helpers, grown on demand. */
  void *d_scratch;
  size_t d_scratch_bytes;
  /* A joined rank's zeros and discarded result (hook allreduce_zeros), grown on demand. */
  void *d_join;
  size_t d_join_bytes;
  /* The async engine's device fusion buffer (hook allreduce_segs), grown on demand to the
   * largest fused group: at most HORA_FUSION_THRESHOLD bytes plus 16 per member. */
  void *d_fusion;
  size_t d_fusion_bytes;
#if HORA_HAVE_NCCL
  ncclComm_t nccl; /* NULL until first use */
  int nccl_dead;   /* aborted after an error or timeout: every later NCCL call fails */
#endif
} hora_gpu_t;

/* The context's GPU state, created collectively on first use (every rank of the world must be in
 * the same device collective). HORA_ERR_NOT_SUPPORTED on every rank when any rank has no GPU. */
hora_result_t hora__gpu_state(hora_ctx_t *ctx, hora_gpu_t **out);

/* Make the context's GPU current on the calling thread; *prev gets the previous one (restore with
 * cudaSetDevice(prev)). */
hora_result_t hora__gpu_enter(hora_gpu_t *g, int *prev);

/* Map a CUDA error to HORA_ERR_CUDA with the call's text and CUDA's message. */
hora_result_t hora__cuda_error(cudaError_t e, const char *what, const char *file, int line);
#define HORA_CUDA_CHECK(call)                                                     \
  do {                                                                            \
    cudaError_t hora_cuda_rc_ = (call);                                           \
    if (hora_cuda_rc_ != cudaSuccess)                                             \
      return hora__cuda_error(hora_cuda_rc_, #call, __FILE__, __LINE__);          \
  } while (0)

/* Grow a device / pinned buffer to at least `bytes` (contents are not kept). Waits for the
 * context's streams before freeing the old buffer. */
hora_result_t hora__gpu_dev_buf(hora_gpu_t *g, void **buf, size_t *cur, size_t bytes);
hora_result_t hora__gpu_pinned_buf(hora_gpu_t *g, void **buf, size_t *cur, size_t bytes);

/* Wait until everything enqueued on `s` is done, polling so that a stuck GPU or a stuck NCCL peer
 * ends in HORA_ERR_TIMEOUT after HORA_PEER_TIMEOUT_S (0: wait forever) instead of a hang. With
 * NCCL, its asynchronous errors are polled too (ncclCommGetAsyncError) and the communicator is
 * aborted on an error or timeout. */
hora_result_t hora__gpu_wait(hora_ctx_t *ctx, hora_gpu_t *g, cudaStream_t s, const char *what);

/* ---- paths: in-place allreduce of `buf` (count elements, already prescaled; op is SUM for
 * AVERAGE) on the device; the caller applies the average and postscale. ---- */
hora_result_t hora__staged_allreduce(hora_ctx_t *ctx, hora_gpu_t *g, void *buf, size_t count,
                                     hora_dtype_t dtype, hora_op_t op);
hora_result_t hora__naive_allreduce(hora_ctx_t *ctx, hora_gpu_t *g, void *buf, size_t count,
                                    hora_dtype_t dtype, hora_op_t op);

/* Staged forms of the other collectives: whole buffer to pinned host memory, the host
 * collective, back to the device. Same arguments as the hooks (already validated). */
hora_result_t hora__staged_broadcast(hora_ctx_t *ctx, hora_gpu_t *g, void *buf, size_t count,
                                     hora_dtype_t dtype, int root);
hora_result_t hora__staged_allgather(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, void *recvbuf,
                                     size_t count, hora_dtype_t dtype);
hora_result_t hora__staged_allgatherv(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, size_t sendcount,
                                      void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype);
hora_result_t hora__staged_reducescatter(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf,
                                         void *recvbuf, size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                         double prescale, double postscale);
hora_result_t hora__staged_adasum(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, void *recvbuf,
                                  size_t count, hora_dtype_t dtype, double prescale, double postscale);
hora_result_t hora__staged_alltoallv(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf,
                                     const size_t *sendcounts, void *recvbuf, const size_t *recvcounts,
                                     hora_dtype_t dtype);

/* ---- for the async engine: start a device allreduce without waiting for the GPU ----
 * hora__gpu_allreduce_start: collective like hora_allreduce (same arguments, already validated;
 * every rank starts the same allreduces in the same order). On the NCCL path everything (prescale,
 * compression casts, ncclAllReduce, average/postscale) is enqueued on the context's stream and an
 * event recorded after it; the call returns without waiting for the GPU. The staged and naive
 * paths (MPI-driven) and integer averages (a host division) run to completion inside the call and
 * the pending op is already done. Compression scratch is per op (cudaMallocAsync/cudaFreeAsync on
 * the stream), so several ops may be in flight. On error no pending op is created.
 * hora__gpu_pending_poll: local, non-blocking: *done = 1 once the GPU finished; returns the op's
 * result (HORA_ERR_TIMEOUT after HORA_PEER_TIMEOUT_S from the start, HORA_ERR_REMOTE/NCCL when NCCL
 * reports an asynchronous error; the communicator is then aborted).
 * hora__gpu_pending_free: NULL is a no-op; waits for the op if it is still running.
 * hora__gpu_batched_copy: hora__batched_copy_cuda on the context's stream (fusion pack/unpack),
 * ordered with the allreduces started before and after it. Local, but the GPU state must exist
 * (HORA_ERR_INTERNAL otherwise): create it with hora__gpu_state at a point where every rank does. Not thread-safe for one context: the
 * engine thread is the only caller while it runs. */
typedef struct hora_gpu_pending hora_gpu_pending_t;
hora_result_t hora__gpu_allreduce_start(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                                        hora_dtype_t dtype, hora_op_t op, double prescale, double postscale,
                                        hora_gpu_pending_t **out);
hora_result_t hora__gpu_pending_poll(hora_ctx_t *ctx, hora_gpu_pending_t *p, int *done);
void hora__gpu_pending_free(hora_ctx_t *ctx, hora_gpu_pending_t *p);
hora_result_t hora__gpu_batched_copy(hora_ctx_t *ctx, const hora_copy_desc_t *descs, size_t n);

#if HORA_HAVE_NCCL
/* NCCL forms (comm/nccl.c): enqueue on g->stream and wait (hora__gpu_wait). */
hora_result_t hora__nccl_allreduce(hora_ctx_t *ctx, hora_gpu_t *g, const void *src, void *dst,
                                   size_t count, hora_dtype_t dtype, hora_op_t op);
hora_result_t hora__nccl_broadcast(hora_ctx_t *ctx, hora_gpu_t *g, void *buf, size_t count,
                                   hora_dtype_t dtype, int root);
hora_result_t hora__nccl_allgatherv(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, void *recvbuf,
                                    const size_t *recvcounts, hora_dtype_t dtype);
hora_result_t hora__nccl_reducescatter(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, void *recvbuf,
                                       size_t recvcount, hora_dtype_t dtype, hora_op_t op);
hora_result_t hora__nccl_alltoallv(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, const size_t *sendcounts,
                                   void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype);
/* Free the communicator (ncclCommDestroy, or ncclCommAbort when it is dead). */
void hora__nccl_free(hora_gpu_t *g);
#endif

#endif /* HORA_HAVE_CUDA */
#endif
