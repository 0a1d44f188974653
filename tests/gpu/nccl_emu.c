/* An emulated NCCL for running runtime/comm's NCCL code path (comm/nccl.c and the NCCL branches of
 * comm/gpu.c) on machines without a GPU, together with cuda_emu.c. Linked into the test
 * executable, these definitions take the place of libnccl's. A communicator is an MPI
 * communicator over its members' world ranks (the world's, or a process set's); collectives run at once over MPI on the (host) buffers, with hora's MPI datatypes
 * and ops (hora__mpi_dtype_op) so that f16/bf16 work; ncclSend/ncclRecv are queued until
 * ncclGroupEnd and then run as MPI_Isend/MPI_Irecv. Calls answer ncclInProgress at random, as a
 * non-blocking communicator may, and ncclCommGetAsyncError then says ncclSuccess.
 *
 * It checks hora's use of the API (arguments, in-place forms, grouping, averaging, the async
 * start/poll) against MPI's results, not NCCL itself. */
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "hora_kernels.h"

struct ncclComm {
  MPI_Comm comm;
  int rank, size;
};

static uint64_t rng = 0x2545f4914f6cdd1dull;
static ncclResult_t maybe_in_progress(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng % 4 == 0 ? ncclInProgress : ncclSuccess;
}

static hora_dtype_t dtype_of(ncclDataType_t t) {
  switch (t) {
    case ncclUint8: return HORA_UINT8;
    case ncclInt8: return HORA_INT8;
    case ncclInt32: return HORA_INT32;
    case ncclInt64: return HORA_INT64;
    case ncclFloat16: return HORA_FLOAT16;
    case ncclBfloat16: return HORA_BFLOAT16;
    case ncclFloat32: return HORA_FLOAT32;
    case ncclFloat64: return HORA_FLOAT64;
    default: fprintf(stderr, "nccl_emu: unsupported datatype %d\n", (int)t); abort();
  }
}
static hora_op_t op_of(ncclRedOp_t o) {
  switch (o) {
    case ncclSum: return HORA_SUM;
    case ncclProd: return HORA_PRODUCT;
    case ncclMin: return HORA_MIN;
    case ncclMax: return HORA_MAX;
    default: fprintf(stderr, "nccl_emu: unsupported op %d (hora must not use ncclAvg)\n", (int)o); abort();
  }
}
static size_t es_of(ncclDataType_t t) { return hora__dtype_size(dtype_of(t)); }

static int check(int mpi_rc) { return mpi_rc == MPI_SUCCESS ? 0 : 1; }
#define RET(call) return check(call) ? ncclSystemError : maybe_in_progress()

