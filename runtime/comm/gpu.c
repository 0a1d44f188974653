/* Device selection, the per-context GPU state, and the device-buffer collectives behind
 * hora__gpu_hooks: scaling, averaging and compression around one of three transports.
 *
 *   hora_allreduce(device=CUDA)
 *     -> prescale (scale kernel)  [-> cast f32 -> f16/bf16 when HORA_COMPRESSION is set]
 *     -> path: nccl   ncclAllReduce on hora's stream                      (comm/nccl.c)
 *              staged pipelined ring through pinned host memory, GPU reduce (comm/staged.c)
 *              naive  whole buffer D2H, MPI_Allreduce, H2D               (comm/staged.c)
 *     [-> cast back to f32] -> average and postscale (scale kernel) -> wait for the stream
 *
 * HORA_GPU_PATH=auto takes NCCL unless the build has no NCCL or two ranks of one node use the same
 * GPU (NCCL refuses that with "Duplicate GPU detected"); then the staged ring. Every rank computes
 * the same choice from values agreed over the world when the state is created. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/coll.h"
#include "comm/gpu.h"
#include "hora_kernels.h"

#if !HORA_HAVE_CUDA

/* No device path: the hooks stay NULL and device buffers are HORA_ERR_NOT_SUPPORTED. */
hora_gpu_hooks_t hora__gpu_hooks;

hora_result_t hora__gpu_on_init(hora_ctx_t *ctx) {
  (void)ctx;
  return HORA_SUCCESS;
}

#else

