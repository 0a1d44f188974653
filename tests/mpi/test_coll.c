/* Every blocking collective on host memory, checked element by element:
 *   allreduce x algorithm (ring, shm, hier, mpi, auto) x dtype x op x count x in/out of place,
 *   with prescale/postscale and average; reducescatter x dtype x op x count x in/out of place;
 *   broadcast (two roots), allgather, allgatherv, alltoall, alltoallv x dtype x count; barrier.
 * Reduction inputs are small rank-dependent integers, so every result is exact in any reduction
 * order (and in f16/bf16). Counts are {0, 1, n-1, n+1, 1000, (1<<20)+3} with n the world size.
 *
 * Options: --algos ring,shm,...   algorithms to sweep (default all)
 *          --max-count N          skip counts above N (the tiny-segment variant uses this)
 *          --fake-nodes           split the ranks into two fake nodes (HORA_CROSS_RANK)
 *          --only allreduce|other only one half of the sweep */
#include <math.h>
#include <stdint.h>
#include <time.h>

#include "hora_test.h"
#include "hora_kernels.h"
#include "core/internal.h"

static hora_ctx_t *ctx;
static int rank, size;

static const hora_dtype_t dtypes[] = {HORA_UINT8, HORA_INT8, HORA_INT32, HORA_INT64, HORA_FLOAT16,
                                      HORA_BFLOAT16, HORA_FLOAT32, HORA_FLOAT64, HORA_INT16};
static const char *const dnames[] = {"u8", "i8", "i32", "i64", "f16", "bf16", "f32", "f64", "i16"};
static const char *const onames[] = {"sum", "avg", "min", "max", "prod"};

#include "hora_test_values.h"

static size_t counts[6];
static size_t max_count = SIZE_MAX;
static int fake_nodes;

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", n);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return p;
}

/* Check n elements of got against expected(i0 + i); report the first few mismatches. */
static long check_reduced(const char *what, const void *got, hora_dtype_t d, hora_op_t op, size_t i0,
                          size_t n, double pre, double post) {
  long bad = 0;
  for (size_t i = 0; i < n; i++) {
    double w = expected(d, op, i0 + i, pre, post);
    /* Round the expectation to the dtype (f16/bf16/f32 store what the library can return). */
    char tmp[8];
    hora__elem_store(tmp, d, 0, w);
    double wr = hora__elem_load(tmp, d, 0), g = hora__elem_load(got, d, i);
    if (!(fabs(g - wr) <= tol(d, op, wr))) {
      if (bad++ < 3)
        EXPECT(0, "%s: element %zu: got %g want %g", what, i0 + i, g, wr);
    }
  }
  if (bad > 3) EXPECT(0, "%s: %ld wrong elements in all", what, bad);
  return bad;
}

