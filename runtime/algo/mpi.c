/* The MPI_Allreduce path: the baseline hora is measured against, and the fallback for tiny
 * messages where a single MPI call has the lowest latency. MPI has no float16/bfloat16 and its
 * built-in ops cannot be reused for them, so every dtype gets a contiguous byte datatype and a
 * user op that calls hora's host reduce kernel. Counts above INT_MAX go in INT_MAX-sized pieces. */
#include <limits.h>
#include <pthread.h>

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

/* MPI_Iallreduce and a polled wait (hora__algo_wait), not MPI_Allreduce: a blocking MPI call never
 * returns when a peer is dead or stopped, and the heartbeat's verdict must end it. Cost on the
 * healthy path: docs/benchmarks.md ("Blocking waits that watch the heartbeat"). */
hora_result_t hora__allreduce_mpi(hora_ctx_t *ctx, MPI_Comm comm, void *buf, size_t count,
                                  hora_dtype_t dtype, hora_op_t op) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MPI_Op o = MPI_OP_NULL;
  HORA_CHECK(hora__mpi_dtype_op(dtype, op, &t, &o));
  size_t es = hora__dtype_size(dtype);
  for (size_t off = 0; off < count;) {
    size_t n = count - off < (size_t)INT_MAX ? count - off : (size_t)INT_MAX;
    MPI_Request req = MPI_REQUEST_NULL;
    HORA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)n, t, o, comm, &req));
    HORA_CHECK(hora__algo_wait(ctx, 1, &req, "MPI_Iallreduce"));
    off += n;
  }
  return HORA_SUCCESS;
}
