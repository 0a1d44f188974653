/* Argument checks of the collectives, shared by the blocking calls (coll.c) and the async engine's
 * calls (engine/api.c), so both follow hora.h's rules (NULL buffers, unknown dtype/op/device,
 * `count * element size` overflow, the in-place forms, "any other overlap is an error", root
 * range). The plain checks are local; the v-variants' checks are collective (they agree across
 * ranks). Nothing here moves data. */
#include <stdint.h>
#include <stdlib.h>

#include "algo/coll.h"

hora_result_t hora__check_buf(const char *fn, const char *what, const void *buf, size_t count,
                              hora_dtype_t dtype, size_t *bytes) {
  size_t es = hora__dtype_size(dtype);
  if (es == 0) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: dtype %d is not a hora_dtype_t", fn, (int)dtype);
  if (count > SIZE_MAX / es)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s count %zu x %zu bytes overflows size_t", fn,
                    what, count, es);
  if (count > 0 && !buf)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s is NULL but count is %zu", fn, what, count);
  /* The reduction kernels read and write elements as their C type, which C requires to be aligned
   * (and a vectorizing compiler may use aligned loads once it has peeled to a 16-byte boundary). A
   * buffer at an odd offset (a NumPy view into a byte buffer, a packed struct) is refused, never
   * reduced as it happens to work on this CPU. */
  if (count > 0 && ((uintptr_t)buf % es) != 0)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to %zu bytes, the size of one %s element",
                    fn, what, buf, es, hora__dtype_name(dtype));
  if (bytes) *bytes = count * es;
  return HORA_SUCCESS;
}

hora_result_t hora__check_common(hora_ctx_t *ctx, const char *fn, hora_dtype_t dtype,
                                 hora_device_t device) {
  HORA_CHECK(hora__ctx_check(ctx, fn));
  if (hora__dtype_size(dtype) == 0)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: dtype %d is not a hora_dtype_t", fn, (int)dtype);
  if (device != HORA_DEVICE_HOST && device != HORA_DEVICE_CUDA)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: device %d is not a hora_device_t", fn, (int)device);
  return HORA_SUCCESS;
}

static int overlaps_partially(const void *a, size_t abytes, const void *b, size_t bbytes) {
  if (!abytes || !bbytes || a == b) return 0;
  uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
  return pa < pb + bbytes && pb < pa + abytes;
}

/* Any overlap, the identical buffer included (for the collectives that have no in-place form). */
static int overlaps(const void *a, size_t abytes, const void *b, size_t bbytes) {
  if (!abytes || !bbytes) return 0;
  uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
  return pa < pb + bbytes && pb < pa + abytes;
}

/* Which of the two causes: a build without CUDA (common on a GPU node where the toolkit's nvcc was
 * not on PATH when hora was configured, e.g. by `pip install ./python` before `module load cuda`)
 * or a rank without a usable GPU. */
hora_result_t hora__device_unsupported(const char *fn) {
#if HORA_HAVE_CUDA
  return HORA_ERR(HORA_ERR_NOT_SUPPORTED,
                  "%s: device buffers (HORA_DEVICE_CUDA) need a GPU, and this rank has none it can use "
                  "(CUDA_VISIBLE_DEVICES, HORA_DEVICE; docs/gpu.md, \"Device selection\")", fn);
#else
  return HORA_ERR(HORA_ERR_NOT_SUPPORTED,
                  "%s: device buffers (HORA_DEVICE_CUDA): this libhora was built without CUDA (no nvcc "
                  "when it was configured); rebuild it with the CUDA toolkit's nvcc on PATH (docs/gpu.md, "
                  "\"Build\"), or pass host memory", fn);
#endif
}

/* Adasum's size rules (hora.h), part of the local argument checks: every rank reaches the same
 * verdict (the layout is the same everywhere), the blocking call returns it on every rank through
 * the call check's "invalid arguments", and the engine never sees a request that would fail it.
 * Host buffers: a power-of-two number of ranks. Device buffers (averaged within each node, Adasum
 * between nodes): the same number of ranks on every node and a power-of-two number of nodes. */
static hora_result_t check_adasum_layout(hora_ctx_t *ctx, const char *fn, hora_device_t device) {
  if (device != HORA_DEVICE_CUDA && (ctx->size & (ctx->size - 1)))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: HORA_ADASUM needs a power-of-two number of ranks "
                    "(this context has %d), as Horovod's Adasum does", fn, ctx->size);
  if (device == HORA_DEVICE_CUDA && !ctx->uniform_local_size)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: HORA_ADASUM on device buffers needs the same number of "
                    "ranks on every node (this context's nodes differ), as Horovod's GPU Adasum does", fn);
  if (device == HORA_DEVICE_CUDA && (ctx->cross_size & (ctx->cross_size - 1)))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: HORA_ADASUM on device buffers needs a power-of-two number "
                    "of nodes (this context spans %d), as Horovod's GPU Adasum does", fn, ctx->cross_size);
  return HORA_SUCCESS;
}

