/* Every blocking collective on device buffers (HORA_DEVICE_CUDA), checked element by element on
 * the host: allreduce x dtype x op x count x in/out of place (plus prescale/postscale), reducescatter
 * (with scale factors too), op=HORA_ADASUM against a double reference of Horovod's GPU Adasum (on
 * one node and, with --fake-nodes K, across K fake nodes), broadcast, allgather (in place too),
 * allgatherv (uneven), alltoall, alltoallv. Inputs are small
 * rank-dependent integers, exact in any reduction order and in f16/bf16 (so also under
 * HORA_COMPRESSION). The receive buffer is poisoned on the device before every call.
 *
 * Run by ctest with 1 rank (auto: NCCL) and 2-4 ranks sharing the GPU (HORA_GPU_PATH=staged, and
 * naive); --expect-path nccl|staged|naive checks which path the context took. Also the engine's
 * entry points in runtime/comm and the async engine with device tensors. Exits 77 on every rank
 * when any rank sees no GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

#include "comm/gpu.h"
#include "core/ctx.h"
#include "engine/engine.h"
#include "hora_kernels.h"
#include "hora_test.h"

static hora_ctx_t *ctx;
static int rank, size;
static size_t counts[6];
static size_t max_count = SIZE_MAX;

#define CK(call)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                               \
    }                                                                                             \
  } while (0)

#include "hora_test_values.h"

static long check_reduced(const char *what, const void *got, hora_dtype_t d, hora_op_t op, size_t i0, size_t n,
                          double pre, double post) {
  long bad = 0;
  for (size_t i = 0; i < n; i++) {
    char tmp[8];
    hora__elem_store(tmp, d, 0, expected(d, op, i0 + i, pre, post));
    double wr = hora__elem_load(tmp, d, 0), g = hora__elem_load(got, d, i);
    if (!(fabs(g - wr) <= tol(d, op, wr)) && bad++ < 3) EXPECT(0, "%s: element %zu: got %g want %g", what, i0 + i, g, wr);
  }
  if (bad > 3) EXPECT(0, "%s: %ld wrong elements in all", what, bad);
  return bad;
}

/* Device and host buffers big enough for the largest count times the world size. */
static char *h_a, *h_b, *d_a, *d_b;
static size_t cap_bytes;

static void to_dev(void *d, const void *h, size_t bytes) { if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice)); }
static void to_host(void *h, const void *d, size_t bytes) { if (bytes) CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost)); }
static void poison(void *d, size_t bytes) { CK(cudaMemset(d, 0xa5, bytes ? bytes : 1)); }

static void test_allreduce(void) {
  for (int d = 0; d < HORA_DTYPE_COUNT; d++)
    for (int op = 0; op < HORA_OP_COUNT; op++)
      for (int ci = 0; ci < 6; ci++)
        for (int inplace = 0; inplace < 2; inplace++) {
          size_t n = counts[ci], es = esize((hora_dtype_t)d);
          if (n > max_count) continue;
          /* bool is OR/AND (tested on the host); NCCL has no int16 reduction. */
          if (d == HORA_BOOL || d == HORA_INT16) continue;
          double pre = 1, post = 1;
          if (is_float((hora_dtype_t)d) && ci == 4) pre = 2.0, post = 0.5;
          for (size_t i = 0; i < n; i++) hora__elem_store(h_a, (hora_dtype_t)d, i, input((hora_dtype_t)d, (hora_op_t)op, rank, i));
          to_dev(d_a, h_a, n * es);
          void *recv = inplace ? d_a : d_b;
          if (!inplace) poison(d_b, n * es);
          char what[128];
          snprintf(what, sizeof what, "allreduce %s dtype %d op %d count %zu pre %g post %g", inplace ? "in place" : "out of place",
                   d, op, n, pre, post);
          hora_result_t rc = hora_allreduce(ctx, d_a, recv, n, (hora_dtype_t)d, (hora_op_t)op, pre, post, HORA_DEVICE_CUDA);
          EXPECT(rc == HORA_SUCCESS, "%s: %s (%s)", what, hora_result_name(rc), hora_last_error());
          to_host(h_b, recv, n * es);
          check_reduced(what, h_b, (hora_dtype_t)d, (hora_op_t)op, 0, n, pre, post);
        }
}

static void test_reducescatter(void) {
  const hora_op_t ops[] = {HORA_SUM, HORA_AVERAGE, HORA_MAX};
  for (int d = 0; d < HORA_DTYPE_COUNT; d++)
    for (int oi = 0; oi < 3; oi++)
      for (int ci = 0; ci < 5; ci++) {
        size_t n = counts[ci], es = esize((hora_dtype_t)d), total = n * (size_t)size;
        hora_op_t op = ops[oi];
        if (d == HORA_BOOL || d == HORA_INT16) continue; /* as in test_allreduce */
        double pre = 1, post = 1;
        if (is_float((hora_dtype_t)d) && ci == 4) pre = 2.0, post = 0.5; /* as in test_allreduce */
        for (size_t i = 0; i < total; i++) hora__elem_store(h_a, (hora_dtype_t)d, i, input((hora_dtype_t)d, op, rank, i));
        to_dev(d_a, h_a, total * es);
        poison(d_b, n * es);
        EXPECT_OK(hora_reducescatter(ctx, d_a, d_b, n, (hora_dtype_t)d, op, pre, post, HORA_DEVICE_CUDA));
        to_host(h_b, d_b, n * es);
        char what[112];
        snprintf(what, sizeof what, "reducescatter dtype %d op %d count %zu pre %g post %g", d, (int)op, n, pre, post);
        check_reduced(what, h_b, (hora_dtype_t)d, op, (size_t)rank * n, n, pre, post);
      }
}