hora_result_t hora__cuda_error(cudaError_t e, const char *what, const char *file, int line) {
  return hora__error(HORA_ERR_CUDA, file, line, "%s failed: %s (%s)", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

/* Make GPU `dev` current on this thread; *prev receives the one to restore (device_leave). */
static hora_result_t device_enter(int dev, int *prev) {
  *prev = dev;
  cudaGetDevice(prev);
  if (*prev != dev) HORA_CUDA_CHECK(cudaSetDevice(dev));
  return HORA_SUCCESS;
}

static void device_leave(int dev, int prev) {
  if (prev != dev) cudaSetDevice(prev);
}

hora_result_t hora__gpu_enter(hora_gpu_t *g, int *prev) { return device_enter(g->device, prev); }

static void gpu_leave(hora_gpu_t *g, int prev) { device_leave(g->device, prev); }

hora_result_t hora__gpu_dev_buf(hora_gpu_t *g, void **buf, size_t *cur, size_t bytes) {
  if (*cur >= bytes && *buf) return HORA_SUCCESS;
  if (*buf) {
    cudaStreamSynchronize(g->stream);
    cudaStreamSynchronize(g->d2h);
    cudaFree(*buf);
    *buf = NULL;
    *cur = 0;
  }
  cudaError_t e = cudaMalloc(buf, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    *buf = NULL;
    return HORA_ERR(e == cudaErrorMemoryAllocation ? HORA_ERR_NO_MEMORY : HORA_ERR_CUDA,
                    "cudaMalloc(%zu bytes) of hora's device scratch failed: %s", bytes, cudaGetErrorString(e));
  }
  *cur = bytes;
  return HORA_SUCCESS;
}

/* Abort this GPU's NCCL communicator (its kernels wait for a peer that will never come) and mark
 * it dead, so no later call uses it. */
static void abort_nccl(hora_gpu_t *g) {
#if HORA_HAVE_NCCL
  if (g->nccl) {
    ncclCommAbort(g->nccl);
    g->nccl = NULL;
    g->nccl_dead = 1;
  }
#else
  (void)g;
#endif
}

hora_result_t hora__gpu_pinned_buf(hora_gpu_t *g, void **buf, size_t *cur, size_t bytes) {
  if (*cur >= bytes && *buf) return HORA_SUCCESS;
  if (*buf) {
    cudaStreamSynchronize(g->stream);
    cudaStreamSynchronize(g->d2h);
    cudaFreeHost(*buf);
    *buf = NULL;
    *cur = 0;
  }
  cudaError_t e = cudaMallocHost(buf, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    *buf = NULL;
    return HORA_ERR(e == cudaErrorMemoryAllocation ? HORA_ERR_NO_MEMORY : HORA_ERR_CUDA,
                    "cudaMallocHost(%zu bytes) of hora's pinned staging buffer failed: %s", bytes,
                    cudaGetErrorString(e));
  }
  *cur = bytes;
  return HORA_SUCCESS;
}

/* Poll until stream s (or, with s NULL, event ev) has completed: spin briefly, then yield the
 * CPU, watching the heartbeat's verdict and HORA_PEER_TIMEOUT_S. With a GPU state g, an NCCL
 * asynchronous error or a timeout aborts g's communicator (its kernels would wait for ever). */
static hora_result_t poll_done(hora_ctx_t *ctx, hora_gpu_t *g, cudaStream_t s, cudaEvent_t ev, const char *what) {
  const double timeout = hora__params()->peer_timeout_s;
  double t0 = 0;
  for (unsigned spin = 0;; spin++) {
    cudaError_t e = s ? cudaStreamQuery(s) : cudaEventQuery(ev);
    if (e == cudaSuccess) return HORA_SUCCESS;
    if (e != cudaErrorNotReady) return hora__cuda_error(e, what, __FILE__, __LINE__);
#if HORA_HAVE_NCCL
    if (g && g->nccl) {
      ncclResult_t ae = ncclSuccess;
      ncclCommGetAsyncError(g->nccl, &ae);
      if (ae != ncclSuccess && ae != ncclInProgress) {
        ncclCommAbort(g->nccl);
        g->nccl = NULL;
        g->nccl_dead = 1;
        return HORA_ERR(ae == ncclRemoteError || ae == ncclSystemError ? HORA_ERR_REMOTE : HORA_ERR_NCCL,
                        "%s: NCCL reported an asynchronous error (%s); the communicator was aborted",
                        what, ncclGetErrorString(ae));
      }
    }
#endif
    if (spin == 1000) t0 = hora__now_s();
    if (spin > 1000 && hora__ctx_failed(ctx)) {
      /* A peer was declared dead or stopped (the heartbeat's verdict): NCCL kernels waiting for
       * it would never finish, so abort the communicator; other queued work finishes alone. */
      if (g) abort_nccl(g);
      return hora__ctx_verdict(ctx, what);
    }
    if (spin > 1000) {
      if (timeout > 0 && (spin & 255) == 0 && hora__now_s() - t0 > timeout) {
        if (g) abort_nccl(g);
        return HORA_ERR(HORA_ERR_TIMEOUT,
                        "%s: the GPU work did not finish within HORA_PEER_TIMEOUT_S=%g s (%s)%s", what, timeout,
                        s ? "a peer is dead or stuck" : "the work recorded before the ready event is stuck",
                        g && HORA_HAVE_NCCL ? "; the NCCL communicator was aborted" : "");
      }
      sched_yield();
    }
  }
}

hora_result_t hora__gpu_wait(hora_ctx_t *ctx, hora_gpu_t *g, cudaStream_t s, const char *what) {
  return poll_done(ctx, g, s, NULL, what);
}

/* hora_set_call_ready's event, waited for on the engine thread before the request's data moves. */
static hora_result_t hook_wait_event(hora_ctx_t *ctx, void *event, const char *what) {
  char msg[192];
  snprintf(msg, sizeof msg, "tensor '%.100s': waiting for its ready event (hora_set_call_ready)", what);
  /* This rank's GPU current on the engine thread: a CUDA call with none would make GPU 0's
   * primary context in every rank's process. */
  int prev = ctx->device;
  if (ctx->device >= 0) HORA_CHECK(device_enter(ctx->device, &prev));
  hora_result_t rc = poll_done(ctx, NULL, NULL, (cudaEvent_t)event, msg);
  if (ctx->device >= 0) device_leave(ctx->device, prev);
  return rc;
}

/* ---- the state ---- */

static void state_free(hora_gpu_t *g) {
  if (!g) return;
  int prev = g->device;
  cudaGetDevice(&prev);
  cudaSetDevice(g->device);
  if (g->stream) cudaStreamSynchronize(g->stream);
  if (g->d2h) cudaStreamSynchronize(g->d2h);
#if HORA_HAVE_NCCL
  hora__nccl_free(g);
#endif
  for (int i = 0; i < HORA_STAGED_SLOTS; i++) {
    if (g->ev_d2h[i]) cudaEventDestroy(g->ev_d2h[i]);
    if (g->ev_h2d[i]) cudaEventDestroy(g->ev_h2d[i]);
  }
  if (g->h_send) cudaFreeHost(g->h_send);
  if (g->h_recv) cudaFreeHost(g->h_recv);
  if (g->h_whole) cudaFreeHost(g->h_whole);
  if (g->d_tmp) cudaFree(g->d_tmp);
  if (g->d_scratch) cudaFree(g->d_scratch);
  if (g->d_join) cudaFree(g->d_join);
  if (g->d_fusion) cudaFree(g->d_fusion);
  if (g->stream) cudaStreamDestroy(g->stream);
  if (g->d2h) cudaStreamDestroy(g->d2h);
  if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
  if (prev != g->device) cudaSetDevice(prev);
  free(g);
}

static hora_result_t state_finalize(hora_ctx_t *ctx, void *arg) {
  state_free(arg);
  ctx->gpu = NULL;
  return HORA_SUCCESS;
}

/* 1 if another local rank uses the same physical GPU (compared by UUID). Collective over
 * ctx->local and ctx->world: every rank takes part even when its own query failed (it then
 * contributes a zero UUID and returns the error after the collectives). */
static hora_result_t detect_shared(hora_ctx_t *ctx, int device, int *shared) {
  unsigned char mine[16] = {0};
  struct cudaDeviceProp prop;
  hora_result_t local = HORA_SUCCESS;
  cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e == cudaSuccess) memcpy(mine, prop.uuid.bytes, 16);
  else local = hora__cuda_error(e, "cudaGetDeviceProperties", __FILE__, __LINE__);
  unsigned char *all = calloc((size_t)ctx->local_size, 16);
  int dup = 0, rc = MPI_Allgather(mine, 16, MPI_BYTE, all ? all : mine, all ? 16 : 0, MPI_BYTE, ctx->local);
  if (!all && local == HORA_SUCCESS) local = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  if (rc != MPI_SUCCESS && local == HORA_SUCCESS) local = hora__mpi_error(rc, "MPI_Allgather(GPU UUIDs)", __FILE__, __LINE__);
  for (int i = 0; all && local == HORA_SUCCESS && i < ctx->local_size; i++)
    if (i != ctx->local_rank && memcmp(all + 16 * (size_t)i, mine, 16) == 0) dup = 1;
  free(all);
  rc = MPI_Allreduce(&dup, shared, 1, MPI_INT, MPI_MAX, ctx->world);
  if (rc != MPI_SUCCESS && local == HORA_SUCCESS) local = hora__mpi_error(rc, "MPI_Allreduce(shared GPU)", __FILE__, __LINE__);
  return local;
}

static hora_result_t choose_path(hora_ctx_t *ctx, hora_gpu_t *g) {
  const char *want = hora__params()->gpu_path;
  if (!strcmp(want, "staged")) g->path = HORA_GPU_PATH_STAGED;
  else if (!strcmp(want, "naive")) g->path = HORA_GPU_PATH_NAIVE;
  else if (!strcmp(want, "nccl")) {
    if (!HORA_HAVE_NCCL)
      return HORA_ERR(HORA_ERR_NOT_SUPPORTED, "HORA_GPU_PATH=nccl but this build of hora has no NCCL");
    if (g->shared_gpu)
      return HORA_ERR(HORA_ERR_NOT_SUPPORTED,
                      "HORA_GPU_PATH=nccl but two ranks of one node share a GPU, which NCCL refuses "
                      "(\"Duplicate GPU detected\"); use HORA_GPU_PATH=auto or staged");
    g->path = HORA_GPU_PATH_NCCL;
  } else {
    g->path = (HORA_HAVE_NCCL && !g->shared_gpu) ? HORA_GPU_PATH_NCCL : HORA_GPU_PATH_STAGED;
    /* Ranks sharing one GPU (docs/benchmarks.md "GPU path"): where naive's one MPI_Allreduce
     * and the staged ring cross depends on the host more than on the GPU. On 2 ranks staged/naive
     * was 0.71x at 1 MiB and 1.37x at 16 MiB on an H200, 0.93x at 1 MiB and 1.32x at 2 MiB on an
     * H100; on 4 ranks 0.79x at 16 MiB and 2.5x at 32 MiB on the H200, 1.57x at 8 MiB and 2.10x at
     * 16 MiB on the H100. The thresholds keep the worst measured loss on either machine smallest
     * (about 1.3x, at 16 MiB on the H200's 4 ranks). Every rank computes the same value. */
    if (g->shared_gpu) g->naive_below = ctx->size >= 4 ? ((size_t)16 << 20) : ((size_t)2 << 20);
  }
  static const char *const names[] = {"nccl", "staged", "naive"};
  if (ctx->rank == 0)
    HORA_INFO(CUDA, "device collectives use the %s path (HORA_GPU_PATH=%s%s%s)", names[g->path], want,
              g->shared_gpu ? ", ranks share a GPU" : "", HORA_HAVE_NCCL ? "" : ", no NCCL in this build");
  return HORA_SUCCESS;
}

hora_result_t hora__gpu_state(hora_ctx_t *ctx, hora_gpu_t **out) {
  if (ctx->gpu) {
    *out = ctx->gpu;
    return HORA_SUCCESS;
  }
  int ndev = 0;
  hora_result_t local = HORA_SUCCESS;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0)
    local = HORA_ERR(HORA_ERR_NOT_SUPPORTED, "device buffers: rank %d sees no GPU (%s)", ctx->rank,
                     e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  else if (ctx->device < 0 || ctx->device >= ndev)
    local = HORA_ERR(HORA_ERR_NOT_SUPPORTED, "device buffers: rank %d has no usable GPU (device %d of %d)",
                     ctx->rank, ctx->device, ndev);
  HORA_CHECK(hora__agree(ctx, "device collective", local));

  /* From here every rank runs the same collectives (dup, UUID exchange, agree) whatever fails
   * locally; local failures are agreed at the end so that all ranks return the same code. */
  hora_gpu_t *g = calloc(1, sizeof *g);
  if (g) {
    g->device = ctx->device;
    g->comm = MPI_COMM_NULL;
  }
  int prev = ctx->device;
  local = g ? hora__gpu_enter(g, &prev) : HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  MPI_Comm dup = MPI_COMM_NULL;
  int mrc = MPI_Comm_dup(ctx->world, &dup);
  if (g) g->comm = dup;
  else if (dup != MPI_COMM_NULL) MPI_Comm_free(&dup);
  if (mrc != MPI_SUCCESS && local == HORA_SUCCESS) local = hora__mpi_error(mrc, "MPI_Comm_dup", __FILE__, __LINE__);
  if (mrc == MPI_SUCCESS && g) MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
  if (local == HORA_SUCCESS) {
    /* Blocking streams: they order after the caller's work on the legacy default stream. */
    e = cudaStreamCreateWithFlags(&g->stream, cudaStreamDefault);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g->d2h, cudaStreamDefault);
    for (int i = 0; i < HORA_STAGED_SLOTS && e == cudaSuccess; i++) {
      e = cudaEventCreateWithFlags(&g->ev_d2h[i], cudaEventDisableTiming);
      if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->ev_h2d[i], cudaEventDisableTiming);
    }
    if (e != cudaSuccess) local = hora__cuda_error(e, "creating hora's CUDA streams and events", __FILE__, __LINE__);
  }
  int shared = 0;
  hora_result_t drc = detect_shared(ctx, ctx->device, &shared);
  if (local == HORA_SUCCESS) local = drc;
  if (g) g->shared_gpu = shared;
  if (local == HORA_SUCCESS) local = choose_path(ctx, g);
  if (local == HORA_SUCCESS) local = hora__ctx_add_finalizer(ctx, state_finalize, g);
  hora_result_t rc = hora__agree(ctx, "device collective", local);
  if (rc != HORA_SUCCESS) {
    if (local == HORA_SUCCESS) {
      /* The finalizer is registered but the state is not used: it frees it at finalize. */
      if (g) gpu_leave(g, prev);
      return rc;
    }
    if (g) {
      gpu_leave(g, prev);
      state_free(g);
    }
    return rc;
  }
  gpu_leave(g, prev);
  ctx->gpu = g;
  *out = g;
  return HORA_SUCCESS;
}

