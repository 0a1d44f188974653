/* HORA_ADASUM: hora_allreduce's Adasum against a serial reference of the same tree (every rank
 * builds every rank's vector and combines them level by level with
 * adasum(a, b) = (1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b), float64 and float32, in place and
 * not, counts that do not halve evenly, a zero vector, parallel vectors of squared norm far below
 * 1e-8 (Horovod 0.28's threshold is sqrt(DBL_MIN): they average); the refusals: a non-power-of-two world
 * (every rank), integer dtypes, reduce-scatter; the async form against the blocking one. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "hora_test.h"

static int rank, size;

static double val(int r, size_t i) { return sin(0.37 * (double)(i + 1) * (r + 1) + r) + 0.25 * (r % 3); }

/* Serial tree over all ranks' vectors (v: size x n, combined in place into v[0]). */
static void reference(double *v, size_t n) {
  for (int d = 1; d < size; d <<= 1)
    for (int r = 0; r < size; r += 2 * d) {
      double *a = v + (size_t)r * n, *b = v + (size_t)(r + d) * n, ab = 0, aa = 0, bb = 0;
      for (size_t i = 0; i < n; i++) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
      const double eps = sqrt(DBL_MIN); /* Horovod 0.28's threshold (adasum.h) */
      double ca = aa >= eps ? 1 - ab / (2 * aa) : 1, cb = bb >= eps ? 1 - ab / (2 * bb) : 1;
      for (size_t i = 0; i < n; i++) a[i] = ca * a[i] + cb * b[i];
    }
}

static void run(hora_ctx_t *ctx, size_t n, int f32, int in_place, int zero_rank) {
  double *all = malloc((size_t)size * n * sizeof *all + 1);
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < n; i++) {
      double x = r == zero_rank ? 0.0 : val(r, i);
      all[(size_t)r * n + i] = f32 ? (double)(float)x : x;
    }
  double *in = malloc(n * sizeof *in + 1), *out = malloc(n * sizeof *out + 1);
  float *in32 = malloc(n * sizeof *in32 + 1), *out32 = malloc(n * sizeof *out32 + 1);
  for (size_t i = 0; i < n; i++) in[i] = all[(size_t)rank * n + i], in32[i] = (float)in[i];
  hora_result_t rc;
  if (f32)
    rc = hora_allreduce(ctx, in32, in_place ? in32 : out32, n, HORA_FLOAT32, HORA_ADASUM, 1, 1, HORA_DEVICE_HOST);
  else
    rc = hora_allreduce(ctx, in, in_place ? in : out, n, HORA_FLOAT64, HORA_ADASUM, 1, 1, HORA_DEVICE_HOST);
  EXPECT(rc == HORA_SUCCESS, "adasum n=%zu f32=%d: %s", n, f32, hora_last_error());
  reference(all, n);
  double tol = f32 ? 2e-5 : 1e-9, worst = 0;
  for (size_t i = 0; i < n; i++) {
    double got = f32 ? (double)(in_place ? in32 : out32)[i] : (in_place ? in : out)[i];
    double err = fabs(got - all[i]) / (fabs(all[i]) > 1 ? fabs(all[i]) : 1);
    if (err > worst) worst = err;
  }
  EXPECT(worst <= tol, "adasum n=%zu f32=%d in_place=%d zero=%d: relative error %g > %g", n, f32, in_place,
         zero_rank, worst, tol);
  free(all), free(in), free(out), free(in32), free(out32);
}