/* ---- op=HORA_ADASUM on device buffers: Horovod 0.28's GPU Adasum ---- */

/* Element i of rank r's Adasum input: no two ranks' vectors parallel, no node's sum zero. */
static double ada_in(int r, size_t i) { return (double)((int)((i * 7 + (size_t)r * 3) % 11) - 5) + 0.25 * (r + 1); }

/* a = adasum(a, b) in double (hora.h's formula and threshold). */
static void ref_adasum(double *a, const double *b, size_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; i++) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  double ca = aa >= 1.4916681462400413e-154 ? 1.0 - ab / (2.0 * aa) : 1.0;
  double cb = bb >= 1.4916681462400413e-154 ? 1.0 - ab / (2.0 * bb) : 1.0;
  for (size_t i = 0; i < n; i++) a[i] = ca * a[i] + cb * b[i];
}

/* nodes fake nodes (0: one node), node k holding ranks [k*size/nodes, (k+1)*size/nodes): each
 * node's ranks summed, the node sums combined by Adasum (node k with k xor d, the lower first),
 * times post / local size; prescale on the inputs. Blocking and async, float32 and float64; a
 * layout Horovod refuses (nodes of different sizes, a node count that is not a power of two) is
 * HORA_ERR_INVALID_ARGUMENT on every rank, the receive buffer untouched. */
static void test_adasum(int nodes) {
  int C = nodes ? nodes : 1, L = size / C;
  int uniform = L * C == size, pow2 = !(C & (C - 1));
  const size_t n = 1000;
  const double pre = 2.0, post = 0.5;
  double *ref = calloc(n * (size_t)C, sizeof *ref);
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < n; i++) ref[(size_t)(r * C / size) * n + i] += pre * ada_in(r, i);
  for (int d = 1; d < C; d <<= 1)
    for (int k = 0; k + d < C; k += 2 * d) ref_adasum(ref + (size_t)k * n, ref + (size_t)(k + d) * n, n);
  for (int dt = 0; dt < 2; dt++)
    for (int async = 0; async < 2; async++) {
      hora_dtype_t d = dt ? HORA_FLOAT64 : HORA_FLOAT32;
      size_t es = esize(d);
      for (size_t i = 0; i < n; i++) hora__elem_store(h_a, d, i, ada_in(rank, i));
      to_dev(d_a, h_a, n * es);
      poison(d_b, n * es);
      char what[96];
      snprintf(what, sizeof what, "adasum %s %s, %d node(s) of %d", async ? "async" : "blocking",
               dt ? "f64" : "f32", C, L);
      hora_result_t rc;
      if (async) {
        hora_handle_t *h = NULL;
        rc = hora_allreduce_async(ctx, dt ? "adasum.f64" : "adasum.f32", d_a, d_b, n, d, HORA_ADASUM, pre, post,
                                  HORA_DEVICE_CUDA, &h);
        if (rc == HORA_SUCCESS) {
          rc = hora_wait(h);
          hora_handle_free(h);
        }
      } else {
        rc = hora_allreduce(ctx, d_a, d_b, n, d, HORA_ADASUM, pre, post, HORA_DEVICE_CUDA);
      }
      if (!uniform || !pow2) {
        EXPECT(rc == HORA_ERR_INVALID_ARGUMENT && strstr(hora_last_error(), uniform ? "power-of-two number of nodes"
                                                                                    : "same number of ranks"),
               "%s: %s (%s)", what, hora_result_name(rc), hora_last_error());
        to_host(h_b, d_b, n * es);
        EXPECT(((unsigned char *)h_b)[0] == 0xa5 && ((unsigned char *)h_b)[n * es - 1] == 0xa5,
               "%s: recvbuf written", what);
        continue;
      }
      EXPECT(rc == HORA_SUCCESS, "%s: %s (%s)", what, hora_result_name(rc), hora_last_error());
      to_host(h_b, d_b, n * es);
      long bad = 0;
      for (size_t i = 0; i < n; i++) {
        double want = post / L * ref[i], got = hora__elem_load(h_b, d, i);
        if (!(fabs(got - want) <= (dt ? 1e-12 : 1e-5) * (1.0 + fabs(want))) && bad++ < 3)
          EXPECT(0, "%s: element %zu: got %.9g want %.9g", what, i, got, want);
      }
      EXPECT(bad == 0, "%s: %ld wrong elements", what, bad);
    }
  free(ref);
}

/* Element i of rank r's contribution to the data movers. */
static int32_t mv(int r, size_t i) { return (int32_t)(r * 1000003 + (int)(i % 1000003)); }