/* ---- helpers shared by the hooks ---- */

static int is_float(hora_dtype_t d) {
  return d == HORA_FLOAT16 || d == HORA_BFLOAT16 || d == HORA_FLOAT32 || d == HORA_FLOAT64;
}

/* HORA_AVERAGE on an integer device buffer: exact truncating division on the host (the kernels
 * have only a multiply by a double, which can round 21 * (1/3) down to 6). A slow path: integer
 * averages of device buffers are rare. */
static hora_result_t int_average(hora_ctx_t *ctx, hora_gpu_t *g, void *buf, size_t count, hora_dtype_t dtype) {
  size_t bytes = count * hora__dtype_size(dtype);
  HORA_CHECK(hora__gpu_pinned_buf(g, &g->h_whole, &g->h_whole_bytes, bytes));
  HORA_CUDA_CHECK(cudaMemcpyAsync(g->h_whole, buf, bytes, cudaMemcpyDeviceToHost, g->stream));
  HORA_CHECK(hora__gpu_wait(ctx, g, g->stream, "allreduce (integer average)"));
  HORA_CHECK(hora__scale_and_average(ctx, g->h_whole, count, dtype, HORA_AVERAGE, 1.0));
  HORA_CUDA_CHECK(cudaMemcpyAsync(buf, g->h_whole, bytes, cudaMemcpyHostToDevice, g->stream));
  return HORA_SUCCESS;
}

