/* The NCCL transport for device buffers: one communicator per hora context, its ncclUniqueId made
 * by rank 0 and broadcast over MPI, created non-blocking (config.blocking = 0) so that hora can
 * poll it and give up after HORA_PEER_TIMEOUT_S instead of hanging in NCCL's bootstrap when a
 * peer is dead. Collectives are enqueued on hora's stream and waited for with hora__gpu_wait,
 * which polls ncclCommGetAsyncError and aborts the communicator on an error or a timeout; after
 * that every NCCL call of the context fails with HORA_ERR_REMOTE.
 *
 *   allreduce      ncclAllReduce (out of place or in place)
 *   broadcast      ncclBroadcast
 *   allgather(v)   ncclAllGather when all counts are equal, else one ncclBroadcast per rank in a
 *                  group (NCCL has no allgatherv; this is what its documentation suggests)
 *   reducescatter  ncclReduceScatter
 *   alltoall(v)    ncclSend/ncclRecv pairs to every peer in one group */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "comm/gpu.h"

#if HORA_HAVE_CUDA && HORA_HAVE_NCCL

static hora_result_t nccl_error(ncclResult_t r, const char *what, const char *file, int line) {
  const char *last = ncclGetLastError(NULL);
  return hora__error(r == ncclRemoteError || r == ncclSystemError ? HORA_ERR_REMOTE : HORA_ERR_NCCL, file, line,
                     "%s failed: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "",
                     last ? last : "");
}

/* A non-blocking communicator may answer ncclInProgress: poll until the call settles. */
static hora_result_t settle(hora_gpu_t *g, ncclResult_t r, const char *what, const char *file, int line) {
  if (r == ncclSuccess) return HORA_SUCCESS;
  if (r != ncclInProgress) goto fail;
  const double timeout = hora__params()->peer_timeout_s, t0 = hora__now_s();
  for (unsigned spin = 0;; spin++) {
    ncclResult_t st = ncclInProgress;
    ncclCommGetAsyncError(g->nccl, &st);
    if (st == ncclSuccess) return HORA_SUCCESS;
    if (st != ncclInProgress) {
      r = st;
      goto fail;
    }
    if (timeout > 0 && (spin & 255) == 0 && hora__now_s() - t0 > timeout) {
      ncclCommAbort(g->nccl);
      g->nccl = NULL;
      g->nccl_dead = 1;
      return hora__error(HORA_ERR_TIMEOUT, file, line,
                         "%s did not complete within HORA_PEER_TIMEOUT_S=%g s (a peer is dead or "
                         "stuck); the NCCL communicator was aborted", what, timeout);
    }
    if (spin > 1000) sched_yield();
  }
fail:
  if (g->nccl) ncclCommAbort(g->nccl);
  g->nccl = NULL;
  g->nccl_dead = 1;
  return nccl_error(r, what, file, line);
}
#define NCCL_SETTLE(g, call) settle((g), (call), #call, __FILE__, __LINE__)

static hora_result_t ensure_comm(hora_ctx_t *ctx, hora_gpu_t *g) {
  if (g->nccl) return HORA_SUCCESS;
  if (g->nccl_dead)
    return HORA_ERR(HORA_ERR_REMOTE, "the NCCL communicator was aborted after an earlier error or timeout");
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  hora_result_t local = HORA_SUCCESS;
  if (ctx->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) local = nccl_error(r, "ncclGetUniqueId", __FILE__, __LINE__);
  }
  int bad = local != HORA_SUCCESS;
  HORA_MPI_CHECK(MPI_Bcast(&bad, 1, MPI_INT, 0, g->comm));
  if (bad)
    return local != HORA_SUCCESS ? local
                                 : HORA_ERR(HORA_ERR_REMOTE, "rank 0 could not create the NCCL unique id");
  HORA_MPI_CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, g->comm));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, ctx->size, id, ctx->rank, &cfg);
  g->nccl = comm;
  if (!comm && r != ncclSuccess) {
    local = nccl_error(r, "ncclCommInitRankConfig", __FILE__, __LINE__);
  } else {
    local = settle(g, r, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  /* Every rank learns whether every rank got a communicator. */
  int any = local != HORA_SUCCESS;
  HORA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, g->comm));
  if (local != HORA_SUCCESS) return local;
  if (any) {
    g->nccl_dead = 1; /* abort, not finalize: the peers that failed will never take part */
    hora__nccl_free(g);
    return HORA_ERR(HORA_ERR_REMOTE, "another rank failed to create its NCCL communicator");
  }
  int ver = 0;
  ncclGetVersion(&ver);
  if (ctx->rank == 0) HORA_INFO(NCCL, "NCCL %d communicator of %d ranks ready", ver, ctx->size);
  return HORA_SUCCESS;
}

