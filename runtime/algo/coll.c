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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/coll.h"
#include "hora_kernels.h"

/* ---- host bodies ---- */

hora_result_t hora__broadcast_host(hora_ctx_t *ctx, void *buf, size_t bytes, int root) {
  if (bytes == 0 || ctx->size == 1) return HORA_SUCCESS;
  MPI_Datatype t;
  int owned;
  HORA_CHECK(hora__mpi_bytes_type(bytes, &t, &owned));
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Ibcast(buf, 1, t, root, ctx->world, &req);
  if (owned) MPI_Type_free(&t); /* allowed while the request is pending */
  if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Ibcast", __FILE__, __LINE__);
  return hora__algo_wait_data(ctx, 1, &req, "MPI_Ibcast", bytes);
}

hora_result_t hora__allgather_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t bytes) {
  if (bytes == 0) return HORA_SUCCESS;
  char *mine = (char *)recvbuf + (size_t)ctx->rank * bytes;
  if (sendbuf != mine) memcpy(mine, sendbuf, bytes);
  if (ctx->size == 1) return HORA_SUCCESS;
  MPI_Datatype t;
  int owned;
  HORA_CHECK(hora__mpi_bytes_type(bytes, &t, &owned));
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuf, 1, t, ctx->world, &req);
  if (owned) MPI_Type_free(&t);
  if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Iallgather", __FILE__, __LINE__);
  return hora__algo_wait_data(ctx, 1, &req, "MPI_Iallgather", bytes * (size_t)ctx->size);
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
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int rc = MPI_Irecv(recvptr[from], recvbytes[from] ? 1 : 0, rt, from, 77, ctx->world, &req[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(sendptr[to], sendbytes[to] ? 1 : 0, st, to, 77, ctx->world, &req[1]);
    if (sown) MPI_Type_free(&st);
    if (rown) MPI_Type_free(&rt);
    if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Irecv/MPI_Isend (exchange)", __FILE__, __LINE__);
    HORA_CHECK(hora__algo_wait_data(ctx, 2, req, "MPI_Irecv/MPI_Isend (exchange)", sendbytes[to] + recvbytes[from]));
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
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Ialltoall(sendbuf, 1, t, recvbuf, 1, t, ctx->world, &req);
  if (owned) MPI_Type_free(&t);
  if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Ialltoall", __FILE__, __LINE__);
  return hora__algo_wait_data(ctx, 1, &req, "MPI_Ialltoall", 2 * bytes * (size_t)ctx->size);
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
 * (n-1)/n of the buffer per rank instead of the 2(n-1)/n of a full allreduce. A prescale other
 * than 1 reduces a scaled copy (Horovod scales the input before the reduction too, so that a
 * float16 sum that would overflow unscaled does not). */
hora_result_t hora__reducescatter_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                       size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                       double prescale, double postscale) {
  if (recvcount == 0) return HORA_SUCCESS;
  void *scaled = NULL;
  if (prescale != 1.0) {
    size_t n = recvcount * (size_t)ctx->size;
    if (!(scaled = malloc(n * hora__dtype_size(dtype))))
      return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_reducescatter: out of memory for the prescaled copy (%zu elements)",
                      n);
    hora_result_t rc = hora__scale_host(scaled, sendbuf, n, dtype, prescale, NULL);
    if (rc != HORA_SUCCESS) {
      free(scaled);
      return rc;
    }
  }
  hora_result_t rc = hora__ring_reducescatter(ctx, scaled ? scaled : sendbuf, recvbuf, recvcount, dtype,
                                              op == HORA_AVERAGE ? HORA_SUM : op);
  free(scaled);
  HORA_CHECK(rc);
  return hora__scale_and_average(ctx, recvbuf, recvcount, dtype, op, postscale);
}

/* The call counts of the context hora_init made (ctx->calls, core/ctx.h), which its heartbeat
 * reads: a peer that finalized before this call, or never entered it, is found by them. Every
 * call that takes part in the call check counts as entered, on every rank in the same order (a
 * call the one-node stall inspection ended with HORA_ERR_TIMEOUT took its arrival back, and its
 * number: the context stays usable). A call is done when no rank needs this one any more: it
 * succeeded, or the check ended it on every rank (HORA_ERR_MISMATCH, or this rank's own invalid
 * arguments, which the others learn as a mismatch). */
