/* Fused allreduces of many tensors of odd sizes through the async engine, checked element by
 * element. For every dtype (f32, f64, i32, f16), op (sum, min, max, average) and postscale (1, and
 * 0.5 for float sum/average) one grouped allreduce of tensors whose lengths are not multiples of
 * 64 bytes (1 element, less than a slice, several pieces of a tiny HORA_SHM_CHUNK_BYTES, empty
 * ones), every third one in place; all groups are submitted before any is waited for, for several
 * steps (the later ones on the response-cache path). Then one rank joins and the others run a
 * grouped sum and average, which the joined rank fuses with zeros.
 *
 * Which fusion path ran is asserted from the engine's counters: with HORA_ALLREDUCE_ALGO=shm on
 * more than one rank every fused group must take the scatter-gather path (no fusion buffer), with
 * HORA_ALLREDUCE_ALGO=mpi none may (pack, MPI_Allreduce, unpack).
 * With "fake-nodes" the ranks are split into two fake nodes (HORA_CROSS_RANK), where no group may
 * take the scatter-gather path (it needs one node).
 *   test_engine_fusion [steps] [big] [fake-nodes]
 *     big: elements of one extra f32 tensor in every f32 group */
#include <math.h>
#include <stdint.h>

#include "engine/engine.h"
#include "hora_kernels.h"
#include "hora_test.h"

static int rank, size;

#include "hora_test_values.h"

static const size_t counts[] = {1, 3, 17, 65, 250, 7, 1001, 33, 0, 2, 401, 5, 129, 1, 63, 31, 777, 9};
#define NT (sizeof counts / sizeof *counts)

typedef struct {
  hora_dtype_t dtype;
  hora_op_t op;
  double post;
  size_t nt;
  size_t count[NT + 1];
  char names[NT + 1][48];
  const char *np[NT + 1];
  void *send[NT + 1], *recv[NT + 1];
  hora_handle_t *h;
} group_t;

static const char *dname(hora_dtype_t d) {
  return d == HORA_FLOAT32 ? "f32" : d == HORA_FLOAT64 ? "f64" : d == HORA_INT32 ? "i32" : "f16";
}
static const char *oname(hora_op_t o) {
  return o == HORA_SUM ? "sum" : o == HORA_MIN ? "min" : o == HORA_MAX ? "max" : "avg";
}

static void group_init(group_t *g, const char *prefix, hora_dtype_t d, hora_op_t op, double post, size_t big) {
  g->dtype = d, g->op = op, g->post = post, g->nt = NT;
  for (size_t k = 0; k < NT; k++) g->count[k] = counts[(k + (size_t)d) % NT];
  if (big && d == HORA_FLOAT32) g->count[g->nt++] = big;
  for (size_t k = 0; k < g->nt; k++) {
    snprintf(g->names[k], sizeof g->names[k], "%s/%s/%s/%g/%zu", prefix, dname(d), oname(op), post, k);
    g->np[k] = g->names[k];
    size_t b = g->count[k] * esize(d);
    g->send[k] = malloc(b + 1);
    g->recv[k] = k % 3 == 0 ? g->send[k] : malloc(b + 1); /* every third in place */
  }
}

static void group_free(group_t *g) {
  for (size_t k = 0; k < g->nt; k++) {
    if (g->recv[k] != g->send[k]) free(g->recv[k]);
    free(g->send[k]);
  }
}

/* Element i of tensor k at step s is element off+i of the logical vector of hora_test_values.h. */
static size_t offset(const group_t *g, size_t k, int s) { return k * 7919 + (size_t)s * 31 + (size_t)g->dtype; }

static void group_submit(hora_ctx_t *ctx, group_t *g, int s) {
  for (size_t k = 0; k < g->nt; k++)
    for (size_t i = 0; i < g->count[k]; i++)
      hora__elem_store(g->send[k], g->dtype, i, input(g->dtype, g->op, rank, offset(g, k, s) + i));
  g->h = NULL;
  EXPECT_OK(hora_grouped_allreduce_async(ctx, g->np, (const void *const *)g->send, (void *const *)g->recv, g->count,
                                         g->nt, g->dtype, g->op, 1.0, g->post, HORA_DEVICE_HOST, &g->h));
}

/* Wait, then check every element. `ranks` ranks contribute (the others have joined: zeros), and
 * the average divides by the world size either way. */