static void test_movers(void) {
  for (int ci = 0; ci < 5; ci++) {
    size_t n = counts[ci];
    /* broadcast from rank 0 and from the last rank */
    for (int root = 0; root < size; root += (size > 1 ? size - 1 : 1)) {
      int32_t *h = (int32_t *)h_a;
      for (size_t i = 0; i < n; i++) h[i] = rank == root ? mv(root, i) : -1;
      to_dev(d_a, h, n * 4);
      EXPECT_OK(hora_broadcast(ctx, d_a, n, HORA_INT32, root, HORA_DEVICE_CUDA));
      to_host(h_b, d_a, n * 4);
      long bad = 0;
      for (size_t i = 0; i < n; i++) bad += ((int32_t *)h_b)[i] != mv(root, i);
      EXPECT(bad == 0, "broadcast root %d count %zu: %ld wrong", root, n, bad);
    }
    /* allgather, out of place and in place */
    for (int inplace = 0; inplace < 2; inplace++) {
      int32_t *h = (int32_t *)h_a;
      for (size_t i = 0; i < n; i++) h[i] = mv(rank, i);
      poison(d_b, n * (size_t)size * 4);
      const void *send = d_a;
      if (inplace) {
        to_dev(d_b + (size_t)rank * n * 4, h, n * 4);
        send = d_b + (size_t)rank * n * 4;
      } else {
        to_dev(d_a, h, n * 4);
      }
      EXPECT_OK(hora_allgather(ctx, send, d_b, n, HORA_INT32, HORA_DEVICE_CUDA));
      to_host(h_b, d_b, n * (size_t)size * 4);
      long bad = 0;
      for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++) bad += ((int32_t *)h_b)[(size_t)r * n + i] != mv(r, i);
      EXPECT(bad == 0, "allgather %s count %zu: %ld wrong", inplace ? "in place" : "out of place", n, bad);
    }
    /* allgatherv: rank r contributes n + r elements */
    {
      size_t rc[64], total = 0;
      for (int r = 0; r < size; r++) total += (rc[r] = n + (size_t)r);
      int32_t *h = (int32_t *)h_a;
      for (size_t i = 0; i < rc[rank]; i++) h[i] = mv(rank, i);
      to_dev(d_a, h, rc[rank] * 4);
      poison(d_b, total * 4);
      EXPECT_OK(hora_allgatherv(ctx, d_a, rc[rank], d_b, rc, HORA_INT32, HORA_DEVICE_CUDA));
      to_host(h_b, d_b, total * 4);
      long bad = 0;
      size_t off = 0;
      for (int r = 0; r < size; r++)
        for (size_t i = 0; i < rc[r]; i++) bad += ((int32_t *)h_b)[off++] != mv(r, i);
      EXPECT(bad == 0, "allgatherv count %zu: %ld wrong", n, bad);
    }
    /* alltoall: block p of rank r holds mv(r, p * n + i) */
    {
      int32_t *h = (int32_t *)h_a;
      for (size_t i = 0; i < n * (size_t)size; i++) h[i] = mv(rank, i);
      to_dev(d_a, h, n * (size_t)size * 4);
      poison(d_b, n * (size_t)size * 4);
      EXPECT_OK(hora_alltoall(ctx, d_a, d_b, n, HORA_INT32, HORA_DEVICE_CUDA));
      to_host(h_b, d_b, n * (size_t)size * 4);
      long bad = 0;
      for (int p = 0; p < size; p++)
        for (size_t i = 0; i < n; i++) bad += ((int32_t *)h_b)[(size_t)p * n + i] != mv(p, (size_t)rank * n + i);
      EXPECT(bad == 0, "alltoall count %zu: %ld wrong", n, bad);
    }
    /* alltoallv: rank r sends (r + p) % 3 + n elements to rank p */
    if (n <= 1000) {
      size_t sc[64], rcv[64], so = 0, ro = 0;
      for (int p = 0; p < size; p++) {
        sc[p] = (size_t)((rank + p) % 3) + n;
        rcv[p] = (size_t)((p + rank) % 3) + n;
      }
      int32_t *h = (int32_t *)h_a;
      for (int p = 0; p < size; p++)
        for (size_t i = 0; i < sc[p]; i++) h[so++] = mv(rank, (size_t)p * 10000 + i);
      to_dev(d_a, h, so * 4);
      for (int p = 0; p < size; p++) ro += rcv[p];
      poison(d_b, ro * 4);
      EXPECT_OK(hora_alltoallv(ctx, d_a, sc, d_b, rcv, HORA_INT32, HORA_DEVICE_CUDA));
      to_host(h_b, d_b, ro * 4);
      long bad = 0;
      size_t off = 0;
      for (int p = 0; p < size; p++)
        for (size_t i = 0; i < rcv[p]; i++) bad += ((int32_t *)h_b)[off++] != mv(p, (size_t)rank * 10000 + i);
      EXPECT(bad == 0, "alltoallv count %zu: %ld wrong", n, bad);
    }
  }
}

/* The engine's entry points: several float32 allreduces started back to back (on the NCCL path
 * they run asynchronously), polled to completion; a fusion-style batched copy on hora's stream. */