void hora__nccl_free(hora_gpu_t *g) {
  if (!g->nccl) return;
  if (g->nccl_dead) {
    ncclCommAbort(g->nccl);
  } else {
    /* Non-blocking: finalize, poll until done, then destroy. */
    ncclResult_t r = ncclCommFinalize(g->nccl);
    ncclResult_t st = r;
    double t0 = hora__now_s(), timeout = hora__params()->peer_timeout_s;
    while (st == ncclInProgress) {
      ncclCommGetAsyncError(g->nccl, &st);
      if (timeout > 0 && hora__now_s() - t0 > timeout) break;
      sched_yield();
    }
    if (st == ncclSuccess) ncclCommDestroy(g->nccl);
    else ncclCommAbort(g->nccl);
  }
  g->nccl = NULL;
}

static ncclDataType_t nccl_type(hora_dtype_t d) {
  switch (d) {
    case HORA_UINT8: return ncclUint8;
    case HORA_INT8: return ncclInt8;
    case HORA_INT32: return ncclInt32;
    case HORA_INT64: return ncclInt64;
    case HORA_FLOAT16: return ncclFloat16;
    case HORA_BFLOAT16: return ncclBfloat16;
    case HORA_FLOAT32: return ncclFloat32;
    case HORA_FLOAT64: return ncclFloat64;
    case HORA_BOOL: return ncclUint8;
    case HORA_INT16: return ncclFloat16; /* moved bit for bit; never reduced (see red_check) */
  }
  return ncclFloat32;
}

/* NCCL has no int16 reduction; bool reduces as uint8 max (OR) and min (AND). */
static hora_result_t red_check(hora_dtype_t dtype, hora_op_t *op, const char *fn) {
  if (dtype == HORA_INT16)
    return HORA_ERR(HORA_ERR_NOT_SUPPORTED,
                    "%s: NCCL cannot reduce int16 tensors; HORA_GPU_PATH=mpi reduces them on the GPU", fn);
  if (dtype == HORA_BOOL) *op = (*op == HORA_MIN || *op == HORA_PRODUCT) ? HORA_MIN : HORA_MAX;
  return HORA_SUCCESS;
}

/* AVERAGE arrives as SUM (the caller divides exactly as the host path does). */
static ncclRedOp_t nccl_op(hora_op_t op) {
  switch (op) {
    case HORA_SUM: case HORA_AVERAGE: return ncclSum;
    case HORA_MIN: return ncclMin;
    case HORA_MAX: return ncclMax;
    case HORA_PRODUCT: return ncclProd;
    case HORA_ADASUM: break; /* never here: device Adasum goes through host memory (staged.c) */
  }
  return ncclSum;
}

hora_result_t hora__nccl_allreduce(hora_ctx_t *ctx, hora_gpu_t *g, const void *src, void *dst,
                                   size_t count, hora_dtype_t dtype, hora_op_t op) {
  HORA_CHECK(red_check(dtype, &op, "hora_allreduce"));
  HORA_CHECK(ensure_comm(ctx, g));
  return NCCL_SETTLE(g, ncclAllReduce(src, dst, count, nccl_type(dtype), nccl_op(op), g->nccl, g->stream));
}