ncclResult_t ncclGetVersion(int *version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
/* The id names its maker (world rank, which is the new communicator's rank 0) and a number of its
 * own, so that a communicator over a subset of the world (a process set's) can be made: the
 * members tell the maker their world ranks point to point, it sends back the list in NCCL rank
 * order, and the members alone make it with MPI_Comm_create_group. */
typedef struct {
  int32_t maker, seq;
} emu_id_t;
#define EMU_TAG 31000

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static int32_t seq;
  memset(id, 0, sizeof *id);
  emu_id_t e = {0, ++seq % 1000};
  MPI_Comm_rank(MPI_COMM_WORLD, &e.maker);
  memcpy(id->internal, &e, sizeof e);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  (void)config;
  emu_id_t e;
  memcpy(&e, id.internal, sizeof e);
  int me, tag = EMU_TAG + e.seq;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  int *world = calloc((size_t)nranks, sizeof *world);
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c || !world) return ncclSystemError;
  if (rank == 0) {
    world[0] = me;
    for (int k = 1; k < nranks; k++) {
      int msg[2]; /* {NCCL rank, world rank} */
      MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (msg[0] > 0 && msg[0] < nranks) world[msg[0]] = msg[1];
    }
    for (int k = 1; k < nranks; k++) MPI_Send(world, nranks, MPI_INT, world[k], tag, MPI_COMM_WORLD);
  } else {
    int msg[2] = {rank, me};
    MPI_Send(msg, 2, MPI_INT, e.maker, tag, MPI_COMM_WORLD);
    MPI_Recv(world, nranks, MPI_INT, e.maker, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  MPI_Group wg, g;
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Group_incl(wg, nranks, world, &g);
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c->comm);
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  free(world);
  if (rc != MPI_SUCCESS) return ncclSystemError;
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  if (c->rank != rank || c->size != nranks) {
    fprintf(stderr, "nccl_emu: rank %d/%d given, MPI says %d/%d\n", rank, nranks, c->rank, c->size);
    return ncclInvalidArgument;
  }
  *comm = c;
  return maybe_in_progress();
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  ncclResult_t r = ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
  return r == ncclInProgress ? ncclSuccess : r; /* blocking communicator */
}
static void comm_free(ncclComm_t c) {
  if (!c) return;
  MPI_Comm_free(&c->comm);
  free(c);
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  (void)comm;
  return maybe_in_progress();
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  comm_free(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  comm_free(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
  (void)comm;
  *err = ncclSuccess;
  return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "emulated NCCL error"; }
const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "";
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  (void)stream;
  if (send != recv) memcpy(recv, send, count * es_of(t));
  MPI_Datatype mt;
  MPI_Op mo;
  if (hora__mpi_dtype_op(dtype_of(t), op_of(op), &mt, &mo) != HORA_SUCCESS) return ncclInternalError;
  RET(MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, mt, mo, comm->comm));
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  (void)stream;
  if (comm->rank == root && send != recv) memcpy(recv, send, count * es_of(t));
  RET(MPI_Bcast(recv, (int)(count * es_of(t)), MPI_BYTE, root, comm->comm));
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  (void)stream;
  size_t b = count * es_of(t);
  char *mine = (char *)recv + (size_t)comm->rank * b;
  if (send != mine) memcpy(mine, send, b);
  RET(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)b, MPI_BYTE, comm->comm));
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  size_t b = count * es_of(t), total = b * (size_t)comm->size;
  char *tmp = malloc(total ? total : 1);
  if (!tmp) return ncclSystemError;
  memcpy(tmp, send, total);
  MPI_Datatype mt;
  MPI_Op mo;
  if (hora__mpi_dtype_op(dtype_of(t), op_of(op), &mt, &mo) != HORA_SUCCESS) return ncclInternalError;
  int rc = MPI_Allreduce(MPI_IN_PLACE, tmp, (int)(count * (size_t)comm->size), mt, mo, comm->comm);
  memcpy(recv, tmp + (size_t)comm->rank * b, b);
  free(tmp);
  RET(rc);
}

/* ---- groups: point-to-point operations wait for ncclGroupEnd ---- */
typedef struct {
  int is_send, peer;
  void *buf;
  size_t bytes;
  ncclComm_t comm;
} p2p_t;
static p2p_t *queued;
static size_t nqueued, cap;
static int depth;

static ncclResult_t enqueue(int is_send, const void *buf, size_t bytes, int peer, ncclComm_t comm) {
  if (depth == 0) {
    fprintf(stderr, "nccl_emu: ncclSend/ncclRecv outside a group (hora always groups them)\n");
    return ncclInvalidUsage;
  }
  if (nqueued == cap) {
    cap = cap ? 2 * cap : 16;
    queued = realloc(queued, cap * sizeof *queued);
  }
  queued[nqueued++] = (p2p_t){is_send, peer, (void *)buf, bytes, comm};
  return ncclSuccess;
}
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  return enqueue(1, buf, count * es_of(t), peer, comm);
}
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  return enqueue(0, buf, count * es_of(t), peer, comm);
}
ncclResult_t ncclGroupStart(void) {
  depth++;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  if (--depth > 0) return ncclSuccess;
  MPI_Request *req = malloc((nqueued ? nqueued : 1) * sizeof *req);
  int bad = 0;
  for (size_t i = 0; i < nqueued; i++) {
    p2p_t *q = &queued[i];
    bad |= q->is_send ? check(MPI_Isend(q->buf, (int)q->bytes, MPI_BYTE, q->peer, 99, q->comm->comm, &req[i]))
                      : check(MPI_Irecv(q->buf, (int)q->bytes, MPI_BYTE, q->peer, 99, q->comm->comm, &req[i]));
  }
  bad |= check(MPI_Waitall((int)nqueued, req, MPI_STATUSES_IGNORE));
  free(req);
  nqueued = 0;
  return bad ? ncclSystemError : maybe_in_progress();
}
