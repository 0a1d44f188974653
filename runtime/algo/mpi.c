/* The MPI_Allreduce path: the baseline hora is measured against, and the fallback for tiny
 * messages where a single MPI call has the lowest latency. MPI has no float16/bfloat16 and its
 * built-in ops cannot be reused for them, so every dtype gets a contiguous byte datatype and a
 * user op that calls hora's host reduce kernel. Counts above INT_MAX go in INT_MAX-sized pieces. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "hora_kernels.h"

static MPI_Datatype types[HORA_DTYPE_COUNT];
static MPI_Op ops[HORA_OP_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int init_rc = MPI_SUCCESS;

static int dtype_of(MPI_Datatype t) {
  for (int i = 0; i < HORA_DTYPE_COUNT; i++)
    if (types[i] == t) return i;
  return -1;
}

#define DEF_USER_OP(name, hop)                                                  \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {         \
    int d = dtype_of(*dt);                                                      \
    if (d >= 0) hora__reduce_host(inout, inout, in, (size_t)*len, (hora_dtype_t)d, hop, NULL); \
  }
DEF_USER_OP(op_sum, HORA_SUM)
DEF_USER_OP(op_min, HORA_MIN)
DEF_USER_OP(op_max, HORA_MAX)
DEF_USER_OP(op_prod, HORA_PRODUCT)

static void create_all(void) {
  for (int i = 0; i < HORA_DTYPE_COUNT && init_rc == MPI_SUCCESS; i++) {
    init_rc = MPI_Type_contiguous((int)hora__dtype_size((hora_dtype_t)i), MPI_BYTE, &types[i]);
    if (init_rc == MPI_SUCCESS) init_rc = MPI_Type_commit(&types[i]);
  }
  MPI_User_function *fns[HORA_OP_COUNT] = {op_sum, op_sum, op_min, op_max, op_prod};
  for (int i = 0; i < HORA_OP_COUNT && init_rc == MPI_SUCCESS; i++)
    init_rc = MPI_Op_create(fns[i], 1, &ops[i]);
}

hora_result_t hora__mpi_dtype_op(hora_dtype_t dtype, hora_op_t op, MPI_Datatype *type, MPI_Op *mop) {
  pthread_once(&once, create_all);
  if (init_rc != MPI_SUCCESS) return hora__mpi_error(init_rc, "creating MPI types/ops", __FILE__, __LINE__);
  if ((unsigned)dtype >= HORA_DTYPE_COUNT || (unsigned)op >= HORA_OP_COUNT)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "unknown dtype %d or op %d", (int)dtype, (int)op);
  *type = types[dtype];
  *mop = ops[op];
  return HORA_SUCCESS;
}

#define RD_TAG 0x4853
#define RD_MAX_BYTES ((size_t)64 << 10) /* recursive doubling up to here, MPI_Iallreduce above */

/* One step of recursive doubling: send `bytes` of buf to `to` and/or receive them from `from`
 * into tmp (-1: none), with a polled wait that watches the failure verdict. */
static hora_result_t rd_xchg(hora_ctx_t *ctx, MPI_Comm comm, const void *buf, void *tmp, int bytes,
                             int to, int from) {
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  if (from >= 0) HORA_MPI_CHECK(MPI_Irecv(tmp, bytes, MPI_BYTE, from, RD_TAG, comm, &req[0]));
  if (to >= 0) HORA_MPI_CHECK(MPI_Isend(buf, bytes, MPI_BYTE, to, RD_TAG, comm, &req[1]));
  return hora__algo_wait(ctx, 2, req, "allreduce (MPI path)");
}

/* dst = a OP b with hora's host kernel (which returns a bare code): an error gets a message. */
static hora_result_t red(void *dst, const void *a, const void *b, size_t count, hora_dtype_t dtype, hora_op_t op) {
  hora_result_t rc = hora__reduce_host(dst, a, b, count, dtype, op, NULL);
  if (rc != HORA_SUCCESS) return HORA_ERR(HORA_ERR_INTERNAL, "allreduce (MPI path): host reduce failed (%s)", hora_result_name(rc));
  return HORA_SUCCESS;
}