static void test_async(void) {
  enum { K = 4 };
  const size_t ns[K] = {1, 1000, 4097, 65536};
  hora_gpu_pending_t *p[K];
  float *d[K];
  for (int k = 0; k < K; k++) {
    for (size_t i = 0; i < ns[k]; i++) ((float *)h_a)[i] = (float)input(HORA_FLOAT32, HORA_SUM, rank, i + (size_t)k);
    CK(cudaMalloc((void **)&d[k], ns[k] * 4));
    to_dev(d[k], h_a, ns[k] * 4);
  }
  for (int k = 0; k < K; k++) {
    p[k] = NULL;
    EXPECT_OK(hora__gpu_allreduce_start(ctx, d[k], d[k], ns[k], HORA_FLOAT32, k == 2 ? HORA_AVERAGE : HORA_SUM,
                                        1.0, k == 3 ? 0.5 : 1.0, &p[k]));
  }
  for (int k = 0; k < K; k++) {
    if (!p[k]) {
      cudaFree(d[k]);
      continue;
    }
    int done = 0;
    double t0 = MPI_Wtime();
    while (!done && MPI_Wtime() - t0 < 60) EXPECT_OK(hora__gpu_pending_poll(ctx, p[k], &done));
    EXPECT(done, "async allreduce %d did not complete in 60 s", k);
    hora__gpu_pending_free(ctx, p[k]);
    to_host(h_b, d[k], ns[k] * 4);
    long bad = 0;
    for (size_t i = 0; i < ns[k]; i++) {
      double w = expected(HORA_FLOAT32, k == 2 ? HORA_AVERAGE : HORA_SUM, i + (size_t)k, 1.0, k == 3 ? 0.5 : 1.0);
      bad += !(fabs(((float *)h_b)[i] - w) <= fabs(w) * 4e-7);
    }
    EXPECT(bad == 0, "async allreduce %d (count %zu): %ld wrong", k, ns[k], bad);
    cudaFree(d[k]);
  }
  /* Pack three regions of d_a into d_b back to back, as the fusion buffer does. */
  for (size_t i = 0; i < 3000; i++) ((int32_t *)h_a)[i] = mv(rank, i);
  to_dev(d_a, h_a, 3000 * 4);
  poison(d_b, 3000 * 4);
  hora_copy_desc_t descs[3] = {{d_b, d_a + 4 * 2000, 1000 * 4}, {d_b + 4000, d_a, 7 * 4}, {d_b + 4028, d_a + 4 * 100, 5 * 4}};
  EXPECT_OK(hora__gpu_batched_copy(ctx, descs, 3));
  CK(cudaDeviceSynchronize());
  to_host(h_b, d_b, 1012 * 4);
  long bad = 0;
  for (size_t i = 0; i < 1000; i++) bad += ((int32_t *)h_b)[i] != mv(rank, 2000 + i);
  for (size_t i = 0; i < 7; i++) bad += ((int32_t *)h_b)[1000 + i] != mv(rank, i);
  for (size_t i = 0; i < 5; i++) bad += ((int32_t *)h_b)[1007 + i] != mv(rank, 100 + i);
  EXPECT(bad == 0, "hora__gpu_batched_copy: %ld wrong", bad);
}

/* A device copy of the first n floats of h_a (cudaFree it). */
static float *dev_floats(size_t n) {
  float *d = NULL;
  CK(cudaMalloc((void **)&d, n * 4));
  to_dev(d, h_a, n * 4);
  return d;
}

/* The async allreduce named PREFIX.k of n floats, in place on d. */
static void start_allreduce(const char *prefix, int k, float *d, size_t n, hora_op_t op, hora_handle_t **h) {
  char name[32];
  snprintf(name, sizeof name, "%s.%d", prefix, k);
  EXPECT_OK(hora_allreduce_async(ctx, name, d, d, n, HORA_FLOAT32, op, 1.0, 1.0, HORA_DEVICE_CUDA, h));
}

/* Wait for and free h, then copy the n result floats of d to h_b. 0 when the start had failed
 * (no handle: nothing to check). */
static int finish_allreduce(hora_handle_t *h, const float *d, size_t n) {
  if (!h) return 0;
  EXPECT_OK(hora_wait(h));
  EXPECT_OK(hora_handle_free(h));
  to_host(h_b, d, n * 4);
  return 1;
}

/* The async engine with device tensors: it runs them through the same hooks on its own context.
 * Several allreduces (different names, counts, ops) in flight at once, submitted in a
 * rank-dependent order, then an allgather and an alltoall. */
