/* The public blocking collectives and the host bodies of the non-allreduce collectives.
 *
 * Each public call checks its arguments (check.c), then runs once: device buffers go to
 * runtime/comm through hora__gpu_hooks (when the build has CUDA), host buffers to the bodies
 * below, or to the allreduce dispatch (dispatch.c). The host bodies are the ones every user of
 * this layer runs: the blocking calls here, the async engine (engine/fusion.c) on its private
 * context, and the staged GPU path (comm/staged.c) on pinned host copies. They take checked
 * arguments, move bytes with MPI byte datatypes that carry any count (hora__mpi_bytes_type), so
 * counts above 2^31 work, and use only the context's world communicator. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algo/coll.h"

/* ---- host bodies ---- */

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

hora_result_t hora__allgather_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t bytes) {
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

/* The per-peer pointers and byte counts of a v-collective, for exchange(). */
typedef struct {
  const char **sp;
  char **rp;
  size_t *sb, *rb;
} peers_t;

static hora_result_t peers_new(int n, peers_t *p) {
  p->sp = malloc((size_t)n * sizeof *p->sp);
  p->rp = malloc((size_t)n * sizeof *p->rp);
  p->sb = malloc((size_t)n * sizeof *p->sb);
  p->rb = malloc((size_t)n * sizeof *p->rb);
  if (p->sp && p->rp && p->sb && p->rb) return HORA_SUCCESS;
  return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory for a %d-rank exchange", n);
}

static void peers_free(peers_t *p) {
  free(p->sp);
  free(p->rp);
  free(p->sb);
  free(p->rb);
}

hora_result_t hora__allgatherv_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                    const size_t *recvcounts, size_t es) {
  int n = ctx->size;
  peers_t P;
  hora_result_t rc = peers_new(n, &P);
  if (rc != HORA_SUCCESS) goto done;
  size_t off = 0, sendcount = recvcounts[ctx->rank];
  char *mine = (char *)recvbuf; /* this rank's block of recvbuf */
  for (int i = 0; i < n; i++) {
    P.rp[i] = (char *)recvbuf + off * es;
    if (i == ctx->rank) mine = P.rp[i];
    P.rb[i] = recvcounts[i] * es;
    P.sb[i] = sendcount * es;
    off += recvcounts[i];
  }
  if (sendcount && mine != (const char *)sendbuf) memmove(mine, sendbuf, sendcount * es);
  for (int i = 0; i < n; i++) P.sp[i] = mine;
  rc = exchange(ctx, P.sp, P.sb, P.rp, P.rb);
done:
  peers_free(&P);
  return rc;
}

hora_result_t hora__alltoall_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t bytes) {
  if (bytes == 0) return HORA_SUCCESS;
  MPI_Datatype t;
  int owned;
  HORA_CHECK(hora__mpi_bytes_type(bytes, &t, &owned));
  int rc = MPI_Alltoall(sendbuf, 1, t, recvbuf, 1, t, ctx->world);
  if (owned) MPI_Type_free(&t);
  if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Alltoall", __FILE__, __LINE__);
  return HORA_SUCCESS;
}

hora_result_t hora__alltoallv_host(hora_ctx_t *ctx, const void *sendbuf, const size_t *sendcounts,
                                   void *recvbuf, const size_t *recvcounts, size_t es) {
  int n = ctx->size;
  peers_t P;
  hora_result_t rc = peers_new(n, &P);
  if (rc != HORA_SUCCESS) goto done;
  size_t so = 0, ro = 0;
  for (int i = 0; i < n; i++) {
    P.sp[i] = (const char *)sendbuf + so * es;
    P.sb[i] = sendcounts[i] * es;
    P.rp[i] = (char *)recvbuf + ro * es;
    P.rb[i] = recvcounts[i] * es;
    so += sendcounts[i];
    ro += recvcounts[i];
  }
  if (P.sb[ctx->rank]) memcpy(P.rp[ctx->rank], P.sp[ctx->rank], P.sb[ctx->rank]);
  rc = exchange(ctx, P.sp, P.sb, P.rp, P.rb);
done:
  peers_free(&P);
  return rc;
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

/* ---- the public calls ---- */

HORA_EXPORT hora_result_t hora_allreduce(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                         size_t count, hora_dtype_t dtype, hora_op_t op,
                                         double prescale, double postscale, hora_device_t device) {
  HORA_CHECK(hora__check_allreduce(ctx, "hora_allreduce", sendbuf, recvbuf, count, dtype, op,
                                   prescale, postscale, device));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.allreduce) return hora__device_unsupported("hora_allreduce");
    return hora__gpu_hooks.allreduce(ctx, sendbuf, recvbuf, count, dtype, op, prescale, postscale);
  }
  hora_algo_t algo;
  HORA_CHECK(hora__algo_parse(hora__params()->allreduce_algo, &algo));
  return hora__allreduce_host_full(ctx, sendbuf, recvbuf, count, dtype, op, prescale, postscale, algo);
}