/* Small buffers: recursive doubling over point-to-point messages, which a polled wait can leave
 * (MPI_Iallreduce's schedule costs microseconds per call more: docs/benchmarks.md). With p2 the
 * largest power of two <= n, ranks p2.. first fold into ranks 0..n-p2-1 and get the result back
 * at the end. In each step both partners compute f(lower rank's value, higher rank's value), so
 * every rank ends with the same bits. log2(p2) (+2) message latencies, as MPI's own small-message
 * allreduce. */
static hora_result_t rd_allreduce(hora_ctx_t *ctx, MPI_Comm comm, void *buf, size_t count,
                                  hora_dtype_t dtype, hora_op_t op) {
  int n, r;
  HORA_MPI_CHECK(MPI_Comm_size(comm, &n));
  HORA_MPI_CHECK(MPI_Comm_rank(comm, &r));
  size_t es = hora__dtype_size(dtype), bytes = count * es;
  char stack[4096];
  char *tmp = bytes <= sizeof stack ? stack : malloc(bytes);
  if (!tmp) return HORA_ERR(HORA_ERR_NO_MEMORY, "allreduce: out of memory (%zu bytes)", bytes);
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2, ib = (int)bytes;
  hora_result_t rc = HORA_SUCCESS;
  if (r >= p2) { /* folded: give the value to r - p2, get the result back */
    rc = rd_xchg(ctx, comm, buf, NULL, ib, r - p2, -1);
    if (rc == HORA_SUCCESS) rc = rd_xchg(ctx, comm, NULL, buf, ib, -1, r - p2);
    goto out;
  }
  if (r < extra) {
    rc = rd_xchg(ctx, comm, NULL, tmp, ib, -1, r + p2);
    if (rc == HORA_SUCCESS) rc = red(buf, buf, tmp, count, dtype, op);
  }
  for (int mask = 1; mask < p2 && rc == HORA_SUCCESS; mask <<= 1) {
    int peer = r ^ mask;
    rc = rd_xchg(ctx, comm, buf, tmp, ib, peer, peer);
    if (rc != HORA_SUCCESS) break;
    if (peer > r) {
      rc = red(buf, buf, tmp, count, dtype, op);
    } else {
      rc = red(tmp, tmp, buf, count, dtype, op); /* f(peer's, mine) */
      memcpy(buf, tmp, bytes);
    }
  }
  if (rc == HORA_SUCCESS && r < extra) rc = rd_xchg(ctx, comm, buf, NULL, ib, r + p2, -1);
out:
  /* After a verdict a receive into tmp may still be pending: leak a heap tmp then (a stack one is
   * only ever the target of a receive that was matched: the peer is stopped or dead). */
  if (tmp != stack && !hora__ctx_failed(ctx)) free(tmp);
  return rc;
}

/* Non-blocking MPI and a polled wait (hora__algo_wait), not MPI_Allreduce: a blocking MPI call
 * never returns when a peer is dead or stopped, and the heartbeat's verdict must end it. Cost on
 * the healthy path: docs/benchmarks.md ("Blocking calls that watch the heartbeat"). */
hora_result_t hora__allreduce_mpi(hora_ctx_t *ctx, MPI_Comm comm, void *buf, size_t count,
                                  hora_dtype_t dtype, hora_op_t op) {
  if (count * hora__dtype_size(dtype) <= RD_MAX_BYTES) return rd_allreduce(ctx, comm, buf, count, dtype, op);
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MPI_Op o = MPI_OP_NULL;
  HORA_CHECK(hora__mpi_dtype_op(dtype, op, &t, &o));
  size_t es = hora__dtype_size(dtype);
  for (size_t off = 0; off < count;) {
    size_t n = count - off < (size_t)INT_MAX ? count - off : (size_t)INT_MAX;
    MPI_Request req = MPI_REQUEST_NULL;
    HORA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)n, t, o, comm, &req));
    HORA_CHECK(hora__algo_wait_data(ctx, 1, &req, "MPI_Iallreduce", 2 * n * es));
    off += n;
  }
  return HORA_SUCCESS;
}