static void group_check(group_t *g, int s, int ranks) {
  if (!g->h) return;
  EXPECT_OK(hora_wait(g->h));
  EXPECT_OK(hora_handle_free(g->h));
  g->h = NULL;
  long bad = 0;
  for (size_t k = 0; k < g->nt; k++) {
    for (size_t i = 0; i < g->count[k]; i++) {
      size_t v = offset(g, k, s) + i;
      double want;
      if (ranks == size) {
        want = expected(g->dtype, g->op, v, 1, g->post);
      } else { /* SUM/AVERAGE over the ranks that have not joined */
        double acc = 0;
        for (int r = 0; r < ranks; r++) acc += input(g->dtype, g->op, r, v);
        if (g->op == HORA_AVERAGE) acc = is_float(g->dtype) ? acc / size : trunc(acc / size);
        want = acc * g->post;
      }
      char tmp[8];
      hora__elem_store(tmp, g->dtype, 0, want);
      want = hora__elem_load(tmp, g->dtype, 0);
      double got = hora__elem_load(g->recv[k], g->dtype, i);
      if (!(fabs(got - want) <= tol(g->dtype, g->op, want)) && bad++ < 3)
        EXPECT(0, "step %d %s (count %zu, %s) [%zu] = %g, want %g", s, g->names[k], g->count[k],
               g->recv[k] == g->send[k] ? "in place" : "out of place", i, got, want);
    }
  }
  EXPECT(bad == 0, "step %d group %s/%s: %ld wrong elements", s, dname(g->dtype), oname(g->op), bad);
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 3;
  size_t big = argc > 2 ? (size_t)atol(argv[2]) : 0;
  int fake_nodes = argc > 3 && !strcmp(argv[3], "fake-nodes");
  if (fake_nodes) { /* the node split must be in the environment before hora_init */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    setenv("HORA_CROSS_RANK", rank < (size + 1) / 2 ? "0" : "1", 1);
  }
  hora_ctx_t *ctx = hora_test_init_mpi(&argc, &argv, &rank, &size);
  if (!ctx) return 1;

  const hora_dtype_t dt[] = {HORA_FLOAT32, HORA_FLOAT64, HORA_INT32, HORA_FLOAT16};
  const hora_op_t ops[] = {HORA_SUM, HORA_MIN, HORA_MAX, HORA_AVERAGE};
  group_t *g = calloc(64, sizeof *g);
  size_t ng = 0;
  for (size_t i = 0; i < 4; i++)
    for (size_t j = 0; j < 4; j++) {
      group_init(&g[ng++], "fu", dt[i], ops[j], 1.0, big);
      if (is_float(dt[i]) && (ops[j] == HORA_SUM || ops[j] == HORA_AVERAGE)) group_init(&g[ng++], "fu", dt[i], ops[j], 0.5, big);
    }
  for (int s = 0; s < steps; s++) {
    for (size_t q = 0; q < ng; q++) group_submit(ctx, &g[q], s);
    for (size_t q = 0; q < ng; q++) group_check(&g[q], s, size);
  }

  /* The last rank joins; the others reduce a grouped sum and average, to which it adds zeros. */
  if (size > 1) {
    group_t jg[2];
    group_init(&jg[0], "join", HORA_FLOAT32, HORA_SUM, 1.0, 0);
    group_init(&jg[1], "join", HORA_FLOAT64, HORA_AVERAGE, 0.5, 0);
    if (rank < size - 1) {
      for (int q = 0; q < 2; q++) group_submit(ctx, &jg[q], 0);
      for (int q = 0; q < 2; q++) group_check(&jg[q], 0, size - 1);
    }
    int last = -1;
    EXPECT_OK(hora_join(ctx, &last));
    EXPECT(last >= 0 && last < size - 1, "last rank to join %d, want one of 0..%d", last, size - 2);
    for (int q = 0; q < 2; q++) group_free(&jg[q]);
  }

  uint64_t cycles, slow, hits, fused, sg;
  EXPECT_OK(hora__engine_stats(ctx, &cycles, &slow, &hits, &fused));
  EXPECT_OK(hora__engine_sg_groups(ctx, &sg));
  EXPECT(fused > 0, "no fused group in %llu cycles", (unsigned long long)cycles);
  const char *algo = getenv("HORA_ALLREDUCE_ALGO");
  if (algo && !strcmp(algo, "shm") && size > 1)
    EXPECT(sg == fused, "%llu of %llu fused groups took the scatter-gather path, want all", (unsigned long long)sg,
           (unsigned long long)fused);
  if ((algo && !strcmp(algo, "mpi")) || size == 1 || fake_nodes)
    EXPECT(sg == 0, "%llu fused groups took the scatter-gather path with algorithm %s on %d ranks",
           (unsigned long long)sg, algo ? algo : "auto", size);
  if (rank == 0)
    printf("engine: %llu cycles, %llu fused groups, %llu without the fusion buffer\n", (unsigned long long)cycles,
           (unsigned long long)fused, (unsigned long long)sg);
  for (size_t q = 0; q < ng; q++) group_free(&g[q]);
  free(g);
  EXPECT_OK(hora_finalize(ctx));
  int rc = hora_test_finish_mpi("test_engine_fusion");
  MPI_Finalize();
  return rc;
}