HORA_EXPORT hora_result_t hora_broadcast(hora_ctx_t *ctx, void *buf, size_t count,
                                         hora_dtype_t dtype, int root, hora_device_t device) {
  size_t bytes = 0;
  HORA_CHECK(hora__check_broadcast(ctx, "hora_broadcast", buf, count, dtype, root, device, &bytes));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.broadcast) return hora__device_unsupported("hora_broadcast");
    return hora__gpu_hooks.broadcast(ctx, buf, count, dtype, root);
  }
  return hora__broadcast_host(ctx, buf, bytes, root);
}

HORA_EXPORT hora_result_t hora_allgather(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                         size_t count, hora_dtype_t dtype, hora_device_t device) {
  size_t bytes = 0;
  HORA_CHECK(hora__check_allgather(ctx, "hora_allgather", sendbuf, recvbuf, count, dtype, device, &bytes));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.allgather) return hora__device_unsupported("hora_allgather");
    return hora__gpu_hooks.allgather(ctx, sendbuf, recvbuf, count, dtype);
  }
  return hora__allgather_host(ctx, sendbuf, recvbuf, bytes);
}

HORA_EXPORT hora_result_t hora_allgatherv(hora_ctx_t *ctx, const void *sendbuf, size_t sendcount,
                                          void *recvbuf, const size_t *recvcounts,
                                          hora_dtype_t dtype, hora_device_t device) {
  HORA_CHECK(hora__check_allgatherv(ctx, "hora_allgatherv", sendbuf, sendcount, recvbuf, recvcounts, dtype,
                                    device, hora__gpu_hooks.allgatherv != NULL));
  if (device == HORA_DEVICE_CUDA) return hora__gpu_hooks.allgatherv(ctx, sendbuf, sendcount, recvbuf, recvcounts, dtype);
  return hora__allgatherv_host(ctx, sendbuf, recvbuf, recvcounts, hora__dtype_size(dtype));
}

HORA_EXPORT hora_result_t hora_reducescatter(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                             size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                             hora_device_t device) {
  const char *fn = "hora_reducescatter";
  HORA_CHECK(hora__check_reducescatter(ctx, fn, sendbuf, recvbuf, recvcount, dtype, op, device));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.reducescatter) return hora__device_unsupported(fn);
    return hora__gpu_hooks.reducescatter(ctx, sendbuf, recvbuf, recvcount, dtype, op);
  }
  return hora__reducescatter_host(ctx, sendbuf, recvbuf, recvcount, dtype, op);
}

HORA_EXPORT hora_result_t hora_alltoall(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype_t dtype, hora_device_t device) {
  const char *fn = "hora_alltoall";
  HORA_CHECK(hora__check_alltoall(ctx, fn, sendbuf, recvbuf, count, dtype, device));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.alltoall) return hora__device_unsupported(fn);
    return hora__gpu_hooks.alltoall(ctx, sendbuf, recvbuf, count, dtype);
  }
  return hora__alltoall_host(ctx, sendbuf, recvbuf, count * hora__dtype_size(dtype));
}

HORA_EXPORT hora_result_t hora_alltoallv(hora_ctx_t *ctx, const void *sendbuf,
                                         const size_t *sendcounts, void *recvbuf,
                                         const size_t *recvcounts, hora_dtype_t dtype,
                                         hora_device_t device) {
  HORA_CHECK(hora__check_alltoallv(ctx, "hora_alltoallv", sendbuf, sendcounts, recvbuf, recvcounts, dtype,
                                   device, hora__gpu_hooks.alltoallv != NULL));
  if (device == HORA_DEVICE_CUDA) return hora__gpu_hooks.alltoallv(ctx, sendbuf, sendcounts, recvbuf, recvcounts, dtype);
  return hora__alltoallv_host(ctx, sendbuf, sendcounts, recvbuf, recvcounts, hora__dtype_size(dtype));
}

HORA_EXPORT hora_result_t hora_barrier(hora_ctx_t *ctx) {
  HORA_CHECK(hora__ctx_check(ctx, "hora_barrier"));
  HORA_MPI_CHECK(MPI_Barrier(ctx->world));
  return HORA_SUCCESS;
}

/* hora__gpu_hooks is defined by runtime/comm/gpu.c (NULL entries in builds without CUDA), so that
 * linking the collectives links the device path and its device selection at init. */
