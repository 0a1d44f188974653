/* The scatter-gather form of the shared-memory allreduce (algo/shm.c hora__shm_run_segs), called
 * directly: a list of segments of odd sizes (empty ones with NULL pointers, single elements,
 * lengths that are not multiples of 64 bytes, segments longer than a piece when
 * HORA_SHM_CHUNK_BYTES is tiny), some in place and some out of place, for f32/f64/i32/f16 and
 * sum/min/max/average (average through the hook, as the engine does). Asserts, per element,
 * the exact value; that nothing outside a segment's recv range is written and no out-of-place
 * send buffer changes; that the hook sees each element of the virtual buffer exactly once over
 * all ranks, in the shared window before it is copied out; that the result is bit-identical to
 * hora__shm_run over the same data concatenated, and to the engine's fused float32 pass
 * (hora__allreduce_segs) for sum and average; and that a hook error on one rank is returned there
 * without hanging the others. Needs one node (every rank of the test runs on this machine).
 * --scale K multiplies every segment's length by K: with K = 40 the slices are long enough to be
 * split over the helper threads of HORA_SHM_THREADS (algo/shm.c step_parts), whose results must be
 * the same bits as one thread's. */
#include <math.h>
#include <stdint.h>

#include "hora_test.h"
#include "hora_kernels.h"
#include "algo/algo.h"
#include "algo/coll.h"

static hora_ctx_t *ctx;
static int rank, size;

#include "hora_test_values.h"

#define GUARD 16 /* bytes after each recv range that must stay untouched */
#define NSEG (sizeof counts / sizeof *counts)

/* Odd lengths: zero, single elements, not multiples of 64 bytes, one of 4099 elements (several
 * pieces of a 192-byte chunk, and more than a slice of any chunk up to 4 KiB). */
static size_t counts[] = {0, 1, 3, 17, 0, 65, 250, 7, 4099, 33, 2, 401, 5, 0, 129, 1};

typedef struct {
  const hora_seg_t *seg;
  size_t nseg;
  hora_dtype_t dtype;
  size_t seen;  /* elements passed to the hook on this rank */
  long in_recv; /* hook runs inside a recv buffer (the hook must see the window, before copy-out) */
  int fail;     /* return an error from the hook */
} hook_arg_t;

static hora_result_t hook(void *arg, void *run, size_t n) {
  hook_arg_t *a = arg;
  size_t es = esize(a->dtype);
  int inside = 0;
  for (size_t i = 0; i < a->nseg; i++) {
    const char *d = a->seg[i].dst;
    if (a->seg[i].count && (const char *)run < d + a->seg[i].count * es && (const char *)run + n * es > d) inside = 1;
  }
  a->in_recv += inside;
  a->seen += n;
  if (a->fail) return HORA_ERR(HORA_ERR_INTERNAL, "test hook fails on purpose");
  /* HORA_AVERAGE's division, as the engine applies it (the op passed down is SUM). */
  return hora__scale_and_average(ctx, run, n, a->dtype, HORA_AVERAGE, 1.0);
}

/* The engine's path (hora__allreduce_segs) takes the fused float32 pass (reduce, average and
 * both stores at once, hora__sum_scale2_f32_host) where the calls above reduce, then run the
 * hook, then copy: the results must be the same bits, in place and out of place, and nothing
 * past a recv range may be written. `want` holds the results of the calls above. */
