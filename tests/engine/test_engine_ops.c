/* Every async collective against exact expected values, the grouped allreduce, hora_poll,
 * argument errors (no handle is created), duplicate pending names, and hora_join with ranks
 * joining at different times. */
#include <stdint.h>
#include <unistd.h>

#include "hora_test.h"

static int rank, size;

static void test_ops(hora_ctx_t *ctx) {
  const size_t n = 1000;
  hora_handle_t *h[8];
  /* broadcast from the last rank */
  int32_t *b = malloc(n * sizeof *b);
  for (size_t i = 0; i < n; i++) b[i] = rank == size - 1 ? (int32_t)(i * 3 + 1) : -1;
  EXPECT_OK(hora_broadcast_async(ctx, "ops/bcast", b, n, HORA_INT32, size - 1, HORA_DEVICE_HOST, &h[0]));
  /* allgather */
  double *ag_s = malloc(n * sizeof *ag_s), *ag_r = malloc(n * (size_t)size * sizeof *ag_r);
  for (size_t i = 0; i < n; i++) ag_s[i] = rank * 10000.0 + (double)i;
  EXPECT_OK(hora_allgather_async(ctx, "ops/allgather", ag_s, ag_r, n, HORA_FLOAT64, HORA_DEVICE_HOST, &h[1]));
  /* allgatherv: rank r sends r+1 elements */
  size_t *rc = malloc((size_t)size * sizeof *rc), tot = 0;
  for (int r = 0; r < size; r++) rc[r] = (size_t)r + 1, tot += rc[r];
  int64_t *av_s = malloc(((size_t)rank + 1) * sizeof *av_s), *av_r = malloc(tot * sizeof *av_r);
  for (int i = 0; i <= rank; i++) av_s[i] = rank * 100 + i;
  EXPECT_OK(hora_allgatherv_async(ctx, "ops/allgatherv", av_s, (size_t)rank + 1, av_r, rc, HORA_INT64,
                                  HORA_DEVICE_HOST, &h[2]));
  /* reducescatter, with Horovod's scale factors: 4 * SUM_p(0.5 * x_p) */
  float *rs_s = malloc(n * (size_t)size * sizeof *rs_s), *rs_r = malloc(n * sizeof *rs_r);
  for (size_t i = 0; i < n * (size_t)size; i++) rs_s[i] = (float)(rank + 1) * (float)(i % 13);
  EXPECT_OK(hora_reducescatter_async(ctx, "ops/reducescatter", rs_s, rs_r, n, HORA_FLOAT32, HORA_SUM, 0.5, 4.0,
                                     HORA_DEVICE_HOST, &h[3]));
  /* alltoall */
  int32_t *a2a_s = malloc(n * (size_t)size * sizeof *a2a_s), *a2a_r = malloc(n * (size_t)size * sizeof *a2a_r);
  for (int p = 0; p < size; p++)
    for (size_t i = 0; i < n; i++) a2a_s[(size_t)p * n + i] = rank * 1000000 + p * 1000 + (int32_t)i;
  EXPECT_OK(hora_alltoall_async(ctx, "ops/alltoall", a2a_s, a2a_r, n, HORA_INT32, HORA_DEVICE_HOST, &h[4]));
  /* grouped allreduce of 5 tensors, one handle */
  const char *names[5] = {"g/0", "g/1", "g/2", "g/3", "g/4"};
  float *gs[5], *gr[5];
  size_t gc[5] = {1, 100, 0, 5000, 7};
  for (int k = 0; k < 5; k++) {
    gs[k] = malloc((gc[k] + 1) * sizeof(float));
    gr[k] = malloc((gc[k] + 1) * sizeof(float));
    for (size_t i = 0; i < gc[k]; i++) gs[k][i] = (float)(rank + 1 + k);
  }
  EXPECT_OK(hora_grouped_allreduce_async(ctx, names, (const void *const *)gs, (void *const *)gr, gc, 5,
                                         HORA_FLOAT32, HORA_SUM, 2.0, 0.5, HORA_DEVICE_HOST, &h[5]));
  for (int k = 0; k < 6; k++) {
    EXPECT_OK(hora_wait(h[k]));
    int done = 0;
    EXPECT_OK(hora_poll(h[k], &done));
    EXPECT(done == 1, "poll after wait: done=%d", done);
    EXPECT_OK(hora_wait(h[k])); /* again: same result */
    EXPECT_OK(hora_handle_free(h[k]));
  }
  for (size_t i = 0; i < n; i++) EXPECT(b[i] == (int32_t)(i * 3 + 1), "bcast[%zu]=%d", i, b[i]);
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < n; i++)
      if (ag_r[(size_t)r * n + i] != r * 10000.0 + (double)i) {
        EXPECT(0, "allgather block %d [%zu] = %g", r, i, ag_r[(size_t)r * n + i]);
        break;
      }
  size_t off = 0;
  for (int r = 0; r < size; r++)
    for (int i = 0; i <= r; i++, off++) EXPECT(av_r[off] == r * 100 + i, "allgatherv[%zu]=%lld", off, (long long)av_r[off]);
  float tri = (float)(size * (size + 1) / 2);
  for (size_t i = 0; i < n; i++) {
    size_t gi = (size_t)rank * n + i;
    if (rs_r[i] != 2.0f * tri * (float)(gi % 13)) {
      EXPECT(0, "reducescatter[%zu] = %g want %g", i, rs_r[i], 2.0f * tri * (float)(gi % 13));
      break;
    }
  }
  for (size_t i = 0; i < n * (size_t)size; i++) /* the prescale went into a copy */
    if (rs_s[i] != (float)(rank + 1) * (float)(i % 13)) {
      EXPECT(0, "reducescatter's sendbuf[%zu] changed to %g", i, rs_s[i]);
      break;
    }
  for (int p = 0; p < size; p++)
    for (size_t i = 0; i < n; i++)
      if (a2a_r[(size_t)p * n + i] != p * 1000000 + rank * 1000 + (int32_t)i) {
        EXPECT(0, "alltoall from %d [%zu] = %d", p, i, a2a_r[(size_t)p * n + i]);
        break;
      }
  for (int k = 0; k < 5; k++) {
    /* postscale 0.5 * sum_r prescale 2 * (r+1+k) = sum_r (r+1+k) */
    float want = tri + (float)(k * size);
    for (size_t i = 0; i < gc[k]; i++)
      if (gr[k][i] != want) {
        EXPECT(0, "grouped %d [%zu] = %g want %g", k, i, gr[k][i], want);
        break;
      }
    free(gs[k]);
    free(gr[k]);
  }
  free(b), free(ag_s), free(ag_r), free(rc), free(av_s), free(av_r), free(rs_s), free(rs_r), free(a2a_s), free(a2a_r);
}