void hora__call_ended_everywhere(hora_ctx_t *ctx) {
  if (ctx->calls)
    __atomic_store_n(&ctx->calls->done, __atomic_load_n(&ctx->calls->entered, __ATOMIC_RELAXED), __ATOMIC_RELEASE);
}

static void enter(hora_ctx_t *ctx) {
  if (ctx->calls) __atomic_add_fetch(&ctx->calls->entered, 1, __ATOMIC_RELEASE);
}

/* The end of a counted call whose agreement returned rc (or the whole call's rc). */
static hora_result_t leave(hora_ctx_t *ctx, hora_result_t rc) {
  if (rc == HORA_SUCCESS || rc == HORA_ERR_MISMATCH) hora__call_ended_everywhere(ctx);
  if (rc == HORA_ERR_TIMEOUT && ctx->calls && !hora__ctx_failed(ctx))
    __atomic_sub_fetch(&ctx->calls->entered, 1, __ATOMIC_RELEASE);
  return rc;
}

static hora_result_t agree(hora_ctx_t *ctx, const char *fn, const hora_call_desc_t *d) {
  enter(ctx);
  hora_result_t rc = hora__call_agree(ctx, fn, d);
  return rc == HORA_SUCCESS ? rc : leave(ctx, rc);
}

static hora_result_t done(hora_ctx_t *ctx, hora_result_t rc) {
  if (rc == HORA_SUCCESS) hora__call_ended_everywhere(ctx);
  return rc;
}

/* A rank whose own arguments fail the local checks (rc) still takes part in the call check, as
 * "invalid arguments", when its context is live: the ranks whose arguments were fine then return
 * HORA_ERR_MISMATCH naming it ("call sequence") instead of waiting for it forever in the
 * collective it left. It returns its own error with its own message. When every rank's arguments
 * fail, the ranks agree on "invalid arguments" and each returns its own error. */
static hora_result_t refuse(hora_ctx_t *ctx, const char *fn, hora_call_desc_t *d, hora_result_t rc) {
  /* Not with a context that is not live (NOT_INITIALIZED), not on a rank outside a process set
   * (no communicator), not after a verdict. */
  if (rc == HORA_SUCCESS || rc == HORA_ERR_NOT_INITIALIZED || !hora__call_check_on() || ctx->excluded ||
      hora__ctx_failed(ctx))
    return rc;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", hora_last_error());
  d->kind = HORA_CALL_INVALID;
  d->count = 0, d->dtype = 0, d->op = 0, d->root = 0, d->device = 0, d->shape = 0, d->algo = 0;
  d->prescale = 0, d->postscale = 0;
  hora_result_t arc = agree(ctx, fn, d);
  if (arc != HORA_ERR_TIMEOUT && !hora__ctx_failed(ctx)) hora__call_ended_everywhere(ctx); /* the others got the mismatch */
  return HORA_ERR(rc, "%s", msg);
}

/* ---- the public blocking calls ----
 * Each takes the shape fingerprint left by hora_set_call_shape (cleared whatever happens), checks
 * its arguments locally, then agrees its call descriptor with every rank (callcheck.c) before any
 * data moves, so a disagreement returns HORA_ERR_MISMATCH everywhere with every buffer untouched. */

HORA_EXPORT hora_result_t hora_allreduce(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                         size_t count, hora_dtype_t dtype, hora_op_t op,
                                         double prescale, double postscale, hora_device_t device) {
  const char *fn = "hora_allreduce";
  hora_call_desc_t d = {HORA_CALL_ALLREDUCE, count,     dtype,    op,       0, device, hora__call_shape_take(ctx),
                        0,                  prescale, postscale};
  hora_result_t rc = hora__check_allreduce(ctx, fn, sendbuf, recvbuf, count, dtype, op, prescale, postscale, device);
  hora_algo_t algo = HORA_ALGO_AUTO;
  if (rc == HORA_SUCCESS && device != HORA_DEVICE_CUDA) rc = hora__algo_parse(hora__params()->allreduce_algo, &algo);
  HORA_CHECK(refuse(ctx, fn, &d, rc));
  if (device == HORA_DEVICE_CUDA) {
    HORA_CHECK(agree(ctx, fn, &d));
    if (!hora__gpu_hooks.allreduce) return hora__device_unsupported(fn);
    return done(ctx, hora__gpu_hooks.allreduce(ctx, sendbuf, recvbuf, count, dtype, op, prescale, postscale));
  }
  /* The host allreduce agrees its descriptor itself (in the shm algorithm's first barrier on one
   * node): counted here like agree() does. */
  enter(ctx);
  return leave(ctx, hora__allreduce_checked(ctx, fn, &d, sendbuf, recvbuf, count, dtype, op, prescale, postscale, algo));
}