/* The op and scale factors of allreduce and reducescatter against the dtype. */
static hora_result_t check_scale(const char *fn, hora_dtype_t dtype, hora_op_t op, double prescale, double postscale) {
  int is_float = dtype == HORA_FLOAT16 || dtype == HORA_BFLOAT16 || dtype == HORA_FLOAT32 ||
                 dtype == HORA_FLOAT64;
  if (dtype == HORA_BOOL && op == HORA_AVERAGE)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "%s: HORA_AVERAGE is not defined for HORA_BOOL (SUM/MAX are OR, MIN/PRODUCT AND)", fn);
  if (!is_float && (prescale != 1.0 || postscale != 1.0))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "%s: prescale (%g) and postscale (%g) must be 1.0 for integer dtype %s", fn,
                    prescale, postscale, hora__dtype_name(dtype));
  if (!(prescale == prescale) || !(postscale == postscale))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: prescale or postscale is NaN", fn);
  return HORA_SUCCESS;
}

hora_result_t hora__check_allreduce(hora_ctx_t *ctx, const char *fn, const void *sendbuf,
                                    void *recvbuf, size_t count, hora_dtype_t dtype, hora_op_t op,
                                    double prescale, double postscale, hora_device_t device) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  if ((unsigned)op >= HORA_OP_COUNT && op != HORA_ADASUM)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: op %d is not a hora_op_t", fn, (int)op);
  if (op == HORA_ADASUM && dtype != HORA_FLOAT32 && dtype != HORA_FLOAT64)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: HORA_ADASUM needs HORA_FLOAT32 or HORA_FLOAT64, not %s",
                    fn, hora__dtype_name(dtype));
  if (op == HORA_ADASUM) HORA_CHECK(check_adasum_layout(ctx, fn, device));
  size_t bytes = 0;
  HORA_CHECK(hora__check_buf(fn, "sendbuf", sendbuf, count, dtype, &bytes));
  HORA_CHECK(hora__check_buf(fn, "recvbuf", recvbuf, count, dtype, NULL));
  if (overlaps_partially(sendbuf, bytes, recvbuf, bytes))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sendbuf and recvbuf overlap partially", fn);
  return check_scale(fn, dtype, op, prescale, postscale);
}

hora_result_t hora__check_broadcast(hora_ctx_t *ctx, const char *fn, void *buf, size_t count,
                                    hora_dtype_t dtype, int root, hora_device_t device, size_t *bytes) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  HORA_CHECK(hora__check_buf(fn, "buf", buf, count, dtype, bytes));
  if (root < 0 || root >= ctx->size)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: root %d is not a rank (world size %d)", fn, root, ctx->size);
  return HORA_SUCCESS;
}

/* *total = count * world size (elements of a buffer with one block per rank), or the error that
 * it overflows size_t bytes; `what` names the argument. */
static hora_result_t world_blocks(const hora_ctx_t *ctx, const char *fn, const char *what, size_t count,
                                  hora_dtype_t dtype, size_t *total) {
  if (count > SIZE_MAX / hora__dtype_size(dtype) / (size_t)ctx->size)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s %zu x world size %d overflows", fn, what, count, ctx->size);
  *total = count * (size_t)ctx->size;
  return HORA_SUCCESS;
}

hora_result_t hora__check_allgather(hora_ctx_t *ctx, const char *fn, const void *sendbuf, void *recvbuf,
                                    size_t count, hora_dtype_t dtype, hora_device_t device, size_t *bytes) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  size_t b;
  HORA_CHECK(hora__check_buf(fn, "sendbuf", sendbuf, count, dtype, &b));
  size_t total = 0;
  HORA_CHECK(world_blocks(ctx, fn, "count", count, dtype, &total));
  HORA_CHECK(hora__check_buf(fn, "recvbuf", recvbuf, total, dtype, NULL));
  const char *mine = (const char *)recvbuf + (size_t)ctx->rank * b;
  if (b && sendbuf != mine && overlaps(sendbuf, b, recvbuf, b * (size_t)ctx->size))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sendbuf overlaps recvbuf but is not this rank's block", fn);
  if (bytes) *bytes = b;
  return HORA_SUCCESS;
}