/* Average and postscale of a reduced device buffer, enqueued on g->stream. */
static hora_result_t finish_scale(hora_ctx_t *ctx, hora_gpu_t *g, void *buf, size_t count,
                                  hora_dtype_t dtype, hora_op_t op, double postscale) {
  if (op == HORA_AVERAGE && !is_float(dtype)) return int_average(ctx, g, buf, count, dtype);
  double f = postscale;
  if (op == HORA_AVERAGE) f /= (double)ctx->size;
  if (f != 1.0) HORA_CHECK(hora__scale_cuda(buf, buf, count, dtype, f, g->stream));
  return HORA_SUCCESS;
}

/* In-place (src == dst) or out-of-place reduction over the world by the context's path. */
static hora_result_t reduce_path(hora_ctx_t *ctx, hora_gpu_t *g, const void *src, void *dst,
                                 size_t count, hora_dtype_t dtype, hora_op_t op) {
#if HORA_HAVE_NCCL
  if (g->path == HORA_GPU_PATH_NCCL) return hora__nccl_allreduce(ctx, g, src, dst, count, dtype, op);
#endif
  if (src != dst)
    HORA_CUDA_CHECK(cudaMemcpyAsync(dst, src, count * hora__dtype_size(dtype), cudaMemcpyDeviceToDevice, g->stream));
  if (ctx->size == 1) return HORA_SUCCESS;
  if (g->path == HORA_GPU_PATH_NAIVE || count * hora__dtype_size(dtype) < g->naive_below)
    return hora__naive_allreduce(ctx, g, dst, count, dtype, op);
  return hora__staged_allreduce(ctx, g, dst, count, dtype, op);
}

/* The allreduce of one device buffer, enqueued on g->stream (the staged and naive paths and integer
 * averages complete inside); the caller waits. */
static hora_result_t allreduce_enqueue(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, void *recvbuf,
                                       size_t count, hora_dtype_t dtype, hora_op_t op,
                                       double prescale, double postscale) {
  const hora_op_t wire_op = op == HORA_AVERAGE ? HORA_SUM : op;
  const char *comp = hora__params()->compression;
  hora_dtype_t wire = dtype;
  if (dtype == HORA_FLOAT32 && !strcmp(comp, "fp16")) wire = HORA_FLOAT16;
  if (dtype == HORA_FLOAT32 && !strcmp(comp, "bf16")) wire = HORA_BFLOAT16;
  const void *src = sendbuf;
  if (prescale != 1.0) {
    HORA_CHECK(hora__scale_cuda(recvbuf, sendbuf, count, dtype, prescale, g->stream));
    src = recvbuf;
  }
  if (wire != dtype) {
    /* Compression: f32 -> 16 bits in scratch, reduce the 16-bit values, cast back into recvbuf. */
    HORA_CHECK(hora__gpu_dev_buf(g, &g->d_scratch, &g->d_scratch_bytes, count * 2));
    if (wire == HORA_FLOAT16) HORA_CHECK(hora__cast_f32_to_f16_cuda(g->d_scratch, src, count, g->stream));
    else HORA_CHECK(hora__cast_f32_to_bf16_cuda(g->d_scratch, src, count, g->stream));
    HORA_CHECK(reduce_path(ctx, g, g->d_scratch, g->d_scratch, count, wire, wire_op));
    if (wire == HORA_FLOAT16) HORA_CHECK(hora__cast_f16_to_f32_cuda(recvbuf, g->d_scratch, count, g->stream));
    else HORA_CHECK(hora__cast_bf16_to_f32_cuda(recvbuf, g->d_scratch, count, g->stream));
  } else {
    HORA_CHECK(reduce_path(ctx, g, src, recvbuf, count, dtype, wire_op));
  }
  return finish_scale(ctx, g, recvbuf, count, dtype, op, postscale);
}

static hora_result_t gpu_allreduce_body(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype_t dtype, hora_op_t op,
                                        double prescale, double postscale) {
  /* Adasum on every GPU path: through host memory (staged.c; NCCL has no such reduction). */
  if (op == HORA_ADASUM) return hora__staged_adasum(ctx, g, sendbuf, recvbuf, count, dtype, prescale, postscale);
  HORA_CHECK(allreduce_enqueue(ctx, g, sendbuf, recvbuf, count, dtype, op, prescale, postscale));
  return hora__gpu_wait(ctx, g, g->stream, "hora_allreduce");
}

/* ---- async starts for the engine (see gpu.h) ---- */

struct hora_gpu_pending {
  hora_gpu_t *g;
  cudaEvent_t done_ev; /* NULL when the op completed inside the start call */
  hora_result_t rc;
  int done;
  double t0;
};

static hora_result_t start_nccl(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, void *recvbuf, size_t count,
                                hora_dtype_t dtype, hora_op_t op, double prescale, double postscale) {
#if HORA_HAVE_NCCL
  const char *comp = hora__params()->compression;
  hora_dtype_t wire = dtype;
  if (dtype == HORA_FLOAT32 && !strcmp(comp, "fp16")) wire = HORA_FLOAT16;
  if (dtype == HORA_FLOAT32 && !strcmp(comp, "bf16")) wire = HORA_BFLOAT16;
  const hora_op_t wire_op = op == HORA_AVERAGE ? HORA_SUM : op;
  const void *src = sendbuf;
  if (prescale != 1.0) {
    HORA_CHECK(hora__scale_cuda(recvbuf, sendbuf, count, dtype, prescale, g->stream));
    src = recvbuf;
  }
  if (wire != dtype) {
    void *tmp = NULL;
    HORA_CUDA_CHECK(cudaMallocAsync(&tmp, count * 2, g->stream));
    hora_result_t rc = wire == HORA_FLOAT16 ? hora__cast_f32_to_f16_cuda(tmp, src, count, g->stream)
                                            : hora__cast_f32_to_bf16_cuda(tmp, src, count, g->stream);
    if (rc == HORA_SUCCESS) rc = hora__nccl_allreduce(ctx, g, tmp, tmp, count, wire, wire_op);
    if (rc == HORA_SUCCESS)
      rc = wire == HORA_FLOAT16 ? hora__cast_f16_to_f32_cuda(recvbuf, tmp, count, g->stream)
                                : hora__cast_bf16_to_f32_cuda(recvbuf, tmp, count, g->stream);
    cudaFreeAsync(tmp, g->stream);
    HORA_CHECK(rc);
  } else {
    HORA_CHECK(hora__nccl_allreduce(ctx, g, src, recvbuf, count, dtype, wire_op));
  }
  return finish_scale(ctx, g, recvbuf, count, dtype, op, postscale);
#else
  (void)ctx, (void)g, (void)sendbuf, (void)recvbuf, (void)count, (void)dtype, (void)op, (void)prescale, (void)postscale;
  return HORA_ERR(HORA_ERR_INTERNAL, "NCCL path without NCCL");
#endif
}