static void test_engine(void) {
  enum { K = 3 };
  const size_t ns[K] = {1, 1000, 70001};
  const hora_op_t ops[K] = {HORA_SUM, HORA_AVERAGE, HORA_MAX};
  float *d[K];
  hora_handle_t *h[K];
  for (int k = 0; k < K; k++) {
    for (size_t i = 0; i < ns[k]; i++) ((float *)h_a)[i] = (float)input(HORA_FLOAT32, ops[k], rank, i);
    d[k] = dev_floats(ns[k]);
    h[k] = NULL;
  }
  for (int j = 0; j < K; j++) {
    int k = (j + rank) % K;
    start_allreduce("grad", k, d[k], ns[k], ops[k], &h[k]);
  }
  for (int k = 0; k < K; k++) {
    if (!finish_allreduce(h[k], d[k], ns[k])) continue;
    char what[64];
    snprintf(what, sizeof what, "engine allreduce grad.%d", k);
    check_reduced(what, h_b, HORA_FLOAT32, ops[k], 0, ns[k], 1.0, 1.0);
    cudaFree(d[k]);
  }
  size_t n = 333;
  int32_t *hh = (int32_t *)h_a;
  for (size_t i = 0; i < n * (size_t)size; i++) hh[i] = mv(rank, i);
  to_dev(d_a, hh, n * (size_t)size * 4);
  poison(d_b, n * (size_t)size * 4);
  hora_handle_t *ha = NULL, *hb = NULL;
  EXPECT_OK(hora_allgather_async(ctx, "ag", d_a, d_b, n, HORA_INT32, HORA_DEVICE_CUDA, &ha));
  if (ha) {
    EXPECT_OK(hora_wait(ha));
    hora_handle_free(ha);
  }
  to_host(h_b, d_b, n * (size_t)size * 4);
  long bad = 0;
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < n; i++) bad += ((int32_t *)h_b)[(size_t)r * n + i] != mv(r, i);
  EXPECT(bad == 0, "engine allgather: %ld wrong", bad);
  poison(d_b, n * (size_t)size * 4);
  EXPECT_OK(hora_alltoall_async(ctx, "a2a", d_a, d_b, n, HORA_INT32, HORA_DEVICE_CUDA, &hb));
  if (hb) {
    EXPECT_OK(hora_wait(hb));
    hora_handle_free(hb);
  }
  to_host(h_b, d_b, n * (size_t)size * 4);
  bad = 0;
  for (int p = 0; p < size; p++)
    for (size_t i = 0; i < n; i++) bad += ((int32_t *)h_b)[(size_t)p * n + i] != mv(p, (size_t)rank * n + i);
  EXPECT(bad == 0, "engine alltoall: %ld wrong", bad);
}

/* One grouped allreduce of device tensors through the async engine, which fuses it (one device
 * fusion buffer, one collective): member k has counts[k] elements of dtype d, input(d, op, rank,
 * i) at element i; odd members are out of place. Each member is checked against the reference,
 * and the engine must have counted a fused group. */
static void fused_group(const char *prefix, hora_dtype_t d, hora_op_t op, double pre, double post,
                        const size_t *ns, int k) {
  enum { MAXK = 8 };
  size_t es = esize(d);
  void *src[MAXK], *dst[MAXK];
  const char *names[MAXK];
  char nbuf[MAXK][32];
  for (int j = 0; j < k; j++) {
    for (size_t i = 0; i < ns[j]; i++) hora__elem_store(h_a, d, i, input(d, op, rank, i));
    CK(cudaMalloc(&src[j], ns[j] * es + 1));
    to_dev(src[j], h_a, ns[j] * es);
    dst[j] = src[j];
    if (j % 2) {
      CK(cudaMalloc(&dst[j], ns[j] * es + 1));
      poison(dst[j], ns[j] * es);
    }
    snprintf(nbuf[j], sizeof nbuf[j], "%s.%d", prefix, j);
    names[j] = nbuf[j];
  }
  uint64_t cyc, slow, hits, fused0, fused1;
  EXPECT_OK(hora__engine_stats(ctx, &cyc, &slow, &hits, &fused0));
  hora_handle_t *h = NULL;
  EXPECT_OK(hora_grouped_allreduce_async(ctx, names, (const void *const *)src, dst, ns, (size_t)k, d, op, pre, post,
                                         HORA_DEVICE_CUDA, &h));
  if (h) {
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
  }
  EXPECT_OK(hora__engine_stats(ctx, &cyc, &slow, &hits, &fused1));
  EXPECT(fused1 > fused0, "%s: the grouped device allreduce of %d tensors was not fused (%llu fused groups before "
         "and after)", prefix, k, (unsigned long long)fused0);
  for (int j = 0; j < k; j++) {
    to_host(h_b, dst[j], ns[j] * es);
    char what[96];
    snprintf(what, sizeof what, "fused device group %s member %d (count %zu, dtype %d, op %d)", prefix, j, ns[j],
             (int)d, (int)op);
    check_reduced(what, h_b, d, op, 0, ns[j], pre, post);
    if (dst[j] != src[j]) cudaFree(dst[j]);
    cudaFree(src[j]);
  }
}

/* The async engine's fused device groups: float32 with scale factors and members of odd sizes
 * (the fusion buffer's 16-byte padding between them), an integer average (the host division of
 * the fused buffer), float16. */
static void test_engine_fused(void) {
  const size_t a[] = {1, 1000, 3, 70001, 0, 17};
  fused_group("fused.f32", HORA_FLOAT32, HORA_SUM, 2.0, 0.5, a, 6);
  const size_t b[] = {5, 4097, 1};
  fused_group("fused.i32", HORA_INT32, HORA_AVERAGE, 1.0, 1.0, b, 3);
  const size_t c[] = {7, 2049};
  fused_group("fused.f16", HORA_FLOAT16, HORA_MAX, 1.0, 1.0, c, 2);
}

