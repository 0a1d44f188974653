/* The public blocking collectives: argument checks, scaling and averaging, then the transport.
 * Host buffers: allreduce through algo/ (ring, shm, hier, mpi); the others through MPI with
 * byte datatypes that carry any count (hora__mpi_bytes_type), so counts above 2^31 work.
 * Device buffers are routed to runtime/comm (hora__gpu_*) when the build has CUDA. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "algo/coll.h"
#include "hora_kernels.h"

/* ---- argument checks shared by the blocking and async APIs ---- */

hora_result_t hora__check_buf(const char *fn, const char *what, const void *buf, size_t count,
                              hora_dtype_t dtype, size_t *bytes) {
  size_t es = hora__dtype_size(dtype);
  if (es == 0) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: dtype %d is not a hora_dtype_t", fn, (int)dtype);
  if (count > SIZE_MAX / es)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s count %zu x %zu bytes overflows size_t", fn,
                    what, count, es);
  if (count > 0 && !buf)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s is NULL but count is %zu", fn, what, count);
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

static hora_result_t device_unsupported(const char *fn) {
  return HORA_ERR(HORA_ERR_NOT_SUPPORTED,
                  "%s: device buffers (HORA_DEVICE_CUDA) need a CUDA build of hora and a GPU", fn);
}

/* ---- allreduce ---- */

hora_result_t hora__scale_and_average(hora_ctx_t *ctx, void *buf, size_t count,
                                      hora_dtype_t dtype, hora_op_t op, double postscale) {
  int is_float = dtype == HORA_FLOAT16 || dtype == HORA_BFLOAT16 || dtype == HORA_FLOAT32 ||
                 dtype == HORA_FLOAT64;
  if (op == HORA_AVERAGE && !is_float) {
    /* Integers: exact truncating division (a double multiply by 1/n could give 1.999... -> 1). */
    int64_t n = ctx->size;
    switch (dtype) {
#define DIV(T)                                            \
  {                                                       \
    T *p = buf;                                           \
    for (size_t i = 0; i < count; i++) p[i] = (T)(p[i] / n); \
  }                                                       \
  break;
      case HORA_UINT8: DIV(uint8_t)
      case HORA_INT8: DIV(int8_t)
      case HORA_INT16: DIV(int16_t)
      case HORA_INT32: DIV(int32_t)
      case HORA_INT64: DIV(int64_t)
      default: break;
#undef DIV
    }
    return HORA_SUCCESS;
  }
  double f = postscale;
  if (op == HORA_AVERAGE) f /= (double)ctx->size;
  if (f != 1.0) HORA_CHECK(hora__scale_host(buf, buf, count, dtype, f, NULL));
  return HORA_SUCCESS;
}

hora_result_t hora__check_allreduce(hora_ctx_t *ctx, const char *fn, const void *sendbuf,
                                    void *recvbuf, size_t count, hora_dtype_t dtype, hora_op_t op,
                                    double prescale, double postscale, hora_device_t device) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  if ((unsigned)op >= HORA_OP_COUNT)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: op %d is not a hora_op_t", fn, (int)op);
  size_t bytes = 0;
  HORA_CHECK(hora__check_buf(fn, "sendbuf", sendbuf, count, dtype, &bytes));
  HORA_CHECK(hora__check_buf(fn, "recvbuf", recvbuf, count, dtype, NULL));
  if (overlaps_partially(sendbuf, bytes, recvbuf, bytes))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sendbuf and recvbuf overlap partially", fn);
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
                                        hora_device_t device) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  if ((unsigned)op >= HORA_OP_COUNT)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: op %d is not a hora_op_t", fn, (int)op);
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

hora_result_t hora__allreduce_host_full(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype_t dtype, hora_op_t op,
                                        double prescale, double postscale, hora_algo_t algo) {
  if (count == 0) return HORA_SUCCESS;
  if (prescale == 1.0) {
    /* The algorithms read sendbuf and write recvbuf directly: no extra copy. */
    HORA_CHECK(hora__allreduce_host_oop(ctx, sendbuf, recvbuf, count, dtype, op, algo));
  } else {
    HORA_CHECK(hora__scale_host(recvbuf, sendbuf, count, dtype, prescale, NULL));
    HORA_CHECK(hora__allreduce_host(ctx, recvbuf, count, dtype, op, algo));
  }
  return hora__scale_and_average(ctx, recvbuf, count, dtype, op, postscale);
}