hora_result_t hora__gpu_allreduce_start(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                                        hora_dtype_t dtype, hora_op_t op, double prescale, double postscale,
                                        hora_gpu_pending_t **out) {
  hora_gpu_t *g;
  HORA_CHECK(hora__gpu_state(ctx, &g));
  hora_gpu_pending_t *p = calloc(1, sizeof *p);
  if (!p) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  p->g = g;
  p->t0 = hora__now_s();
  int prev;
  hora_result_t rc = hora__gpu_enter(g, &prev);
  if (rc != HORA_SUCCESS) {
    free(p);
    return rc;
  }
  if (count == 0) {
    p->done = 1;
  } else if (g->path != HORA_GPU_PATH_NCCL || (op == HORA_AVERAGE && !is_float(dtype)) || op == HORA_ADASUM) {
    /* MPI-driven paths, integer averages and Adasum: complete inside the call. */
    rc = gpu_allreduce_body(ctx, g, sendbuf, recvbuf, count, dtype, op, prescale, postscale);
    p->done = 1;
  } else {
    rc = start_nccl(ctx, g, sendbuf, recvbuf, count, dtype, op, prescale, postscale);
    if (rc == HORA_SUCCESS) {
      cudaError_t e = cudaEventCreateWithFlags(&p->done_ev, cudaEventDisableTiming);
      if (e == cudaSuccess) e = cudaEventRecord(p->done_ev, g->stream);
      if (e != cudaSuccess) rc = hora__cuda_error(e, "recording the completion event", __FILE__, __LINE__);
    }
  }
  gpu_leave(g, prev);
  if (rc != HORA_SUCCESS) {
    if (p->done_ev) cudaEventDestroy(p->done_ev);
    free(p);
    return rc;
  }
  *out = p;
  return HORA_SUCCESS;
}

hora_result_t hora__gpu_pending_poll(hora_ctx_t *ctx, hora_gpu_pending_t *p, int *done) {
  if (p->done) {
    *done = 1;
    return p->rc;
  }
  *done = 0;
  cudaError_t e = cudaEventQuery(p->done_ev);
  if (e == cudaSuccess) {
    p->done = 1;
    *done = 1;
    return p->rc = HORA_SUCCESS;
  }
  if (e != cudaErrorNotReady) {
    p->done = 1;
    *done = 1;
    return p->rc = hora__cuda_error(e, "device allreduce", __FILE__, __LINE__);
  }
#if HORA_HAVE_NCCL
  hora_gpu_t *g = p->g;
  ncclResult_t ae = ncclSuccess;
  if (g->nccl) ncclCommGetAsyncError(g->nccl, &ae);
  const double timeout = hora__params()->peer_timeout_s;
  int timed_out = timeout > 0 && hora__now_s() - p->t0 > timeout, lost = hora__ctx_failed(ctx);
  if ((ae != ncclSuccess && ae != ncclInProgress) || timed_out || lost || g->nccl_dead) {
    if (g->nccl) ncclCommAbort(g->nccl);
    g->nccl = NULL;
    g->nccl_dead = 1;
    p->done = 1;
    *done = 1;
    if (lost) return p->rc = hora__ctx_verdict(ctx, "device allreduce (the NCCL communicator was aborted)");
    if (timed_out)
      return p->rc = HORA_ERR(HORA_ERR_TIMEOUT, "device allreduce did not finish within HORA_PEER_TIMEOUT_S=%g s; "
                                                "the NCCL communicator was aborted", timeout);
    return p->rc = HORA_ERR(HORA_ERR_REMOTE, "device allreduce: NCCL failed (%s); the communicator was aborted",
                            ae != ncclSuccess ? ncclGetErrorString(ae) : "aborted earlier");
  }
#endif
  return HORA_SUCCESS;
}

void hora__gpu_pending_free(hora_ctx_t *ctx, hora_gpu_pending_t *p) {
  if (!p) return;
  int done = p->done;
  while (!done) {
    hora__gpu_pending_poll(ctx, p, &done);
    if (!done) sched_yield();
  }
  if (p->done_ev) cudaEventDestroy(p->done_ev);
  free(p);
}

hora_result_t hora__gpu_batched_copy(hora_ctx_t *ctx, const hora_copy_desc_t *descs, size_t n) {
  hora_gpu_t *g = ctx->gpu;
  if (!g)
    return HORA_ERR(HORA_ERR_INTERNAL, "device batched copy before the GPU state exists (hora__gpu_state is "
                                       "collective: create it when the ranks agree on the first device tensor)");
  int prev;
  HORA_CHECK(hora__gpu_enter(g, &prev));
  hora_result_t rc = hora__batched_copy_cuda(descs, n, g->stream);
  gpu_leave(g, prev);
  return rc;
}

/* ---- the hooks (arguments already validated by algo/coll.c) ---- */

/* A buffer passed as HORA_DEVICE_CUDA must be device (or managed) memory of this rank's GPU: host
 * memory would make NCCL or a kernel fault. Local check (cudaPointerGetAttributes, no sync); like
 * the host path's argument checks it is not agreed across ranks, so the other ranks of a
 * collective whose one rank fails it wait until HORA_PEER_TIMEOUT_S. */