static void fused_same_bits(const char *name, const hora_seg_t *seg, char *const *want, hora_op_t op) {
  hora_seg_t s2[NSEG];
  char *r2[NSEG];
  for (size_t i = 0, v = 0; i < NSEG; v += counts[i++]) {
    size_t b = counts[i] * 4;
    r2[i] = NULL;
    s2[i] = (hora_seg_t){NULL, NULL, counts[i]};
    if (!counts[i]) continue;
    r2[i] = malloc(b + GUARD);
    memset(r2[i] + b, 0xEF, GUARD);
    if (i % 3 == 0) { /* in place, as above; the first calls overwrote those sends: fill afresh */
      for (size_t k = 0; k < counts[i]; k++) hora__elem_store(r2[i], HORA_FLOAT32, k, input(HORA_FLOAT32, op, rank, v + k));
      s2[i] = (hora_seg_t){r2[i], r2[i], counts[i]};
    } else {
      s2[i] = (hora_seg_t){seg[i].src, r2[i], counts[i]};
    }
  }
  EXPECT_OK(hora__allreduce_segs(ctx, s2, NSEG, HORA_FLOAT32, op, 1.0));
  for (size_t i = 0; i < NSEG; i++) {
    if (!counts[i]) continue;
    size_t b = counts[i] * 4, g = 0;
    EXPECT(memcmp(r2[i], want[i], b) == 0, "%s: segment %zu: the fused pass gave other bits", name, i);
    while (g < GUARD && (unsigned char)r2[i][b + g] == 0xEF) g++;
    EXPECT(g == GUARD, "%s: segment %zu: the fused pass wrote byte %zu past its end", name, i, g);
    free(r2[i]);
  }
}