hora_result_t hora__check_reducescatter(hora_ctx_t *ctx, const char *fn, const void *sendbuf,
                                        void *recvbuf, size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                        double prescale, double postscale, hora_device_t device) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  if ((unsigned)op >= HORA_OP_COUNT)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: op %d is not a hora_op_t", fn, (int)op);
  HORA_CHECK(check_scale(fn, dtype, op, prescale, postscale));
  size_t es = hora__dtype_size(dtype);
  size_t total = 0;
  HORA_CHECK(world_blocks(ctx, fn, "recvcount", recvcount, dtype, &total));
  HORA_CHECK(hora__check_buf(fn, "sendbuf", sendbuf, total, dtype, NULL));
  HORA_CHECK(hora__check_buf(fn, "recvbuf", recvbuf, recvcount, dtype, NULL));
  if (recvcount && (const char *)recvbuf != (const char *)sendbuf + (size_t)ctx->rank * recvcount * es &&
      overlaps(sendbuf, total * es, recvbuf, recvcount * es))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "%s: recvbuf overlaps sendbuf but is not this rank's block (the in-place form)", fn);
  return HORA_SUCCESS;
}

hora_result_t hora__check_alltoall(hora_ctx_t *ctx, const char *fn, const void *sendbuf, void *recvbuf,
                                   size_t count, hora_dtype_t dtype, hora_device_t device) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  size_t es = hora__dtype_size(dtype);
  size_t total = 0;
  HORA_CHECK(world_blocks(ctx, fn, "count", count, dtype, &total));
  HORA_CHECK(hora__check_buf(fn, "sendbuf", sendbuf, total, dtype, NULL));
  HORA_CHECK(hora__check_buf(fn, "recvbuf", recvbuf, total, dtype, NULL));
  if (overlaps(sendbuf, total * es, recvbuf, total * es))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sendbuf and recvbuf overlap (alltoall is not in place)", fn);
  return HORA_SUCCESS;
}

/* Agree across ranks that `counts` (n entries) is identical everywhere. */
static hora_result_t check_same_counts(hora_ctx_t *ctx, const char *fn, const size_t *counts, int n) {
  uint64_t *mn = malloc(2 * (size_t)n * sizeof *mn);
  if (!mn) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
  uint64_t *mx = mn + n;
  for (int i = 0; i < n; i++) mn[i] = mx[i] = counts[i];
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int rc = MPI_Iallreduce(MPI_IN_PLACE, mn, n, MPI_UINT64_T, MPI_MIN, ctx->world, &req[0]);
  if (rc == MPI_SUCCESS) rc = MPI_Iallreduce(MPI_IN_PLACE, mx, n, MPI_UINT64_T, MPI_MAX, ctx->world, &req[1]);
  hora_result_t wrc = rc != MPI_SUCCESS ? hora__mpi_error(rc, "MPI_Iallreduce(counts)", __FILE__, __LINE__)
                                        : hora__algo_wait(ctx, 2, req, "MPI_Iallreduce(counts)");
  if (wrc != HORA_SUCCESS) {
    if (!hora__ctx_failed(ctx)) free(mn); /* else MPI may still write it */
    return wrc;
  }
  for (int i = 0; i < n; i++)
    if (mn[i] != mx[i]) {
      hora_result_t r = HORA_ERR(HORA_ERR_MISMATCH,
                                 "%s: ranks pass different recvcounts[%d] (from %llu to %llu)", fn, i,
                                 (unsigned long long)mn[i], (unsigned long long)mx[i]);
      free(mn);
      return r;
    }
  free(mn);
  return HORA_SUCCESS;
}

/* Agree on an error flag: returns HORA_ERR_MISMATCH/INVALID on every rank if any rank had one. */
hora_result_t hora__agree(hora_ctx_t *ctx, const char *fn, hora_result_t mine) {
  int bad = mine != HORA_SUCCESS ? (int)mine : 0, any = 0;
  int *res = malloc(sizeof *res); /* leaked after a verdict: MPI may still write the result */
  if (!res) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
  MPI_Request req = MPI_REQUEST_NULL;
  int mrc = MPI_Iallreduce(&bad, res, 1, MPI_INT, MPI_MAX, ctx->world, &req);
  hora_result_t wrc = mrc != MPI_SUCCESS ? hora__mpi_error(mrc, "MPI_Iallreduce(argument check)", __FILE__, __LINE__)
                                         : hora__algo_wait(ctx, 1, &req, fn);
  if (wrc != HORA_SUCCESS && hora__ctx_failed(ctx)) return wrc;
  any = *res;
  free(res);
  if (wrc != HORA_SUCCESS) return wrc;
  if (mine != HORA_SUCCESS) return mine;
  if (any) return HORA_ERR((hora_result_t)any, "%s: another rank rejected its arguments (%s)", fn,
                           hora_result_name((hora_result_t)any));
  return HORA_SUCCESS;
}