static hora_result_t check_dev(hora_gpu_t *g, const char *fn, const char *what, const void *p, size_t bytes) {
  if (!bytes) return HORA_SUCCESS;
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* not sticky: clear it */
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not CUDA memory (%s) but device is HORA_DEVICE_CUDA",
                    fn, what, p, cudaGetErrorString(e));
  }
  if (a.type == cudaMemoryTypeManaged) return HORA_SUCCESS;
  if (a.type != cudaMemoryTypeDevice)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s (%p) is host memory but device is HORA_DEVICE_CUDA", fn, what, p);
  if (a.device != g->device)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s (%p) is memory of GPU %d but this rank uses GPU %d "
                    "(hora_device_index)", fn, what, p, a.device, g->device);
  return HORA_SUCCESS;
}
#define CHECK_DEV(fn, what, p, bytes)                           \
  do {                                                          \
    hora_result_t cd_ = check_dev(g, (fn), (what), (p), (bytes)); \
    if (cd_ != HORA_SUCCESS) {                                  \
      gpu_leave(g, prev_);                                      \
      return cd_;                                               \
    }                                                           \
  } while (0)

#define ENTER(fn)                         \
  hora_gpu_t *g;                          \
  HORA_CHECK(hora__gpu_state(ctx, &g));   \
  int prev_;                              \
  HORA_CHECK(hora__gpu_enter(g, &prev_)); \
  hora_result_t rc_

#define LEAVE()          \
  gpu_leave(g, prev_);   \
  return rc_

static hora_result_t hook_allreduce(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                                    hora_dtype_t dtype, hora_op_t op, double prescale, double postscale) {
  ENTER("hora_allreduce");
  size_t bytes = count * hora__dtype_size(dtype);
  CHECK_DEV("hora_allreduce", "sendbuf", sendbuf, bytes);
  CHECK_DEV("hora_allreduce", "recvbuf", recvbuf, bytes);
  rc_ = count ? gpu_allreduce_body(ctx, g, sendbuf, recvbuf, count, dtype, op, prescale, postscale) : HORA_SUCCESS;
  LEAVE();
}

/* A joined rank (hora_join) in the other ranks' device allreduce: the same call as theirs, on a
 * zeroed device buffer of its own with the result written beside it and never read, so that every
 * transport (NCCL, the staged ring, naive) meets the same calls on every rank and the joined rank
 * adds zeros, as Horovod's join does. The zeros are written at every call: an earlier, longer
 * call's result half covers part of this call's zero half. The memset runs on the legacy default
 * stream, which hora's blocking streams wait for. */
static hora_result_t hook_allreduce_zeros(hora_ctx_t *ctx, size_t count, hora_dtype_t dtype, hora_op_t op,
                                          double prescale, double postscale) {
  ENTER("hora_join");
  size_t bytes = count * hora__dtype_size(dtype);
  rc_ = count ? hora__gpu_dev_buf(g, &g->d_join, &g->d_join_bytes, 2 * bytes) : HORA_SUCCESS;
  if (rc_ == HORA_SUCCESS && count) {
    cudaError_t e = cudaMemset(g->d_join, 0, bytes);
    rc_ = e == cudaSuccess ? gpu_allreduce_body(ctx, g, g->d_join, (char *)g->d_join + bytes, count, dtype, op,
                                                prescale, postscale)
                           : hora__cuda_error(e, "cudaMemset (hora_join's zeros)", __FILE__, __LINE__);
  }
  LEAVE();
}

/* The device fusion buffer: FUSION_ALIGN zero bytes (the source of the padding), then the
 * members at 16-byte offsets (a multiple of every element size), so that the batched copy moves
 * 16-byte words, as Horovod pads its fused GPU entries. The padding is zeroed, reduced with the
 * rest and never read: zeros keep an integer sum from overflowing. Returns the bytes reduced
 * (from offset FUSION_ALIGN); off[i] is member i's offset in the buffer. */
#define FUSION_ALIGN 16
static size_t fusion_layout(const hora_seg_t *seg, size_t nseg, size_t es, size_t *off) {
  size_t total = 0;
  for (size_t i = 0; i < nseg; i++) {
    off[i] = FUSION_ALIGN + total;
    total += (seg[i].count * es + FUSION_ALIGN - 1) / FUSION_ALIGN * FUSION_ALIGN;
  }
  return total;
}

/* Pack the members into the fusion buffer (zeros where a source is NULL, and in the padding, copied
 * from the buffer's zero head): one batched-copy launch on g->stream, and a memset of the whole
 * buffer first on a rank that has joined. d has room for 2 * nseg. */
static hora_result_t fusion_pack(hora_gpu_t *g, const hora_seg_t *seg, size_t nseg, size_t es, const size_t *off,
                                 size_t total, hora_copy_desc_t *d) {
  char *fb = g->d_fusion;
  int any_null = 0;
  for (size_t i = 0; i < nseg; i++) any_null |= !seg[i].src && seg[i].count;
  /* A rank that has joined: every byte zero first, the members it has copied over them. */
  if (any_null) HORA_CUDA_CHECK(cudaMemsetAsync(fb, 0, FUSION_ALIGN + total, g->stream));
  size_t nd = 0;
  for (size_t i = 0; i < nseg; i++) {
    size_t b = seg[i].count * es, pad = (FUSION_ALIGN - b % FUSION_ALIGN) % FUSION_ALIGN;
    if (b && seg[i].src) d[nd++] = (hora_copy_desc_t){fb + off[i], seg[i].src, b};
    if (pad && !any_null) d[nd++] = (hora_copy_desc_t){fb + off[i] + b, fb, pad};
  }
  return hora__batched_copy_cuda(d, nd, g->stream);
}

/* Unpack the reduced fusion buffer into the destinations that are not NULL: one launch. */
static hora_result_t fusion_unpack(hora_gpu_t *g, const hora_seg_t *seg, size_t nseg, size_t es, const size_t *off,
                                   hora_copy_desc_t *d) {
  size_t nd = 0;
  for (size_t i = 0; i < nseg; i++)
    if (seg[i].count && seg[i].dst)
      d[nd++] = (hora_copy_desc_t){seg[i].dst, (char *)g->d_fusion + off[i], seg[i].count * es};
  return hora__batched_copy_cuda(d, nd, g->stream);
}

