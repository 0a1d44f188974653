/* Across emulated nodes (tests/multinode/nodes.sh): hora's node detection against the host names
 * the ranks really run on, then allreduce values over the links.
 *
 *   mn_check NODES [MIB]
 *
 * Layout: every rank gathers every rank's host name; the nodes, numbered in order of their first
 * rank, must be exactly NODES distinct hosts, and hora's local rank/size and cross rank/size must
 * be what the host names say (ranks of one host are one node, local rank = order within it).
 * Values: an allreduce of MIB MiB of float32 (default 16) with hier, ring and auto, and a small
 * one (below auto's MPI crossover); every rank r contributes (r + 1) * (i % 7 + 1), so element i
 * must equal size (size + 1) / 2 * (i % 7 + 1) exactly. auto's choice across real nodes: hier at
 * every size with several ranks per node, else MPI_Allreduce below 16 KiB and the ring above
 * (docs/design.md, "auto"). Error counts are summed over the ranks. */
#include <unistd.h>

#include "hora_test.h"
#include "algo/algo.h"
#include "core/internal.h"

#define HOST_MAX 64

static void check_layout(hora_ctx_t *ctx, int rank, int size, int want_nodes) {
  char me[HOST_MAX] = "";
  gethostname(me, sizeof me - 1);
  char *all = calloc((size_t)size, HOST_MAX);
  MPI_Allgather(me, HOST_MAX, MPI_CHAR, all, HOST_MAX, MPI_CHAR, MPI_COMM_WORLD);
  /* node of each rank: index of the first rank with the same host name, renumbered densely */
  int nodes = 0, my_node = -1, my_local = 0, my_local_size = 0;
  int *node_of = calloc((size_t)size, sizeof *node_of);
  for (int r = 0; r < size; r++) {
    node_of[r] = -1;
    for (int q = 0; q < r && node_of[r] < 0; q++)
      if (strcmp(all + (size_t)q * HOST_MAX, all + (size_t)r * HOST_MAX) == 0) node_of[r] = node_of[q];
    if (node_of[r] < 0) node_of[r] = nodes++;
  }
  my_node = node_of[rank];
  for (int r = 0; r < size; r++)
    if (node_of[r] == my_node) {
      if (r < rank) my_local++;
      my_local_size++;
    }
  int lr = -1, ls = -1, cr = -1, cs = -1;
  EXPECT_OK(hora_local_rank(ctx, &lr));
  EXPECT_OK(hora_local_size(ctx, &ls));
  EXPECT_OK(hora_cross_rank(ctx, &cr));
  EXPECT_OK(hora_cross_size(ctx, &cs));
  EXPECT(nodes == want_nodes, "rank %d: the ranks run on %d distinct hosts, want %d", rank, nodes, want_nodes);
  EXPECT(cs == nodes, "rank %d on %s: hora sees %d nodes, the host names say %d", rank, me, cs, nodes);
  EXPECT(cr == my_node, "rank %d on %s: cross rank %d, want %d", rank, me, cr, my_node);
  EXPECT(lr == my_local && ls == my_local_size, "rank %d on %s: local rank/size %d/%d, want %d/%d", rank, me,
         lr, ls, my_local, my_local_size);
  if (rank == 0) {
    printf("mn_check: %d ranks on %d hosts:", size, nodes);
    for (int r = 0; r < size; r++) printf(" %d@%s", r, all + (size_t)r * HOST_MAX);
    printf("\n");
  }
  free(node_of);
  free(all);
}

static void check_auto(hora_ctx_t *ctx, int rank) {
  int ls = 0, cs = 0;
  hora_local_size(ctx, &ls);
  hora_cross_size(ctx, &cs);
  if (cs < 2) return;
  const size_t sizes[] = {4, 4096, 16384, (size_t)1 << 20, (size_t)64 << 20};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    size_t count = sizes[k] / 4;
    hora_algo_t got = hora__algo_resolve(ctx, count, HORA_FLOAT32, HORA_ALGO_AUTO);
    hora_algo_t want = ls > 1 ? HORA_ALGO_HIER : sizes[k] < 16384 ? HORA_ALGO_MPI : HORA_ALGO_RING;
    EXPECT(got == want, "rank %d: auto for %zu B on %d nodes x %d ranks: %s, want %s", rank, sizes[k], cs, ls,
           hora__algo_name(got), hora__algo_name(want));
  }
}

static void check_allreduce(hora_ctx_t *ctx, int rank, int size, size_t count, const char *algo) {
  float *x = malloc(count * sizeof *x);
  if (!x) {
    EXPECT(0, "rank %d: cannot allocate %zu floats", rank, count);
    return;
  }
  for (size_t i = 0; i < count; i++) x[i] = (float)((rank + 1) * (int)(i % 7 + 1));
  setenv("HORA_ALLREDUCE_ALGO", algo, 1);
  EXPECT_OK(hora__params_reload());
  double t0 = MPI_Wtime();
  hora_result_t rc = hora_allreduce(ctx, x, x, count, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST);
  double dt = MPI_Wtime() - t0;
  EXPECT(rc == HORA_SUCCESS, "rank %d: %s allreduce of %zu floats failed: %s", rank, algo, count,
         hora_last_error());
  if (rc != HORA_SUCCESS) { /* the failure is the finding: the untouched buffer is not "wrong data" */
    free(x);
    return;
  }
  size_t bad = 0, first = 0;
  float base = (float)(size * (size + 1) / 2);
  for (size_t i = 0; i < count; i++)
    if (x[i] != base * (float)(i % 7 + 1) && bad++ == 0) first = i;
  EXPECT(bad == 0, "rank %d: %s allreduce of %zu floats: %zu wrong elements, first [%zu] = %g, want %g", rank,
         algo, count, bad, first, bad ? x[first] : 0.0, bad ? base * (float)(first % 7 + 1) : 0.0);
  if (rank == 0) printf("mn_check: %s allreduce of %zu floats: %.3f s\n", algo, count, dt);
  free(x);
}

int main(int argc, char **argv) {
  int rank = 0, size = 0;
  if (argc < 2 || atoi(argv[1]) < 1) {
    fprintf(stderr, "usage: mn_check NODES [MIB]\n");
    return 2;
  }
  int want_nodes = atoi(argv[1]);
  size_t mib = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 16;
  hora_ctx_t *ctx = hora_test_init_mpi(&argc, &argv, &rank, &size);
  if (!ctx) {
    EXPECT(0, "hora_init failed");
  } else {
    check_layout(ctx, rank, size, want_nodes);
    check_auto(ctx, rank);
    const char *algos[] = {"hier", "ring", "auto"};
    for (size_t a = 0; a < sizeof algos / sizeof *algos; a++) {
      check_allreduce(ctx, rank, size, 1000, algos[a]);
      check_allreduce(ctx, rank, size, mib * 1024 * 1024 / sizeof(float), algos[a]);
    }
    EXPECT_OK(hora_finalize(ctx));
  }
  int rc = hora_test_finish_mpi("mn_check");
  MPI_Finalize();
  return rc;
}