hora_result_t hora__nccl_broadcast(hora_ctx_t *ctx, hora_gpu_t *g, void *buf, size_t count,
                                   hora_dtype_t dtype, int root) {
  HORA_CHECK(ensure_comm(ctx, g));
  HORA_CHECK(NCCL_SETTLE(g, ncclBroadcast(buf, buf, count, nccl_type(dtype), root, g->nccl, g->stream)));
  return hora__gpu_wait(ctx, g, g->stream, "hora_broadcast");
}

hora_result_t hora__nccl_allgatherv(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, void *recvbuf,
                                    const size_t *recvcounts, hora_dtype_t dtype) {
  HORA_CHECK(ensure_comm(ctx, g));
  int n = ctx->size, equal = 1;
  size_t es = hora__dtype_size(dtype), off = 0, mine = 0;
  for (int i = 0; i < n; i++) {
    if (recvcounts[i] != recvcounts[0]) equal = 0;
    if (i < ctx->rank) mine += recvcounts[i];
  }
  if (equal) {
    if (recvcounts[0] == 0) return HORA_SUCCESS;
    HORA_CHECK(NCCL_SETTLE(g, ncclAllGather(sendbuf, recvbuf, recvcounts[0], nccl_type(dtype), g->nccl, g->stream)));
  } else {
    /* Root r broadcasts its block into everyone's slot r; the root's own send buffer is its slot
     * (copied first, unless it already is the slot). */
    char *mine_p = (char *)recvbuf + mine * es;
    if (recvcounts[ctx->rank] && (const char *)sendbuf != mine_p)
      HORA_CUDA_CHECK(cudaMemcpyAsync(mine_p, sendbuf, recvcounts[ctx->rank] * es, cudaMemcpyDeviceToDevice, g->stream));
    HORA_CHECK(NCCL_SETTLE(g, ncclGroupStart()));
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
      char *slot = (char *)recvbuf + off * es;
      if (recvcounts[i]) r = ncclBroadcast(slot, slot, recvcounts[i], nccl_type(dtype), i, g->nccl, g->stream);
      off += recvcounts[i];
    }
    ncclResult_t r2 = ncclGroupEnd();
    HORA_CHECK(settle(g, r != ncclSuccess && r != ncclInProgress ? r : r2, "ncclBroadcast group (allgatherv)", __FILE__, __LINE__));
  }
  return hora__gpu_wait(ctx, g, g->stream, "hora_allgatherv");
}

hora_result_t hora__nccl_reducescatter(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, void *recvbuf,
                                       size_t recvcount, hora_dtype_t dtype, hora_op_t op) {
  HORA_CHECK(red_check(dtype, &op, "hora_reducescatter"));
  HORA_CHECK(ensure_comm(ctx, g));
  return NCCL_SETTLE(g, ncclReduceScatter(sendbuf, recvbuf, recvcount, nccl_type(dtype), nccl_op(op), g->nccl, g->stream));
}

hora_result_t hora__nccl_alltoallv(hora_ctx_t *ctx, hora_gpu_t *g, const void *sendbuf, const size_t *sendcounts,
                                   void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype) {
  HORA_CHECK(ensure_comm(ctx, g));
  size_t es = hora__dtype_size(dtype), so = 0, ro = 0;
  ncclDataType_t t = nccl_type(dtype);
  HORA_CHECK(NCCL_SETTLE(g, ncclGroupStart()));
  ncclResult_t r = ncclSuccess;
  for (int p = 0; p < ctx->size && (r == ncclSuccess || r == ncclInProgress); p++) {
    if (sendcounts[p]) r = ncclSend((const char *)sendbuf + so * es, sendcounts[p], t, p, g->nccl, g->stream);
    if ((r == ncclSuccess || r == ncclInProgress) && recvcounts[p])
      r = ncclRecv((char *)recvbuf + ro * es, recvcounts[p], t, p, g->nccl, g->stream);
    so += sendcounts[p];
    ro += recvcounts[p];
  }
  ncclResult_t r2 = ncclGroupEnd();
  HORA_CHECK(settle(g, r != ncclSuccess && r != ncclInProgress ? r : r2, "ncclSend/ncclRecv group (alltoallv)", __FILE__, __LINE__));
  return hora__gpu_wait(ctx, g, g->stream, "hora_alltoallv");
}

#endif