static hora_result_t fused_body(hora_ctx_t *ctx, hora_gpu_t *g, const hora_seg_t *seg, size_t nseg,
                                hora_dtype_t dtype, hora_op_t op, double prescale, double postscale) {
  size_t es = hora__dtype_size(dtype);
  size_t *off = malloc(nseg * sizeof *off);
  hora_copy_desc_t *d = malloc(2 * nseg * sizeof *d);
  hora_result_t rc = off && d ? HORA_SUCCESS : HORA_ERR(HORA_ERR_NO_MEMORY, "hora_allreduce_async: out of memory "
                                                        "(%zu members of a fused device group)", nseg);
  size_t total = rc == HORA_SUCCESS ? fusion_layout(seg, nseg, es, off) : 0;
  size_t had = g->d_fusion_bytes;
  if (rc == HORA_SUCCESS && total) rc = hora__gpu_dev_buf(g, &g->d_fusion, &g->d_fusion_bytes, FUSION_ALIGN + total);
  /* The zero head, written once per allocation (nothing writes it later). */
  if (rc == HORA_SUCCESS && total && g->d_fusion_bytes != had) {
    cudaError_t e = cudaMemsetAsync(g->d_fusion, 0, FUSION_ALIGN, g->stream);
    if (e != cudaSuccess) rc = hora__cuda_error(e, "cudaMemsetAsync (fusion buffer)", __FILE__, __LINE__);
  }
  if (rc == HORA_SUCCESS && total) rc = fusion_pack(g, seg, nseg, es, off, total, d);
  void *fb = total ? (char *)g->d_fusion + FUSION_ALIGN : NULL;
  if (rc == HORA_SUCCESS && total) rc = allreduce_enqueue(ctx, g, fb, fb, total / es, dtype, op, prescale, postscale);
  if (rc == HORA_SUCCESS && total) rc = fusion_unpack(g, seg, nseg, es, off, d);
  if (rc == HORA_SUCCESS && total) rc = hora__gpu_wait(ctx, g, g->stream, "hora_allreduce_async (fused device group)");
  free(off);
  free(d);
  return rc;
}

/* The async engine's fused group of device allreduces (engine/fusion.c), Horovod's fusion buffer
 * on the GPU: the members packed in order into a device buffer of hora's (one batched-copy
 * kernel), the buffer reduced in place as one tensor (prescale, compression, the context's path,
 * average and postscale as for one), unpacked by a second batched copy, and one wait for the GPU,
 * where reducing them one by one costs a collective and a wait each. Every rank forms the same
 * groups, so the buffers agree in layout. A NULL src (a rank that has joined) adds zeros, a NULL
 * dst discards. */
static hora_result_t hook_allreduce_segs(hora_ctx_t *ctx, const hora_seg_t *seg, size_t nseg, hora_dtype_t dtype,
                                         hora_op_t op, double prescale, double postscale) {
  ENTER("hora_allreduce_async");
  size_t es = hora__dtype_size(dtype);
  for (size_t i = 0; i < nseg; i++) {
    if (seg[i].src) CHECK_DEV("hora_allreduce_async", "sendbuf", seg[i].src, seg[i].count * es);
    if (seg[i].dst) CHECK_DEV("hora_allreduce_async", "recvbuf", seg[i].dst, seg[i].count * es);
  }
  rc_ = nseg ? fused_body(ctx, g, seg, nseg, dtype, op, prescale, postscale) : HORA_SUCCESS;
  LEAVE();
}

static hora_result_t hook_broadcast(hora_ctx_t *ctx, void *buf, size_t count, hora_dtype_t dtype, int root) {
  ENTER("hora_broadcast");
  CHECK_DEV("hora_broadcast", "buf", buf, count * hora__dtype_size(dtype));
  if (count == 0 || ctx->size == 1) rc_ = HORA_SUCCESS;
#if HORA_HAVE_NCCL
  else if (g->path == HORA_GPU_PATH_NCCL) rc_ = hora__nccl_broadcast(ctx, g, buf, count, dtype, root);
#endif
  else rc_ = hora__staged_broadcast(ctx, g, buf, count, dtype, root);
  LEAVE();
}

static hora_result_t hook_allgatherv(hora_ctx_t *ctx, const void *sendbuf, size_t sendcount, void *recvbuf,
                                     const size_t *recvcounts, hora_dtype_t dtype) {
  ENTER("hora_allgatherv");
  size_t total = 0;
  for (int i = 0; i < ctx->size; i++) total += recvcounts[i];
  CHECK_DEV("hora_allgatherv", "sendbuf", sendbuf, sendcount * hora__dtype_size(dtype));
  CHECK_DEV("hora_allgatherv", "recvbuf", recvbuf, total * hora__dtype_size(dtype));
#if HORA_HAVE_NCCL
  if (g->path == HORA_GPU_PATH_NCCL) rc_ = hora__nccl_allgatherv(ctx, g, sendbuf, recvbuf, recvcounts, dtype);
  else
#endif
    rc_ = hora__staged_allgatherv(ctx, g, sendbuf, sendcount, recvbuf, recvcounts, dtype);
  LEAVE();
}

static hora_result_t hook_allgather(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                                    hora_dtype_t dtype) {
  ENTER("hora_allgather");
  CHECK_DEV("hora_allgather", "sendbuf", sendbuf, count * hora__dtype_size(dtype));
  CHECK_DEV("hora_allgather", "recvbuf", recvbuf, count * (size_t)ctx->size * hora__dtype_size(dtype));
#if HORA_HAVE_NCCL
  if (g->path == HORA_GPU_PATH_NCCL) {
    size_t *counts = malloc((size_t)ctx->size * sizeof *counts);
    if (!counts) {
      rc_ = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_allgather: out of memory");
    } else {
      for (int i = 0; i < ctx->size; i++) counts[i] = count;
      rc_ = hora__nccl_allgatherv(ctx, g, sendbuf, recvbuf, counts, dtype);
      free(counts);
    }
  } else
#endif
    rc_ = hora__staged_allgather(ctx, g, sendbuf, recvbuf, count, dtype);
  LEAVE();
}