static void test_errors(hora_ctx_t *ctx) {
  float x[4] = {1, 2, 3, 4}, y[4];
  hora_handle_t *h = (hora_handle_t *)0x1;
  EXPECT_RC(hora_allreduce_async(ctx, NULL, x, y, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h),
            HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "name") != NULL, "message: %s", hora_last_error());
  EXPECT_RC(hora_allreduce_async(ctx, "", x, y, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h),
            HORA_ERR_INVALID_ARGUMENT);
  char longname[1100];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  EXPECT_RC(hora_allreduce_async(ctx, longname, x, y, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h),
            HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_allreduce_async(ctx, "e", x, y, 4, (hora_dtype_t)99, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h),
            HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_allreduce_async(ctx, "e", x, x + 1, 3, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h),
            HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_allreduce_async(ctx, "e", x, y, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, NULL),
            HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_allreduce_async(NULL, "e", x, y, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h),
            HORA_ERR_NOT_INITIALIZED);
  EXPECT_RC(hora_broadcast_async(ctx, "e", x, 4, HORA_FLOAT32, size, HORA_DEVICE_HOST, &h), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_alltoall_async(ctx, "e", x, x, 1, HORA_FLOAT32, HORA_DEVICE_HOST, &h), HORA_ERR_INVALID_ARGUMENT);
  int32_t xi[4] = {1, 2, 3, 4}, yi[4];
  EXPECT_RC(hora_allreduce_async(ctx, "e", xi, yi, 4, HORA_INT32, HORA_SUM, 2.0, 1, HORA_DEVICE_HOST, &h),
            HORA_ERR_INVALID_ARGUMENT);
  const char *dup[2] = {"d", "d"};
  const void *sb[2] = {x, x};
  void *rb[2] = {y, y};
  size_t cnt[2] = {1, 1};
  EXPECT_RC(hora_grouped_allreduce_async(ctx, dup, sb, rb, cnt, 2, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h),
            HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "twice") != NULL, "message: %s", hora_last_error());
  EXPECT_RC(hora_grouped_allreduce_async(ctx, dup, sb, rb, cnt, 0, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h),
            HORA_ERR_INVALID_ARGUMENT);
#if !HORA_HAVE_CUDA
  EXPECT_RC(hora_allreduce_async(ctx, "e", x, y, 4, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_CUDA, &h),
            HORA_ERR_NOT_SUPPORTED);