HORA_EXPORT hora_result_t hora_allreduce(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                         size_t count, hora_dtype_t dtype, hora_op_t op,
                                         double prescale, double postscale, hora_device_t device) {
  HORA_CHECK(hora__check_allreduce(ctx, "hora_allreduce", sendbuf, recvbuf, count, dtype, op,
                                   prescale, postscale, device));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.allreduce) return device_unsupported("hora_allreduce");
    return hora__gpu_hooks.allreduce(ctx, sendbuf, recvbuf, count, dtype, op, prescale, postscale);
  }
  hora_algo_t algo;
  HORA_CHECK(hora__algo_parse(hora__params()->allreduce_algo, &algo));
  return hora__allreduce_host_full(ctx, sendbuf, recvbuf, count, dtype, op, prescale, postscale, algo);
}

/* ---- broadcast ---- */

HORA_EXPORT hora_result_t hora_broadcast(hora_ctx_t *ctx, void *buf, size_t count,
                                         hora_dtype_t dtype, int root, hora_device_t device) {
  size_t bytes = 0;
  HORA_CHECK(hora__check_broadcast(ctx, "hora_broadcast", buf, count, dtype, root, device, &bytes));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.broadcast) return device_unsupported("hora_broadcast");
    return hora__gpu_hooks.broadcast(ctx, buf, count, dtype, root);
  }
  return hora__broadcast_host(ctx, buf, bytes, root);
}

hora_result_t hora__broadcast_host(hora_ctx_t *ctx, void *buf, size_t bytes, int root) {
  if (bytes == 0 || ctx->size == 1) return HORA_SUCCESS;
  MPI_Datatype t;
  int owned;
  HORA_CHECK(hora__mpi_bytes_type(bytes, &t, &owned));
  int rc = MPI_Bcast(buf, 1, t, root, ctx->world);
  if (owned) MPI_Type_free(&t);
  if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Bcast", __FILE__, __LINE__);
  return HORA_SUCCESS;
}

/* ---- allgather / allgatherv ---- */

HORA_EXPORT hora_result_t hora_allgather(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                         size_t count, hora_dtype_t dtype, hora_device_t device) {
  size_t bytes = 0;
  HORA_CHECK(hora__check_allgather(ctx, "hora_allgather", sendbuf, recvbuf, count, dtype, device, &bytes));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.allgather) return device_unsupported("hora_allgather");
    return hora__gpu_hooks.allgather(ctx, sendbuf, recvbuf, count, dtype);
  }
  if (bytes == 0) return HORA_SUCCESS;
  char *mine = (char *)recvbuf + (size_t)ctx->rank * bytes;
  if (sendbuf != mine) memcpy(mine, sendbuf, bytes);
  if (ctx->size == 1) return HORA_SUCCESS;
  MPI_Datatype t;
  int owned;
  HORA_CHECK(hora__mpi_bytes_type(bytes, &t, &owned));
  int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuf, 1, t, ctx->world);
  if (owned) MPI_Type_free(&t);
  if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Allgather", __FILE__, __LINE__);
  return HORA_SUCCESS;
}

/* Agree across ranks that `counts` (n entries) is identical everywhere. */
static hora_result_t check_same_counts(hora_ctx_t *ctx, const char *fn, const size_t *counts, int n) {
  uint64_t *mn = malloc(2 * (size_t)n * sizeof *mn);
  if (!mn) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
  uint64_t *mx = mn + n;
  for (int i = 0; i < n; i++) mn[i] = mx[i] = counts[i];
  int rc = MPI_Allreduce(MPI_IN_PLACE, mn, n, MPI_UINT64_T, MPI_MIN, ctx->world);
  if (rc == MPI_SUCCESS) rc = MPI_Allreduce(MPI_IN_PLACE, mx, n, MPI_UINT64_T, MPI_MAX, ctx->world);
  if (rc != MPI_SUCCESS) {
    free(mn);
    return hora__mpi_error(rc, "MPI_Allreduce(counts)", __FILE__, __LINE__);
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
  HORA_MPI_CHECK(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, ctx->world));
  if (mine != HORA_SUCCESS) return mine;
  if (any) return HORA_ERR((hora_result_t)any, "%s: another rank rejected its arguments (%s)", fn,
                           hora_result_name((hora_result_t)any));
  return HORA_SUCCESS;
}

/* Pairwise exchange: in step s (1..n-1) send to rank+s and receive from rank-s. Used by
 * allgatherv and alltoallv so that any per-peer count works (MPI's v-variants take int counts
 * and displacements). */