static hora_result_t hook_reducescatter(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t recvcount,
                                        hora_dtype_t dtype, hora_op_t op, double prescale, double postscale) {
  ENTER("hora_reducescatter");
  size_t es = hora__dtype_size(dtype), n = recvcount * (size_t)ctx->size;
  CHECK_DEV("hora_reducescatter", "sendbuf", sendbuf, n * es);
  CHECK_DEV("hora_reducescatter", "recvbuf", recvbuf, recvcount * es);
  if (recvcount == 0) rc_ = HORA_SUCCESS;
#if HORA_HAVE_NCCL
  else if (g->path == HORA_GPU_PATH_NCCL) {
    /* A prescale reduces a scaled copy in hora's scratch buffer (the caller's sendbuf is const). */
    const void *src = sendbuf;
    rc_ = HORA_SUCCESS;
    if (prescale != 1.0) {
      rc_ = hora__gpu_dev_buf(g, &g->d_scratch, &g->d_scratch_bytes, n * es);
      if (rc_ == HORA_SUCCESS) rc_ = hora__scale_cuda(g->d_scratch, sendbuf, n, dtype, prescale, g->stream);
      src = g->d_scratch;
    }
    if (rc_ == HORA_SUCCESS)
      rc_ = hora__nccl_reducescatter(ctx, g, src, recvbuf, recvcount, dtype, op == HORA_AVERAGE ? HORA_SUM : op);
    if (rc_ == HORA_SUCCESS) rc_ = finish_scale(ctx, g, recvbuf, recvcount, dtype, op, postscale);
    if (rc_ == HORA_SUCCESS) rc_ = hora__gpu_wait(ctx, g, g->stream, "hora_reducescatter");
  }
#endif
  else rc_ = hora__staged_reducescatter(ctx, g, sendbuf, recvbuf, recvcount, dtype, op, prescale, postscale);
  LEAVE();
}

static hora_result_t hook_alltoallv(hora_ctx_t *ctx, const void *sendbuf, const size_t *sendcounts, void *recvbuf,
                                    const size_t *recvcounts, hora_dtype_t dtype) {
  ENTER("hora_alltoallv");
  size_t stot = 0, rtot = 0;
  for (int i = 0; i < ctx->size; i++) {
    stot += sendcounts[i];
    rtot += recvcounts[i];
  }
  CHECK_DEV("hora_alltoallv", "sendbuf", sendbuf, stot * hora__dtype_size(dtype));
  CHECK_DEV("hora_alltoallv", "recvbuf", recvbuf, rtot * hora__dtype_size(dtype));
#if HORA_HAVE_NCCL
  if (g->path == HORA_GPU_PATH_NCCL) rc_ = hora__nccl_alltoallv(ctx, g, sendbuf, sendcounts, recvbuf, recvcounts, dtype);
  else
#endif
    rc_ = hora__staged_alltoallv(ctx, g, sendbuf, sendcounts, recvbuf, recvcounts, dtype);
  LEAVE();
}

static hora_result_t hook_alltoall(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                                   hora_dtype_t dtype) {
  size_t *counts = malloc((size_t)ctx->size * sizeof *counts);
  if (!counts) return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_alltoall: out of memory");
  for (int i = 0; i < ctx->size; i++) counts[i] = count;
  hora_result_t rc = hook_alltoallv(ctx, sendbuf, counts, recvbuf, counts, dtype);
  free(counts);
  return rc;
}

/* This rank's GPU; HORA_SUCCESS with *dev = -1 when it sees none. Local. */
static hora_result_t pick_device(hora_ctx_t *ctx, int *dev) {
  *dev = -1;
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    HORA_INFO(CUDA, "no GPU visible (%s): device buffers are not available on this rank",
              e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    cudaGetLastError(); /* clear the sticky "no device" error for later callers */
    return HORA_SUCCESS;
  }
  const hora_params_t *p = hora__params();
  int d;
  if (p->device >= 0) {
    if (p->device >= ndev) {
      const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                      "HORA_DEVICE=%lld but this rank sees only %d GPU%s (CUDA_VISIBLE_DEVICES=%s)",
                      (long long)p->device, ndev, ndev == 1 ? "" : "s", cvd ? cvd : "(unset)");
    }
    d = (int)p->device;
  } else {
    d = ctx->local_rank % ndev;
  }
  HORA_CUDA_CHECK(cudaSetDevice(d));
  char bus[32] = "?";
  cudaDeviceGetPCIBusId(bus, sizeof bus, d);
  HORA_INFO(CUDA, "rank %d (local rank %d) uses GPU %d of %d (PCI %s)%s", ctx->rank, ctx->local_rank, d,
            ndev, bus, p->device >= 0 ? " from HORA_DEVICE" : ", local rank modulo GPU count");
  *dev = d;
  return HORA_SUCCESS;
}

/* The table algo/coll.c routes device buffers through. */
hora_gpu_hooks_t hora__gpu_hooks = {
    .allreduce = hook_allreduce,
    .broadcast = hook_broadcast,
    .allgather = hook_allgather,
    .allgatherv = hook_allgatherv,
    .reducescatter = hook_reducescatter,
    .alltoall = hook_alltoall,
    .alltoallv = hook_alltoallv,
    .allreduce_zeros = hook_allreduce_zeros,
    .allreduce_segs = hook_allreduce_segs,
    .wait_event = hook_wait_event,
};

hora_result_t hora__gpu_on_init(hora_ctx_t *ctx) {
  int dev;
  /* A bad HORA_DEVICE on one rank fails hora_init on every rank (instead of a hang later). */
  HORA_CHECK(hora__agree(ctx, "hora_init (GPU selection)", pick_device(ctx, &dev)));
  if (dev >= 0) ctx->device = dev;
  return HORA_SUCCESS;
}

#endif /* HORA_HAVE_CUDA */
