/* Adasum allreduce on host buffers (Maleki et al., "Scaling Distributed Training with Adaptive
 * Summation", MLSys 2021; Horovod's op=Adasum): recursive vector halving, distance doubling.
 *
 * Two gradients a and b are combined by the adaptive sum
 *     adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
 * (a coefficient is 1 when its |x|^2 < sqrt(DBL_MIN) = 1.49e-154, the threshold of Horovod 0.28's
 * horovod/common/ops/adasum/adasum.h, so a zero gradient adds): orthogonal gradients add, equal
 * ones average. n = 2^k ranks combine pairwise in a binary tree of k levels. With 4 ranks holding
 * a, b, c, d (one row per rank, "|" = the part of the vector a rank keeps):
 *
 *   level 0 (d=1)  0:[a0 a1] 1:[b0 b1]  0 keeps half 0, 1 keeps half 1; they swap the other half
 *                  → 0:[ab0 .] 1:[. ab1]  ab = adasum(a, b), dots summed over ranks {0,1}
 *                  2:[c0 c1] 3:[d0 d1]  → 2:[cd0 .] 3:[. cd1]
 *   level 1 (d=2)  0 and 2 split half 0 again, 1 and 3 half 1, and swap quarters
 *                  → each rank holds one quarter of adasum(ab, cd); the dot products a.b, |a|^2,
 *                    |b|^2 of the whole vectors are the sum of every rank's part over the group of
 *                    2d ranks that hold them (a recursive-doubling sum of 3 doubles, bitwise
 *                    identical on every rank of the group since each step adds two partials)
 *   allgather      the halvings are undone in reverse order (distance halving, vector doubling):
 *                  each rank swaps the part it holds with its partner of that level
 *
 * Cost model (N bytes, n = 2^k ranks, latency a, per-byte time b): the reduce phase sends
 * N/2 + N/4 + ... = (n-1)/n N bytes in k messages plus k(k+1)/2 small dot-product messages, the
 * allgather phase the same N(n-1)/n in k messages: T = (2k + k(k+1)/2) a + 2 (n-1)/n N b, as
 * the ring's bandwidth term with log-n latency. Dot products and the combination run in double.
 * Memory: scratch for ceil(count/2) elements. Non-power-of-two sizes are refused (as Horovod). */
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"

#define ADASUM_TAG 4141
#define ADASUM_EPS 1.4916681462400413e-154 /* sqrt(DBL_MIN), as Horovod 0.28 */
#define MAX_LEVELS 32

/* Send `sbytes` at sbuf to partner and receive `rbytes` into rbuf (either may be 0). The wait
 * watches the heartbeat's verdict (algo/state.c): a dead or stopped partner ends it with
 * HORA_ERR_REMOTE instead of a hang. */
static hora_result_t swap(hora_ctx_t *ctx, MPI_Comm comm, int partner, const void *sbuf, size_t sbytes,
                          void *rbuf, size_t rbytes) {
  MPI_Datatype st, rt;
  int sown = 0, rown = 0;
  HORA_CHECK(hora__mpi_bytes_type(sbytes, &st, &sown));
  hora_result_t rc = hora__mpi_bytes_type(rbytes, &rt, &rown);
  if (rc != HORA_SUCCESS) {
    if (sown) MPI_Type_free(&st);
    return rc;
  }
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int mrc = MPI_Irecv(rbuf, rbytes ? 1 : 0, rt, partner, ADASUM_TAG, comm, &req[0]);
  if (mrc == MPI_SUCCESS) mrc = MPI_Isend(sbuf, sbytes ? 1 : 0, st, partner, ADASUM_TAG, comm, &req[1]);
  if (sown) MPI_Type_free(&st); /* MPI keeps a type alive until the requests using it end */
  if (rown) MPI_Type_free(&rt);
  if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Isend/Irecv(adasum)", __FILE__, __LINE__);
  return hora__algo_wait_data(ctx, 2, req, "hora_allreduce (adasum)", sbytes + rbytes);
}