static void run_case(hora_dtype_t d, hora_op_t op) {
  size_t es = esize(d), total = 0;
  for (size_t i = 0; i < NSEG; i++) total += counts[i];
  char name[64];
  snprintf(name, sizeof name, "%s/%s", d == HORA_FLOAT32 ? "f32" : d == HORA_FLOAT64 ? "f64" : d == HORA_INT32 ? "i32" : "f16",
           op == HORA_SUM ? "sum" : op == HORA_MIN ? "min" : op == HORA_MAX ? "max" : "avg");
  hora_seg_t seg[NSEG];
  char *sbuf[NSEG], *rbuf[NSEG];
  char *csend = malloc(total * es), *crecv = malloc(total * es);
  size_t v = 0;
  for (size_t i = 0; i < NSEG; i++) {
    size_t b = counts[i] * es;
    int inplace = i % 3 == 0;
    sbuf[i] = rbuf[i] = NULL;
    if (counts[i]) {
      sbuf[i] = malloc(b + GUARD);
      rbuf[i] = inplace ? sbuf[i] : malloc(b + GUARD);
      for (size_t k = 0; k < counts[i]; k++) hora__elem_store(sbuf[i], d, k, input(d, op, rank, v + k));
      memset(sbuf[i] + b, 0xAB, GUARD);
      if (!inplace) memset(rbuf[i], 0xCD, b + GUARD);
      memcpy(csend + v * es, sbuf[i], b);
    }
    seg[i] = (hora_seg_t){sbuf[i], rbuf[i], counts[i]};
    v += counts[i];
  }
  int avg = op == HORA_AVERAGE;
  hora_op_t pass = avg ? HORA_SUM : op;
  hook_arg_t ha = {seg, NSEG, d, 0, 0, 0};
  EXPECT_OK(hora__shm_run_segs(ctx, seg, NSEG, d, pass, avg ? hook : NULL, avg ? &ha : NULL));
  hook_arg_t hc = {NULL, 0, d, 0, 0, 0};
  EXPECT_OK(hora__shm_run(ctx, csend, crecv, total, d, pass, avg ? hook : NULL, avg ? &hc : NULL));

  long bad = 0;
  v = 0;
  for (size_t i = 0; i < NSEG; i++) {
    size_t b = counts[i] * es;
    for (size_t k = 0; k < counts[i]; k++) {
      double want = expected(d, op, v + k, 1, 1), got = hora__elem_load(rbuf[i], d, k);
      char tmp[8];
      hora__elem_store(tmp, d, 0, want);
      want = hora__elem_load(tmp, d, 0);
      if (!(fabs(got - want) <= tol(d, op, want)) && bad++ < 3)
        EXPECT(0, "%s: segment %zu element %zu: got %g want %g", name, i, k, got, want);
    }
    if (counts[i]) {
      EXPECT(memcmp(rbuf[i], crecv + v * es, b) == 0, "%s: segment %zu differs from the contiguous run", name, i);
      for (size_t g = 0; g < GUARD; g++)
        if ((unsigned char)rbuf[i][b + g] != (rbuf[i] == sbuf[i] ? 0xAB : 0xCD)) {
          EXPECT(0, "%s: segment %zu: byte %zu past its end was written", name, i, g);
          break;
        }
      if (rbuf[i] != sbuf[i]) {
        long changed = 0;
        for (size_t k = 0; k < counts[i]; k++) changed += hora__elem_load(sbuf[i], d, k) != input(d, op, rank, v + k);
        EXPECT(changed == 0, "%s: segment %zu: %ld send elements changed", name, i, changed);
      }
    }
    v += counts[i];
  }
  EXPECT(bad == 0, "%s: %ld wrong elements", name, bad);
  if (d == HORA_FLOAT32 && (op == HORA_SUM || avg)) fused_same_bits(name, seg, rbuf, op);
  if (avg) {
    unsigned long long seen = ha.seen, all = 0;
    MPI_Allreduce(&seen, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT(all == total, "%s: the hooks saw %llu elements over all ranks, want %zu", name, all, total);
    EXPECT(ha.in_recv == 0, "%s: %ld hook runs were given recv memory instead of the window", name, ha.in_recv);
  }
  for (size_t i = 0; i < NSEG; i++) {
    if (rbuf[i] != sbuf[i]) free(rbuf[i]);
    free(sbuf[i]);
  }
  free(csend);
  free(crecv);
}

/* A hook that fails on rank 0 only: rank 0 gets the error, the others an error naming local rank
 * 0 (its slice, which they copy out, is unfinished: no data from it may pass as a result), and
 * nobody hangs. */
static void hook_error(void) {
  float a[300], b[300];
  for (int i = 0; i < 300; i++) a[i] = 1;
  hora_seg_t seg[2] = {{a, b, 100}, {a + 100, b + 100, 200}};
  hook_arg_t ha = {seg, 2, HORA_FLOAT32, 0, 0, rank == 0};
  hora_result_t rc = hora__shm_run_segs(ctx, seg, 2, HORA_FLOAT32, HORA_SUM, hook, &ha);
  /* Rank 0 always owns a slice of a 300-element piece, so its hook runs and fails. */
  if (rank == 0) {
    EXPECT_RC(rc, HORA_ERR_INTERNAL);
  } else if (size > 1) {
    EXPECT_RC(rc, HORA_ERR_REMOTE);
    EXPECT(strstr(hora_last_error(), "local rank 0 could not finish its slice (HORA_ERR_INTERNAL)") != NULL,
           "rank %d: the error does not name local rank 0's failure: %s", rank, hora_last_error());
  }
  /* The window is still usable afterwards. */
  EXPECT_OK(hora__shm_run_segs(ctx, seg, 2, HORA_FLOAT32, HORA_SUM, NULL, NULL));
  EXPECT(b[299] == (float)size && b[0] == (float)size, "after a hook error: %g %g, want %d", b[0], b[299], size);
}

int main(int argc, char **argv) {
  ctx = hora_test_init_mpi(&argc, &argv, &rank, &size);
  if (!ctx) return 1;
  if (ctx->cross_size != 1) {
    if (rank == 0) printf("test_shm_sg: the ranks span %d nodes; the shm allreduce needs one\n", ctx->cross_size);
    hora_finalize(ctx);
    MPI_Finalize();
    return HORA_TEST_SKIP;
  }
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--scale"))
      for (size_t k = 0, m = strtoull(argv[i + 1], NULL, 10); k < NSEG; k++) counts[k] *= m;
  const hora_dtype_t dt[] = {HORA_FLOAT32, HORA_FLOAT64, HORA_INT32, HORA_FLOAT16};
  const hora_op_t ops[] = {HORA_SUM, HORA_MIN, HORA_MAX, HORA_AVERAGE};
  for (size_t i = 0; i < sizeof dt / sizeof *dt; i++)
    for (size_t j = 0; j < sizeof ops / sizeof *ops; j++) run_case(dt[i], ops[j]);
  /* All segments empty: nothing to do, no barrier, success. */
  hora_seg_t none[2] = {{NULL, NULL, 0}, {NULL, NULL, 0}};
  EXPECT_OK(hora__shm_run_segs(ctx, none, 2, HORA_FLOAT32, HORA_SUM, NULL, NULL));
  hook_error();
  EXPECT_OK(hora_finalize(ctx));
  int rc = hora_test_finish_mpi("test_shm_sg");
  MPI_Finalize();
  return rc;
}