/* The local part of allgatherv's checks: recvcounts, their sum (*total), sendcount against this
 * rank's entry, the buffers. */
hora_result_t hora__check_allgatherv_local(hora_ctx_t *ctx, const char *fn, const void *sendbuf, size_t sendcount,
                                           const void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype,
                                           size_t *total) {
  size_t es = hora__dtype_size(dtype), sum = 0;
  for (int i = 0; i < ctx->size; i++) {
    if (recvcounts[i] > (SIZE_MAX / es) - sum)
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sum of recvcounts overflows", fn);
    sum += recvcounts[i];
  }
  if (sendcount != recvcounts[ctx->rank])
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sendcount %zu != recvcounts[%d] = %zu", fn,
                    sendcount, ctx->rank, recvcounts[ctx->rank]);
  HORA_CHECK(hora__check_buf(fn, "sendbuf", sendbuf, sendcount, dtype, NULL));
  HORA_CHECK(hora__check_buf(fn, "recvbuf", recvbuf, sum, dtype, NULL));
  if (total) *total = sum;
  return HORA_SUCCESS;
}

hora_result_t hora__check_allgatherv(hora_ctx_t *ctx, const char *fn, const void *sendbuf, size_t sendcount,
                                     const void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype,
                                     hora_device_t device, int device_ok) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  if (!recvcounts) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: recvcounts is NULL", fn);
  hora_result_t local = hora__check_allgatherv_local(ctx, fn, sendbuf, sendcount, recvbuf, recvcounts, dtype, NULL);
  if (local == HORA_SUCCESS && device == HORA_DEVICE_CUDA && !device_ok) local = hora__device_unsupported(fn);
  HORA_CHECK(hora__agree(ctx, fn, local));
  return check_same_counts(ctx, fn, recvcounts, ctx->size);
}

hora_result_t hora__check_alltoallv(hora_ctx_t *ctx, const char *fn, const void *sendbuf, const size_t *sendcounts,
                                    const void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype,
                                    hora_device_t device, int device_ok) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  if (!sendcounts || !recvcounts)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !sendcounts ? "sendcounts" : "recvcounts");
  int n = ctx->size;
  size_t es = hora__dtype_size(dtype), stot = 0, rtot = 0;
  hora_result_t local = HORA_SUCCESS;
  for (int i = 0; i < n && local == HORA_SUCCESS; i++) {
    if (sendcounts[i] > SIZE_MAX / es - stot || recvcounts[i] > SIZE_MAX / es - rtot)
      local = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sum of counts overflows", fn);
    stot += sendcounts[i];
    rtot += recvcounts[i];
  }
  if (local == HORA_SUCCESS) local = hora__check_buf(fn, "sendbuf", sendbuf, stot, dtype, NULL);
  if (local == HORA_SUCCESS) local = hora__check_buf(fn, "recvbuf", recvbuf, rtot, dtype, NULL);
  if (local == HORA_SUCCESS && overlaps(sendbuf, stot * es, recvbuf, rtot * es))
    local = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sendbuf and recvbuf overlap (alltoallv is not in place)", fn);
  if (local == HORA_SUCCESS && device == HORA_DEVICE_CUDA && !device_ok) local = hora__device_unsupported(fn);
  /* Every rank learns what each peer will send it and compares with its recvcounts. */
  uint64_t *peer = malloc((size_t)n * 2 * sizeof *peer);
  if (!peer) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
  for (int i = 0; i < n; i++) peer[i] = sendcounts[i];
  MPI_Request req = MPI_REQUEST_NULL;
  int mrc = MPI_Ialltoall(peer, 1, MPI_UINT64_T, peer + n, 1, MPI_UINT64_T, ctx->world, &req);
  hora_result_t wrc = mrc != MPI_SUCCESS ? hora__mpi_error(mrc, "MPI_Ialltoall(counts)", __FILE__, __LINE__)
                                         : hora__algo_wait(ctx, 1, &req, "MPI_Ialltoall(counts)");
  if (wrc != HORA_SUCCESS) {
    if (!hora__ctx_failed(ctx)) free(peer); /* else MPI may still write it */
    return wrc;
  }
  for (int i = 0; i < n && local == HORA_SUCCESS; i++)
    if (peer[n + i] != recvcounts[i])
      local = HORA_ERR(HORA_ERR_MISMATCH, "%s: rank %d sends %llu elements to rank %d, which expects %zu "
                       "(recvcounts[%d])", fn, i, (unsigned long long)peer[n + i], ctx->rank, recvcounts[i], i);
  free(peer);
  return hora__agree(ctx, fn, local);
}