static void set_algo(const char *algo) {
  setenv("HORA_ALLREDUCE_ALGO", algo, 1);
  if (hora__params_reload() != HORA_SUCCESS) {
    fprintf(stderr, "bad algo %s\n", algo);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

static void test_allreduce(const char *algo) {
  set_algo(algo);
  for (int di = 0; di < (int)(sizeof dtypes / sizeof dtypes[0]); di++)
    for (int op = 0; op < HORA_OP_COUNT; op++)
      for (int ci = 0; ci < 6; ci++)
        for (int inplace = 0; inplace < 2; inplace++)
          for (int sc = 0; sc < (is_float(dtypes[di]) ? 2 : 1); sc++) {
            hora_dtype_t d = dtypes[di];
            size_t n = counts[ci], es = esize(d);
            if (n > max_count) continue;
            /* The big count once per dtype and op (out of place, no scaling) keeps the run short;
             * multi-piece paths are covered by it and by the tiny-segment variant. */
            if (n > 4096 && (inplace != (op % 2) || sc)) continue;
            double pre = sc ? 0.5 : 1.0, post = sc ? 4.0 : 1.0;
            char *send = xmalloc(n * es), *recv = xmalloc(n * es);
            for (size_t i = 0; i < n; i++) hora__elem_store(send, d, i, input(d, (hora_op_t)op, rank, i));
            memset(recv, 0x5a, n * es);
            char what[160];
            snprintf(what, sizeof what, "allreduce %s %s %s n=%zu %s pre=%g post=%g", algo, dnames[di],
                     onames[op], n, inplace ? "in-place" : "out-of-place", pre, post);
            void *sb = inplace ? (void *)recv : (void *)send;
            if (inplace) memcpy(recv, send, n * es);
            hora_result_t rc = hora_allreduce(ctx, sb, recv, n, d, (hora_op_t)op, pre, post, HORA_DEVICE_HOST);
            EXPECT(rc == HORA_SUCCESS, "%s: %s (%s)", what, hora_result_name(rc), hora_last_error());
            if (rc == HORA_SUCCESS) check_reduced(what, recv, d, (hora_op_t)op, 0, n, pre, post);
            if (!inplace) {
              long changed = 0;
              for (size_t i = 0; i < n; i++) changed += hora__elem_load(send, d, i) != input(d, (hora_op_t)op, rank, i);
              EXPECT(changed == 0, "%s: sendbuf modified (%ld elements)", what, changed);
            }
            free(send);
            free(recv);
          }
}

static void test_reducescatter(void) {
  for (int di = 0; di < (int)(sizeof dtypes / sizeof dtypes[0]); di++)
    for (int op = 0; op < HORA_OP_COUNT; op++)
      for (int ci = 0; ci < 6; ci++)
        for (int inplace = 0; inplace < 2; inplace++)
          for (int sc = 0; sc < (is_float(dtypes[di]) ? 2 : 1); sc++) {
            hora_dtype_t d = dtypes[di];
            size_t n = counts[ci], es = esize(d), total = n * (size_t)size;
            if (n > max_count) continue;
            if (n > 4096 && (inplace != (op % 2) || sc)) continue;
            double pre = sc ? 0.5 : 1.0, post = sc ? 4.0 : 1.0; /* as in test_allreduce */
            char *send = xmalloc(total * es), *recv = xmalloc(n * es);
            for (size_t i = 0; i < total; i++) hora__elem_store(send, d, i, input(d, (hora_op_t)op, rank, i));
            memset(recv, 0x5a, n * es);
            char *out = inplace ? send + (size_t)rank * n * es : recv;
            char what[160];
            snprintf(what, sizeof what, "reducescatter %s %s n=%zu %s pre=%g post=%g", dnames[di], onames[op], n,
                     inplace ? "in-place" : "out-of-place", pre, post);
            hora_result_t rc = hora_reducescatter(ctx, send, out, n, d, (hora_op_t)op, pre, post, HORA_DEVICE_HOST);
            EXPECT(rc == HORA_SUCCESS, "%s: %s (%s)", what, hora_result_name(rc), hora_last_error());
            if (rc == HORA_SUCCESS) check_reduced(what, out, d, (hora_op_t)op, (size_t)rank * n, n, pre, post);
            if (!inplace) {
              long changed = 0;
              for (size_t i = 0; i < total; i++)
                changed += hora__elem_load(send, d, i) != input(d, (hora_op_t)op, rank, i);
              EXPECT(changed == 0, "%s: sendbuf modified (%ld elements)", what, changed);
            }
            free(send);
            free(recv);
          }
}

/* Byte pattern of rank r's element i (any bits: these collectives only move data). */
static void fill(char *p, size_t es, int r, size_t i0, size_t n) {
  for (size_t b = 0; b < n * es; b++) p[b] = (char)((r * 131 + (i0 * es + b) * 7 + 3) % 251);
}
static long diff(const char *got, size_t es, int r, size_t i0, size_t n) {
  long bad = 0;
  for (size_t b = 0; b < n * es; b++) bad += got[b] != (char)((r * 131 + (i0 * es + b) * 7 + 3) % 251);
  return bad;
}

static void test_movers(void) {
  for (int di = 0; di < (int)(sizeof dtypes / sizeof dtypes[0]); di++)
    for (int ci = 0; ci < 6; ci++) {
      hora_dtype_t d = dtypes[di];
      size_t n = counts[ci], es = esize(d), S = (size_t)size;
      if (n > max_count) continue;
      if (n > 4096 && di % 3) continue; /* the big count for three dtypes */
      char what[128];
      /* broadcast from rank 0 and from the last rank */
      for (int root = 0; root < size; root += (size > 1 ? size - 1 : 1)) {
        char *buf = xmalloc(n * es);
        fill(buf, es, rank, 0, n);
        snprintf(what, sizeof what, "broadcast %s n=%zu root=%d", dnames[di], n, root);
        EXPECT_OK(hora_broadcast(ctx, buf, n, d, root, HORA_DEVICE_HOST));
        EXPECT(diff(buf, es, root, 0, n) == 0, "%s: wrong data", what);
        free(buf);
      }
      /* allgather, out of place and in place */
      for (int inplace = 0; inplace < 2; inplace++) {
        char *send = xmalloc(n * es), *recv = xmalloc(n * S * es);
        memset(recv, 0x5a, n * S * es);
        char *sb = inplace ? recv + (size_t)rank * n * es : send;
        fill(sb, es, rank, 0, n);
        snprintf(what, sizeof what, "allgather %s n=%zu %s", dnames[di], n, inplace ? "in-place" : "");
        EXPECT_OK(hora_allgather(ctx, sb, recv, n, d, HORA_DEVICE_HOST));
        long bad = 0;
        for (int r = 0; r < size; r++) bad += diff(recv + (size_t)r * n * es, es, r, 0, n);
        EXPECT(bad == 0, "%s: %ld wrong bytes", what, bad);
        free(send);
        free(recv);
      }
      /* allgatherv: rank r contributes n + r elements (or r % 2 when n == 0, so some give none) */
      {
        size_t *rc = xmalloc(S * sizeof *rc), tot = 0, mine_off = 0;
        for (int r = 0; r < size; r++) {
          rc[r] = n ? n + (size_t)r : (size_t)(r % 2);
          if (r < rank) mine_off += rc[r];
          tot += rc[r];
        }
        for (int inplace = 0; inplace < 2; inplace++) {
          char *send = xmalloc(rc[rank] * es), *recv = xmalloc(tot * es);
          memset(recv, 0x5a, tot * es);
          char *sb = inplace ? recv + mine_off * es : send;
          fill(sb, es, rank, 0, rc[rank]);
          snprintf(what, sizeof what, "allgatherv %s n=%zu %s", dnames[di], n, inplace ? "in-place" : "");
          EXPECT_OK(hora_allgatherv(ctx, sb, rc[rank], recv, rc, d, HORA_DEVICE_HOST));
          long bad = 0;
          size_t o = 0;
          for (int r = 0; r < size; r++) {
            bad += diff(recv + o * es, es, r, 0, rc[r]);
            o += rc[r];
          }
          EXPECT(bad == 0, "%s: %ld wrong bytes", what, bad);
          free(send);
          free(recv);
        }
        free(rc);
      }
      /* alltoall: block p of rank r is the pattern of (r, p*n .. p*n+n) */
      {
        char *send = xmalloc(n * S * es), *recv = xmalloc(n * S * es);
        fill(send, es, rank, 0, n * S);
        memset(recv, 0x5a, n * S * es);
        snprintf(what, sizeof what, "alltoall %s n=%zu", dnames[di], n);
        EXPECT_OK(hora_alltoall(ctx, send, recv, n, d, HORA_DEVICE_HOST));
        long bad = 0;
        for (int p = 0; p < size; p++) bad += diff(recv + (size_t)p * n * es, es, p, (size_t)rank * n, n);
        EXPECT(bad == 0, "%s: %ld wrong bytes", what, bad);
        free(send);
        free(recv);
      }
      /* alltoallv: rank s sends f(s, p) = ((2s + p) % 3) * n / 2 + (s + p) % 2 elements to p */
      {
        size_t *sc = xmalloc(S * sizeof *sc), *rcv = xmalloc(S * sizeof *rcv), st = 0, rt = 0;
        for (int p = 0; p < size; p++) {
          sc[p] = (size_t)((2 * rank + p) % 3) * n / 2 + (size_t)((rank + p) % 2);
          rcv[p] = (size_t)((2 * p + rank) % 3) * n / 2 + (size_t)((p + rank) % 2);
          st += sc[p];
          rt += rcv[p];
        }
        char *send = xmalloc(st * es), *recv = xmalloc(rt * es);
        /* Block for p holds pattern (rank, 1000*p ...) so the receiver can tell who sent it. */
        size_t o = 0;
        for (int p = 0; p < size; p++) {
          fill(send + o * es, es, rank, (size_t)p * 1000, sc[p]);
          o += sc[p];
        }
        memset(recv, 0x5a, rt * es);
        snprintf(what, sizeof what, "alltoallv %s n=%zu", dnames[di], n);
        EXPECT_OK(hora_alltoallv(ctx, send, sc, recv, rcv, d, HORA_DEVICE_HOST));
        long bad = 0;
        o = 0;
        for (int p = 0; p < size; p++) {
          bad += diff(recv + o * es, es, p, (size_t)rank * 1000, rcv[p]);
          o += rcv[p];
        }
        EXPECT(bad == 0, "%s: %ld wrong bytes", what, bad);
        free(send);
        free(recv);
        free(sc);
        free(rcv);
      }
    }
}

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* barrier: no rank leaves before the last one entered (rank 0 enters 50 ms late). */
static void test_barrier(void) {
  for (int rep = 0; rep < 3; rep++) {
    if (rank == rep % size) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    double t[2];
    t[0] = mono();
    EXPECT_OK(hora_barrier(ctx));
    t[1] = mono();
    double *all = xmalloc(2 * (size_t)size * sizeof *all);
    MPI_Allgather(t, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, MPI_COMM_WORLD);
    double last_in = 0, first_out = 1e300;
    for (int r = 0; r < size; r++) {
      last_in = all[2 * r] > last_in ? all[2 * r] : last_in;
      first_out = all[2 * r + 1] < first_out ? all[2 * r + 1] : first_out;
    }
    EXPECT(first_out >= last_in, "barrier: a rank left at %.6f before the last entered at %.6f", first_out, last_in);
    free(all);
  }
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char *algos = "ring,shm,hier,mpi,auto", *only = "";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--algos") && i + 1 < argc) algos = argv[++i];
    else if (!strcmp(argv[i], "--max-count") && i + 1 < argc) max_count = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--fake-nodes")) fake_nodes = 1;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
  }
  if (!getenv("HORA_LOG")) setenv("HORA_LOG", "WARN", 1);
  if (fake_nodes) setenv("HORA_CROSS_RANK", rank < (size + 1) / 2 ? "0" : "1", 1);
  size_t c[6] = {0, 1, (size_t)size - 1, (size_t)size + 1, 1000, ((size_t)1 << 20) + 3};
  memcpy(counts, c, sizeof c);
  EXPECT_OK(hora_init(&ctx));
  if (fake_nodes && size >= 2) {
    int cs = 0;
    hora_cross_size(ctx, &cs);
    EXPECT(cs == 2, "fake nodes: cross size %d, want 2", cs);
  }
  if (strcmp(only, "other") != 0) {
    char list[128];
    snprintf(list, sizeof list, "%s", algos);
    for (char *save = NULL, *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save))
      test_allreduce(a);
  }
  if (strcmp(only, "allreduce") != 0) {
    test_reducescatter();
    test_movers();
    test_barrier();
  }
  EXPECT_OK(hora_finalize(ctx));
  int rc = hora_test_finish_mpi("test_coll");
  MPI_Finalize();
  return rc;
}
