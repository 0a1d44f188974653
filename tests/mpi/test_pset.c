/* Process sets: hora_process_set_create / destroy. The ranks split into the even and the odd
 * ranks (2 of 3 and 1 of 3 at np 3, 2+2 at np 4), and each set runs allreduce, allgather and
 * broadcast, blocking and async, while the parent context runs an async allreduce at the same
 * time; values are asserted. Then the misuse cases: a rank outside a set, ranks that pass
 * different lists, a bad list on one rank, hora_finalize on a set: the documented error on every
 * rank, never a hang. A third, overlapping set is left for hora_finalize to destroy. */
#include <stdint.h>

#include "hora_test.h"

static int rank, size;

#define N 37

/* The collectives on one set of which this rank is a member; `members` lists the set's parent
 * ranks in order (so the set rank of members[i] is i). */
/* Wrong values after an allreduce (sum, divided by `div`), an allgather and a broadcast on the set
 * of n members: every member k contributed (members[k] + 1) * (i + 1) + round at element i; the
 * broadcast's root contributed root_f * (i + 1) + round, times bc_scale. */
static long wrong_values(const int *members, int n, int round, const double *out, const double *gat,
                         const double *bc, int div, int root_f, double bc_scale) {
  long bad = 0;
  for (int i = 0; i < N; i++) {
    double want = 0;
    for (int k = 0; k < n; k++) {
      double v = (members[k] + 1) * (i + 1) + round;
      want += v;
      bad += gat[k * N + i] != v;
    }
    bad += out[i] != want / div;
    bad += bc[i] != bc_scale * (double)(root_f * (i + 1) + round);
  }
  return bad;
}

static void run_on_set(hora_ctx_t *set, const int *members, int n, int round) {
  int srank = -1, ssize = -1;
  EXPECT_OK(hora_rank(set, &srank));
  EXPECT_OK(hora_size(set, &ssize));
  EXPECT(ssize == n, "set size %d, want %d", ssize, n);
  EXPECT(srank >= 0 && srank < n && members[srank] == rank, "set rank %d is not parent rank %d", srank, rank);
  double in[N], out[N], gat[N * 4], bc[N];
  for (int i = 0; i < N; i++) in[i] = (rank + 1) * (i + 1) + round;
  /* Blocking: allreduce (sum), allgather, broadcast from the set's last rank. */
  EXPECT_OK(hora_allreduce(set, in, out, N, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST));
  EXPECT_OK(hora_allgather(set, in, gat, N, HORA_FLOAT64, HORA_DEVICE_HOST));
  for (int i = 0; i < N; i++) bc[i] = srank == n - 1 ? in[i] : -1;
  EXPECT_OK(hora_broadcast(set, bc, N, HORA_FLOAT64, n - 1, HORA_DEVICE_HOST));
  long bad = wrong_values(members, n, round, out, gat, bc, 1, (members[n - 1] + 1), 1.0);
  EXPECT(bad == 0, "blocking collectives on the set: %ld wrong values (round %d)", bad, round);

  /* Async on the set while the parent runs its own async allreduce (the parent's part is in
   * main): same checks. */
  hora_handle_t *h[3] = {NULL, NULL, NULL};
  for (int i = 0; i < N; i++) bc[i] = srank == 0 ? in[i] * 2 : -1;
  EXPECT_OK(hora_allreduce_async(set, "ps.ar", in, out, N, HORA_FLOAT64, HORA_AVERAGE, 1, 1, HORA_DEVICE_HOST, &h[0]));
  EXPECT_OK(hora_allgather_async(set, "ps.ag", in, gat, N, HORA_FLOAT64, HORA_DEVICE_HOST, &h[1]));
  EXPECT_OK(hora_broadcast_async(set, "ps.bc", bc, N, HORA_FLOAT64, 0, HORA_DEVICE_HOST, &h[2]));
  for (int k = 0; k < 3; k++) {
    if (h[k]) EXPECT_OK(hora_wait(h[k]));
    hora_handle_free(h[k]);
  }
  bad = wrong_values(members, n, round, out, gat, bc, n, (members[0] + 1), 2.0);
  EXPECT(bad == 0, "async collectives on the set: %ld wrong values (round %d)", bad, round);
}

static void misuse(hora_ctx_t *ctx) {
  hora_ctx_t *s = NULL;
  /* Different lists on different ranks: HORA_ERR_MISMATCH everywhere, *set unchanged. */
  if (size > 1) {
    int l0[2] = {0, 1}, l1[1] = {0};
    EXPECT_ERR(hora_process_set_create(ctx, rank == 0 ? l0 : l1, rank == 0 ? 2 : 1, &s), HORA_ERR_MISMATCH,
               "different rank lists");
    EXPECT(s == NULL, "set written on error");
  }
  /* A bad list on the last rank only: INVALID_ARGUMENT everywhere, naming the reason there. */
  int dup[2] = {0, 0}, ok[1] = {0};
  EXPECT_ERR(hora_process_set_create(ctx, rank == size - 1 ? dup : ok, rank == size - 1 ? 2 : 1, &s),
             HORA_ERR_INVALID_ARGUMENT, rank == size - 1 ? "listed twice" : "another rank");
  int out_of_range[1] = {size};
  EXPECT_ERR(hora_process_set_create(ctx, out_of_range, 1, &s), HORA_ERR_INVALID_ARGUMENT, "not a rank");
  EXPECT_ERR(hora_process_set_create(ctx, ok, 0, &s), HORA_ERR_INVALID_ARGUMENT, "empty");
  EXPECT_ERR(hora_process_set_create(ctx, ok, 1, NULL), HORA_ERR_INVALID_ARGUMENT, "NULL");
  EXPECT(s == NULL, "set written on error");
  /* hora_finalize is not the way to release a set; hora_process_set_destroy is not for roots. */
  EXPECT_ERR(hora_process_set_destroy(ctx), HORA_ERR_INVALID_ARGUMENT, "hora_finalize");
}