HORA_EXPORT hora_result_t hora_broadcast(hora_ctx_t *ctx, void *buf, size_t count,
                                         hora_dtype_t dtype, int root, hora_device_t device) {
  const char *fn = "hora_broadcast";
  hora_call_desc_t d = {HORA_CALL_BROADCAST, count, dtype, 0, root, device, hora__call_shape_take(ctx), 0, 0, 0};
  size_t bytes = 0;
  HORA_CHECK(refuse(ctx, fn, &d, hora__check_broadcast(ctx, fn, buf, count, dtype, root, device, &bytes)));
  HORA_CHECK(agree(ctx, fn, &d));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.broadcast) return hora__device_unsupported(fn);
    return done(ctx, hora__gpu_hooks.broadcast(ctx, buf, count, dtype, root));
  }
  return done(ctx, hora__broadcast_host(ctx, buf, bytes, root));
}

HORA_EXPORT hora_result_t hora_allgather(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                         size_t count, hora_dtype_t dtype, hora_device_t device) {
  const char *fn = "hora_allgather";
  hora_call_desc_t d = {HORA_CALL_ALLGATHER, count, dtype, 0, 0, device, hora__call_shape_take(ctx), 0, 0, 0};
  size_t bytes = 0;
  HORA_CHECK(refuse(ctx, fn, &d, hora__check_allgather(ctx, fn, sendbuf, recvbuf, count, dtype, device, &bytes)));
  HORA_CHECK(agree(ctx, fn, &d));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.allgather) return hora__device_unsupported(fn);
    return done(ctx, hora__gpu_hooks.allgather(ctx, sendbuf, recvbuf, count, dtype));
  }
  return done(ctx, hora__allgather_host(ctx, sendbuf, recvbuf, bytes));
}

/* The v-collectives' own checks communicate (they agree on the counts), so the descriptor is
 * agreed first; its count is the sum of recvcounts (allgatherv) or 0 (alltoallv). */
static uint64_t sum_counts(const hora_ctx_t *ctx, const size_t *counts) {
  uint64_t s = 0;
  for (int i = 0; counts && i < ctx->size; i++) s += counts[i];
  return s;
}

HORA_EXPORT hora_result_t hora_allgatherv(hora_ctx_t *ctx, const void *sendbuf, size_t sendcount,
                                          void *recvbuf, const size_t *recvcounts,
                                          hora_dtype_t dtype, hora_device_t device) {
  const char *fn = "hora_allgatherv";
  uint64_t shape = hora__call_shape_take(ctx);
  hora_call_desc_t d = {HORA_CALL_ALLGATHERV, 0, dtype, 0, 0, device, shape, 0, 0, 0};
  HORA_CHECK(refuse(ctx, fn, &d, hora__check_common(ctx, fn, dtype, device)));
  d.count = sum_counts(ctx, recvcounts);
  HORA_CHECK(agree(ctx, fn, &d));
  HORA_CHECK(hora__check_allgatherv(ctx, fn, sendbuf, sendcount, recvbuf, recvcounts, dtype,
                                    device, hora__gpu_hooks.allgatherv != NULL));
  if (device == HORA_DEVICE_CUDA) return done(ctx, hora__gpu_hooks.allgatherv(ctx, sendbuf, sendcount, recvbuf, recvcounts, dtype));
  return done(ctx, hora__allgatherv_host(ctx, sendbuf, recvbuf, recvcounts, hora__dtype_size(dtype)));
}

HORA_EXPORT hora_result_t hora_reducescatter(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                             size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                             double prescale, double postscale, hora_device_t device) {
  const char *fn = "hora_reducescatter";
  hora_call_desc_t d = {HORA_CALL_REDUCESCATTER, recvcount, dtype, op, 0, device, hora__call_shape_take(ctx),
                        0,                       prescale,  postscale};
  HORA_CHECK(refuse(ctx, fn, &d,
                    hora__check_reducescatter(ctx, fn, sendbuf, recvbuf, recvcount, dtype, op, prescale, postscale,
                                              device)));
  HORA_CHECK(agree(ctx, fn, &d));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.reducescatter) return hora__device_unsupported(fn);
    return done(ctx, hora__gpu_hooks.reducescatter(ctx, sendbuf, recvbuf, recvcount, dtype, op, prescale, postscale));
  }
  return done(ctx, hora__reducescatter_host(ctx, sendbuf, recvbuf, recvcount, dtype, op, prescale, postscale));
}