#endif
  EXPECT(h == (hora_handle_t *)0x1, "handle changed on error");
  EXPECT_OK(hora_handle_free(NULL));
  EXPECT_RC(hora_wait(NULL), HORA_ERR_INVALID_ARGUMENT);
  int done;
  EXPECT_RC(hora_poll(NULL, &done), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_join(ctx, NULL), HORA_ERR_INVALID_ARGUMENT);

  /* The same name twice while the first is pending: the second fails, the first completes. Rank 0
   * submits "dup" twice and sees the second fail before the others submit it at all (after a
   * barrier), so the first cannot have completed in between. On one rank nothing can hold the
   * first back (the engine may complete it before the second submit): checked from 2 ranks. */
  hora_handle_t *h1 = NULL, *h2 = NULL;
  float a[2] = {1, 1}, ra[2], rb2[2];
  if (rank == 0)
    EXPECT_OK(hora_allreduce_async(ctx, "dup", a, ra, 2, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h1));
  if (rank == 0 && size > 1) {
    EXPECT_OK(hora_allreduce_async(ctx, "dup", a, rb2, 2, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h2));
    EXPECT_RC(hora_wait(h2), HORA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(hora_last_error(), "already pending") != NULL, "message: %s", hora_last_error());
    EXPECT_OK(hora_handle_free(h2));
  }
  EXPECT_OK(hora_barrier(ctx));
  if (rank != 0)
    EXPECT_OK(hora_allreduce_async(ctx, "dup", a, ra, 2, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h1));
  EXPECT_OK(hora_wait(h1));
  EXPECT(ra[0] == (float)size && ra[1] == (float)size, "dup result %g %g", ra[0], ra[1]);
  EXPECT_OK(hora_handle_free(h1));
}

/* Ranks join one after another; while some have joined, the others' allreduces see zeros from
 * them (sum over the ranks that have not joined). */
static void test_join(hora_ctx_t *ctx) {
  for (int step = 0; step < size; step++) {
    if (rank < step) break; /* rank r runs r+1 steps, then joins */
    float v[3] = {1, 2, 3}, out[3];
    hora_handle_t *h;
    EXPECT_OK(hora_allreduce_async(ctx, "join/grad", v, out, 3, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
    int active = size - step; /* ranks >= step are still running */
    EXPECT(out[0] == (float)active && out[2] == 3.0f * (float)active, "join step %d: %g %g, want %d", step,
           out[0], out[2], active);
  }
  int last = -1;
  EXPECT_OK(hora_join(ctx, &last));
  EXPECT(last == size - 1, "last joined rank %d, want %d", last, size - 1);
  /* After the join everything is back to normal. */
  float v = 1, out = 0;
  hora_handle_t *h;
  EXPECT_OK(hora_allreduce_async(ctx, "join/after", &v, &out, 1, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
  EXPECT_OK(hora_wait(h));
  hora_handle_free(h);
  EXPECT(out == (float)size, "after join: %g", out);
}

/* Async requests in flight while the program runs blocking collectives on the same context, in
 * a different interleaving on every rank: the engine's own communicators keep them apart. */
static void test_mixed(hora_ctx_t *ctx) {
  double a[300], ra[300], b[300];
  for (int i = 0; i < 300; i++) a[i] = rank + 1, b[i] = 2 * (rank + 1);
  for (int round = 0; round < 5; round++) {
    hora_handle_t *h;
    if (rank % 2) usleep(2000);
    EXPECT_OK(hora_allreduce_async(ctx, "mixed/async", a, ra, 300, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
    if (rank % 2 == 0) usleep(2000);
    EXPECT_OK(hora_allreduce(ctx, b, b, 300, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST));
    EXPECT_OK(hora_barrier(ctx));
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
    EXPECT(ra[299] == size * (size + 1) / 2.0, "async result %g", ra[299]);
  }
  double want = 2 * (size * (size + 1) / 2.0);
  for (int r = 1; r < 5; r++) want *= size;
  EXPECT(b[0] == want, "blocking result %g want %g", b[0], want);
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  test_ops(ctx);
  test_errors(ctx);
  test_join(ctx);
  test_mixed(ctx);
  /* A request no other rank submits is still pending at hora_finalize: it completes with
   * HORA_ERR_SHUTDOWN (no hang), and its handle can be freed after finalize. */
  char name[32];
  snprintf(name, sizeof name, "orphan/%d", rank);
  float o = 1, ro;
  hora_handle_t *orphan = NULL;
  EXPECT_OK(hora_allreduce_async(ctx, name, &o, &ro, 1, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &orphan));
  if (size == 1) { /* alone, the orphan completes at once */
    EXPECT_OK(hora_wait(orphan));
    hora_handle_free(orphan);
    orphan = NULL;
  }
  EXPECT_OK(hora_finalize(ctx));
  if (orphan) {
    EXPECT_RC(hora_wait(orphan), HORA_ERR_SHUTDOWN);
    EXPECT_OK(hora_handle_free(orphan));
  }
  hora_handle_t *h2 = (hora_handle_t *)0x1;
  EXPECT_RC(hora_allreduce_async(ctx, "after", &o, &ro, 1, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h2),
            HORA_ERR_NOT_INITIALIZED);
  int rc = hora_test_finish_mpi("test_engine_ops");
  MPI_Finalize();
  return rc;
}