/* dots[0..3) = {lo.hi, |lo|^2, |hi|^2} over n elements of lo and hi. */
#define DOTS(T)                                                                              \
  static void dots_##T(const T *lo, const T *hi, size_t n, double *dots) {                  \
    double ab = 0, aa = 0, bb = 0;                                                           \
    for (size_t i = 0; i < n; i++) {                                                         \
      double a = lo[i], b = hi[i];                                                           \
      ab += a * b;                                                                           \
      aa += a * a;                                                                           \
      bb += b * b;                                                                           \
    }                                                                                        \
    dots[0] = ab, dots[1] = aa, dots[2] = bb;                                                \
  }                                                                                          \
  static void combine_##T(T *dst, const T *lo, const T *hi, size_t n, double ca, double cb) { \
    for (size_t i = 0; i < n; i++) dst[i] = (T)(ca * (double)lo[i] + cb * (double)hi[i]);  \
  }
DOTS(float)
DOTS(double)

/* Sum 3 doubles over the 2d ranks of this rank's group (aligned, ranks g*2d .. g*2d+2d-1 of comm).
 * The received partials live in a per-thread buffer, not on the stack: after HORA_ERR_REMOTE MPI
 * may still write them. */
static hora_result_t group_sum(hora_ctx_t *ctx, MPI_Comm comm, int rank, int d, double *s) {
  static _Thread_local double r[3];
  for (int dd = 1; dd <= d; dd <<= 1) {
    int partner = rank ^ dd;
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int mrc = MPI_Irecv(r, 3, MPI_DOUBLE, partner, ADASUM_TAG + 1, comm, &req[0]);
    if (mrc == MPI_SUCCESS) mrc = MPI_Isend(s, 3, MPI_DOUBLE, partner, ADASUM_TAG + 1, comm, &req[1]);
    if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Isend/Irecv(adasum dots)", __FILE__, __LINE__);
    HORA_CHECK(hora__algo_wait(ctx, 2, req, "hora_allreduce (adasum dots)"));
    /* The lower rank's partial first, so both ranks compute the same sum bit for bit. */
    for (int k = 0; k < 3; k++) s[k] = rank < partner ? s[k] + r[k] : r[k] + s[k];
  }
  return HORA_SUCCESS;
}

static void scale_in_place(void *buf, size_t count, int is64, double f) {
  if (f == 1.0) return;
  for (size_t i = 0; i < count; i++)
    if (is64) ((double *)buf)[i] *= f;
    else ((float *)buf)[i] = (float)(((float *)buf)[i] * f);
}

/* The Adasum of buf (count elements) over the n = 2^k ranks of comm (this one is `rank`), in place:
 * the reduce phase and the allgather phase of the comment at the top. */