static hora_result_t exchange(hora_ctx_t *ctx, const char *const *sendptr, const size_t *sendbytes,
                              char *const *recvptr, const size_t *recvbytes) {
  int n = ctx->size, r = ctx->rank;
  for (int s = 1; s < n; s++) {
    int to = (r + s) % n, from = (r - s + n) % n;
    MPI_Datatype st, rt;
    int sown = 0, rown = 0;
    HORA_CHECK(hora__mpi_bytes_type(sendbytes[to], &st, &sown));
    hora_result_t hr = hora__mpi_bytes_type(recvbytes[from], &rt, &rown);
    if (hr != HORA_SUCCESS) {
      if (sown) MPI_Type_free(&st);
      return hr;
    }
    int rc = MPI_Sendrecv(sendptr[to], sendbytes[to] ? 1 : 0, st, to, 77, recvptr[from],
                          recvbytes[from] ? 1 : 0, rt, from, 77, ctx->world, MPI_STATUS_IGNORE);
    if (sown) MPI_Type_free(&st);
    if (rown) MPI_Type_free(&rt);
    if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Sendrecv", __FILE__, __LINE__);
  }
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_allgatherv(hora_ctx_t *ctx, const void *sendbuf, size_t sendcount,
                                          void *recvbuf, const size_t *recvcounts,
                                          hora_dtype_t dtype, hora_device_t device) {
  const char *fn = "hora_allgatherv";
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  if (!recvcounts) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: recvcounts is NULL", fn);
  size_t es = hora__dtype_size(dtype), total = 0;
  hora_result_t local = HORA_SUCCESS;
  for (int i = 0; i < ctx->size && local == HORA_SUCCESS; i++) {
    if (recvcounts[i] > (SIZE_MAX / es) - total)
      local = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sum of recvcounts overflows", fn);
    else
      total += recvcounts[i];
  }
  if (local == HORA_SUCCESS && sendcount != recvcounts[ctx->rank])
    local = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: sendcount %zu != recvcounts[%d] = %zu", fn,
                     sendcount, ctx->rank, recvcounts[ctx->rank]);
  if (local == HORA_SUCCESS) local = hora__check_buf(fn, "sendbuf", sendbuf, sendcount, dtype, NULL);
  if (local == HORA_SUCCESS) local = hora__check_buf(fn, "recvbuf", recvbuf, total, dtype, NULL);
  if (local == HORA_SUCCESS && device == HORA_DEVICE_CUDA && !hora__gpu_hooks.allgatherv)
    local = device_unsupported(fn);
  HORA_CHECK(hora__agree(ctx, fn, local));
  HORA_CHECK(check_same_counts(ctx, fn, recvcounts, ctx->size));
  if (device == HORA_DEVICE_CUDA) return hora__gpu_hooks.allgatherv(ctx, sendbuf, sendcount, recvbuf, recvcounts, dtype);

  int n = ctx->size;
  const char **sp = malloc((size_t)n * sizeof *sp);
  char **rp = malloc((size_t)n * sizeof *rp);
  size_t *sb = malloc((size_t)n * sizeof *sb), *rb = malloc((size_t)n * sizeof *rb);
  hora_result_t rc = HORA_SUCCESS;
  if (!sp || !rp || !sb || !rb) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
    goto done;
  }
  size_t off = 0;
  char *mine = (char *)recvbuf; /* this rank's block of recvbuf */
  for (int i = 0; i < n; i++) {
    rp[i] = (char *)recvbuf + off * es;
    if (i == ctx->rank) mine = rp[i];
    rb[i] = recvcounts[i] * es;
    sb[i] = sendcount * es;
    off += recvcounts[i];
  }
  if (sendcount && mine != (const char *)sendbuf) memmove(mine, sendbuf, sendcount * es);
  for (int i = 0; i < n; i++) sp[i] = mine;
  rc = exchange(ctx, sp, sb, rp, rb);
done:
  free(sp);
  free(rp);
  free(sb);
  free(rb);
  return rc;
}

/* ---- reducescatter ---- */

HORA_EXPORT hora_result_t hora_reducescatter(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                             size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                             hora_device_t device) {
  const char *fn = "hora_reducescatter";
  HORA_CHECK(hora__check_reducescatter(ctx, fn, sendbuf, recvbuf, recvcount, dtype, op, device));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.reducescatter) return device_unsupported(fn);
    return hora__gpu_hooks.reducescatter(ctx, sendbuf, recvbuf, recvcount, dtype, op);
  }
  return hora__reducescatter_host(ctx, sendbuf, recvbuf, recvcount, dtype, op);
}

/* Host reduce-scatter: the reduce-scatter phase of the ring (algo/ring.c), which moves
 * (n-1)/n of the buffer per rank instead of the 2(n-1)/n of a full allreduce. */