/* A host function on the producer's stream: it holds the stream for `ms` milliseconds. */
static void CUDART_CB hold_stream(void *ms) {
  struct timespec ts = {0, (long)*(const int *)ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* hora_set_call_ready (Horovod's ready event): the data of an async allreduce is still being
 * written on another stream when it is submitted (the stream is held 150 ms by a host function,
 * then a copy writes the inputs over a poisoned buffer, then the event is recorded); the engine
 * must wait for the event, so every result is the reference, never the poison. A single request
 * and a grouped one (one event for both members), then the tag's rules: NULL clears it, a NULL
 * context is refused, and the next call takes it (a later request does not wait on it). */
static void test_engine_ready(void) {
  static int hold_ms = 150;
  enum { N0 = 4099, N1 = 70001 };
  float *pin = NULL, *d0 = NULL, *d1 = NULL;
  cudaStream_t us;
  cudaEvent_t ev;
  CK(cudaMallocHost((void **)&pin, (size_t)(N0 + N1) * 4));
  CK(cudaMalloc((void **)&d0, (size_t)N0 * 4));
  CK(cudaMalloc((void **)&d1, (size_t)N1 * 4));
  CK(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  for (size_t i = 0; i < (size_t)(N0 + N1); i++) pin[i] = (float)input(HORA_FLOAT32, HORA_SUM, rank, i);
  for (int grouped = 0; grouped < 2; grouped++) {
    poison(d0, (size_t)N0 * 4);
    poison(d1, (size_t)N1 * 4);
    CK(cudaLaunchHostFunc(us, hold_stream, &hold_ms));
    CK(cudaMemcpyAsync(d0, pin, (size_t)N0 * 4, cudaMemcpyHostToDevice, us));
    CK(cudaMemcpyAsync(d1, pin + N0, (size_t)N1 * 4, cudaMemcpyHostToDevice, us));
    CK(cudaEventRecord(ev, us));
    hora_handle_t *h = NULL;
    EXPECT_OK(hora_set_call_ready(ctx, ev));
    if (grouped) {
      const char *names[2] = {"ready.g0", "ready.g1"};
      const void *send[2] = {d0, d1};
      void *recv[2] = {d0, d1};
      const size_t ns[2] = {N0, N1};
      EXPECT_OK(hora_grouped_allreduce_async(ctx, names, send, recv, ns, 2, HORA_FLOAT32, HORA_SUM, 1.0, 1.0,
                                             HORA_DEVICE_CUDA, &h));
    } else {
      EXPECT_OK(hora_allreduce_async(ctx, "ready.one", d0, d0, N0, HORA_FLOAT32, HORA_SUM, 1.0, 1.0,
                                     HORA_DEVICE_CUDA, &h));
    }
    if (!h) continue;
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
    CK(cudaStreamSynchronize(us)); /* the single request left d1's copy to finish on its own */
    to_host(h_b, d0, (size_t)N0 * 4);
    check_reduced(grouped ? "ready event, grouped member 0" : "ready event, one request", h_b, HORA_FLOAT32,
                  HORA_SUM, 0, N0, 1.0, 1.0);
    if (grouped) {
      to_host(h_b, d1, (size_t)N1 * 4);
      check_reduced("ready event, grouped member 1", h_b, HORA_FLOAT32, HORA_SUM, N0, N1, 1.0, 1.0);
    }
  }
  EXPECT_RC(hora_set_call_ready(NULL, ev), HORA_ERR_NOT_INITIALIZED);
  EXPECT_OK(hora_set_call_ready(ctx, ev));
  EXPECT_OK(hora_set_call_ready(ctx, NULL)); /* cleared: the request below does not wait */
  CK(cudaLaunchHostFunc(us, hold_stream, &hold_ms)); /* holds the event's next record */
  CK(cudaEventRecord(ev, us));
  hora_handle_t *h = NULL;
  to_dev(d0, pin, (size_t)N0 * 4);
  EXPECT_OK(hora_allreduce_async(ctx, "ready.none", d0, d0, N0, HORA_FLOAT32, HORA_SUM, 1.0, 1.0,
                                 HORA_DEVICE_CUDA, &h));
  if (h) {
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
    to_host(h_b, d0, (size_t)N0 * 4);
    check_reduced("after hora_set_call_ready(NULL)", h_b, HORA_FLOAT32, HORA_SUM, 0, N0, 1.0, 1.0);
  }
  CK(cudaStreamSynchronize(us));
  cudaEventDestroy(ev);
  cudaStreamDestroy(us);
  cudaFree(d0);
  cudaFree(d1);
  cudaFreeHost(pin);
}

/* hora_join with device tensors (Horovod's join(device) for ranks that ran out of data): the last
 * rank joins first; the others' SUM and AVERAGE allreduces of device buffers then complete with
 * zeros from it (AVERAGE still divides by the world size), and every rank's join returns the same
 * last rank. The joined rank takes part in each transport with a zero device buffer of its own. */
static float jv(int r, size_t i) { return (float)((r + 1) * 3 + (int)(i % 11)); }

static void test_engine_join(void) {
  if (size < 2) return;
  const int joined = size - 1;
  int last = -1;
  if (rank == joined) {
    EXPECT_OK(hora_join(ctx, &last));
  } else {
    enum { K = 2 };
    const size_t ns[K] = {1000, 70001};
    const hora_op_t ops[K] = {HORA_SUM, HORA_AVERAGE};
    float *d[K];
    hora_handle_t *h[K] = {NULL, NULL};
    for (int k = 0; k < K; k++) {
      for (size_t i = 0; i < ns[k]; i++) ((float *)h_a)[i] = jv(rank, i);
      d[k] = dev_floats(ns[k]);
      start_allreduce("joined", k, d[k], ns[k], ops[k], &h[k]);
    }
    for (int k = 0; k < K; k++) {
      if (!finish_allreduce(h[k], d[k], ns[k])) continue;
      long bad = 0;
      for (size_t i = 0; i < ns[k]; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += r == joined ? 0.0 : jv(r, i);
        if (ops[k] == HORA_AVERAGE) want /= size;
        double got = ((float *)h_b)[i];
        if (fabs(got - want) > 1e-5 * fabs(want) + 1e-6) {
          if (bad++ < 3) fprintf(stderr, "rank %d: join allreduce %d [%zu] = %g, want %g\n", rank, k, i, got, want);
        }
      }
      EXPECT(bad == 0, "engine allreduce with rank %d joined (op %d): %ld wrong", joined, (int)ops[k], bad);
      cudaFree(d[k]);
    }
    /* A grouped SUM, fused on every rank: the joined rank's fusion buffer is all zeros. */
    enum { G = 3 };
    const size_t gn[G] = {1000, 3, 70001};
    void *gd[G];
    const char *gnames[G] = {"joined.group.0", "joined.group.1", "joined.group.2"};
    for (int k = 0; k < G; k++) {
      for (size_t i = 0; i < gn[k]; i++) ((float *)h_a)[i] = jv(rank, i) * (float)(k + 1);
      gd[k] = dev_floats(gn[k]);
    }
    hora_handle_t *gh = NULL;
    EXPECT_OK(hora_grouped_allreduce_async(ctx, gnames, (const void *const *)gd, gd, gn, G, HORA_FLOAT32, HORA_SUM,
                                           1.0, 1.0, HORA_DEVICE_CUDA, &gh));
    if (gh) {
      EXPECT_OK(hora_wait(gh));
      hora_handle_free(gh);
    }
    for (int k = 0; k < G; k++) {
      to_host(h_b, gd[k], gn[k] * 4);
      long bad = 0;
      for (size_t i = 0; i < gn[k]; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += r == joined ? 0.0 : (double)jv(r, i) * (k + 1);
        bad += ((float *)h_b)[i] != (float)want;
      }
      EXPECT(bad == 0, "fused device group with rank %d joined, member %d: %ld wrong", joined, k, bad);
      cudaFree(gd[k]);
    }
    EXPECT_OK(hora_join(ctx, &last));
  }
  int lo = 0, hi = 0;
  MPI_Allreduce(&last, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&last, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT(lo == hi && lo >= 0 && lo < joined, "hora_join: last ranks %d..%d, want one of 0..%d on every rank", lo, hi,
         joined - 1);
}

/* Ranks that disagree about the device of one async allreduce (rank 0 passes host memory, the
 * others device memory, as a Horovod program whose rank 0 forgot .cuda()): HORA_ERR_MISMATCH on
 * every rank, naming the device, nothing written; the engine goes on (an allreduce after it is
 * right). */
static void test_engine_device_mismatch(void) {
  if (size < 2) return;
  const size_t n = 257;
  for (size_t i = 0; i < n; i++) ((float *)h_a)[i] = jv(rank, i);
  float *host = malloc(n * 4), *d = dev_floats(n);
  memcpy(host, h_a, n * 4);
  hora_handle_t *h = NULL;
  int on_host = rank == 0;
  EXPECT_OK(hora_allreduce_async(ctx, "mixed.device", on_host ? (void *)host : (void *)d, on_host ? (void *)host : (void *)d,
                                 n, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, on_host ? HORA_DEVICE_HOST : HORA_DEVICE_CUDA, &h));
  if (h) {
    hora_result_t rc = hora_wait(h);
    EXPECT(rc == HORA_ERR_MISMATCH, "allreduce with rank 0 on the host, the others on the GPU: %s (%s), want "
           "HORA_ERR_MISMATCH", hora_result_name(rc), hora_last_error());
    EXPECT(strstr(hora_last_error(), "device") != NULL, "the mismatch message does not name the device: %s",
           hora_last_error());
    hora_handle_free(h);
  }
  const float *mine = host;
  if (!on_host) {
    to_host(h_b, d, n * 4);
    mine = (const float *)h_b;
  }
  long bad = 0;
  for (size_t i = 0; i < n; i++) bad += mine[i] != jv(rank, i);
  EXPECT(bad == 0, "the refused allreduce wrote %ld values into rank %d's buffer", bad, rank);
  /* The engine is still usable: the same tensor, now on the GPU everywhere. */
  to_dev(d, h_a, n * 4);
  h = NULL;
  start_allreduce("mixed.after", 0, d, n, HORA_SUM, &h);
  if (finish_allreduce(h, d, n)) {
    bad = 0;
    for (size_t i = 0; i < n; i++) {
      float want = 0;
      for (int r = 0; r < size; r++) want += jv(r, i);
      bad += ((float *)h_b)[i] != want;
    }
    EXPECT(bad == 0, "allreduce after the device mismatch: %ld wrong", bad);
  }
  cudaFree(d);
  free(host);
}

/* A process set with device buffers (hvd.add_process_set and process_set= on a GPU tensor): the
 * set of ranks 0 and size-1 makes its own GPU state (its own NCCL communicator or staged comm) at
 * its first device collective; a blocking SUM and an async AVERAGE over the set's members give the
 * set's values; a rank outside the set gets HORA_ERR_INVALID_ARGUMENT. */
static void test_process_set(void) {
  if (size < 2) return;
  const int members[2] = {0, size - 1};
  hora_ctx_t *set = NULL;
  EXPECT_OK(hora_process_set_create(ctx, members, 2, &set));
  if (!set) return;
  int in = rank == members[0] || rank == members[1];
  const size_t n = 5003;
  float *d = NULL;
  CK(cudaMalloc((void **)&d, n * 4));
  for (size_t i = 0; i < n; i++) ((float *)h_a)[i] = jv(rank, i);
  to_dev(d, h_a, n * 4);
  if (!in) {
    EXPECT_RC(hora_allreduce(set, d, d, n, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA), HORA_ERR_INVALID_ARGUMENT);
  } else {
    EXPECT_OK(hora_allreduce(set, d, d, n, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA));
    to_host(h_b, d, n * 4);
    long bad = 0;
    for (size_t i = 0; i < n; i++) bad += ((float *)h_b)[i] != jv(members[0], i) + jv(members[1], i);
    EXPECT(bad == 0, "device allreduce in the set {0,%d}: %ld wrong", members[1], bad);
    to_dev(d, h_a, n * 4);
    hora_handle_t *h = NULL;
    EXPECT_OK(hora_allreduce_async(set, "set.avg", d, d, n, HORA_FLOAT32, HORA_AVERAGE, 1.0, 1.0, HORA_DEVICE_CUDA, &h));
    if (h) {
      EXPECT_OK(hora_wait(h));
      hora_handle_free(h);
    }
    to_host(h_b, d, n * 4);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
      double want = (jv(members[0], i) + jv(members[1], i)) / 2.0;
      bad += fabs(((float *)h_b)[i] - want) > 1e-5 * want;
    }
    EXPECT(bad == 0, "async device average in the set {0,%d}: %ld wrong", members[1], bad);
  }
  cudaFree(d);
  EXPECT_OK(hora_process_set_destroy(set));
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char *expect_path = NULL;
  int fake_nodes = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--expect-path") && i + 1 < argc) expect_path = argv[++i];
    else if (!strcmp(argv[i], "--max-count") && i + 1 < argc) max_count = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--fake-nodes") && i + 1 < argc) fake_nodes = atoi(argv[++i]);
  }
  /* --fake-nodes K: node k holds ranks [k*size/K, (k+1)*size/K) (HORA_CROSS_RANK), and only the
   * Adasum cases run (the rest assumes one node). */
  char node_id[16];
  snprintf(node_id, sizeof node_id, "%d", fake_nodes ? rank * fake_nodes / size : 0);
  if (fake_nodes) setenv("HORA_CROSS_RANK", node_id, 1);
  int ndev = 0, have, all;
  have = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
  MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (rank == 0) printf("test_coll_gpu: a rank sees no GPU: skipped\n");
    MPI_Finalize();
    return HORA_TEST_SKIP;
  }
  if (size > 64) {
    if (rank == 0) printf("test_coll_gpu: at most 64 ranks\n");
    MPI_Finalize();
    return 1;
  }
  if (!getenv("HORA_LOG")) setenv("HORA_LOG", "WARN", 1);
  size_t c[6] = {0, 1, (size_t)size - 1, (size_t)size + 1, 1000, ((size_t)1 << 20) + 3};
  memcpy(counts, c, sizeof c);
  EXPECT_OK(hora_init(&ctx));
  int dev = -1;
  EXPECT_OK(hora_device_index(ctx, &dev));
  EXPECT(dev >= 0 && dev < ndev, "hora_device_index %d, %d GPUs visible", dev, ndev);
  cap_bytes = (((size_t)1 << 20) + 16) * (size_t)size * 8 + 4096;
  h_a = malloc(cap_bytes);
  h_b = malloc(cap_bytes);
  CK(cudaMalloc((void **)&d_a, cap_bytes));
  CK(cudaMalloc((void **)&d_b, cap_bytes));
  if (!h_a || !h_b) MPI_Abort(MPI_COMM_WORLD, 2);

  if (fake_nodes) {
    test_adasum(fake_nodes);
    goto done;
  }
  test_allreduce();
  test_adasum(0);
  if (expect_path) {
    hora_gpu_t *g = ctx->gpu;
    static const char *const names[] = {"nccl", "staged", "naive"};
    EXPECT(g != NULL, "no GPU state after device collectives");
    if (g) EXPECT(!strcmp(names[g->path], expect_path), "path %s, want %s", names[g->path], expect_path);
  }
  test_reducescatter();
  test_movers();
  test_async();
  test_engine();
  test_engine_fused();
  test_engine_ready();
  test_engine_join();
  test_process_set();
  test_engine_device_mismatch();
  if (size == 1) {
    /* Host memory passed as device memory: a clear error, nothing written (1 rank: the check is
     * local, a second rank would wait for this one). */
    float host[4] = {1, 2, 3, 4};
    EXPECT_RC(hora_allreduce(ctx, host, host, 4, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA),
              HORA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(hora_last_error(), "host memory") != NULL, "message: %s", hora_last_error());
    EXPECT(host[0] == 1 && host[3] == 4, "host buffer changed");
    EXPECT_RC(hora_broadcast(ctx, host, 4, HORA_FLOAT32, 0, HORA_DEVICE_CUDA), HORA_ERR_INVALID_ARGUMENT);
  }

done:
  cudaFree(d_a);
  cudaFree(d_b);
  free(h_a);
  free(h_b);
  EXPECT_OK(hora_finalize(ctx));
  int rc = hora_test_finish_mpi("test_coll_gpu");
  MPI_Finalize();
  return rc;
}