int main(int argc, char **argv) {
  setenv("HORA_LOG", "NONE", 1);
  hora_ctx_t *ctx = hora_test_init_mpi(&argc, &argv, &rank, &size);
  if (!ctx) return 1;
  double x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  if (size & (size - 1)) {
    EXPECT_RC(hora_allreduce(ctx, x, x, 8, HORA_FLOAT64, HORA_ADASUM, 1, 1, HORA_DEVICE_HOST),
              HORA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(hora_last_error(), "power-of-two") != NULL, "message: %s", hora_last_error());
  } else {
    const size_t counts[] = {0, 1, 2, 3, 7, 1000, 4099};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
      for (int f32 = 0; f32 < 2; f32++) run(ctx, counts[c], f32, (int)(c % 2), -1);
    run(ctx, 100, 0, 0, size - 1); /* a zero gradient: its coefficient is 1, the other's too */
    /* Scale factors: prescale before, postscale after. */
    double y[8];
    for (int i = 0; i < 8; i++) y[i] = 1.0; /* equal vectors: adasum averages them */
    EXPECT_OK(hora_allreduce(ctx, y, y, 8, HORA_FLOAT64, HORA_ADASUM, 2.0, 3.0, HORA_DEVICE_HOST));
    EXPECT(fabs(y[0] - 6.0) < 1e-12 && fabs(y[7] - 6.0) < 1e-12, "scaled adasum of equal vectors %g, want 6", y[0]);
    /* Parallel vectors (r + 1) v with |v|^2 ~ 1e-38 (double) and ~ 1e-58 (float32, squares that
     * underflow in float32, so the dots must run in double):
     * their coefficients are computed (Horovod's threshold is sqrt(DBL_MIN), not 1e-8), so the
     * tree averages them: (size + 1) / 2 v on every rank, not the sum. */
    double t[64], worst = 0;
    float t32[64];
    for (int i = 0; i < 64; i++) t[i] = (rank + 1) * 1e-20 * sin(i + 1.0), t32[i] = (float)((rank + 1) * 1e-30 * sin(i + 1.0));
    EXPECT_OK(hora_allreduce(ctx, t, t, 64, HORA_FLOAT64, HORA_ADASUM, 1, 1, HORA_DEVICE_HOST));
    EXPECT_OK(hora_allreduce(ctx, t32, t32, 64, HORA_FLOAT32, HORA_ADASUM, 1, 1, HORA_DEVICE_HOST));
    for (int i = 0; i < 64; i++) {
      double w = (size + 1) / 2.0 * 1e-20 * sin(i + 1.0), w32 = (size + 1) / 2.0 * 1e-30 * sin(i + 1.0);
      double e = fabs(t[i] - w) / fabs(w), e32 = fabs(t32[i] - w32) / fabs(w32);
      if (e > worst) worst = e;
      if (e32 / 1e3 > worst) worst = e32 / 1e3; /* float32: 1e-6 relative */
    }
    EXPECT(worst <= 1e-9, "adasum of tiny parallel vectors: relative error %g (the sum, not the mean?)", worst);
  }
  int32_t ix[4] = {1, 2, 3, 4};
  EXPECT_RC(hora_allreduce(ctx, ix, ix, 4, HORA_INT32, HORA_ADASUM, 1, 1, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT);
  /* The async form: refused at submission on a non-power-of-two world, else the same values as
   * the blocking call, also with a fusable neighbour in flight (Adasum never fuses). */
  hora_handle_t *h = NULL, *h2 = NULL;
  if (size & (size - 1)) {
    EXPECT_RC(hora_allreduce_async(ctx, "a", x, x, 8, HORA_FLOAT64, HORA_ADASUM, 1, 1, HORA_DEVICE_HOST, &h),
              HORA_ERR_INVALID_ARGUMENT);
    EXPECT(h == NULL, "handle written on error");
  } else {
    double a[257], b[257], s[8];
    for (int i = 0; i < 257; i++) a[i] = b[i] = val(rank, (size_t)i);
    for (int i = 0; i < 8; i++) s[i] = rank;
    EXPECT_OK(hora_allreduce(ctx, b, b, 257, HORA_FLOAT64, HORA_ADASUM, 1, 1, HORA_DEVICE_HOST));
    EXPECT_OK(hora_allreduce_async(ctx, "adasum.async", a, a, 257, HORA_FLOAT64, HORA_ADASUM, 1, 1,
                                   HORA_DEVICE_HOST, &h));
    EXPECT_OK(hora_allreduce_async(ctx, "sum.async", s, s, 8, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h2));
    if (h) EXPECT_OK(hora_wait(h));
    if (h2) EXPECT_OK(hora_wait(h2));
    long bad = 0;
    for (int i = 0; i < 257; i++) bad += a[i] != b[i];
    for (int i = 0; i < 8; i++) bad += s[i] != size * (size - 1) / 2.0;
    EXPECT(bad == 0, "async adasum differs from the blocking one (%ld values)", bad);
    hora_handle_free(h);
    hora_handle_free(h2);
  }
  EXPECT_RC(hora_reducescatter(ctx, x, x, 1, HORA_FLOAT64, HORA_ADASUM, 1.0, 1.0, HORA_DEVICE_HOST),
            HORA_ERR_INVALID_ARGUMENT);
  EXPECT_OK(hora_finalize(ctx));
  int ret = hora_test_finish_mpi("test_adasum");
  MPI_Finalize();
  return ret;
}