/* Checkpoints and signals are the root context's. */
static void root_only(hora_ctx_t *set) {
  hora_ckpt_t *ck = NULL;
  EXPECT_ERR(hora_ckpt_open(set, NULL, &ck), HORA_ERR_INVALID_ARGUMENT, "root context");
  EXPECT(ck == NULL, "checkpointer written on error");
  EXPECT_ERR(hora_ckpt_on_signal(set), HORA_ERR_INVALID_ARGUMENT, "root context");
}

int main(int argc, char **argv) {
  setenv("HORA_LOG", "NONE", 1);
  hora_ctx_t *ctx = hora_test_init_mpi(&argc, &argv, &rank, &size);
  if (!ctx) return 1;

  /* Even and odd ranks. */
  int even[4], odd[4], ne = 0, no = 0;
  for (int r = 0; r < size; r++) {
    if (r % 2 == 0) even[ne++] = r;
    else odd[no++] = r;
  }
  hora_ctx_t *se = NULL, *so = NULL;
  EXPECT_OK(hora_process_set_create(ctx, even, (size_t)ne, &se));
  if (no) EXPECT_OK(hora_process_set_create(ctx, odd, (size_t)no, &so));
  hora_ctx_t *mine = rank % 2 ? so : se, *other = rank % 2 ? se : so;
  int inc = -1;
  if (mine) EXPECT_OK(hora_process_set_included(mine, &inc));
  EXPECT(inc == 1, "included %d in its own set", inc);
  if (other) {
    EXPECT_OK(hora_process_set_included(other, &inc));
    EXPECT(inc == 0, "included %d in the other set", inc);
    /* A rank outside the set: every use is refused with a message naming the set. */
    double x[N] = {0};
    int r = -1;
    hora_handle_t *h = NULL;
    EXPECT_ERR(hora_rank(other, &r), HORA_ERR_INVALID_ARGUMENT, "not in the process set");
    EXPECT_ERR(hora_allreduce(other, x, x, N, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST),
               HORA_ERR_INVALID_ARGUMENT, "not in the process set");
    EXPECT_ERR(hora_allreduce_async(other, "x", x, x, N, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h),
               HORA_ERR_INVALID_ARGUMENT, "not in the process set");
    EXPECT(h == NULL, "handle written on error");
    EXPECT_ERR(hora_finalize(other), HORA_ERR_INVALID_ARGUMENT, "process set");
  }

  /* The parent's async allreduce runs beside the sets' collectives. */
  double p_in[N], p_out[N];
  for (int i = 0; i < N; i++) p_in[i] = rank + i;
  hora_handle_t *ph = NULL;
  EXPECT_OK(hora_allreduce_async(ctx, "parent.ar", p_in, p_out, N, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &ph));
  if (mine) root_only(mine);
  for (int round = 0; round < 3 && mine; round++)
    run_on_set(mine, rank % 2 ? odd : even, rank % 2 ? no : ne, round);
  if (ph) EXPECT_OK(hora_wait(ph));
  hora_handle_free(ph);
  long bad = 0;
  for (int i = 0; i < N; i++) bad += p_out[i] != (double)(size * (size - 1) / 2 + size * i);
  EXPECT(bad == 0, "parent allreduce beside the sets: %ld wrong values", bad);

  misuse(ctx);

  /* An overlapping set, ranks 1..size-1 (a nested set of it on ranks 1..2 at np >= 3), left for
   * hora_finalize to destroy; a parent collective still works after the sets are gone. */
  hora_ctx_t *tail = NULL, *nested = NULL;
  if (size > 1) {
    int t[4], nt = 0;
    for (int r = 1; r < size; r++) t[nt++] = r;
    EXPECT_OK(hora_process_set_create(ctx, t, (size_t)nt, &tail));
    if (rank > 0 && size >= 3) {
      int sub[2] = {0, 1}; /* set ranks 0 and 1 of tail = parent ranks 1 and 2 */
      EXPECT_OK(hora_process_set_create(tail, sub, 2, &nested));
      double v = rank, sum = 0;
      if (nested && rank <= 2) EXPECT_OK(hora_allreduce(nested, &v, &sum, 1, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST));
      if (rank <= 2) EXPECT(sum == 3.0, "nested set sum %g, want 3", sum);
    }
  }
  EXPECT_OK(hora_process_set_destroy(so));
  EXPECT_OK(hora_process_set_destroy(se));
  EXPECT_OK(hora_barrier(ctx));
  EXPECT_OK(hora_finalize(ctx));
  int ret = hora_test_finish_mpi("test_pset");
  MPI_Finalize();
  return ret;
}