hora_result_t hora__reducescatter_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                       size_t recvcount, hora_dtype_t dtype, hora_op_t op) {
  if (recvcount == 0) return HORA_SUCCESS;
  HORA_CHECK(hora__ring_reducescatter(ctx, sendbuf, recvbuf, recvcount, dtype,
                                      op == HORA_AVERAGE ? HORA_SUM : op));
  return hora__scale_and_average(ctx, recvbuf, recvcount, dtype, op, 1.0);
}

/* ---- alltoall / alltoallv ---- */

HORA_EXPORT hora_result_t hora_alltoall(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype_t dtype, hora_device_t device) {
  const char *fn = "hora_alltoall";
  HORA_CHECK(hora__check_alltoall(ctx, fn, sendbuf, recvbuf, count, dtype, device));
  size_t es = hora__dtype_size(dtype), total = count * (size_t)ctx->size;
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.alltoall) return device_unsupported(fn);
    return hora__gpu_hooks.alltoall(ctx, sendbuf, recvbuf, count, dtype);
  }
  if (total == 0) return HORA_SUCCESS;
  MPI_Datatype t;
  int owned;
  HORA_CHECK(hora__mpi_bytes_type(count * es, &t, &owned));
  int rc = MPI_Alltoall(sendbuf, 1, t, recvbuf, 1, t, ctx->world);
  if (owned) MPI_Type_free(&t);
  if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Alltoall", __FILE__, __LINE__);
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_alltoallv(hora_ctx_t *ctx, const void *sendbuf,
                                         const size_t *sendcounts, void *recvbuf,
                                         const size_t *recvcounts, hora_dtype_t dtype,
                                         hora_device_t device) {
  const char *fn = "hora_alltoallv";
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
  if (local == HORA_SUCCESS && device == HORA_DEVICE_CUDA && !hora__gpu_hooks.alltoallv)
    local = device_unsupported(fn);
  /* Every rank learns what each peer will send it and compares with its recvcounts. */
  uint64_t *peer = malloc((size_t)n * 2 * sizeof *peer);
  if (!peer) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
  for (int i = 0; i < n; i++) peer[i] = sendcounts[i];
  int mrc = MPI_Alltoall(peer, 1, MPI_UINT64_T, peer + n, 1, MPI_UINT64_T, ctx->world);
  if (mrc != MPI_SUCCESS) {
    free(peer);
    return hora__mpi_error(mrc, "MPI_Alltoall(counts)", __FILE__, __LINE__);
  }
  for (int i = 0; i < n && local == HORA_SUCCESS; i++)
    if (peer[n + i] != recvcounts[i])
      local = HORA_ERR(HORA_ERR_MISMATCH, "%s: rank %d sends %llu elements to rank %d, which expects %zu "
                       "(recvcounts[%d])", fn, i, (unsigned long long)peer[n + i], ctx->rank, recvcounts[i], i);
  free(peer);
  HORA_CHECK(hora__agree(ctx, fn, local));
  if (device == HORA_DEVICE_CUDA) return hora__gpu_hooks.alltoallv(ctx, sendbuf, sendcounts, recvbuf, recvcounts, dtype);

  const char **sp = malloc((size_t)n * sizeof *sp);
  char **rp = malloc((size_t)n * sizeof *rp);
  size_t *sb = malloc((size_t)n * sizeof *sb), *rb = malloc((size_t)n * sizeof *rb);
  hora_result_t rc = HORA_SUCCESS;
  if (!sp || !rp || !sb || !rb) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
    goto done;
  }
  size_t so = 0, ro = 0;
  for (int i = 0; i < n; i++) {
    sp[i] = (const char *)sendbuf + so * es;
    sb[i] = sendcounts[i] * es;
    rp[i] = (char *)recvbuf + ro * es;
    rb[i] = recvcounts[i] * es;
    so += sendcounts[i];
    ro += recvcounts[i];
  }
  if (sb[ctx->rank]) memcpy(rp[ctx->rank], sp[ctx->rank], sb[ctx->rank]);
  rc = exchange(ctx, sp, sb, rp, rb);
done:
  free(sp);
  free(rp);
  free(sb);
  free(rb);
  return rc;
}

HORA_EXPORT hora_result_t hora_barrier(hora_ctx_t *ctx) {
  HORA_CHECK(hora__ctx_check(ctx, "hora_barrier"));
  HORA_MPI_CHECK(MPI_Barrier(ctx->world));
  return HORA_SUCCESS;
}

/* hora__gpu_hooks is defined by runtime/comm/gpu.c (NULL entries in builds without CUDA), so that
 * linking the collectives links the device path and its device selection at init. */