static hora_result_t adasum_comm(hora_ctx_t *ctx, MPI_Comm comm, int rank, int n, char *buf, size_t count,
                                 int is64) {
  const size_t es = is64 ? sizeof(double) : sizeof(float);
  void *tmp = NULL;
  if (n > 1) HORA_CHECK(hora__algo_scratch(ctx, (count / 2 + 1) * es, &tmp));
  size_t off[MAX_LEVELS + 1], len[MAX_LEVELS + 1];
  off[0] = 0, len[0] = count;
  int level = 0;
  /* Reduce phase: halve the part held, combine it with the partner's copy of that part. */
  for (int d = 1; d < n; d <<= 1, level++) {
    int partner = rank ^ d, lower = !(rank & d);
    size_t left = len[level] / 2, right = len[level] - left;
    size_t koff = lower ? off[level] : off[level] + left, klen = lower ? left : right;
    size_t soff = lower ? off[level] + left : off[level], slen = lower ? right : left;
    HORA_CHECK(swap(ctx, comm, partner, buf + soff * es, slen * es, tmp, klen * es));
    const void *mine = buf + koff * es;
    const void *lo = lower ? mine : tmp, *hi = lower ? tmp : mine;
    double s[3];
    if (is64) dots_double(lo, hi, klen, s);
    else dots_float(lo, hi, klen, s);
    HORA_CHECK(group_sum(ctx, comm, rank, d, s));
    double ca = s[1] >= ADASUM_EPS ? 1.0 - s[0] / (2.0 * s[1]) : 1.0;
    double cb = s[2] >= ADASUM_EPS ? 1.0 - s[0] / (2.0 * s[2]) : 1.0;
    if (is64) combine_double((double *)(buf + koff * es), lo, hi, klen, ca, cb);
    else combine_float((float *)(buf + koff * es), lo, hi, klen, ca, cb);
    off[level + 1] = koff, len[level + 1] = klen;
  }
  /* Allgather phase: undo the halvings, newest first. */
  for (int d = n >> 1; d >= 1; d >>= 1) {
    level--;
    int partner = rank ^ d, lower = !(rank & d);
    size_t left = len[level] / 2;
    size_t poff = lower ? off[level] + left : off[level], plen = len[level] - len[level + 1];
    HORA_CHECK(swap(ctx, comm, partner, buf + off[level + 1] * es, len[level + 1] * es, buf + poff * es,
                    plen * es));
  }
  return HORA_SUCCESS;
}

hora_result_t hora__adasum_host(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                hora_dtype_t dtype, double prescale, double postscale) {
  const int n = ctx->size;
  if (n & (n - 1))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "hora_allreduce: HORA_ADASUM needs a power-of-two number of ranks (this context "
                    "has %d), as Horovod's Adasum does", n);
  const int is64 = dtype == HORA_FLOAT64;
  if (src != dst && count) memmove(dst, src, count * (is64 ? sizeof(double) : sizeof(float)));
  scale_in_place(dst, count, is64, prescale);
  HORA_CHECK(adasum_comm(ctx, ctx->world, ctx->rank, n, dst, count, is64));
  scale_in_place(dst, count, is64, postscale);
  return HORA_SUCCESS;
}

/* Horovod 0.28's Adasum of device tensors in its NCCL builds (AdasumGpuAllreduceOp, and the
 * postscale divided by the local size in EnqueueTensorAllreduces): within each node the ranks'
 * prescaled vectors are summed (there: ncclReduceScatter; here: the ring over ctx->local), the
 * node sums are combined by Adasum across nodes (there: from level local_size of the global
 * tree, each local rank on its slice; here: every local rank over ctx->cross on the whole vector,
 * the same inputs and steps on every local rank, so the same bits), and the result is multiplied
 * by postscale / local size: an average within the node, Adasum between nodes. One node: the
 * average. The same number of ranks on every node and a power-of-two number of nodes, as
 * Horovod's checks in horovod/torch/mpi_ops.py require, are checked with the arguments
 * (check_adasum_layout in check.c). */
hora_result_t hora__adasum_nodes_host(hora_ctx_t *ctx, void *buf, size_t count, hora_dtype_t dtype,
                                      double prescale, double postscale) {
  const int C = ctx->cross_size; /* the argument checks refused other layouts (check.c) */
  if (!ctx->uniform_local_size || (C & (C - 1)))
    return HORA_ERR(HORA_ERR_INTERNAL, "hora_allreduce: device Adasum reached with a node layout the "
                    "argument checks refuse");
  const int is64 = dtype == HORA_FLOAT64;
  scale_in_place(buf, count, is64, prescale);
  if (ctx->local_size > 1 && count)
    HORA_CHECK(hora__ring_allreduce(ctx, ctx->local, buf, buf, count, dtype, HORA_SUM));
  if (C > 1) HORA_CHECK(adasum_comm(ctx, ctx->cross, ctx->cross_rank, C, buf, count, is64));
  scale_in_place(buf, count, is64, postscale / (double)ctx->local_size);
  return HORA_SUCCESS;
}