HORA_EXPORT hora_result_t hora_alltoall(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype_t dtype, hora_device_t device) {
  const char *fn = "hora_alltoall";
  hora_call_desc_t d = {HORA_CALL_ALLTOALL, count, dtype, 0, 0, device, hora__call_shape_take(ctx), 0, 0, 0};
  HORA_CHECK(refuse(ctx, fn, &d, hora__check_alltoall(ctx, fn, sendbuf, recvbuf, count, dtype, device)));
  HORA_CHECK(agree(ctx, fn, &d));
  if (device == HORA_DEVICE_CUDA) {
    if (!hora__gpu_hooks.alltoall) return hora__device_unsupported(fn);
    return done(ctx, hora__gpu_hooks.alltoall(ctx, sendbuf, recvbuf, count, dtype));
  }
  return done(ctx, hora__alltoall_host(ctx, sendbuf, recvbuf, count * hora__dtype_size(dtype)));
}

HORA_EXPORT hora_result_t hora_alltoallv(hora_ctx_t *ctx, const void *sendbuf,
                                         const size_t *sendcounts, void *recvbuf,
                                         const size_t *recvcounts, hora_dtype_t dtype,
                                         hora_device_t device) {
  const char *fn = "hora_alltoallv";
  uint64_t shape = hora__call_shape_take(ctx);
  hora_call_desc_t d = {HORA_CALL_ALLTOALLV, 0, dtype, 0, 0, device, shape, 0, 0, 0};
  HORA_CHECK(refuse(ctx, fn, &d, hora__check_common(ctx, fn, dtype, device)));
  HORA_CHECK(agree(ctx, fn, &d));
  HORA_CHECK(hora__check_alltoallv(ctx, fn, sendbuf, sendcounts, recvbuf, recvcounts, dtype,
                                   device, hora__gpu_hooks.alltoallv != NULL));
  if (device == HORA_DEVICE_CUDA) return done(ctx, hora__gpu_hooks.alltoallv(ctx, sendbuf, sendcounts, recvbuf, recvcounts, dtype));
  return done(ctx, hora__alltoallv_host(ctx, sendbuf, sendcounts, recvbuf, recvcounts, hora__dtype_size(dtype)));
}

/* With the check on, the descriptor's allreduce is the barrier (and a rank calling another
 * collective is reported, not paired with it). */
HORA_EXPORT hora_result_t hora_barrier(hora_ctx_t *ctx) {
  hora_call_desc_t d = {HORA_CALL_BARRIER, 0, 0, 0, 0, 0, hora__call_shape_take(ctx), 0, 0, 0};
  HORA_CHECK(hora__ctx_check(ctx, "hora_barrier"));
  if (hora__call_check_on()) return done(ctx, agree(ctx, "hora_barrier", &d));
  if (ctx->calls) __atomic_add_fetch(&ctx->calls->entered, 1, __ATOMIC_RELEASE);
  MPI_Request req = MPI_REQUEST_NULL;
  HORA_MPI_CHECK(MPI_Ibarrier(ctx->world, &req));
  return done(ctx, hora__algo_wait(ctx, 1, &req, "hora_barrier"));
}

HORA_EXPORT hora_result_t hora_refuse(hora_ctx_t *ctx) {
  const char *fn = "hora_refuse";
  HORA_CHECK(hora__ctx_check(ctx, fn));
  (void)hora__call_shape_take(ctx); /* the refused call's tags go with it */
  /* What refuse() does for a call whose arguments fail libhora's own checks. */
  if (!hora__call_check_on() || ctx->excluded || hora__ctx_failed(ctx)) return HORA_SUCCESS;
  hora_call_desc_t d = {.kind = HORA_CALL_INVALID};
  hora_result_t rc = agree(ctx, fn, &d);
  if (rc != HORA_ERR_TIMEOUT && !hora__ctx_failed(ctx)) hora__call_ended_everywhere(ctx);
  return rc == HORA_ERR_MISMATCH ? HORA_SUCCESS : rc; /* the others got the mismatch: delivered */
}

/* hora__gpu_hooks is defined by runtime/comm/gpu.c (NULL entries in builds without CUDA), so that
 * linking the collectives links the device path and its device selection at init. */
